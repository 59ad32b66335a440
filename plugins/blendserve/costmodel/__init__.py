"""Cost model: hardware and model specs as data, and BlendServe's Comp/Mem/density.

See ``../shared/DESIGN.md`` section 2 (in the steering material) for the formulas.
"""

from blendserve.costmodel.cost import CostModel
from blendserve.costmodel.hardware import HardwareSpec, get_hardware
from blendserve.costmodel.model_spec import ModelSpec, get_model

__all__ = ["CostModel", "HardwareSpec", "ModelSpec", "get_hardware", "get_model"]
