"""A run's steps and what they hand each other: run folders, part files, DuckDB.

- ``steps``: the steps as plain functions (the CLI runs them in a row, the DAG one task each).
- ``plan``: the run's requests as the planner sees them, the plan, the plan file.
- ``shard``: one shard's work: what is left to serve and the order it is admitted in.
- ``parts``: a shard's results as atomically committed Parquet part files (what a retry resumes from).
- ``database``: DuckDB, where results land, one writer at a time.
"""
