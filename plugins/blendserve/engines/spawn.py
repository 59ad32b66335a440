"""Start engine processes safely from inside Airflow tasks.

vLLM on CPU starts its engine-core process with the ``spawn`` method, and a
spawned child re-imports the parent's ``__main__`` module. Inside an Airflow
task that is the task runner, which in a child process refuses to start (its
database settings are blanked for workers) and takes the engine down with it.
The child needs nothing from ``__main__``: it gets its target by qualified
name. So the parent's ``__main__`` is hidden while engine processes start.
"""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def hidden_main_module() -> Iterator[None]:
    real_main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__, no __spec__: nothing to re-import
    try:
        yield
    finally:
        sys.modules["__main__"] = real_main
