"""Every way blendserve orders requests, one file per idea; ``registry`` names them.

- ``admission``: the protocol engines drive (``next_request``, ``on_progress``, ``on_finish``),
  ``StaticOrder``, ``Delegating`` and ``planned_order`` (a controller's order as one list).
- ``baselines``: fcfs, balance, dfs, density.
- ``dual_scan``: the paper's dual scan (memory split, both cursors) and its static list.
- ``dual_scan_projected``: the dual scan on projected KV, the controller blendserve runs.
- ``blend``: the stratified blend (density strata spread over the run, prefixes kept whole).
- ``choice``: ``blendserve`` itself: candidates simulated on the estimates, the fastest kept.
- ``warmup``: samples first, fillers beside them, then the policy on the learnt lengths.
- ``plan_worker``: where that plan is made while the engine runs on (a thread; the simulator's clock).
- ``rest_planner``: what plans the rest: the estimates learnt so far and the policy's view of the requests left.
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
# 4 (2026-12-06): the warm-up's plan is made beside the engine, which admits fillers until it lands
#   (``plan_worker``); the simulator charges its modelled time. Known-length runs have no warm-up: unchanged.
# 5 (2026-12-06): the rest is planned again once half the shard has started (``warmup.REPLAN_AT``), the running
#   plan kept unless another is predicted 1% faster (``choice.pick_replan``).
# 6 (2026-12-07): a re-plan whose pick is the running plan's own candidate, re-made, keeps the running plan.
# 7 (2026-12-07): a baseline (``choice.BASELINES``) is picked only if predicted ``choice.CLEAR_GAIN`` ahead of
#   blendserve's own pick; it changes only runs that picked a baseline.
PLANNER_REVISION = 7
# The last revision that changed a hidden-length run's order, and a known-length one's (they plan once, with no
# warm-up), but for runs whose pick was a baseline: those changed at ``BASELINE_PICK_REVISION``.
HIDDEN_LENGTHS_REVISION = 6
KNOWN_LENGTHS_REVISION = 3
BASELINE_PICK_REVISION = 7
