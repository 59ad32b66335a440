"""The prediction a run is measured against: stored at plan time, or simulated now from the run's requests."""

from __future__ import annotations

from dataclasses import dataclass, field

from blendserve.config import RunConfig
from blendserve.report.data import RunData
from blendserve.report.explain import explain_run, prediction_metrics


@dataclass
class Prediction:
    source: str  # where the numbers come from, in words (for the report)
    hardware: str  # the hardware profile they are costed on (auto resolved: a calibrated profile's name, or the GPU)
    comparable: bool  # True when the run's seconds are on the same clock (simulator engine, calibrated profile)
    seconds: dict[str, float] = field(default_factory=dict)  # policy -> predicted wall seconds
    tokens_per_second: dict[str, float] = field(default_factory=dict)  # policy -> predicted tokens/s
    prefix_hit_rate: dict[str, float] = field(default_factory=dict)  # policy -> predicted prefix-cache hit rate


def prediction_for(data: RunData) -> tuple[Prediction | None, str]:
    """The prediction and, when there is none, why."""
    stored = _stored(data)
    if stored.tokens_per_second:
        return stored, ""
    try:
        return _simulated(data), ""
    except (FileNotFoundError, KeyError, ValueError, ImportError) as exc:
        return None, f"no prediction was stored at plan time and none could be simulated now ({exc})"


def _hardware(data: RunData) -> str:
    if data.run["engine"] == "simulator":
        return str(data.config.get("extra", {}).get("simulator", {}).get("hardware", data.config.get("hardware")))
    return str(data.config.get("hardware"))


def _comparable(data: RunData) -> bool:
    """The simulator engine runs on the cost model's clock; a real engine only on a calibrated profile of
    itself (then the report step stored the replay of what ran: ``replay_seconds``)."""
    return data.run["engine"] == "simulator" or "replay_seconds" in data.metrics


def _stored(data: RunData) -> Prediction:
    source = "stored at plan time (metrics predicted_*)"
    sample = data.metrics.get("predicted_simulated_requests")
    if sample and sample < data.totals["requests"]:
        source += f"; policies simulated on a uniform sample of {sample:,.0f} requests, times scaled by T_opt"
    prediction = Prediction(source, _hardware(data), _comparable(data))
    for name, value in data.metrics.items():
        for prefix, target in (("predicted_seconds_", prediction.seconds),
                               ("predicted_tokens_per_second_", prediction.tokens_per_second),
                               ("predicted_prefix_hit_rate_", prediction.prefix_hit_rate)):
            if name.startswith(prefix):
                target[name[len(prefix):]] = value
    return prediction


def _simulated(data: RunData) -> Prediction:
    """Every policy through the simulator on the run's requests Parquet (token ids are not in DuckDB)."""

    config = RunConfig.from_dict(data.config)
    config.db = str(data.db)  # the file this report reads (the run folder beside it, unless work_dir says)
    if not config.requests_path.exists():
        raise FileNotFoundError(f"{config.requests_path} is gone")
    explanation = explain_run(config)
    data.metrics.update({k: v for k, v in prediction_metrics(explanation, config.policy).items()
                         if k not in data.metrics})
    prediction = _stored(data)
    prediction.source = f"simulated while building this report from {config.requests_path.name}"
    return prediction
