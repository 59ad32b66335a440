"""Calibrated hardware profiles: a ``HardwareSpec`` fitted on this machine, stored as JSON, and ``--hardware auto``.

``blendserve calibrate`` runs a short grid through the real engine and fits
the simulator's own step formula to it (``costmodel.fit``); the result is a
``Profile`` keyed by everything that changes step costs (engine, model
files, dtype, engine limits, threads, host). A run with ``hardware="auto"``
is costed on the profile of its own key when one exists, else on the
A100-80G with a warning naming the command to run. ``resolve_hardware`` is
the one place that decides.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from blendserve.costmodel.hardware import HARDWARE, HardwareSpec, get_hardware
from blendserve.model_prep import REPO_ROOT

log = logging.getLogger(__name__)

AUTO = "auto"  # RunConfig.hardware: this config's calibrated profile, else FALLBACK
FALLBACK = "a100-80g"  # what an uncalibrated machine is costed on (nominal: the order depends on density ratios)
PREFIX = "calibrated-"  # names of calibrated profiles: PREFIX + engine + key digest
CHOICES = (AUTO, *HARDWARE)  # what the DAG form and the CLI offer (a calibrated profile's name works too)
# what a profile's fit assumes of the engine; a profile fitted under an older one is not reused.
# 2: KV bytes at the run's dtype, attention FLOPs counted, and the engine's KV block size kept in the profile
FIT_VERSION = 2
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")  # files whose size and mtime stand for the weights


@dataclass
class Profile:
    name: str  # PREFIX + engine + key digest: what runs record as their hardware
    key: dict  # what the step costs depend on (profile_key): a different key needs a new calibration
    hardware: dict  # the fitted HardwareSpec's fields
    fit_error: float  # median |predicted / measured - 1| of the grid's batch seconds, end to end
    batches: list[dict] = field(default_factory=list)  # the grid: n, p, d, measured_s, predicted_s per batch
    fitted_at: str = ""  # UTC ISO time of the calibration
    took_s: float = 0.0  # seconds the calibration took, engine start included

    @property
    def spec(self) -> HardwareSpec:
        known = {f.name for f in fields(HardwareSpec)}
        return HardwareSpec(**{k: v for k, v in self.hardware.items() if k in known})

    def describe(self) -> str:
        return f"{self.name} (fitted {self.fitted_at}, step error {self.fit_error:.1%})"


def profiles_dir() -> Path:
    """$BLENDSERVE_PROFILES, else ``.cache/hardware/`` in the repository (git-ignored)."""
    return Path(os.environ.get("BLENDSERVE_PROFILES", REPO_ROOT / ".cache" / "hardware"))


def host() -> str:
    """The machine a profile was measured on: the GPU's name when the driver lists one, else the CPU model."""
    gpus = sorted(Path("/proc/driver/nvidia/gpus").glob("*/information"))
    for info in gpus[:1]:
        for line in info.read_text().splitlines():
            if line.startswith("Model:"):
                return f"gpu {line.split(':', 1)[1].strip()} x{len(gpus)}"
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                      if ln.startswith("model name")), "")
    return f"cpu {model or 'unknown'} x{os.cpu_count()}"


def model_fingerprint(folder: Path) -> dict:
    """The model folder, its config's digest and its weights' sizes and mtimes: a new model is a new key."""
    config = folder / "config.json"
    weights = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES) if folder.is_dir() else []
    return {
        "folder": str(folder.resolve()),
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest()[:16] if config.exists() else None,
        "weights": [[p.name, p.stat().st_size, int(p.stat().st_mtime)] for p in weights],
    }


def profile_key(config) -> dict:  # type: ignore[no-untyped-def]  # a RunConfig (imported lazily: config imports us)
    """Everything that changes an engine step's cost for ``config``."""
    options = {k: v for k, v in config.extra.get(config.engine, {}).items() if k != "dtype"}
    return {
        "engine": config.engine,
        "model": model_fingerprint(config.model_path()),
        "dtype": config.engine_dtype,
        "engine_options": sorted((k, repr(v)) for k, v in options.items()),
        "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "kv_cache_gb": config.kv_cache_gb,
        "enforce_eager": config.enforce_eager,
        "cpu_threads": config.cpu_threads or os.cpu_count(),
        "host": host(),
        "fit_version": FIT_VERSION,
    }


def profile_name(key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    return f"{PREFIX}{key['engine']}-{digest}"


def save_profile(profile: Profile) -> Path:
    from blendserve import files  # here, not at the top: files imports pyarrow, and the DAG file parses CHOICES

    folder = profiles_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{profile.name}.json"  # whole or not at all: a run reading it never sees half a profile
    files.atomic_write_bytes(json.dumps(asdict(profile), indent=2, sort_keys=True).encode(), path)
    return path


def load_named(name: str) -> Profile | None:
    path = profiles_dir() / f"{name}.json"
    if not path.exists():
        return None
    known = {f.name for f in fields(Profile)}
    return Profile(**{k: v for k, v in json.loads(path.read_text()).items() if k in known})


def load_profile(config) -> Profile | None:  # type: ignore[no-untyped-def]
    """The calibrated profile of ``config``'s key, or None when this setup was never calibrated."""
    return load_named(profile_name(profile_key(config)))


def calibrate_command(config) -> str:  # type: ignore[no-untyped-def]
    """The command that calibrates ``config``'s engine settings (for the warning)."""
    model = f" --model {config.model}" if config.model else ""
    vllm = config.extra.get("vllm", {}) if config.engine == "vllm" else {}
    options = "".join(f" --{k.replace('_', '-')} {vllm[k]}" for k in ("dtype", "max_num_batched_tokens") if k in vllm)
    return (f"blendserve calibrate --engine {config.engine}{model} --max-model-len {config.max_model_len}"
            f" --max-num-seqs {config.max_num_seqs} --kv-cache-gb {config.kv_cache_gb}{options}")


def resolved_profile(config) -> Profile | None:  # type: ignore[no-untyped-def]
    """The calibrated profile ``config.hardware`` stands for (``auto``: its key's), None for a catalog GPU
    or an uncalibrated ``auto``; KeyError for a calibrated name whose file is gone."""
    name = config.hardware
    if name == AUTO:
        return load_profile(config)
    if not name.startswith(PREFIX):
        return None
    profile = load_named(name)
    if profile is None:
        raise KeyError(f"calibrated profile {name!r} is not in {profiles_dir()}; run `{calibrate_command(config)}`")
    return profile


def resolve_hardware(config) -> tuple[HardwareSpec, Profile | None]:  # type: ignore[no-untyped-def]
    """The hardware a real-engine run is costed on, and its calibrated profile when it is one: the one place
    that decides. ``auto``: this config's calibrated profile, else FALLBACK with a warning; a calibrated
    profile's name: that profile; a catalog name: the catalog's."""
    profile = resolved_profile(config)
    if profile is not None:
        log.info("costed on calibrated profile %s", profile.describe())
        return profile.spec, profile
    if config.hardware == AUTO:
        log.warning("no calibrated profile for these engine settings on this machine: costing on %s"
                    " (an A100's seconds, not this machine's); run `%s` to calibrate",
                    FALLBACK, calibrate_command(config))
        return get_hardware(FALLBACK), None
    return get_hardware(config.hardware), None
