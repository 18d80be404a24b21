"""Smoke run of bench.orchestration: 20 shards on SQLite, one rep. It checks the JSON's shape
and what every step did (every shard requested once in each automation variant, nothing when
steady, the dry run lists every shard, a rewrite observes every shard); no timing is
asserted."""

import json
import math

from bench import orchestration

SHARD_ASSETS = ("features", "mask", "shard_report", "selected_subset")


def test_orchestration_bench_at_20_shards_on_sqlite(tmp_path):
    rc = orchestration.main(["--shards", "20", "--reps", "1", "--storages", "sqlite",
                             "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "results_orchestration.json").read_text())
    for key in ("schema_version", "command", "machine", "settings", "storages", "before",
                "browser", "total_s"):
        assert key in res, key
    assert "--shards 20" in res["command"]
    assert len(res["machine"]["loadavg_start"]) == 3 and len(res["machine"]["loadavg_end"]) == 3
    assert set(res["storages"]) == {"sqlite"}
    cell = res["storages"]["sqlite"]
    [row] = cell["rows"]
    assert row["shards"] == 20
    for part in orchestration.PARTS:
        stats = row[part]
        assert len(stats["all_s"]) == 1 and math.isfinite(stats["median_s"]), part
        assert stats["min_s"] <= stats["median_s"] <= stats["max_s"], part
    # right after the shards were registered every shard is requested once, then nothing:
    # features alone (corpus scope), the chain (per_shard), one run per shard (job)
    first = row["requested_first"]
    assert first["corpus"] == {"features": 20}
    assert {a: first["per_shard"][a] for a in SHARD_ASSETS} == {a: 20 for a in SHARD_ASSETS}
    assert first["job"] == {"job:features_job": 20}
    assert row["requested_steady"]["corpus"] == row["requested_steady"]["per_shard"] == {}
    # the preview job condition requests the same runs again: its request is the job's, so
    # eager's "since requested" never resets (no run was launched in this evaluation-only
    # bench); recorded, not hidden
    assert row["requested_steady"]["job"] == {"job:features_job": 20}
    assert len(row["rewrite_apply"]["all_s"]) == 1
    assert row["plan_to_run"] == 20
    assert cell["slopes"] == {p: [] for p in orchestration.PARTS}  # one size: no slope
    assert cell["ours_under_limit"] is (row["ours_max_median_s"] < orchestration.OUR_TICK_LIMIT_S)
    assert res["browser"] == {"skipped": orchestration.BROWSER_SKIPPED}
    md = (tmp_path / "REPORT_orchestration.md").read_text()
    assert md == orchestration.report_markdown(res)
    assert "| requested right after, corpus | {'features': 20} |" in md
    assert "## Side by side in this run" in md


def test_committed_report_is_the_committed_results():
    """bench/results/REPORT_orchestration.md is what the bench renders from the committed
    results (and the README's numbers come from the same file, tests/engine/test_docs.py)."""
    res = json.loads((orchestration.RESULTS / "results_orchestration.json").read_text())
    assert (orchestration.RESULTS / "REPORT_orchestration.md").read_text() == \
        orchestration.report_markdown(res)


def test_slopes_are_log_log_between_consecutive_sizes():
    rows = [{"shards": n, **{p: {"median_s": t} for p in orchestration.PARTS}}
            for n, t in ((100, 0.5), (1000, 5.0), (10000, 500.0))]
    got = orchestration.slopes(rows)["plan"]
    assert [(s["from"], s["to"]) for s in got] == [(100, 1000), (1000, 10000)]
    assert got[0]["slope"] == 1.0 and abs(got[1]["slope"] - 2.0) < 1e-12
