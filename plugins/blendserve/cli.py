"""``blendserve`` command line: one subcommand per module in ``blendserve.commands``."""

from __future__ import annotations

import argparse
import importlib
import logging
from typing import Sequence

# Each names a module in blendserve.commands that defines add_parser(subparsers),
# which sets ``func`` on its parser. Heavy imports stay inside each func.
COMMANDS = ("run", "plan", "simulate", "workload", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blendserve", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"blendserve.commands.{name}").add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args) or 0)
