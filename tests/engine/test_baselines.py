"""Baselines (random, quality top-k, greedy) and whole-shard evaluation."""

import numpy as np
import pytest
import torch

from datamask_pipeline.engine.baselines import greedy, quality_topk, random_selection
from datamask_pipeline.engine.evaluate import evaluate_selection
from datamask_pipeline.engine.objectives import Batch, score

from .test_objectives import BRUTE

TERMS = ("DiSF", "Facility", "Pair_simi")


def _data(n, d, seed):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(3, d))
    x = centers[rng.integers(0, 3, n)] + 0.6 * rng.normal(size=(n, d))
    q = rng.random(n)
    return x, q


def naive_greedy(x, q, k, term, lamb):
    """Recompute f(U + j) from scratch for every candidate j (|U| < 2: f_div = 0 for the
    pair terms, facility location is defined for any |U|)."""
    batch = Batch(torch.as_tensor(x), torch.as_tensor(q))
    chosen = []
    for t in range(k):
        best, best_j = -np.inf, None
        for j in range(len(q)):
            if j in chosen:
                continue
            U = chosen + [j]
            if term != "Facility" and len(U) < 2:
                fdiv = 0.0
            else:
                fdiv = score(batch, torch.as_tensor([U]), term, 0.0)[2].item()
            f = lamb * np.mean(q[U]) + (1 - lamb) * fdiv
            if f > best:
                best, best_j = f, j
        chosen.append(best_j)
    return chosen


@pytest.mark.parametrize("term", TERMS)
@pytest.mark.parametrize("lamb", [0.2, 0.5, 0.8])
def test_greedy_equals_naive_greedy(term, lamb):
    x, q = _data(40, 5, seed=hash((term, lamb)) % 1000)
    k = 9
    fast = greedy(x, q, k, term, lamb)
    assert list(fast) == naive_greedy(x, q, k, term, lamb)


def test_facility_greedy_without_dense_matrix_matches_dense():
    x, q = _data(300, 8, seed=5)
    dense = greedy(x, q, 30, "Facility", 0.5)
    blocks = greedy(x, q, 30, "Facility", 0.5, mem_budget=300 * 8 * 8)  # too small for n x n
    assert list(dense) == list(blocks)


def test_disf_greedy_chunked_rows_matches_unchunked():
    x, q = _data(200, 6, seed=2)
    a = greedy(x, q, 20, "DiSF", 0.5)
    b = greedy(x, q, 20, "DiSF", 0.5, mem_budget=6 * 6 * 8 * 7)  # a few rows per chunk
    assert list(a) == list(b)


@pytest.mark.parametrize("term", TERMS)
def test_greedy_beats_random_and_topk_on_the_joint_objective(term):
    x, q = _data(500, 8, seed=7)
    k = 50
    ev = lambda sel: evaluate_selection(x, q, sel, lamb=0.5, terms=(term,))["f"][term]
    g = ev(greedy(x, q, k, term, 0.5))
    assert g > ev(random_selection(500, k, seed=0))
    assert g > ev(quality_topk(q, k))


def test_random_selection_is_k_distinct_and_seeded():
    a = random_selection(100, 10, seed=3)
    assert len(set(a.tolist())) == 10 and a.min() >= 0 and a.max() < 100
    assert list(a) == list(random_selection(100, 10, seed=3))
    assert list(a) != list(random_selection(100, 10, seed=4))
    with pytest.raises(ValueError, match="need 0 < k <= n"):
        random_selection(5, 6)


def test_quality_topk_breaks_ties_by_id():
    q = np.array([0.5, 0.9, 0.9, 0.1, 0.9])
    assert list(quality_topk(q, 2)) == [1, 2]
    assert list(quality_topk(q, 2, ids=np.array([50, 40, 30, 20, 10]))) == [2, 4]


@pytest.mark.parametrize("as_mask", [False, True])
def test_evaluate_selection_matches_brute_force_on_the_whole_shard(as_mask):
    x, q = _data(30, 4, seed=11)
    sel = np.array([1, 4, 7, 20, 29])
    arg = np.isin(np.arange(30), sel) if as_mask else sel[::-1]
    ev = evaluate_selection(x, q, arg, lamb=0.3)
    assert ev["k"] == 5 and ev["n"] == 30
    assert ev["f_qua"] == pytest.approx(q[sel].mean())
    for term in TERMS:
        ref = BRUTE[term](x, sel)
        assert ev["f_div"][term] == pytest.approx(ref, rel=1e-9, abs=1e-12)
        assert ev["f"][term] == pytest.approx(0.3 * q[sel].mean() + 0.7 * ref, rel=1e-9)


def test_evaluate_selection_rejects_bad_selections():
    x, q = _data(10, 3, seed=0)
    with pytest.raises(ValueError, match="duplicates"):
        evaluate_selection(x, q, [1, 1, 2])
    with pytest.raises(ValueError, match="out of range"):
        evaluate_selection(x, q, [1, 10])
    with pytest.raises(ValueError, match="at least 2"):
        evaluate_selection(x, q, [3])
