"""The draft quantizers on small known tensors, and which tensors they touch."""

from __future__ import annotations

import pytest
import torch

from specbook.core.errors import ModelPrepareError
from specbook.models.quantize import (
    FP8_E4M3_MAX,
    QUANTIZERS,
    fake_quant_fp8_e4m3,
    fake_quant_int4_asym,
    fake_quant_int4_sym,
    fp8_e4m3_scale,
    get_quantizer,
    int4_sym_scales,
    quantize_state_dict,
)


def _weights(rows: int = 8, cols: int = 96, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * 0.05


def test_int4_sym_error_is_at_most_half_a_step_per_group():
    w = _weights()
    wq = fake_quant_int4_sym(w)
    scale = int4_sym_scales(w)  # [rows, groups, 1]
    err = (wq - w).abs().reshape(w.shape[0], -1, 32)
    assert bool((err <= scale / 2 + 1e-7).all())
    assert float(err.max()) > 0  # it did quantize


def test_int4_sym_values_lie_on_a_symmetric_16_level_grid():
    w = _weights()
    wq = fake_quant_int4_sym(w).reshape(w.shape[0], -1, 32)
    scale = int4_sym_scales(w)
    q = wq / scale
    assert torch.allclose(q, q.round(), atol=1e-5)
    assert int(q.round().min()) >= -8 and int(q.round().max()) <= 7
    # the grid is symmetric: amax maps to +-7 exactly, so each group's largest magnitude survives
    amax = w.reshape(w.shape[0], -1, 32).abs().amax(dim=-1)
    assert torch.allclose(wq.abs().amax(dim=-1), amax, rtol=1e-6)
    assert all(len(torch.unique(g.round())) <= 16 for g in q.reshape(-1, 32))


def test_int4_sym_groups_run_along_the_input_dim():
    w = torch.zeros(2, 64)
    w[0, :32] = 1.0  # one group of ones, the next group tiny: separate scales keep the tiny one
    w[0, 32:] = 0.001
    wq = fake_quant_int4_sym(w)
    assert torch.allclose(wq[0, 32:], torch.full((32,), 0.001))
    assert torch.equal(wq[1], torch.zeros(64))  # an all-zero group stays zero


def test_int4_rejects_an_input_dim_not_divisible_by_the_group():
    with pytest.raises(ModelPrepareError, match="groups of 32"):
        fake_quant_int4_sym(torch.ones(4, 40))


def test_fp8_uses_one_scale_per_tensor_and_keeps_amax():
    w = _weights(4, 64)
    scale = fp8_e4m3_scale(w)
    assert scale == pytest.approx(float(w.abs().max()) / FP8_E4M3_MAX)
    wq = fake_quant_fp8_e4m3(w)
    i = int(w.abs().argmax())
    assert float(wq.flatten()[i]) == pytest.approx(float(w.flatten()[i]), rel=1e-6)


def test_fp8_round_trip_error_bounds():
    w = _weights(16, 64, seed=3)
    scale = fp8_e4m3_scale(w)
    err = (fake_quant_fp8_e4m3(w) - w).abs()
    # e4m3: 3 mantissa bits -> relative error <= 2^-4 for normals; subnormal step 2^-9 -> abs <= 2^-10 * scale
    bound = torch.maximum(w.abs() * 2**-4, torch.full_like(w, scale * 2**-10))
    assert bool((err <= bound * (1 + 1e-5)).all())
    assert float(err.max()) > 0


def test_fp8_is_exact_on_values_already_on_its_grid():
    grid = torch.tensor([[448.0, -448.0, 1.0, 0.5, -0.875, 2**-9, 0.0, 240.0]])
    assert torch.equal(fake_quant_fp8_e4m3(grid), grid)


def test_asymmetric_int4_g32_is_lossless_on_a_q4_1_grid_but_symmetric_is_not():
    # A Q4_1 block is d * q + m, q in 0..15; the GGUF target holds exactly such values, which is why
    # asymmetric int4 g32 would be no lower-precision draft at all.
    g = torch.Generator().manual_seed(1)
    q = torch.randint(0, 16, (4, 64), generator=g).float()
    q[:, ::32] = 0.0
    q[:, 1::32] = 15.0
    d = torch.rand(4, 2, 1, generator=g) * 0.01 + 0.001
    m = -torch.rand(4, 2, 1, generator=g) * 0.05
    w = (q.reshape(4, 2, 32) * d + m).reshape(4, 64)
    assert torch.allclose(fake_quant_int4_asym(w), w, atol=1e-6)
    assert not torch.allclose(fake_quant_int4_sym(w), w, atol=1e-4)


def _toy_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    st = {
        "model.embed_tokens.weight": torch.randn(10, 64, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.randn(64, generator=g).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.randn(64, generator=g).to(torch.bfloat16),
    }
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        st[f"model.layers.0.{name}.weight"] = (torch.randn(32, 64, generator=g) * 0.05).to(torch.bfloat16)
    return st


@pytest.mark.parametrize("quantizer", ["int4_sym_g32", "fp8_e4m3_tensor"])
def test_quantize_state_dict_touches_only_decoder_linears(quantizer):
    st = _toy_state()
    out, stats = quantize_state_dict(st, get_quantizer(quantizer))
    assert stats["quantized_tensors"] == 7
    assert 0 < stats["relative_rms_error"] < 0.5
    for name, w in st.items():
        assert out[name].dtype == torch.bfloat16
        if name.endswith("_proj.weight"):
            assert not torch.equal(out[name], w), name
        else:
            assert torch.equal(out[name], w), name


def test_int4_loses_more_than_fp8():
    st = _toy_state()
    _, int4 = quantize_state_dict(st, get_quantizer("int4_sym_g32"))
    _, fp8 = quantize_state_dict(st, get_quantizer("fp8_e4m3_tensor"))
    assert int4["relative_rms_error"] > fp8["relative_rms_error"]


def test_quantize_state_dict_without_linears_is_an_error():
    with pytest.raises(ModelPrepareError, match="q_proj"):
        quantize_state_dict({"model.norm.weight": torch.ones(4)}, get_quantizer("fp8_e4m3_tensor"))


def test_unknown_quantizer_lists_known_ones():
    with pytest.raises(ModelPrepareError) as exc:
        get_quantizer("int3")
    assert all(name in str(exc.value) for name in QUANTIZERS)
