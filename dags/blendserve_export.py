"""Export each finished run as OpenAI batch output and error files.

Scheduled on the ``blendserve_outputs`` Asset: every time ``blendserve_batch``
loads a run into DuckDB, this DAG writes ``<run_id>-output.jsonl`` and
``<run_id>-errors.jsonl`` into ``exports/`` beside the DuckDB file.
"""

from __future__ import annotations

from airflow.sdk import dag, task

from blendserve.assets import OUTPUTS


@dag(dag_id="blendserve_export", schedule=[OUTPUTS], catchup=False, tags=["blendserve", "export"], doc_md=__doc__)
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
