"""Offline batch LLM inference, scheduled the BlendServe way.

Thin on purpose: every task calls a function of ``blendserve.pipeline``
(in ``plugins/``), which also runs without Airflow. Heavy libraries are
imported inside the tasks, so this file parses in milliseconds.
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import Param, dag, task

from blendserve import ENGINES
from blendserve.airflow_tasks import fail_fast
from blendserve.assets import OUTPUTS
from blendserve.costmodel.profiles import CHOICES as HARDWARE_CHOICES
from blendserve.scheduling.registry import PUBLIC_POLICIES

DOC_MD = """
### blendserve_batch

Runs one dataset through an LLM and lands one output row per accepted request
in DuckDB (`outputs` table, keyed by `run_id` and your `custom_id`).

`ingest` (files -> normalized Parquet, bad rows -> `rejects` with a reason)
-> `validate_input` (great-expectations on the accepted requests)
-> `plan` (prefix tree, split, dual scan with the chosen policy, cut into shards of whole subtrees)
-> `infer` (one mapped task per shard, queue and pool `gpu`: runs its warm-up sample first to learn output
   lengths, with spare room filled meanwhile, then re-plans the rest on them; the sample's answers are final;
   resumes from its committed part files when retried)
-> `load_outputs` (shard part files into DuckDB)
-> `validate_outputs` (exactly one output per accepted request)
-> `report` (every policy's predicted time on the learnt lengths, then Markdown + PNG plots beside the DuckDB
   file: throughput against the prediction, prefix hits, estimates against actual lengths, shard balance,
   utilization, rejects and errors, validation) -> `summary` (updates the `blendserve_outputs` Asset once
   every DuckDB write of the run is over).

Tasks write DuckDB one after another (shards write Parquet only, one run at a time). A bad path, parameter
or missing input fails its task at once, with the reason; engine faults and killed workers are retried.

Input and output paths must lie inside the data roots (`BLENDSERVE_DATA_ROOTS`,
default the project's `data/` and `out/`); anything else fails the first task.
On a cluster, `runs_dir` (an `s3://` or `gs://` URL inside a data root) lets
workers on other hosts share the run folders; `storage_conn_id` names the
Airflow connection holding the bucket's credentials. The DuckDB file stays local.
The `blendserve_export` DAG runs on every update of the Asset and writes the
OpenAI-style output and error files beside the DuckDB file.

| parameter | meaning |
|---|---|
| `input` | input file or glob: JSONL (also OpenAI batch format), CSV or Parquet |
| `db` | DuckDB file the outputs land in (a local file: one writer) |
| `runs_dir` | where run folders go (requests, plan, shard part files): a path or `s3://`, `gs://` URL; empty: `runs/` beside the DuckDB file |
| `storage_conn_id` | Airflow connection for URL inputs and `runs_dir` (empty: the workers' own credentials) |
| `engine` | `vllm` (real model), `transformers`, `simulator` |
| `policy` | `blendserve` (default), or a baseline to A/B: `fcfs` is file order, `balance` random |
| `hardware` | profile the plan is costed on: `auto` (default: this machine's profile from `blendserve calibrate` for these engine settings, else `a100-80g` with a warning), or a catalog GPU (`a100-80g`, `h100-sxm`, `h200`, `l40s`) |
| `sample_rate` | share of each shard's requests run first to learn output lengths (0 turns warm-up off) |
| `keep_sharing` | split budget: the plan keeps at least this share of the DFS order's prefix sharing |
| `shards` | data-parallel shards: one `infer` task each |
| `max_tokens` | default `max_tokens` for requests that give none |
| `max_model_len` | context length; longer prompts are rejected at ingest |
| `kv_cache_gb` | KV cache size for vLLM on CPU |
"""

INFER_POOL = os.environ.get("BLENDSERVE_INFER_POOL", "gpu")  # slots = GPUs (or CPU engines) available
INFER_QUEUE = os.environ.get("BLENDSERVE_INFER_QUEUE", "gpu")  # Celery queue the GPU workers listen on
DEFAULT_INPUT = os.environ.get("BLENDSERVE_DEFAULT_INPUT", "data/sample/requests-small.jsonl")  # a quick first run
DEFAULT_DB = os.environ.get("BLENDSERVE_DB", "out/blendserve.duckdb")
DEFAULT_RUNS_DIR = os.environ.get("BLENDSERVE_RUNS_DIR", "")  # e.g. s3://bucket/blendserve/runs on a cluster
DEFAULT_STORAGE_CONN = os.environ.get("BLENDSERVE_STORAGE_CONN_ID", "")
DEFAULT_MAX_TOKENS = int(os.environ.get("BLENDSERVE_MAX_TOKENS", "256"))

# The optional ones take null: a "string" with default "" would be a required field in the trigger form.
PARAMS = {
    "input": Param(DEFAULT_INPUT, type="string", minLength=1, description="Input file or glob."),
    "db": Param(DEFAULT_DB, type="string", minLength=1, description="DuckDB file for the outputs."),
    "runs_dir": Param(DEFAULT_RUNS_DIR or None, type=["null", "string"],
                      description="Folder or s3://, gs:// URL for run folders (empty: beside the DuckDB file)."),
    "storage_conn_id": Param(DEFAULT_STORAGE_CONN or None, type=["null", "string"],
                             description="Airflow connection for URL inputs and runs_dir (empty: none)."),
    "engine": Param("vllm", enum=list(ENGINES), description="Inference engine."),
    "policy": Param(PUBLIC_POLICIES[0], enum=list(PUBLIC_POLICIES),
                    description="Scheduling policy: blendserve, or a baseline to A/B against."),
    "hardware": Param(HARDWARE_CHOICES[0], enum=list(HARDWARE_CHOICES),
                      description="Hardware profile the plan is costed on: auto = this machine's calibrated"
                                  " profile (blendserve calibrate), else a100-80g; or a catalog GPU."),
    "sample_rate": Param(0.01, type="number", minimum=0, maximum=1,
                         description="Share of each shard run first to learn output lengths (0 = none)."),
    "keep_sharing": Param(0.99, type="number", minimum=0, maximum=1,
                          description="Split budget: keep at least this share of DFS prefix sharing."),
    "shards": Param(1, type="integer", minimum=1, maximum=64, description="Data-parallel shards."),
    "max_tokens": Param(DEFAULT_MAX_TOKENS, type="integer", minimum=1, maximum=32768, description="Default max_tokens."),
    "max_model_len": Param(2048, type="integer", minimum=16, maximum=131072, description="Context length."),
    "kv_cache_gb": Param(1.0, type="number", exclusiveMinimum=0, description="KV cache (GB) on CPU."),
}
# Tests also pass "fail_after_rows" in the run conf (each shard's first try fails after that many rows)
# and "part_rows", bench/bench_peer.py "max_num_seqs" and ENGINE_CONF; they are no Params, so the form
# does not offer them.
ENGINE_CONF = ("dtype", "max_num_batched_tokens")  # run conf keys passed to vLLM (RunConfig.extra["vllm"])


def run_config(params: dict, run_id: str, try_number: int = 1):
    """The library's RunConfig for this DAG run (one run folder per Airflow run, named by its safe id).
    Paths outside the data roots raise ConfigError here, in the first task, with the reason."""
    from blendserve.config import RunConfig, safe_run_id
    from blendserve.data_roots import resolve_in_roots

    safe_id = safe_run_id(run_id)
    runs_dir = (params["runs_dir"] or "").rstrip("/")
    fail_after_rows = params.get("fail_after_rows", -1)
    return RunConfig(
        run_id=safe_id, airflow_run_id=run_id,
        input=resolve_in_roots(params["input"], "input"), db=resolve_in_roots(params["db"], "db"),
        work_dir=resolve_in_roots(f"{runs_dir}/{safe_id}", "runs_dir") if runs_dir else "",
        storage_conn_id=params["storage_conn_id"] or "", engine=params["engine"],
        policy=params["policy"], hardware=params["hardware"], sample_rate=params["sample_rate"],
        keep_sharing=params["keep_sharing"], shards=params["shards"], default_max_tokens=params["max_tokens"],
        max_model_len=params["max_model_len"], kv_cache_gb=params["kv_cache_gb"],
        fail_after_rows=fail_after_rows if try_number == 1 else -1,  # injected faults hit the first try only
        # tests pass "part_rows" in the run conf too (small part files: a shard killed mid-way has committed some)
        **({"part_rows": params["part_rows"]} if "part_rows" in params else {}),
        # bench/bench_peer.py passes the engine settings it matches across systems (as `blendserve run` flags)
        **({"max_num_seqs": params["max_num_seqs"]} if "max_num_seqs" in params else {}),
        **({"extra": {"vllm": vllm}} if (vllm := {k: params[k] for k in ENGINE_CONF if k in params}) else {}),
    )


def mark_run_failed(context: dict) -> None:
    """A task that failed for good (retries spent, or fail_fast) marks the run failed in DuckDB:
    a run is never left ``running`` there. A config that cannot be built never started a run."""
    from blendserve.config import ConfigError
    from blendserve.pipeline.steps import mark_failed

    try:
        config = run_config(context["params"], context["run_id"])
    except ConfigError:
        return
    mark_failed(config)


# The tasks, in run order; each calls one step of blendserve.pipeline.
@task
def ingest(params=None, run_id=None) -> dict:
    from blendserve.pipeline.steps import ingest_step

    with fail_fast():
        return ingest_step(run_config(params, run_id))


@task
def validate_input(ingested: dict, params=None, run_id=None) -> dict:
    from blendserve.pipeline.steps import validate_input_step

    with fail_fast():
        return validate_input_step(run_config(params, run_id))


@task
def plan(validated: dict, params=None, run_id=None) -> list[int]:
    from blendserve.pipeline.steps import plan_step

    with fail_fast():
        return plan_step(run_config(params, run_id))


@task(map_index_template="{{ shard_label }}", pool=INFER_POOL, queue=INFER_QUEUE)
def infer(shard: int, params=None, run_id=None, ti=None) -> dict:
    from airflow.sdk import get_current_context

    from blendserve.pipeline.steps import infer_shard

    get_current_context()["shard_label"] = f"shard {shard}"  # names the mapped task in the UI
    with fail_fast():
        return infer_shard(run_config(params, run_id, ti.try_number), shard)


@task
def load_outputs(shard_reports: list[dict], params=None, run_id=None) -> dict:
    from blendserve.pipeline.steps import load_step

    with fail_fast():
        return load_step(run_config(params, run_id))


@task
def validate_outputs(loaded: dict, params=None, run_id=None) -> dict:
    from blendserve.pipeline.steps import validate_outputs_step

    with fail_fast():
        return validate_outputs_step(run_config(params, run_id))


@task
def report(validated: dict, params=None, run_id=None) -> str:
    from blendserve.pipeline.steps import explain_step, report_step

    with fail_fast():
        config = run_config(params, run_id)
        explain_step(config)  # every policy's predicted time, in this task's log; the report compares against it
        return report_step(config)  # the path is in the task log


# The Asset event comes from the last task: every DuckDB write of the run (load_outputs, validate_outputs,
# report's predictions) is over, so blendserve_export never meets this run's writer.
@task(outlets=[OUTPUTS])
def summary(report_path: str, params=None, run_id=None, outlet_events=None) -> dict:
    from blendserve.pipeline.steps import summary as run_summary

    with fail_fast():
        config = run_config(params, run_id)
        result = {**run_summary(config), "report": report_path}
    outlet_events[OUTPUTS].extra = {"db": config.db, "run_id": config.run_id}  # for the export DAG
    print(result)  # lands in the task log
    return result


@dag(
    dag_id="blendserve_batch",
    schedule=None,  # runs come from the UI, the REST API and the blendserve_inbox DAG
    catchup=False,
    is_paused_upon_creation=False,  # a fresh Airflow runs the README's trigger without a click on "unpause"
    max_active_runs=1,
    params=PARAMS,
    doc_md=DOC_MD,
    tags=["blendserve", "llm", "batch"],
    default_args={"retries": 2, "retry_delay": timedelta(seconds=int(os.environ.get("BLENDSERVE_RETRY_DELAY_S", "30"))),
                  "on_failure_callback": mark_run_failed},
)
def blendserve_batch():
    shards = plan(validate_input(ingest()))
    summary(report(validate_outputs(load_outputs(infer.expand(shard=shards)))))


blendserve_batch()
