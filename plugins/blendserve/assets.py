"""Airflow Assets shared by the DAGs (imported by DAG files only: it needs Airflow)."""

from airflow.sdk import Asset

# Updated by blendserve_batch.load_outputs with extra {"db", "run_id"}; schedules blendserve_export.
OUTPUTS = Asset(name="blendserve_outputs", uri="file:///blendserve/outputs")
