#!/usr/bin/env bash
# On the GPU machine, once every part is in $VC (default /tmp/vc, shared with the vLLM kit):
# verify, unpack and install SGLang 0.5.15.post1 into /tmp/sglsite (run it with
# PYTHONPATH=/tmp/sglsite:/tmp/site). Idempotent; a failing smoke import does not fail the script.
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
PYTHONPATH=$T:/tmp/site${PYTHONPATH:+:$PYTHONPATH} "$PY" - <<'PY' || true
import importlib, traceback
for mod in ["torch", "transformers", "sgl_kernel", "flashinfer", "sglang", "sglang.srt.server_args", "sglang.srt.entrypoints.http_server"]:
    try:
        m = importlib.import_module(mod)
        v = getattr(m, "__version__", "")
        print(f"OK   {mod} {v} {getattr(m, '__file__', '')}")
        if mod == "torch":
            print("     cuda", m.version.cuda, m.cuda.get_device_name(), m.cuda.get_device_capability())
        if mod == "sgl_kernel":
            print("     common_ops", m.common_ops.__file__)
    except BaseException:
        print(f"FAIL {mod}"); traceback.print_exc()
PY
step "smoke check"
