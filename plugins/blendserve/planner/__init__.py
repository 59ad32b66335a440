"""BlendServe's planner: resource-aware prefix tree, sort and split, dual scan, data-parallel shards.

Importing it registers the planner's policies (dfs, density,
blendserve-nosplit, blendserve) in ``blendserve.policies``.
"""

from blendserve.planner import policies as _policies  # noqa: F401  (registers the policies)
from blendserve.planner.dual_scan import DualScanController, memory_split
from blendserve.planner.estimates import default_output_estimates
from blendserve.planner.plan import Plan, build_plan, fan_out, read_plan, write_plan

__all__ = [
    "DualScanController",
    "Plan",
    "build_plan",
    "default_output_estimates",
    "fan_out",
    "memory_split",
    "read_plan",
    "write_plan",
]
