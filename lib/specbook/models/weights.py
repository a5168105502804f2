"""Identical target (and draft) weights for vLLM and llama.cpp, derived from one source.

The one source is the bf16 safetensors folder that `specbook models prepare` made (itself the
packaged GGUF dequantized). From it we write a GGUF whose tensors hold exactly the same bf16 values:
2-D weights as GGUF BF16 (the same 16 bits), 1-D norms as F32 (bf16 -> f32 is exact), q/k rows
permuted back into llama.cpp's rotary layout. Metadata (architecture, tokenizer, chat template)
is copied from the source GGUF the folder was made from, so both engines tokenize and template alike.

Proof of identity, kept in a JSON sidecar: the GGUF is read back, every tensor un-permuted and
compared bit for bit with the safetensors tensor; a per-tensor sha256 of the bf16 bytes in HF
layout is recorded for both sides, and `identical` is True only if all match.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from specbook.core.digest import sha256_bytes
from specbook.core.digest import sha256_file as _sha256_file
from specbook.core.errors import ModelPrepareError
from specbook.core.paths import cache_dir
from specbook.models.convert import hf_name

WEIGHTS_FILE = "model.safetensors"
SIDECAR_SUFFIX = ".json"
FORMAT_VERSION = 1

# GGUF tensor name -> HF LlamaForCausalLM name: the same tables the embedded-model conversion uses.
# Metadata the writer sets itself or that must change with the tensor types.
_SKIP_FIELDS = ("GGUF.", "general.architecture", "general.file_type", "general.quantization_version")
GGUF_FILE_TYPE_MOSTLY_BF16 = 32


def gguf_dir() -> Path:
    return cache_dir() / "gguf"


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF q/k rows -> llama.cpp's interleaved rotary layout (what convert_hf_to_gguf does)."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of permute_qk (what specbook.models.convert applies to the GGUF)."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def read_safetensors_bf16(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a bf16 safetensors file as its raw 16-bit patterns (np.uint16), no torch needed."""
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
            base = 8 + header_len
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError, struct.error) as exc:
        raise ModelPrepareError(f"cannot read safetensors file {path}: {exc}") from exc
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "BF16":
            raise ModelPrepareError(f"{path}: tensor {name} is {info['dtype']}, expected BF16")
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(data[base + start : base + end], dtype="<u2").reshape(info["shape"])
    return out


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_exact(values: np.ndarray, what: str) -> np.ndarray:
    """f32 values that are bf16 values (low 16 bits zero) back to bf16 bits; refuses anything lossy."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    if np.any(bits & 0xFFFF):
        raise ModelPrepareError(f"{what}: F32 values are not exact bf16 values")
    return (bits >> 16).astype(np.uint16)


def _tensor_digest(bits: np.ndarray) -> str:
    return sha256_bytes(np.ascontiguousarray(bits, dtype="<u2").tobytes())


def _model_folder(model: str | Path) -> Path:
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from specbook.models import model_path

    return Path(model_path(str(model)))


def _source_gguf() -> Path:
    try:
        from specbook.models import gguf_path

        return Path(gguf_path())
    except ImportError:
        from specbook.models.convert import packaged_gguf

        return packaged_gguf()


def _copy_metadata(reader, writer) -> None:  # type: ignore[no-untyped-def]
    from gguf import GGUFValueType

    for field in reader.fields.values():
        if field.name.startswith(_SKIP_FIELDS):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)


def write_gguf(folder: Path, source_gguf: Path, out: Path) -> None:
    """Write `out`: the tensors of `folder`'s safetensors in GGUF layout, metadata of `source_gguf`."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

    cfg = json.loads((folder / "config.json").read_text())
    n_heads, n_kv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    state = read_safetensors_bf16(folder / WEIGHTS_FILE)
    reader = GGUFReader(str(source_gguf))
    arch = str(reader.fields["general.architecture"].contents())
    tmp = out.with_suffix(out.suffix + ".tmp")
    writer = GGUFWriter(str(tmp), arch)
    _copy_metadata(reader, writer)
    writer.add_file_type(GGUF_FILE_TYPE_MOSTLY_BF16)
    used = set()
    for t in reader.tensors:
        name, part = hf_name(t.name)
        if name not in state:
            raise ModelPrepareError(f"{folder / WEIGHTS_FILE} has no tensor {name} (GGUF {t.name})")
        bits = state[name]
        used.add(name)
        if part == "attn_q":
            bits = permute_qk(bits, n_heads)
        elif part == "attn_k":
            bits = permute_qk(bits, n_kv)
        if bits.ndim == 1:  # llama.cpp keeps norms in F32; bf16 -> f32 is exact
            writer.add_tensor(t.name, np.ascontiguousarray(bf16_to_f32(bits)))
        else:
            writer.add_tensor(t.name, np.ascontiguousarray(bits), raw_dtype=GGMLQuantizationType.BF16)
    extra = sorted(set(state) - used - {"lm_head.weight"})
    if extra:
        raise ModelPrepareError(f"{folder / WEIGHTS_FILE} holds tensors the GGUF layout has no place for: {extra[:5]}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)


def verify_identical(folder: Path, gguf_file: Path) -> dict:
    """Read `gguf_file` back and compare every tensor, bit for bit, with `folder`'s safetensors."""
    from gguf import GGMLQuantizationType, GGUFReader

    cfg = json.loads((folder / "config.json").read_text())
    n_heads, n_kv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    state = read_safetensors_bf16(folder / WEIGHTS_FILE)
    reader = GGUFReader(str(gguf_file))
    digests: dict[str, dict[str, str]] = {}
    mismatched: list[str] = []
    for t in reader.tensors:
        name, part = hf_name(t.name)
        shape = [int(x) for x in reversed(t.shape)]
        if t.tensor_type == GGMLQuantizationType.BF16:
            bits = np.asarray(t.data).view("<u2").reshape(shape)
        elif t.tensor_type == GGMLQuantizationType.F32:
            bits = f32_to_bf16_exact(np.asarray(t.data).reshape(shape), f"{gguf_file}: {t.name}")
        else:
            raise ModelPrepareError(f"{gguf_file}: tensor {t.name} is {t.tensor_type.name}, expected BF16 or F32")
        if part == "attn_q":
            bits = unpermute_qk(bits, n_heads)
        elif part == "attn_k":
            bits = unpermute_qk(bits, n_kv)
        ours, theirs = _tensor_digest(bits), _tensor_digest(state[name])
        digests[name] = {"gguf": ours, "safetensors": theirs}
        if ours != theirs:
            mismatched.append(name)
    missing = sorted(set(state) - set(digests) - {"lm_head.weight"})
    combined = sha256_bytes("".join(d["safetensors"] for _, d in sorted(digests.items())))
    return {
        "identical": not mismatched and not missing,
        "tensors": len(digests),
        "mismatched": mismatched,
        "missing": missing,
        "weights_digest": combined,
        "per_tensor": digests,
    }


def bf16_round(values: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bits, round to nearest even (what torch's .to(bfloat16) does)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def compare_with_source_gguf(gguf_file: Path, source_gguf: Path) -> dict:
    """Layout check independent of permute_qk: every tensor of the derived GGUF, read in GGUF layout,
    equals bf16(dequantize(source tensor)) with no permutation at all (holds for the target only,
    whose folder is the source dequantized; drafts are re-quantized)."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    derived = {t.name: t for t in GGUFReader(str(gguf_file)).tensors}
    differing = []
    for t in GGUFReader(str(source_gguf)).tensors:
        shape = [int(x) for x in reversed(t.shape)]
        want = bf16_round(dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape))
        d = derived[t.name]
        if d.tensor_type == GGMLQuantizationType.BF16:
            got = np.asarray(d.data).view("<u2").reshape(shape)
        else:
            got = f32_to_bf16_exact(np.asarray(d.data).reshape(shape), t.name)
        if not np.array_equal(got, want):
            differing.append(t.name)
    return {"equal_to_source": not differing, "differing": differing, "tensors": len(derived)}


def derive_gguf(model: str | Path, *, out_dir: Path | None = None, force: bool = False) -> Path:
    """The bf16 GGUF of an embedded model name or a bf16 safetensors folder (derived once, then reused).

    Raises ModelPrepareError if the written GGUF is not bit-identical to the safetensors.
    """
    folder = _model_folder(model)
    out_dir = out_dir or gguf_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{folder.name}.bf16.gguf"
    sidecar = out.with_suffix(out.suffix + SIDECAR_SUFFIX)
    source_sha = _sha256_file(folder / WEIGHTS_FILE)
    if not force and out.is_file() and sidecar.is_file():
        try:
            meta = json.loads(sidecar.read_text())
        except ValueError:
            meta = {}
        if (
            meta.get("format_version") == FORMAT_VERSION
            and meta.get("source_safetensors_sha256") == source_sha
            and meta.get("identical") is True
            and meta.get("gguf_sha256") == _sha256_file(out)
        ):
            return out
    source_gguf = _source_gguf()
    write_gguf(folder, source_gguf, out)
    proof = verify_identical(folder, out)
    meta = {
        "format_version": FORMAT_VERSION,
        "method": "bf16 safetensors -> GGUF (2-D BF16, 1-D F32, q/k re-permuted); metadata from the source GGUF",
        "source_folder": str(folder),
        "source_safetensors_sha256": source_sha,
        "metadata_from": str(source_gguf),
        "gguf_sha256": _sha256_file(out),
        **{k: v for k, v in proof.items() if k != "per_tensor"},
        "per_tensor": proof["per_tensor"],
    }
    sidecar.write_text(json.dumps(meta, indent=1) + "\n")
    if not proof["identical"]:
        raise ModelPrepareError(
            f"{out}: derived GGUF is not identical to {folder / WEIGHTS_FILE}: "
            f"mismatched {proof['mismatched'][:5]}, missing {proof['missing'][:5]}"
        )
    return out


def weights_proof(gguf_file: Path) -> dict:
    """The sidecar written by derive_gguf (identical, weights_digest, hashes), without per-tensor detail."""
    sidecar = Path(str(gguf_file) + SIDECAR_SUFFIX)
    try:
        meta = json.loads(sidecar.read_text())
    except (OSError, ValueError) as exc:
        raise ModelPrepareError(f"{sidecar}: no readable proof of identical weights: {exc}") from exc
    meta.pop("per_tensor", None)
    return meta
