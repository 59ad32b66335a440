"""What the DAG files share. Imports nothing heavy (DAG files parse it); Airflow only inside."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def fail_fast() -> Iterator[None]:
    """What no retry can fix (ConfigError: a bad path, parameter or model; a missing input file) fails
    the task at once with the reason; anything else (engine faults, killed workers) keeps its retries."""
    from airflow.sdk.exceptions import AirflowFailException

    from blendserve.config import ConfigError  # here, not at the top: config reads pyarrow, the DAG files parse this

    try:
        yield
    except (ConfigError, FileNotFoundError) as error:
        raise AirflowFailException(f"{type(error).__name__}: {error}") from error
