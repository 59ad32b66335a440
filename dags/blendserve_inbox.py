"""Scheduled runs of new data: every input file dropped in the inbox runs once through blendserve_batch.

A short schedule (default every minute) scans the inbox folder (``BLENDSERVE_INBOX``,
default ``data/inbox``, inside the data roots). Each new file is claimed by its
SHA-256 (``blendserve.inbox``: moved into the ledger ``.blendserve/claims/<sha256>/``)
and one ``blendserve_batch`` run is triggered for it, with run id
``inbox__<first 24 hex digits of the hash>``. A file with the same content dropped
again is moved to ``.blendserve/duplicates/`` and not run. The batch run takes the
DAG's default parameters, with ``input`` set to the claimed file.

``BLENDSERVE_INBOX_SCHEDULE`` sets the schedule: a cron expression or preset
(``@daily``, ``0 2 * * *``); the mechanism stays the same.

Why a schedule and not an AssetWatcher: Airflow 3.3's file triggers fire on a path
appearing (and delete it), know nothing of content, and need a triggerer running;
exactly-once by content hash needs the ledger anyway, and a one-minute scan costs a
second of CPU.
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import dag, task

from blendserve.airflow_tasks import fail_fast

INBOX = os.environ.get("BLENDSERVE_INBOX", "data/inbox")
SCHEDULE = os.environ.get("BLENDSERVE_INBOX_SCHEDULE", "* * * * *")
SETTLE_SECONDS = float(os.environ.get("BLENDSERVE_INBOX_SETTLE_S", "5"))  # a file still being copied waits


def inbox_folder():
    from pathlib import Path

    from blendserve.data_roots import resolve_in_roots

    return Path(resolve_in_roots(INBOX, "inbox"))


@dag(dag_id="blendserve_inbox", schedule=SCHEDULE, catchup=False, max_active_runs=1, is_paused_upon_creation=False,
     tags=["blendserve", "inbox"], doc_md=__doc__,
     # a scan is safe to repeat; the first one may start before the api-server answers
     default_args={"retries": 2, "retry_delay": timedelta(seconds=10)})
def blendserve_inbox():
    @task
    def claim_new_files() -> list[dict]:
        """Every claimed file whose batch run is not yet created, as the trigger's arguments."""
        from blendserve.inbox import claim_new_files as claim

        with fail_fast():  # an inbox outside the data roots: no retry fixes it
            claims = claim(inbox_folder(), SETTLE_SECONDS)
        for c in claims:
            print(f"claimed {c.name} (sha256 {c.sha256}): batch run {c.run_id}")
        return [{"trigger_run_id": c.run_id, "conf": {"input": c.input}} for c in claims]

    @task(trigger_rule="none_failed")
    def mark_triggered(claims: list[dict]) -> None:
        from blendserve.inbox import mark_triggered as mark

        mark(inbox_folder(), {claim["trigger_run_id"] for claim in claims})

    claims = claim_new_files()
    # skip_when_already_exists: a claim offered again after a cut-off scan does not run twice
    trigger = TriggerDagRunOperator.partial(task_id="trigger_batch", trigger_dag_id="blendserve_batch",
                                            skip_when_already_exists=True).expand_kwargs(claims)
    trigger >> mark_triggered(claims)


blendserve_inbox()
