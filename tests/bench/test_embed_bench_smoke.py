"""CI smoke run of bench/embed.py: 200 real-sentence documents, one round, every variant in its
own process; the JSON and report are written and the variants' vectors agree. No timing is
asserted."""

import json

import numpy as np
import pytest

from bench import embed as bench_embed
from tests.engine.text_corpus import ASTRONOMY, COOKING, _sentences


def test_quick_run_writes_json_and_report(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    assert bench_embed.main(["--quick", "--out", str(out), "--work", str(work)]) == 0
    res = json.loads((out / "results_embed.json").read_text())
    assert res["reps"] == 1 and res["sample"]["docs"] == 200
    assert set(res["variants"]) == set(bench_embed.VARIANTS)
    for name, runs in res["runs"].items():
        (r,) = runs
        assert r["docs"] == 200, name
        # VmHWM of the child itself: at least what it held once the model was loaded
        assert r["peak_rss_bytes"] >= r["rss_after_load_bytes"] > 50 * 2**20
    v = res["variants"]["embed_shard"]
    assert v["core_hours_per_1e9_docs"] == pytest.approx(1e9 / v["docs_per_s"] / 3600)
    assert v["tokens_per_s"] == pytest.approx(res["sample"]["tokens"] / v["median_s"])
    # every chunk computed afresh (the checkpoint folder is cleared each round)
    assert res["runs"]["embed_shard"][0]["chunks_computed"] == 1
    assert res["runs"]["embed_shard"][0]["chunks_reused"] == 0
    # the embedder's own token count matches the bench's (the model's tokenizer)
    assert res["runs"]["embed_shard"][0]["tokens_reported"] == res["sample"]["tokens"]
    a = res["agreement"]
    assert a["shard_vs_embedder_max_abs"] == 0.0
    assert a["embedder_vs_reference_max_abs_within_limit"] < 1e-5
    assert 0 < a["docs_within_limit"] < 200  # the sample has documents over the token limit
    report = (out / "REPORT_embed.md").read_text()
    assert res["command"] in report and "core-hours per 10⁹ documents" in report


def test_sample_lengths_vary_and_come_from_the_corpus():
    docs = bench_embed.make_docs(300, max_sentences=32)
    assert len(docs) == 300 and docs == bench_embed.make_docs(300, max_sentences=32)
    tokens = bench_embed.token_counts(docs)
    assert tokens.min() < 40 and tokens.max() > 512
    cooking, astronomy = _sentences(COOKING), _sentences(ASTRONOMY)
    assert all(any(d.startswith(c) for c in cooking) for d in docs[0::3])
    assert all(any(d.startswith(a) for a in astronomy) for d in docs[1::3])
