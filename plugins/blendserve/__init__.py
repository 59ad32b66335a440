"""blendserve: offline batch LLM inference scheduled the BlendServe way.

The library behind the Airflow DAGs in ``dags/``. Everything here imports and
runs without Airflow; heavy dependencies (vllm, torch, great_expectations) are
imported inside the functions that need them.
"""

__version__ = "0.1.0"

# The inference engines a run may use (``blendserve.engines``): what --engine and the DAG's `engine` Param offer.
# Here, beside nothing heavy, so the DAG file reads it in no time.
ENGINES = ("vllm", "transformers", "simulator")
