#!/usr/bin/env bash
# On the GPU machine, once every part is in $VC (default /tmp/vc, shared with the vLLM kit):
# verify, unpack and install SGLang 0.5.15.post1 into /tmp/sglsite (run it with
# PYTHONPATH=/tmp/sglsite:/tmp/site, as env.sh sets it). Idempotent; a failing smoke import fails it (exit 2),
# so that book.sh starts no run on a kit that cannot serve.
set -uo pipefail
VC=${VC:-/tmp/vc}; B=/tmp/sglbundle; T=/tmp/sglsite; PY=${PY:-python3}
t0=$(date +%s.%N); step() { local t=$(date +%s.%N); awk -v a="$t0" -v b="$t" -v m="$*" 'BEGIN{printf "[%6.1fs] %s\n", b-a, m}'; t0=$t; }
if [ ! -f "$T/.done" ]; then
  (cd "$VC" && sha256sum -c --quiet sglang.SHA256SUMS) || { echo "checksum FAILED (parts in $VC: $(ls "$VC" | grep -c '^sglang.tar.part-'))"; exit 1; }
  step "checksums ok"
  rm -rf "$B" "$T" && mkdir -p "$B" "$T"
  cat "$VC"/sglang.tar.part-* | tar -xf - -C "$B" || exit 1
  step "untar ($(du -sh "$B" | cut -f1))"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$T" "$B"/wheels/*.whl || exit 1
  touch "$T/.done"; step "pip install into $T ($(du -sh "$T" | cut -f1))"
  rm -rf "$B"
else
  echo "already installed in $T"
fi
PYTHONPATH=$T:$T/nvidia_cutlass_dsl/python_packages:/tmp/site${PYTHONPATH:+:$PYTHONPATH} "$PY" - <<'PY'
import importlib, traceback
failed = []
# what a server imports: the HTTP server, and (to capture a draft model's CUDA graphs) the DSA backend with CUTLASS's DSL
for mod in ["torch", "tokenizers", "transformers", "sgl_kernel", "flashinfer", "cutlass", "sglang", "sglang.srt.server_args",
            "sglang.srt.entrypoints.http_server", "sglang.srt.layers.attention.dsa_backend"]:
    try:
        m = importlib.import_module(mod)
        v = getattr(m, "__version__", "")
        print(f"OK   {mod} {v} {getattr(m, '__file__', '')}")
        if mod == "torch":
            print("     cuda", m.version.cuda, m.cuda.get_device_name(), m.cuda.get_device_capability())
        if mod == "sgl_kernel":
            print("     common_ops", m.common_ops.__file__)
    except BaseException:
        print(f"FAIL {mod}"); traceback.print_exc(); failed.append(mod)
raise SystemExit(f"smoke imports failed: {failed}" if failed else 0)
PY
smoke=$?
step "smoke check"
[ "$smoke" -eq 0 ] || { echo "install.sh: the SGLang kit does not import (above): no server could start" >&2; exit 2; }
