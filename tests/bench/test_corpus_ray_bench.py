"""bench.corpus_ray: the corpus stage on Ray tasks runs for real at a tiny size, and the
measured table in docs/measured.md is the one the committed results render to."""

import json
from pathlib import Path

import pytest

from bench import corpus_ray

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("ray", reason="the ray extra is part of the test extra")


def test_the_scale_bench_runs_and_records_what_it_measured(tmp_path):
    r = corpus_ray.run_scale(4000, 4, 8, 1, str(tmp_path / "w"), cut="sorted_by_quality")
    assert r["rows"] == 4000 and r["k"] == 400 and r["engine"] == "Ray (1 CPU)"
    assert r["rounds"] and r["converged"]
    # the exchange never ends below its start (the shards' own selections)
    assert r["scores"]["selection"]["f"] >= r["rounds"][0]["f_before"] - 1e-12
    assert r["coordinator_peak_rss_bytes"] > 0 and r["worker_peak_rss_bytes"]
    table = corpus_ray.table_markdown([r], [])
    assert "| sorted_by_quality | 4,000 × 8 (4) | 1 |" in table
    json.dumps(r, default=float)  # what main() writes


def test_measured_page_shows_the_committed_runs():
    scale, speed = corpus_ray.load_results(str(REPO / corpus_ray.RESULTS_GLOB))
    assert scale, "no results_corpus_ray_*.json under bench/results"
    assert any(r["rows"] >= 10 ** 8 and r["shards"] >= 1000 for r in scale)
    page = (REPO / "docs" / "measured.md").read_text()
    assert corpus_ray.table_markdown(scale, speed) in page
