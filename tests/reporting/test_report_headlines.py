"""Reports say what they measure (issue 26, point 8): the corpus page's headline gives the rows
selected as a share of the input rows it was taken of; the trade-off figure's title says what
each route did (no "400 steps" for routes that took none); a shard report whose route learns
nothing leaves the optimisation curve out and says why in one line. Each test reads the
rendered HTML or the PNG's text metadata."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image

from datamask_pipeline.engine import sample
from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.corpus import CorpusBudget, CorpusShard, select_corpus
from datamask_pipeline.engine.data import table_to_shard
from datamask_pipeline.engine.evaluate import evaluate_selection, make_ground_set
from datamask_pipeline.engine.baselines import quality_topk, random_selection
from datamask_pipeline.reporting import build_shard_report, plot_frontier, sweep_lambda
from datamask_pipeline.reporting.corpus_selection_report import render_page


def _sub(html: str) -> str:
    """The page's headline paragraph, as text."""
    m = re.search(r'<p class="sub">(.*?)</p>', html, re.S)
    assert m, "no headline"
    return re.sub(r"\s+", " ", m.group(1))


def _shard(n, seed):
    t = sample.make_table(n, dim=16, seed=seed, id_offset=seed * n)
    return table_to_shard(t, f"memory://s{seed}")


def test_corpus_headline_is_a_share_of_the_input_rows():
    """3,000 input rows, 2,621 left after dedup, budget 0.1: the page said "300 of 2621 rows ·
    budget 0.1", which reads as 11%; it now says 10% of the 3,000 input rows."""
    parts = [_shard(1000, i) for i in range(3)]
    rng = np.random.default_rng(0)
    keep = []
    for drop in (100, 150, 129):  # 379 rows dropped as duplicates
        m = np.ones(1000, dtype=bool)
        m[rng.choice(1000, drop, replace=False)] = False
        keep.append(m)
    shards = [CorpusShard(key=f"shard_{i:03d}", n=1000, load=lambda p=p: p, keep=k)
              for i, (p, k) in enumerate(zip(parts, keep))]
    cfg = LearnerConfig.profile("pipeline", algorithm="Pair_simi")
    budget = CorpusBudget("fraction", 0.1)
    result = select_corpus(shards, cfg, budget, mode="gather")
    summary = {**result.summary(), "sizes": {s.key: s.n for s in shards}, "excluded": {}}
    assert (summary["n_input"], summary["n"], summary["k"]) == (3000, 2621, 300)
    text = _sub(render_page(summary, budget.label))
    assert text.startswith("300 rows selected = 10% of 3,000 input rows (2,621 after dedup) · "
                           "budget 10% of the input rows · Pair_simi")
    assert "300 of 2621" not in text and "budget 0.1" not in text


@pytest.mark.parametrize("summary, want", [
    # no dedup: no bracket
    ({"selected_rows": 50, "k": 50, "n": 1000, "n_input": 1000,
      "budget": {"kind": "fraction", "value": 0.05}},
     "50 rows selected = 5% of 1,000 input rows · budget 5% of the input rows"),
    # a fraction taken of the rows after dedup says so
    ({"selected_rows": 80, "k": 80, "n": 800, "n_input": 1000,
      "budget": {"kind": "fraction", "value": 0.1}},
     "80 rows selected = 8% of 1,000 input rows (800 after dedup) · budget 10% of the rows "
     "after dedup"),
    # a row budget keeps its label; an old summary without n_input reads n
    ({"selected_rows": 7, "k": 7, "n": 2000, "budget": {"kind": "rows", "value": 7}},
     "7 rows selected = 0.35% of 2,000 input rows · budget 7 rows"),
])
def test_headline_wording(summary, want):
    from datamask_pipeline.reporting.corpus_selection_report import headline

    assert headline(summary, "7 rows") == want


def _title(png: bytes) -> str:
    img = Image.open(io.BytesIO(png))
    img.load()
    return img.text["Title"]


@pytest.fixture(scope="module")
def shard():
    t = sample.make_table(300, dim=16, seed=3)
    x = np.asarray(t["feature_arr"].combine_chunks().values).reshape(300, 16).copy()
    return x, t["quality_score"].to_numpy().copy(), t["chunk_id"].to_numpy().copy()


def test_tradeoff_title_says_what_each_route_did(shard):
    """The pipeline profile's routes take no learning steps at these sizes: the title said
    "400 steps, G=64" (the configured n_epochs) for them."""
    x, q, ids = shard
    sweep = sweep_lambda(x, q, "Pair_simi", "0.5, 1", ids=ids, greedy_lambs="none")
    assert {p["steps"] for p in sweep["points"]} == {0}
    assert sweep["config"]["n_epochs"] == 400
    title = _title(plot_frontier(sweep))
    routes = {p["lamb"]: p["route"] for p in sweep["points"]}
    assert title == (f"λ trade-off, Pair_simi  (n=300, d=16, k=30; λ=0.5: {routes[0.5]}, no "
                     f"learning steps; λ=1: {routes[1.0]}, no learning steps)")
    assert "400 steps" not in title and "G=" not in title


def test_tradeoff_title_of_the_learner_names_its_steps(shard):
    x, q, ids = shard
    cfg = LearnerConfig(algorithm="Pair_simi", select_ratio=0.1, n_epochs=20, n_rollout=8,
                        partial=0.3, solver="paper")
    sweep = sweep_lambda(x, q, "Pair_simi", "0.5", cfg, ids=ids, greedy_lambs="none")
    (pt,) = sweep["points"]
    assert pt["steps"] > 0
    assert _title(plot_frontier(sweep, title="T")) == (
        f"T  (n=300, d=16, k=30; {pt['route']}, {pt['steps']} steps, G=8, partial=0.3)")


def test_a_route_without_learning_has_no_curve_panels(shard):
    """The default route (quality top-k + polish) has no learner history: no curve figure (it
    drew three empty panels) and one line that says why."""
    from datamask_pipeline.engine.select import select_shard

    x, q, ids = shard

    class _S:
        embeddings, quality = x, q

    _S.ids = ids
    res = select_shard(_S, LearnerConfig.profile("pipeline", algorithm="Pair_simi"),
                       device="cpu", references=False)
    assert res.steps == 0 and not res.history
    ground = make_ground_set(x, q)
    k = int(res.indices.size)

    def ev(sel):
        return evaluate_selection(None, None, sel, lamb=0.5, terms=("Pair_simi",), ground=ground)

    rep = build_shard_report(x, q, res.indices, res.history, ids=ids, lamb=0.5,
                             algorithm="Pair_simi", title="t", route=res.route,
                             reference={"random": ev(random_selection(300, k, seed=1)),
                                        "quality_topk": ev(quality_topk(q, k, ids))})
    assert "curve" not in rep.figures
    assert "Optimisation curve</h2>" not in rep.html and 'alt="curve"' not in rep.html
    line = re.search(r'<p class="note" id="no-curve">(.*?)</p>', rep.html).group(1)
    assert line.startswith(f"Optimisation curve: none — {res.route} took no learning steps")
    assert "\n" not in line
