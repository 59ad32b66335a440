"""Cost model: hardware and model specs as data, and BlendServe's Comp/Mem/density.

See ``../shared/DESIGN.md`` section 2 (in the steering material) and
``docs/COST_MODEL.md`` for the formulas and what they count.
"""

from blendserve.costmodel.cost import CostModel, GroupCost, balanced_token_budget, combine, kv_tokens_read
from blendserve.costmodel.hardware import HARDWARE, HardwareSpec, get_hardware
from blendserve.costmodel.model_spec import MODELS, ModelSpec, from_gguf, from_hf_config, get_model
from blendserve.costmodel.optimum import Optimum, batch_t_opt, t_opt, unique_prompt_tokens

__all__ = [
    "CostModel", "GroupCost", "balanced_token_budget", "combine", "kv_tokens_read", "HARDWARE", "HardwareSpec", "get_hardware", "MODELS", "ModelSpec",
    "from_gguf", "from_hf_config", "get_model", "Optimum", "batch_t_opt", "t_opt", "unique_prompt_tokens",
]
