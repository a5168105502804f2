#!/usr/bin/env bash
# Build the carry kit for SGLang 0.5.15.post1 (Hopper only) in parts of PART_SIZE, one folder per device call.
# Usage (from the project root): scripts/sglang/prepare.sh DIR [PART_SIZE]   e.g. scripts/sglang/prepare.sh .gpu-carry
#   writes DIR/s0, DIR/s1, ...: each holds sglang.tar.part-NN and sglang.SHA256SUMS (names distinct from the vLLM kit's).
set -euo pipefail
dir=${1:?usage: prepare.sh DIR [PART_SIZE]}; size=${2:-45M}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/b/wheels" "$dir"
plat="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_39_x86_64 --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform any"
python3 -m pip download -q --no-deps $plat -d "$work/b/wheels" -r "$here/wheels.txt" 2> >(grep -v 'is ignored: it is neither' >&2)
n=$(ls "$work/b/wheels"/*.whl | wc -l); want=$(grep -c "^[^#].*==" "$here/wheels.txt")
[ "$n" -eq "$want" ] || { echo "downloaded $n wheels, wheels.txt pins $want" >&2; exit 1; }
python3 "$here/cut_wheels.py" "$work/b/wheels"
cp "$here/install.sh" "$here/env.sh" "$here/wheels.txt" "$work/b/"
echo "10 largest wheels after cutting:"; ls -S "$work/b/wheels" | head -10 | while read -r w; do printf '  %6.1f MiB  %s\n' "$(stat -c %s "$work/b/wheels/$w" | awk '{print $1/1048576}')" "$w"; done
rm -rf "$dir"/s[0-9]*
tar -cf - -C "$work/b" . | split -b "$size" -d -a 2 - "$work/sglang.tar.part-"
(cd "$work" && sha256sum sglang.tar.part-* > sglang.SHA256SUMS)
i=0; for part in "$work"/sglang.tar.part-*; do
  mkdir -p "$dir/s$i"; mv "$part" "$dir/s$i/"; cp "$work/sglang.SHA256SUMS" "$dir/s$i/"; i=$((i+1))
done
du -sh "$dir"/s*
echo "total carried: $(du -cb "$dir"/s*/sglang.tar.part-* | tail -1 | awk '{printf "%.1f MiB", $1/1048576}') in $i parts ($dir/s0 .. s$((i-1))); copy each part to \$VC (/tmp/vc), then run install.sh from the last one"
