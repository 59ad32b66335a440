"""Per-layer kernel estimates, and the paper's measurements they are checked against.

BlendServe validated its performance model per layer on Llama-3-8B on one
A100 (times in ms). The A100's efficiency factors in ``hardware.py`` are the
least-squares fit of these six points; the tests hold every estimate within 15%.
"""

from __future__ import annotations

from blendserve.costmodel.hardware import HardwareSpec
from blendserve.costmodel.model_spec import ModelSpec

# (batch tokens, measured ms) for one layer's GEMMs (QKV, O, gated MLP).
PAPER_GEMM_MS: tuple[tuple[int, float], ...] = ((512, 1.087), (768, 1.537), (1024, 2.005))
# (decode sequences, measured ms) for one layer's decode attention over 1024-token contexts.
PAPER_DECODE_ATTENTION_MS: tuple[tuple[int, float], ...] = ((512, 1.317), (768, 1.913), (1024, 2.515))
PAPER_CONTEXT = 1024
PAPER_MODEL, PAPER_HARDWARE = "llama-3-8b", "a100-80g"


def gemm_layer_ms(model: ModelSpec, hardware: HardwareSpec, tokens: int) -> float:
    """One layer's GEMMs for ``tokens`` tokens: 2 FLOPs per weight per token at effective F."""
    return 2.0 * tokens * model.layer_params / hardware.flops * 1e3


def decode_attention_layer_ms(model: ModelSpec, hardware: HardwareSpec, sequences: int, context: int) -> float:
    """One layer's decode attention: every sequence reads its whole context's K and V at effective B."""
    kv_bytes_per_layer = model.kv_bytes_per_token / model.num_layers
    return sequences * context * kv_bytes_per_layer / hardware.bandwidth * 1e3


def calibration_errors(model: ModelSpec, hardware: HardwareSpec) -> list[tuple[str, int, float, float, float]]:
    """(kernel, batch, measured ms, estimated ms, relative error) for the six published cases."""
    rows = [("gemm", n, ms, gemm_layer_ms(model, hardware, n)) for n, ms in PAPER_GEMM_MS]
    rows += [
        ("decode_attention", n, ms, decode_attention_layer_ms(model, hardware, n, PAPER_CONTEXT))
        for n, ms in PAPER_DECODE_ATTENTION_MS
    ]
    return [(kind, n, ms, est, est / ms - 1.0) for kind, n, ms, est in rows]
