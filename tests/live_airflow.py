"""A live Airflow for the tests, started and stopped the way the README does (``bin/airflow-local``),
in its own AIRFLOW_HOME, on free ports, and a small client for its REST API."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO

AIRFLOW_LOCAL = REPO / "bin" / "airflow-local"
# Set by conftest for dag.test(); the live Airflow gets its own from bin/airflow-local.
DROPPED_ENV = ("AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER", "AIRFLOW__CORE__UNIT_TEST_MODE",
               "BLENDSERVE_KEEP_ENGINES")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveAirflow:
    home: Path
    port: int
    work: Path  # a data root of this instance: its default DuckDB file and its inbox
    env: dict
    session: int  # standalone's session id (its pid: bin/airflow-local starts it with setsid)

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}"

    @property
    def password(self) -> str:
        return json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]

    def api(self, path: str, body: dict | None = None) -> dict:
        token = self._request("/auth/token", {"username": "admin", "password": self.password})["access_token"]
        return self._request(f"/api/v2/{path}", body, token)

    def _request(self, path: str, body: dict | None, token: str | None = None) -> dict:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        data = None if body is None else json.dumps(body).encode()
        with urllib.request.urlopen(urllib.request.Request(self.url + path, data, headers), timeout=30) as response:
            return json.loads(response.read())

    def runs(self, dag_id: str) -> list[dict]:
        return self.api(f"dags/{dag_id}/dagRuns?limit=100")["dag_runs"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 900) -> dict:
        """The run once it has finished (success or failed); fails the test on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = next((r for r in self.runs(dag_id) if r["dag_run_id"] == run_id), None)
            if run and run["state"] in ("success", "failed"):
                return run
            time.sleep(5)
        raise TimeoutError(f"{dag_id} run {run_id} did not finish in {timeout} s; log: {self.home}/standalone.log")

    def task_states(self, dag_id: str, run_id: str) -> dict[tuple[str, int], tuple[str, int]]:
        tis = self.api(f"dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances")["task_instances"]
        return {(t["task_id"], t["map_index"]): (t["state"], t["try_number"]) for t in tis}

    def xcom(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1):
        path = f"dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances/{task_id}/xcomEntries/return_value?map_index={map_index}"
        value = self.api(path)["value"]
        return json.loads(value) if isinstance(value, str) else value


def quote(run_id: str) -> str:
    return urllib.parse.quote(run_id, safe="")


def start(home: Path, work: Path) -> LiveAirflow:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    port = free_port()
    env.update(
        AIRFLOW_HOME=str(home), AIRFLOW__API__PORT=str(port),
        # standalone's log servers: free ports too, beside any other Airflow on this machine
        AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
        BLENDSERVE_DATA_ROOTS=os.pathsep.join([str(REPO / "data"), str(REPO / "out"), str(work)]),
        BLENDSERVE_DB=str(work / "live.duckdb"), BLENDSERVE_INBOX=str(work / "inbox"),
        BLENDSERVE_RETRY_DELAY_S="5",
        BLENDSERVE_INBOX_SETTLE_S="1",
    )
    (work / "inbox").mkdir(parents=True, exist_ok=True)
    subprocess.run([str(AIRFLOW_LOCAL), "start"], env=env, check=True, timeout=600)
    return LiveAirflow(home, port, work, env, int((home / "standalone.pid").read_text()))


def stop(live: LiveAirflow) -> None:
    subprocess.run([str(AIRFLOW_LOCAL), "stop"], env=live.env, check=True, timeout=120)


def processes_of(live: LiveAirflow) -> list[str]:
    """Processes of the instance: in the session `bin/airflow-local` gave standalone, or with its
    AIRFLOW_HOME in their environment (a process that renames itself, as the LocalExecutor's workers
    and vLLM's do, may overwrite its environment, never its session)."""
    marker = f"AIRFLOW_HOME={live.home}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit():
                continue
            session = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[3])
            if session == live.session or marker in (proc / "environ").read_bytes().split(b"\0"):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name} {command[:120]}")
        except (OSError, ValueError, IndexError):  # gone, or not ours to read
            continue
    return found
