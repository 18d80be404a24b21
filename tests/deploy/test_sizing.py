"""deploy/sizing.py: the numbers of deploy/SIZING.md come from the engine's own estimate, and
the document shows what the script prints."""

from __future__ import annotations

import importlib.util
import json
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
    assert "CPU: not a GPU rate" in table
    assert f"{5000 / 4.0 / 3600:.3g}" in table
    assert "TO FILL" in table  # the GPU placeholder stays until a GPU rate is measured
    assert sizing.load_bench_rates(str(tmp_path / "none*.json")) == []


def test_sizing_md_shows_what_the_script_prints(sizing):
    doc = (REPO / "deploy" / "SIZING.md").read_text()
    assert sizing.memory_table() in doc
    assert sizing.shards_table() in doc
