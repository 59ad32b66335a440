"""Export each finished run as OpenAI batch output and error files.

Scheduled on the ``blendserve_outputs`` Asset, which ``blendserve_batch`` updates
in its last task, after every DuckDB write of the run: this DAG then writes
``<run_id>-output.jsonl``, ``<run_id>-errors.jsonl`` (engine errors and ingest
rejects) and ``<run_id>-manifest.json`` (the Airflow run id, model, counts) into
``exports/`` beside the DuckDB file. It only reads DuckDB; should the next batch
run hold the file just then, the task retries.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag, task

from blendserve.assets import OUTPUTS


@dag(dag_id="blendserve_export", schedule=[OUTPUTS], catchup=False, is_paused_upon_creation=False,
     tags=["blendserve", "export"], doc_md=__doc__,
     default_args={"retries": 5, "retry_delay": timedelta(seconds=10)})
def blendserve_export():
    @task
    def export(triggering_asset_events=None) -> list[dict]:
        from dataclasses import asdict
        from pathlib import Path

        from blendserve.export import export_openai

        reports = []
        for event in triggering_asset_events[OUTPUTS]:
            db, run_id = event.extra["db"], event.extra["run_id"]
            reports.append(asdict(export_openai(db, run_id, Path(db).parent / "exports")))
        return reports

    export()


blendserve_export()
