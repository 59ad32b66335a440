"""Shared test setup: the real small model, one vLLM engine per session, Airflow's test home.

Airflow reads its settings when first imported, so its environment is set here,
before any test module imports it.
"""

from __future__ import annotations

import json
import os
import tempfile
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
SHARED_DATA = REPO.parent / "shared" / "data"

os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".cache" / "airflow-test"))
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO / "dags"))
os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(REPO / "plugins"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
# One vLLM engine per test session: starting one costs ~30 s on 2 cores.
os.environ["BLENDSERVE_KEEP_ENGINES"] = "1"
os.environ.setdefault("BLENDSERVE_RETRY_DELAY_S", "1")
# Calibrated profiles of the developer's machine stay out of tests: `--hardware auto` finds none (the A100
# fallback) unless a test calibrates into its own folder.
os.environ["BLENDSERVE_PROFILES"] = tempfile.mkdtemp(prefix="blendserve-profiles-")


def jsonl(*records: dict | str) -> bytes:
    """A JSONL file's bytes: each dict as one JSON line, each str as it is (a line written by hand, malformed or not)."""
    return "".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records).encode()


@pytest.fixture(scope="session", autouse=True)
def _close_engines():
    yield
    from blendserve.engines import close_all

    close_all()  # before interpreter exit, where vLLM's teardown can hang


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from blendserve.model_prep import ensure_model_dir

    return ensure_model_dir()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from blendserve.ingest.tokenize import PromptTokenizer

    return PromptTokenizer(model_dir)


@pytest.fixture
def make_config(tmp_path, model_dir):
    """A RunConfig for the mini fixture dataset in a fresh folder; override any field."""
    from blendserve.config import RunConfig

    def make(**overrides) -> RunConfig:
        values = dict(run_id="test-run", input=str(FIXTURES / "mini.jsonl"), db=str(tmp_path / "out.duckdb"),
                      engine="vllm", max_model_len=2048, max_num_seqs=32, kv_cache_gb=0.5, part_rows=4)
        values.update(overrides)
        return RunConfig(**values)

    return make


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """A migrated Airflow metadata database (SQLite) under .cache/airflow-test."""
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared workload data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def bucket() -> str:
    """A fresh folder in fsspec's process-wide memory filesystem (an object store), removed afterwards."""
    from fsspec.implementations.memory import MemoryFileSystem

    name = f"memory://bucket-{uuid.uuid4().hex}"
    yield name
    fs = MemoryFileSystem()
    if fs.exists(name):
        fs.rm(name, recursive=True)


@pytest.fixture
def airflow_memory_fs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make Airflow serve memory:// as a provider would serve s3://, so the
    ObjectStoragePath branch runs for real without cloud credentials."""
    import airflow.sdk.io.fs as airflow_fs
    from fsspec.implementations.memory import MemoryFileSystem

    monkeypatch.setattr(airflow_fs, "_register_filesystems", lambda: {"memory": lambda conn_id, options: MemoryFileSystem()})


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child ``python -m blendserve``: this checkout's plugins first on its path
    (a fresh clone has no editable install), and engines that stop with their run."""
    env = {k: v for k, v in os.environ.items() if k != "BLENDSERVE_KEEP_ENGINES"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "plugins"), os.environ.get("PYTHONPATH")]))
    return {**env, **extra}


def run_cli(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """``python -m blendserve ARGS`` in a child process, output captured as text."""
    return subprocess.run([sys.executable, "-m", "blendserve", *args], capture_output=True, text=True,
                          timeout=timeout, env=subprocess_env(**env), cwd=REPO)


def record_admissions(controller, check: Callable[[list[int]], None] | None = None,  # type: ignore[no-untyped-def]
                      ) -> list[int]:
    """The request indices ``controller`` admits from now on, in order (filled as it runs); ``check`` sees the
    list after every call to ``next_request``."""
    admitted: list[int] = []
    inner_next = controller.next_request

    def record(state):  # type: ignore[no-untyped-def]
        picked = inner_next(state)
        if picked is not None:
            admitted.append(picked)
        if check is not None:
            check(admitted)
        return picked

    controller.next_request = record
    return admitted


def pytest_configure(config) -> None:
    # registered here, not in pyproject.toml: a change there re-runs `make setup` (its stamp depends on it)
    config.addinivalue_line("markers", "cluster: starts a Celery cluster (bin/airflow-cluster) and kills a worker; "
                                       "runs only with --cluster (make cluster-test)")


def pytest_addoption(parser) -> None:
    parser.addoption("--cluster", action="store_true",
                     help="also run the Celery cluster test (tests/test_cluster.py; `make cluster-test`)")


def pytest_collection_modifyitems(config, items) -> None:
    """The cluster test runs only when asked for (`make cluster-test`): minutes of wall time, PostgreSQL,
    Redis and two workers; `make test` and `make test-fast` leave it out."""
    if config.getoption("--cluster"):
        return
    left_out = [item for item in items if item.get_closest_marker("cluster")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("cluster")]
