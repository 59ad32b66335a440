"""bench_policies --out: the mixes of a long table measured by separate runs, each with the run that measured it."""

from __future__ import annotations

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _run(commit: str, command: str) -> dict:
    return {"commit": commit, "command": command, "date": "today", "cpu": "c", "cores": 2, "python": "3",
            "numpy": "2", "uncommitted": []}


def test_a_mix_run_alone_joins_the_stored_ones_of_the_same_settings(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_policies
    import common
    import page_parts

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    settings = {"setup": "8B", "requests": 400_000, "lengths": "hidden", "estimates": "warm-up",
                "policies": ["fcfs", "blendserve"]}
    earlier = _run("old", "bench_policies.py --mixes d0.9-s5 d1.4-s35 --out")
    (tmp_path / "policies-8b-400k.json").write_text(json.dumps({
        "provenance": earlier, **settings,
        "mixes": [{"mix": "d1.4-s35", "t_opt_s": 1.0}, {"mix": "d0.9-s5", "t_opt_s": 2.0}]}))
    now = _run("new", "bench_policies.py --mixes d1.4-s5 d1.4-s35 --out")
    data = {**settings, "mixes": [{"mix": "d1.4-s35", "t_opt_s": 3.0, "provenance": now},
                                  {"mix": "d1.4-s5", "t_opt_s": 4.0, "provenance": now}]}

    merged = bench_policies.with_earlier("policies-8b-400k", data)
    # the paper's order; d1.4-s35 measured now replaces the stored one, d0.9-s5 is kept with its run
    assert [(m["mix"], m["t_opt_s"]) for m in merged["mixes"]] == [("d1.4-s35", 3.0), ("d1.4-s5", 4.0),
                                                                  ("d0.9-s5", 2.0)]
    assert merged["mixes"][2]["provenance"] == earlier
    runs = page_parts.measured_by({**merged, "provenance": now}, {m["mix"]: m for m in merged["mixes"]}, "Mixes")
    assert "d0.9-s5: blendserve old" in runs and "d1.4-s5: blendserve new" in runs
    assert page_parts.measured_by({**data, "provenance": now}, {m["mix"]: m for m in data["mixes"]}, "Mixes") == ""

    for other in ({"requests": 40_000}, {"lengths": "known"}, {"policies": ["fcfs"]}):  # nothing is kept
        assert [m["mix"] for m in bench_policies.with_earlier("policies-8b-400k", {**data, **other})["mixes"]] \
            == ["d1.4-s35", "d1.4-s5"]
        assert f"measured with other {next(iter(other))}: its parts" in capsys.readouterr().err
