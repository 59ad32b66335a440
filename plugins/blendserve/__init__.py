"""blendserve: offline batch LLM inference scheduled the BlendServe way.

The library behind the Airflow DAGs in ``dags/``. Everything here imports and
runs without Airflow; heavy dependencies (vllm, torch, great_expectations) are
imported inside the functions that need them.
"""

__version__ = "0.1.0"
