"""``blendserve`` command line: one subcommand per module in ``blendserve.commands``.

A failed command prints one line naming what went wrong and exits non-zero;
``-v`` adds the traceback (and debug logging).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Sequence

from blendserve.config import ConfigError
from blendserve.logs import configure_logging
from blendserve.pipeline.database import DatabaseLocked

# Each names a module in blendserve.commands that defines add_parser(subparsers),
# which sets ``func`` on its parser.
COMMANDS = ("run", "plan", "simulate", "workload", "report", "calibrate")
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130  # the shell's code for SIGINT

log = logging.getLogger("blendserve")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blendserve", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, and tracebacks of errors")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"blendserve.commands.{name}").add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"blendserve {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:  # noqa: BLE001  (every failure ends as one line; -v keeps the traceback)
        if args.verbose:
            log.exception("blendserve %s failed", args.command)
        print(f"blendserve {args.command}: error: {error_line(err, args.verbose)}", file=sys.stderr)
        return EXIT_ERROR


def entry() -> None:
    """The program (``blendserve``, ``python -m blendserve``): ``main``, then an exit that skips the
    interpreter's teardown. Every result is committed and every engine stopped by then; tearing down
    torch, vLLM and great-expectations would only add about 3 s to each run on 2 cores."""
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def error_line(err: BaseException, verbose: bool) -> str:
    """One line for ``err``: the message alone for errors in what the user gave (settings, paths,
    files, a busy database, the disk); the exception's type too for anything else."""
    message = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, (ConfigError, DatabaseLocked, OSError)):
        return message
    return f"{type(err).__name__}: {message}" + ("" if verbose else " (-v shows the traceback)")
