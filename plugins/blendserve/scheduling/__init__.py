"""Every way blendserve orders requests, one file per idea; ``registry`` names them.

- ``admission``: the protocol engines drive (``next_request``, ``on_progress``, ``on_finish``),
  ``StaticOrder``, ``Delegating`` and ``planned_order`` (a controller's order as one list).
- ``baselines``: fcfs, balance, dfs, density.
- ``dual_scan``: the paper's dual scan (memory split, both cursors) and its static list.
- ``dual_scan_projected``: the dual scan on projected KV, the controller blendserve runs.
- ``blend``: the stratified blend (density strata spread over the run, prefixes kept whole).
- ``choice``: ``blendserve`` itself: candidates simulated on the estimates, the fastest kept.
- ``warmup``: samples first, fillers beside them, then the policy on the learnt lengths.
- ``registry``: name -> policy, read by the DAG form, the CLI, the config and the benches.

The tree side (prefix tree, sort and split, groups, shards, scan items) is ``blendserve.planner``.
"""

# The planner's revision, stored with every benchmark result (bench/common.py) so that a table planned by an
# earlier revision says so until it is rerun. Bumped by a change that alters what blendserve orders:
# 1 (2026-12-03): a hot prefix on under 20% of the leaves is cut in pieces (``blend.HOT_PIECE``).
# 2 (2026-12-05): a request whose own stratum has too few samples is estimated from its group's
#   (``sampling.estimator``: a family of long answers spread over several prompt lengths).
# 3 (2026-12-05): the warm-up also samples every group that could hold a quarter of a stratum's share
#   (``sampling.select._group_picks``: a family too thin in each prompt length to be covered there).
PLANNER_REVISION = 3
