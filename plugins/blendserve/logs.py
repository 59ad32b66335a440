"""The command line's logging, set up the same in its child processes."""

from __future__ import annotations

import logging
import os

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(verbose: bool) -> None:
    """INFO lines (DEBUG with ``verbose``) on stderr, without other libraries' INFO chatter.
    vLLM's own lines go to stderr too (its default is stdout): stdout carries the result (``--json``)."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # read when vLLM is first imported
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=FORMAT)
    if not verbose:  # a filter on the handler: great-expectations sets its own loggers' levels on import
        for handler in logging.getLogger().handlers:
            handler.addFilter(_without_library_chatter)


def _without_library_chatter(record: logging.LogRecord) -> bool:
    """great-expectations' INFO lines (temporary folders, empty datasource lists) say nothing to a user."""
    return record.levelno >= logging.WARNING or not record.name.startswith("great_expectations")
