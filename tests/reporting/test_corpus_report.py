"""Corpus report from real per-shard report metrics."""

from __future__ import annotations

import base64
import json
import math
import os

import numpy as np
import pytest

from datamask_pipeline.engine import storage
from datamask_pipeline.reporting import (
    build_corpus_report,
    build_shard_report,
    corpus_rows_from_metrics,
    write_corpus_report,
)

from .conftest import ShardRun
from .test_shard_report import _Attrs, _png_image


@pytest.fixture(scope="module")
def shards():
    """Three real shards of different sizes, each with a real learner run and shard report."""
    out = {}
    for i, n in enumerate((240, 300, 360)):
        run = ShardRun(n=n, dim=16, seed=i)
        rep = build_shard_report(run.x, run.q, run.result.selected, run.result.history,
                                 ids=run.ids, sources=run.sources, lamb=run.lamb,
                                 algorithm=run.algorithm, reference=run.reference,
                                 title=f"shard {i}")
        out[f"shard_{i:03d}"] = (run, rep.metrics)
    return out


@pytest.fixture(scope="module")
def corpus(shards):
    return build_corpus_report({k: m for k, (_, m) in shards.items()}, algorithm="Pair_simi")


def test_totals_add_up_against_the_raw_shards(corpus, shards):
    runs = [run for run, _ in shards.values()]
    t = corpus.totals
    assert t["n_shards"] == 3 and t["n_shards_counted"] == 3
    assert t["rows_total"] == sum(len(r.q) for r in runs)
    assert t["rows_kept"] == sum(r.k for r in runs)
    assert t["kept_fraction"] == pytest.approx(t["rows_kept"] / t["rows_total"])
    # weighted means equal the means over the concatenated rows / the union of the subsets
    all_q = np.concatenate([r.q for r in runs])
    kept_q = np.concatenate([r.q[r.result.selected] for r in runs])
    topk_q = np.concatenate([r.q[r.topk_idx] for r in runs])
    assert t["quality_mean_before"] == pytest.approx(all_q.mean())
    assert t["quality_mean_after"] == pytest.approx(kept_q.mean())
    assert t["quality_mean_topk"] == pytest.approx(topk_q.mean())
    gains = [r.reference["datamask"]["f"]["Pair_simi"] - r.reference["quality_topk"]["f"]["Pair_simi"]
             for r in runs]
    assert t["gain_f_over_topk_mean"] == pytest.approx(np.mean(gains), rel=1e-5)
    assert t["gain_f_over_topk_min"] == pytest.approx(min(gains), rel=1e-5)
    assert t["gain_f_over_topk_max"] == pytest.approx(max(gains), rel=1e-5)
    assert t["shards_beating_topk"] == sum(g > 0 for g in gains)
    assert t["lamb"] == 0.5
    assert corpus.metrics == t
    assert all(type(v) is float and math.isfinite(v) for v in t.values())


def test_rows_follow_the_shard_metrics(corpus, shards):
    assert [r["shard"] for r in corpus.rows] == sorted(shards)
    for row in corpus.rows:
        run, m = shards[row["shard"]]
        assert row["n_rows"] == len(run.q) and row["k_selected"] == run.k
        assert isinstance(row["n_rows"], int)
        assert row["quality_mean_before"] == m["quality_mean_shard"]
        assert row["quality_mean_after"] == m["quality_mean_selected"]
        assert row["f_datamask"] == m["f_datamask"] and row["f_greedy"] == m["f_greedy"]
        assert row["gain_f_over_topk"] == m["gain_f_over_topk"]


def test_page_is_self_contained_and_lists_every_shard(corpus, shards):
    p = _Attrs()
    p.feed(corpus.html)
    assert "script" not in p.tags and "link" not in p.tags and "a" not in p.tags
    refs = [(t, k, v) for t, k, v in p.attrs if k in ("src", "href", "srcset")]
    assert [(t, k) for t, k, _ in refs] == [("img", "src")]
    assert refs[0][2] == "data:image/png;base64," + base64.b64encode(corpus.figures["overview"]).decode()
    _png_image(corpus.figures["overview"])
    assert "http://" not in corpus.html and "url(" not in corpus.html
    for key in shards:
        assert f"<td>{key}</td>" in corpus.html
        assert f"| {key} |" in corpus.markdown
    assert "| shards where the selection beats quality top-k |" in corpus.markdown


def test_links_are_the_only_hyperlinks_and_are_escaped(shards):
    metrics = {k: m for k, (_, m) in shards.items()}
    links = {"shard_000": "shard_000/report.html", "shard_001": 'a"b<c>.html'}
    rep = build_corpus_report(metrics, links=links)
    p = _Attrs()
    p.feed(rep.html)
    hrefs = [v for t, k, v in p.attrs if k == "href"]
    assert hrefs == ["shard_000/report.html", 'a"b<c>.html']  # parsed back unescaped
    assert 'a"b<c>' not in rep.html  # escaped by the template engine (its entity spelling is its own)


def test_partial_and_mixed_metrics(shards):
    (run0, m0), (_, m1) = shards["shard_000"], shards["shard_001"]
    m1 = dict(m1, lamb=0.2, gain_f_over_topk=-0.01)  # top-k better on this one
    partial = {"n_rows": 100.0, "k_selected": 10.0}  # a shard whose report lacks the rest
    broken = {"n_rows": float("nan"), "f_datamask": "oops"}
    rep = build_corpus_report({"a": m0, "b": m1, "c": partial, "d": broken})
    rows = {r["shard"]: r for r in rep.rows}
    assert rows["c"]["kept_fraction"] == pytest.approx(0.1)  # derived from its parts
    assert rows["c"]["f_datamask"] is None and rows["d"]["n_rows"] is None
    t = rep.totals
    assert t["n_shards"] == 4 and t["n_shards_counted"] == 3
    assert t["rows_total"] == m0["n_rows"] + m1["n_rows"] + 100
    # quality means only over the shards that have them, weighted by their rows
    w = m0["n_rows"] * m0["quality_mean_shard"] + m1["n_rows"] * m1["quality_mean_shard"]
    assert t["quality_mean_before"] == pytest.approx(w / (m0["n_rows"] + m1["n_rows"]))
    assert t["shards_with_gain"] == 2
    assert t["shards_beating_topk"] == float(m0["gain_f_over_topk"] > 0)
    assert t["gain_f_over_topk_min"] == -0.01
    assert "lamb" not in t and t["lamb_values"] == 2
    assert "different λ" in rep.html and "different λ" in rep.markdown
    assert all(math.isfinite(v) for v in t.values())
    assert "| c | 100 | 10 | 10.0% | – |" in rep.markdown
    _png_image(rep.figures["overview"])


def test_empty_corpus():
    rep = build_corpus_report({})
    assert rep.rows == [] and rep.totals["n_shards"] == 0 and rep.totals["rows_total"] == 0
    assert "kept_fraction" not in rep.totals
    _png_image(rep.figures["overview"])


def test_corpus_rows_from_metrics_accepts_loaded_json(shards, tmp_path):
    _, m = shards["shard_002"]
    loaded = json.loads(json.dumps(m))
    assert corpus_rows_from_metrics({"x": loaded}) == corpus_rows_from_metrics({"x": m})


def test_write_is_atomic_with_the_page_last(corpus, tmp_path, monkeypatch):
    calls = []
    real = storage.atomic_write_bytes
    monkeypatch.setattr(storage, "atomic_write_bytes",
                        lambda uri, data: (calls.append(os.path.basename(str(uri))), real(uri, data))[1])
    paths = write_corpus_report(corpus, str(tmp_path / "corpus"))
    assert sorted(os.listdir(tmp_path / "corpus")) == sorted(calls)
    assert calls[-1] == "corpus_report.html"
    assert set(paths) == {"html", "metrics", "markdown", "overview"}

    def strict(c):
        raise ValueError(c)

    blob = json.loads(open(paths["metrics"]).read(), parse_constant=strict)
    assert blob["totals"] == pytest.approx(corpus.totals)
    assert [r["shard"] for r in blob["shards"]] == [r["shard"] for r in corpus.rows]
    assert open(paths["overview"], "rb").read() == corpus.figures["overview"]
