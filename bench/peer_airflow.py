"""A live Airflow for bench_peer.py's ``airflow`` system: started with bin/airflow-local in its own
AIRFLOW_HOME on free ports (as tests/live_airflow.py does), and DAG ``blendserve_batch`` run over the REST API."""

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

from common import REPO

AIRFLOW_LOCAL = REPO / "bin" / "airflow-local"
DAG = "blendserve_batch"
# Settings a test run or another Airflow of this shell may have set; the instance gets its own.
DROPPED_ENV = ("AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER", "AIRFLOW__CORE__UNIT_TEST_MODE",
               "BLENDSERVE_KEEP_ENGINES", "AIRFLOW_HOME")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveAirflow:
    home: Path  # AIRFLOW_HOME of this instance; its data root too (batch files and DuckDB files live beside it)
    port: int  # the api-server's port
    env: dict  # the environment it was started with (bin/airflow-local stop needs the same)

    @classmethod
    def start(cls, home: Path) -> "LiveAirflow":
        home.mkdir(parents=True, exist_ok=True)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        env.update(AIRFLOW_HOME=str(home), AIRFLOW__API__PORT=str(port),
                   AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
                   AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
                   BLENDSERVE_DATA_ROOTS=os.pathsep.join([str(REPO / "data"), str(home.parent)]),
                   BLENDSERVE_DB=str(home / "live.duckdb"), BLENDSERVE_INBOX=str(home / "inbox"))
        (home / "inbox").mkdir(exist_ok=True)
        started = time.monotonic()
        subprocess.run([str(AIRFLOW_LOCAL), "start"], env=env, check=True, timeout=600, stdout=subprocess.DEVNULL)
        live = cls(home, port, env)
        # the export DAG follows each run on its Asset event, the inbox DAG polls every minute: paused, neither
        # takes the cores (nor the DuckDB file) from the timed runs
        for dag in ("blendserve_export", "blendserve_inbox"):
            live.api(f"dags/{dag}", {"is_paused": True}, method="PATCH")
        print(f"airflow: up in {time.monotonic() - started:.0f} s on port {port} (home {home})", flush=True)
        return live

    def stop(self) -> None:
        subprocess.run([str(AIRFLOW_LOCAL), "stop"], env=self.env, check=False, timeout=180, stdout=subprocess.DEVNULL)

    def api(self, path: str, body: dict | None = None, method: str | None = None) -> dict:
        password = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        token = self._request("/auth/token", {"username": "admin", "password": password})["access_token"]
        return self._request(f"/api/v2/{path}", body, token, method)

    def _request(self, path: str, body: dict | None, token: str | None = None, method: str | None = None) -> dict:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://localhost:{self.port}{path}", data, headers, method=method)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def run_batch(self, batch: Path, db: Path, settings: dict, timeout: float = 6 * 3600) -> tuple[float, dict]:
        """Trigger the DAG on ``batch`` into ``db``; seconds from the trigger to the run's success, and the
        summary task's value. A failed run raises."""
        started = time.monotonic()
        run = self.api(f"dags/{DAG}/dagRuns", {"logical_date": None,
                                              "conf": {"input": str(batch), "db": str(db), **settings}})
        run_id = urllib.parse.quote(run["dag_run_id"], safe="")
        while time.monotonic() - started < timeout:
            state = self.api(f"dags/{DAG}/dagRuns/{run_id}")["state"]
            if state in ("success", "failed"):
                break
            time.sleep(1)
        wall = time.monotonic() - started
        if state != "success":
            raise RuntimeError(f"{DAG} run {run['dag_run_id']} ended {state}; log: {self.home}/standalone.log")
        value = self.api(f"dags/{DAG}/dagRuns/{run_id}/taskInstances/summary/xcomEntries/return_value")["value"]
        return wall, json.loads(value) if isinstance(value, str) else value
