"""deploy/sizing.py: the numbers of deploy/SIZING.md come from the engine's own estimate, and
the document shows what the script prints."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.learner import estimate_memory

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sizing():
    spec = importlib.util.spec_from_file_location("datamask_sizing", REPO / "deploy" / "sizing.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shards_and_partition_limits(sizing):
    assert sizing.shard_count(1e10, 1_000_000) == 10_000
    assert sizing.shard_count(10, 3) == 4
    assert sizing.partition_verdict(25_000) == "fine"
    assert "100k" in sizing.partition_verdict(25_001)
    assert sizing.partition_verdict(100_001).startswith("too many")
    assert sizing.min_rows_per_shard(2.5e10) == 1_000_000
    with pytest.raises(ValueError):
        sizing.shard_count(0, 1)


def test_memory_is_the_engines_estimate(sizing):
    n, d, g, p = 250_000, 384, 128, 0.1
    row = sizing.gpu_estimate(n, d, g, p)
    # the engine's number, computed directly (small enough to fit this machine, so the
    # engine's own fit check passes without being switched off)
    direct = estimate_memory(n, d, LearnerConfig(n_rollout=g, partial=p), device="cpu",
                             mem_budget=2 << 30)
    assert row["learn_total_bytes"] == direct["total_bytes"]
    assert row["parts"] == direct["parts"]
    assert row["batch"] == 25_000 and row["k_batch"] == 2_500


def test_sizes_beyond_this_machine_are_still_reported(sizing):
    row = sizing.gpu_estimate(4_000_000, 1024, 256, 0.1)
    assert row["parts"]["embeddings"] == 4_000_000 * 1024 * 4
    assert row["device_peak_bytes"] >= row["learn_total_bytes"]
    assert row["smallest_gpu_gib"] == 40
    assert row["host_bytes"] > 2 * row["parts"]["embeddings"]


def test_bench_rates_are_read_and_marked(sizing, tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({
        "machine": "ci", "runs": [
            {"device": "cpu", "n": 20000, "d": 384, "n_rollout": 64, "partial": 0.1,
             "steps_per_s": 12.5},
            {"device": "cuda:0", "n": 1000000, "d": 768, "result": {"steps_per_second": 4.0}},
            {"device": "cpu", "note": "no rate"},
        ]}))
    (tmp_path / "broken.json").write_text("{not json")
    rates = sizing.load_bench_rates(str(tmp_path / "*.json"))
    assert [(r["device"], r["steps_per_s"]) for r in rates] == [("cpu", 12.5), ("cuda:0", 4.0)]
    assert rates[0]["G"] == 64 and rates[1]["d"] == 768
    table = sizing.rates_table(rates, n_epochs=5000)
    assert "| cpu |" not in table  # a CPU rate is no GPU-hour
    assert f"{5000 / 4.0 / 3600:.3g}" in table and "not measured" not in table
    assert sizing.load_bench_rates(str(tmp_path / "none*.json")) == []
    # without a GPU rate the row says so instead of inventing one
    assert "not measured" in sizing.rates_table(rates[:1])


def _solver_results(path, cells):
    path.write_text(json.dumps({"cells": [
        {"term": t, "n": n, "d": 128, "partial": 0.05, "steps": 1000,
         "solvers": {s: {"time_s": sec, "reps": 3, "runs": [{"converged": conv}]}
                     for s, (sec, conv) in solvers.items()}}
        for t, n, solvers in cells]}))
    return path


def test_cpu_time_per_shard_is_measured_or_fitted(sizing, tmp_path):
    path = _solver_results(tmp_path / "s.json", [
        ("DiSF", 10_000, {"topk+polish": (1.0, True), "greedy": (10.0, None)}),
        ("DiSF", 100_000, {"topk+polish": (100.0, False), "greedy": (1000.0, None)}),
        ("Pair_simi", 1_000_000, {"topk+polish": (7.0, True)}),
    ])
    rows = sizing.solver_times(path)
    assert len(rows) == 5 and rows[0]["file"].endswith("s.json")
    est = {(e["term"], e["solver"]): e for e in sizing.cpu_per_shard(rows)}
    # t = 1 s * (n / 10^4)^2 -> 10^4 s at 10^6
    e = est[("DiSF", "topk+polish")]
    assert e["how"] == "extrapolated" and e["exponent"] == pytest.approx(2.0)
    # not converged, but no budget was set: not "stopped by its time budget"
    assert e["seconds"] == pytest.approx(1e4) and not e["polish_stopped_by_budget"]
    assert e["polish_stops"] == ["not_converged"]
    assert est[("Pair_simi", "topk+polish")]["how"] == "measured"
    assert est[("Pair_simi", "topk+polish")]["seconds"] == 7.0
    table = sizing.cpu_table(rows)
    assert "n^2.00 fit" in table and "measured at n = 1,000,000" in table
    assert "time budget: a lower bound" not in table and "no time budget" in table


def test_only_a_budget_makes_a_polish_time_a_lower_bound(sizing, tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"cells": [
        {"term": "DiSF", "n": n, "d": 128, "partial": 0.05, "steps": 1000, "solvers": {
            # a budget recorded on the solver: this cell's polish stopped by it
            "topk+polish": {"time_s": t, "polish_time_budget_s": 60.0,
                            "runs": [{"converged": False}]},
            # the run records its own stop (newer results): the partial check, no budget
            "sgreedy+polish": {"time_s": t, "runs": [{"converged": False,
                                                      "stop": "partial_check"}]},
            "paper+polish": {"time_s": t, "runs": [{"converged": True,
                                                    "stop": "local_optimum"}]},
            "greedy": {"time_s": t, "runs": [{"converged": None}]},
        }} for n, t in ((10_000, 1.0), (100_000, 10.0))]}))
    est = {e["solver"]: e for e in sizing.cpu_per_shard(sizing.solver_times(path))}
    assert est["topk+polish"]["polish_stopped_by_budget"]
    assert not est["sgreedy+polish"]["polish_stopped_by_budget"]
    assert est["sgreedy+polish"]["polish_stops"] == ["partial_check"]
    for solver in ("paper+polish", "greedy"):
        assert not est[solver]["polish_stopped_by_budget"] and not est[solver]["polish_stops"]
    rows = {line.split("|")[2].strip(): line for line in sizing.cpu_table(
        sizing.solver_times(path)).splitlines()[2:]}
    assert "stopped by its time budget: a lower bound" in rows["`topk+polish`"]
    assert "ended at DiSF's partial check" in rows["`sgreedy+polish`"]
    assert "lower bound" not in rows["`sgreedy+polish`"] + rows["`paper+polish`"]
    assert sizing.solver_times(tmp_path / "missing.json") == []
    assert "not measured" in sizing.cpu_table([])


def test_nodes_and_shards_per_node(sizing):
    gib = sizing.GIB
    assert sizing.shards_per_node(10 * gib, cores=32, memory_gib=128) == 12  # memory-bound
    assert sizing.shards_per_node(1 * gib, cores=32, memory_gib=128) == 32  # core-bound
    # 1,000 shards of 3,600 s, 10 at once per node: 360,000 node-seconds -> 5 nodes in 24 h
    assert sizing.nodes_needed(1e9, 3600.0, 10) == math.ceil(1000 * 3600 / 10 / 86400)
    with pytest.raises(ValueError):
        sizing.nodes_needed(1e9, 1.0, 0)
    assert sizing.cpu_host_bytes(1_000_000, 768) == 3 * 1_000_000 * 768 * 4 + gib


def test_io_peaks_come_from_the_throughput_results(sizing, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"dim": 768, "variants": {
        "subset_ours": {"peak_rss_mib": 300.0, "rows": 100_000, "median_s": 3.0},
        "subset_raw_pyarrow": {"peak_rss_mib": 900.0, "rows": 100_000, "median_s": 6.0}}}))
    peaks = sizing.io_peaks(path)
    assert list(peaks) == ["subset_ours"] and peaks["subset_ours"]["peak_bytes"] == 300 * 2**20
    table = sizing.io_table(path)
    assert "| 30 s |" in table and "100,000 x 768" in table
    assert "not measured" in sizing.io_table(tmp_path / "missing.json")


def test_embedding_cost_comes_from_the_embed_bench(sizing, tmp_path):
    path = tmp_path / "e.json"
    v = {"docs_per_s": 1000.0, "tokens_per_s": 2e5, "peak_rss_mib": 512.0}
    path.write_text(json.dumps({"model": {"name": "wordllama/l2_supercat"},
                                "sample": {"docs": 10_000, "tokens_per_doc": {"mean": 200.0}},
                                "variants": {"embed_shard": v, "reference": v}}))
    table = sizing.embed_table(path, corpora=(1e9,))
    # 1e9 documents / 1,000 per s / 3600 = 277.8 core-hours
    assert "| `embed_shard` | 1,000 | 200,000 | 0.50 | 278 |" in table
    assert "not measured" in sizing.embed_table(tmp_path / "missing.json")


def test_sizing_md_shows_what_the_script_prints(sizing):
    doc = (REPO / "deploy" / "SIZING.md").read_text()
    assert sizing.memory_table() in doc
    assert sizing.shards_table() in doc
    assert sizing.cpu_table() in doc
    assert sizing.io_table() in doc
    assert sizing.large_shard_table() in doc
    assert sizing.embed_table() in doc
    assert sizing.corpus_stage_table() in doc
    assert sizing.corpus_tasks_table() in doc
    assert sizing.dedup_table() in doc
    assert sizing.rates_table(sizing.load_bench_rates()) in doc


def test_large_shard_rows_come_from_the_pipeline_runs(sizing, tmp_path):
    gib = sizing.GIB
    sc = {"datamask": {"f": 0.8}, "quality_topk": {"f": 0.6}, "random": {"f": 0.5}}
    (tmp_path / "results_large_shard_a.json").write_text(json.dumps({
        "tag": "large_shard_a", "rows": 1_000_000, "dim": 768, "threads": 1, "terms": {
            "DiSF": {"rc": 0, "route": "topk+polish", "config": {"algorithm": "DiSF",
                                                                 "polish_time_budget_s": 600},
                     "steps_s": {"features": 40.0, "validate_features": 20.0, "mask": 700.0,
                                 "selected_subset": 16.0},
                     "wall_s": 800.0, "cpu_s": 820.0, "peak_rss_bytes": 10 * gib, "scores": sc,
                     "reference": {"stochastic_greedy": {"f": 0.79, "wall_s": 900.0}}},
            "Facility": {"rc": 1, "refused": "PreflightError: estimated peak memory 30 GiB",
                         "wall_s": 70.0, "cpu_s": 70.0, "peak_rss_bytes": 11 * gib}}}))
    (tmp_path / "results_large_shard_quick.json").write_text(json.dumps({
        "tag": "large_shard_quick", "rows": 400, "dim": 16, "terms": {"Pair_simi": {}}}))
    runs = sizing.large_shard_runs(str(tmp_path / "results_large_shard*.json"))
    assert [r["term"] for r in runs] == ["DiSF", "Facility"]  # the quick run is ignored
    table = sizing.large_shard_table(runs, corpora=(1e9,))
    # 12 shards per node (128 GiB / 10 GiB); 1,000 shards x 800 s / 12 / 86,400 s -> 1 node
    disf = next(line for line in table.splitlines() if line.startswith("| DiSF"))
    assert "`topk+polish` (polish_time_budget_s=600)" in disf and "| 700 s |" in disf
    assert "0.8000 / 0.6000 / 0.7900" in disf and "| 12 | 1 |" in disf
    assert "refused by the pre-flight: PreflightError: estimated peak memory 30 GiB" in table
    assert "not measured" in sizing.large_shard_table([])


def test_corpus_stage_table_scales_the_measured_run(sizing, tmp_path):
    (tmp_path / "results_corpus_scale_x.json").write_text(json.dumps({
        "cut": "sorted_by_quality", "term": "Pair_simi", "rows": 10_000_000, "shards": 10,
        "dim": 256, "per_shard_phase_s": 100.0, "peak_rss_bytes": 2 * sizing.GIB,
        "round_log": [{"seconds": 30.0, "swaps": 5}, {"seconds": 50.0, "swaps": 1},
                      {"seconds": 40.0, "swaps": 0}]}))
    table = sizing.corpus_stage_table(str(tmp_path / "results_corpus_scale*.json"),
                                      shards=25_000, coordinator_rows=4_000_000, workers=1_000)
    row = table.splitlines()[2]
    # 100 s / 10 shards; median round 40 s / 10 shards; 4e6 / (2 x 25,000) = 80 per side;
    # 25 shards per worker x 4 s
    assert row.startswith("| sorted_by_quality, Pair_simi | 10,000,000 × 256 | 10.0 | 4.0 | 3 | 6 |")
    assert "| 80 per side |" in row and "4,000,000 rows" in row and row.endswith("| 100 s |")
    assert "not measured" in sizing.corpus_stage_table(str(tmp_path / "none*.json"))


def test_corpus_tasks_table_extends_the_per_task_costs(sizing, tmp_path):
    (tmp_path / "results_corpus_ray_x.json").write_text(json.dumps({
        "cut": "random_blocks", "term": "Pair_simi", "rows": 100_000_000, "shards": 1000,
        "dim": 16, "workers": 2, "timings": {"shards_s": 50.0},
        "rounds": [{"seconds": 10.0}, {"seconds": 30.0}, {"seconds": 20.0}],
        "coordinator_peak_rss_bytes": 1.5 * sizing.GIB,
        "worker_peak_rss_bytes": [0.5 * sizing.GIB, 0.7 * sizing.GIB]}))
    (tmp_path / "results_corpus_ray_speedup_x.json").write_text(json.dumps({"reps": []}))
    table = sizing.corpus_tasks_table(str(tmp_path / "results_corpus_ray_*.json"), rows=1e10,
                                      shards=25_000, workers=1_000)
    row = table.splitlines()[2]
    # 50 s x 2 workers / 1,000 shards = 0.1 worker-s per 10^5-row shard; median round 20 s -> 0.04;
    # at 4*10^5 rows per shard (x4), 25 waves of 1,000 workers: 10 s and 4 s
    assert row == ("| random_blocks, Pair_simi | 100,000,000 × 16 (1,000) | 1.50 GiB | 0.70 GiB | "
                   "0.100 | 0.040 | 3 | 10 s | 4 s |")
    assert "16 candidates each way" in table
    assert "not measured" in sizing.corpus_tasks_table(str(tmp_path / "none*.json"))


def test_dedup_table_scales_the_measured_run(sizing, tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps({"rows": 1_000_000, "dim": 256, "kinds": {
        "exact": {"seconds": 36.0, "peak_rss_bytes": 2 * sizing.GIB},
        "near": {"seconds": 72.0, "peak_rss_bytes": 3 * sizing.GIB}}}))
    table = sizing.dedup_table(p, corpora=(1e8,))
    # 36 s per 10^6 rows -> 3,600 s per 10^8 = 1 core-hour
    assert "| exact | 36 | N (hash, then group by key) | 1.0 |" in table
    assert "| near | 72 |" in table and "| 2.0 |" in table and "3.00 GiB" in table
    assert "not measured" in sizing.dedup_table(tmp_path / "none.json")
