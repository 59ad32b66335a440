"""Transformer shapes as data: what the cost model needs to know about a model.

A spec comes from a Hugging Face ``config.json`` (``from_hf_config``) or from
GGUF metadata (``from_gguf``); the catalog below holds the config fields of the
architectures the paper evaluates, so they can be costed without weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_params: float  # parameters every token passes through (the paper's P: the whole model)
    dtype_bytes: int = 2  # bf16 weights and KV (a run in float32: 4, see DTYPE_BYTES)
    max_context: int = 8192

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for one token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer's GEMMs (QKV, O, gated MLP): what a token multiplies per layer."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.hidden_size * (q + 2 * kv) + q * self.hidden_size + 3 * self.hidden_size * self.intermediate_size


def count_params(config: dict[str, Any]) -> int:
    """Parameter count of a Llama-style decoder from its config (embeddings, layers, norms, head)."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or h // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    attn = h * (q + 2 * kv) + q * h + (q + 2 * kv if config.get("attention_bias", False) else 0)
    layer = attn + 3 * h * inter + 2 * h  # + two RMSNorm weight vectors
    embed = config["vocab_size"] * h
    head = 0 if config.get("tie_word_embeddings", False) else embed
    return embed + config["num_hidden_layers"] * layer + h + head


# bytes per weight and KV element of the engines' dtype settings ("auto": the checkpoint's, bf16 here)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "auto": 2, "float32": 4}


def from_hf_config(config: dict[str, Any] | str | Path, name: str | None = None) -> ModelSpec:
    """A spec from a ``config.json`` (a dict, or the path of the file or of its folder)."""
    if not isinstance(config, dict):
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        config = json.loads(path.read_text())
        name = name or path.parent.name
    heads = config["num_attention_heads"]
    return ModelSpec(
        name=name or config.get("_name_or_path", "model"),
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads", heads),
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        num_params=float(count_params(config)),
        max_context=config.get("max_position_embeddings", 8192),
    )


def from_gguf(path: str | Path, name: str | None = None) -> ModelSpec:
    """A spec from GGUF metadata; the parameter count is the sum of the tensors' element counts.

    Weights in the file may be quantized; the spec still costs bf16 serving
    (``dtype_bytes = 2``) because that is how the project runs the model.
    """
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    heads = int(field(f"{arch}.attention.head_count"))
    hidden = int(field(f"{arch}.embedding_length"))
    vocab = field(f"{arch}.vocab_size") or len(field("tokenizer.ggml.tokens", []))
    return ModelSpec(
        name=name or str(field("general.name", Path(path).stem)),
        num_layers=int(field(f"{arch}.block_count")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(field(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(field(f"{arch}.attention.key_length", hidden // heads)),
        intermediate_size=int(field(f"{arch}.feed_forward_length")),
        vocab_size=int(vocab),
        num_params=float(sum(int(t.n_elements) for t in reader.tensors)),
        max_context=int(field(f"{arch}.context_length", 8192)),
    )


def _llama(layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int, ctx: int, **extra: Any) -> dict:
    return {
        "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
        "num_key_value_heads": kv, "intermediate_size": inter, "vocab_size": vocab,
        "max_position_embeddings": ctx, **extra,
    }


# The config.json fields of each architecture (as published with the weights).
CATALOG_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": _llama(32, 4096, 32, 8, 14336, 128256, 131072),
    "llama-3-8b": _llama(32, 4096, 32, 8, 14336, 128256, 8192),  # the paper's calibration model
    "llama-3.1-70b": _llama(80, 8192, 64, 8, 28672, 128256, 131072),
    "qwen2.5-7b": _llama(28, 3584, 28, 4, 18944, 152064, 131072, attention_bias=True),
    "qwen2.5-72b": _llama(80, 8192, 64, 8, 29568, 152064, 131072, attention_bias=True),
    "llama-2-7b": _llama(32, 4096, 32, 32, 11008, 32000, 4096),
    "deepseek-67b": _llama(95, 8192, 64, 8, 22016, 102400, 4096),
    "smollm2-135m": _llama(30, 576, 9, 3, 1536, 49152, 8192, tie_word_embeddings=True),
}
MODELS: dict[str, ModelSpec] = {name: from_hf_config(cfg, name) for name, cfg in CATALOG_CONFIGS.items()}


def get_model(name: str) -> ModelSpec:
    """A catalog spec by name, or one read from a ``config.json``/model folder or a ``.gguf`` path."""
    key = name.lower()
    if key in MODELS:
        return MODELS[key]
    path = Path(name)
    if path.suffix == ".gguf" and path.exists():
        return from_gguf(path)
    if path.exists():
        return from_hf_config(path)
    raise KeyError(f"unknown model {name!r}; known: {sorted(MODELS)} (or a config.json / .gguf path)")
