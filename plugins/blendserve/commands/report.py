"""``blendserve report RUN_ID``: rebuild a run's report (Markdown and PNG figures) from DuckDB."""

from __future__ import annotations

import argparse

from blendserve.config import check_run_id, default_db
from blendserve.report.build import build_report


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="rebuild a run's report (Markdown + PNG plots) from DuckDB")
    p.add_argument("run_id", metavar="RUN_ID", help="the run to report on")
    p.add_argument("--db", default=None, help="DuckDB file of the run (default: $BLENDSERVE_DB or out/blendserve.duckdb)")
    p.add_argument("--out", default=None, help="folder for report.md and its PNGs (default: <db folder>/reports/RUN_ID)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_run_id(args.run_id)  # it names the report's folder
    path = build_report(args.db or default_db(), args.run_id, args.out)
    print(path)
    return 0
