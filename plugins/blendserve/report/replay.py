"""The cost model's time for what actually ran: each shard's order, with the true output lengths.

A plan's prediction mixes two errors: the estimated output lengths and the
cost model's clock. The replay removes the first: it simulates each shard's
admission order (DuckDB ``plan.position``, filled after load) with the
lengths the engine really produced (``outputs.num_output_tokens``), with the
run's engine settings (KV capacity, max_num_seqs, token budget) on the
profile the run was costed on. Only a calibrated profile of the engine that
ran is on the run's clock, so only then are its seconds compared with the
measured ones (``replay_seconds``, ``replay_measured_seconds``, ``replay_error``).
"""

from __future__ import annotations

import numpy as np

from blendserve.config import RunConfig
from blendserve.costmodel.profiles import resolved_profile
from blendserve.pipeline import database, parts
from blendserve.batch import RequestBatch
from blendserve.pipeline.plan import Inputs, load_inputs
from blendserve.report.explain import sim_config_for, stored_plan
from blendserve.scheduling.admission import StaticOrder
from blendserve.sim import simulate


def replay_applies(config: RunConfig) -> bool:
    """A real engine costed on a calibrated profile of that engine: the replay's seconds are the run's clock."""
    if config.engine == "simulator":
        return False
    try:
        profile = resolved_profile(config)
    except KeyError:
        return False
    return profile is not None and profile.key.get("engine") == config.engine


def replay_seconds(config: RunConfig) -> list[float]:
    """Simulated seconds of each shard's admitted order with its true output lengths."""
    inputs = load_inputs(config)
    sim = sim_config_for(config, inputs.kv_capacity)
    return [simulate(batch, outputs, inputs.cost, StaticOrder(np.arange(len(batch))), sim).total_time
            for batch, outputs in replayed_shards(config, inputs)]


def replayed_shards(config: RunConfig, inputs: Inputs | None = None) -> list[tuple[RequestBatch, np.ndarray]]:
    """Each shard's requests the engine ran, in the order it admitted them, and their true output lengths."""
    inputs = inputs or load_inputs(config)
    batch = inputs.batch
    _, positions = stored_plan(config, batch)
    with database.connect(config.db, read_only=True) as con:
        # only the requests the engine ran: a duplicate holds its twin's position and a copy of its answer
        lengths = dict(con.execute("SELECT o.request_id, o.num_output_tokens FROM outputs o JOIN plan p"
                                   " ON o.run_id = p.run_id AND o.request_id = p.request_id"
                                   " WHERE o.run_id = ? AND o.status = 'ok' AND p.answered_by = p.request_id",
                                   [config.run_id]).fetchall())
    by_shard: dict[int, list[tuple[int, int]]] = {}
    for b, request_id in enumerate(batch.request_ids.tolist()):
        if request_id in positions and request_id in lengths:  # ran, and answered
            shard, position = positions[request_id]
            by_shard.setdefault(shard, []).append((position, b))
    shards = []
    for _, rows in sorted(by_shard.items()):
        order = np.array([b for _, b in sorted(rows)], dtype=np.int64)
        outputs = np.array([max(int(lengths[r] or 0), 1) for r in batch.request_ids[order].tolist()])
        shards.append((batch.take(order), outputs))
    return shards


def measured_shard_seconds(config: RunConfig) -> float:
    """The shards' engine seconds added up (each shard's stats.json): one engine doing every shard's work."""
    return float(sum(s["wall_seconds"] for s in parts.shard_stats(config.parts_dir)))


def replay_metrics(config: RunConfig) -> dict[str, float]:
    """``replay_*`` metrics when the run was costed on its own engine's calibrated profile, else none."""
    if not replay_applies(config):
        return {}
    replay, measured = float(sum(replay_seconds(config))), measured_shard_seconds(config)
    return {"replay_seconds": replay, "replay_measured_seconds": measured,
            "replay_error": replay / measured - 1.0 if measured else 0.0}
