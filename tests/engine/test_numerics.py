"""Legal but awkward embeddings, computed exactly: rows with tiny norms, constant dimensions
and huge finite values. Every objective is compared with a float64 brute force on the original
data; greedy and the polish must pick what they pick on an equivalent well-scaled shard."""

import numpy as np
import pytest
import torch

from datamask_pipeline.engine.baselines import greedy
from datamask_pipeline.engine.evaluate import evaluate_selection
from datamask_pipeline.engine.objectives import Batch, score
from datamask_pipeline.engine.polish import best_swap, polish

from .test_objectives import BRUTE

TERMS = ("DiSF", "Facility", "Pair_simi")


def _shard(n=40, d=6, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(3, d))
    x = centers[rng.integers(0, 3, n)] + 0.6 * rng.normal(size=(n, d))
    return x, rng.random(n)


def _masks(n, k, G=6, seed=1):
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(n, size=k, replace=False) for _ in range(G)])


def _check_objectives(x, q, terms, rel, abs_):
    """score() on G masks and evaluate_selection() on one, against the float64 brute force."""
    ref_x = np.asarray(x, dtype=np.float64)
    idx = _masks(len(q), 7)
    batch = Batch(torch.as_tensor(x), torch.as_tensor(q, dtype=torch.as_tensor(x).dtype))
    for term in terms:
        fd = score(batch, torch.as_tensor(idx), term, 0.5)[2]
        for g, sel in enumerate(idx):
            assert fd[g].item() == pytest.approx(BRUTE[term](ref_x, sel), rel=rel, abs=abs_), term
        ev = evaluate_selection(x, q, idx[0], lamb=0.5, terms=(term,))
        assert ev["f_div"][term] == pytest.approx(BRUTE[term](ref_x, idx[0]), rel=rel, abs=abs_)


# ------------------------------------------------------------ (a) tiny norms
@pytest.mark.parametrize("dtype,scale", [(np.float64, 1e-13), (np.float32, 1e-30)])
def test_rows_with_tiny_norms_are_unit_normalised_exactly(dtype, scale):
    x, q = _shard()
    x[::3] *= scale  # a third of the rows, legal (finite, non-zero) but tiny
    x = x.astype(dtype)
    rel, abs_ = (1e-9, 1e-12) if dtype == np.float64 else (2e-5, 2e-6)
    _check_objectives(x, q, ("Pair_simi", "Facility"), rel, abs_)


@pytest.mark.parametrize("term", ("Pair_simi", "Facility"))
def test_greedy_and_polish_ignore_row_scale_for_cosine_terms(term):
    # cosine terms depend on directions only: shrinking rows must change nothing
    x, q = _shard(60, 5, seed=3)
    tiny = x.copy()
    tiny[::2] *= 1e-14
    assert list(greedy(tiny, q, 8, term, 0.5)) == list(greedy(x, q, 8, term, 0.5))
    start = np.arange(8)
    a, b = polish(x, q, start, term, 0.5), polish(tiny, q, start, term, 0.5)
    np.testing.assert_array_equal(a.selected, b.selected)
    assert b.f_end == pytest.approx(a.f_end, rel=1e-9)


# ------------------------------------------------------- (b) constant dimensions
def _with_constant_dims(dtype):
    # float32 rounds the mean of a constant 0.1 column, and the polish's float64 raw moments
    # (sum x^2 - k mean^2) of a column near 1e8 cancel: either residual is near the std floor
    # and looked like an O(1) correlation
    x, q = _shard(40, 6, seed=5)
    x[:, 1], x[:, 4] = (0.1, -3.7) if dtype == np.float32 else (123456789.1, -3.7e8)
    return x.astype(dtype), q


def test_disf_sees_no_correlation_between_constant_dimensions():
    x, q = _with_constant_dims(np.float32)
    _check_objectives(x, q, ("DiSF",), 1e-5, 1e-7)


def test_disf_polish_state_is_exact_with_constant_dimensions():
    x, q = _with_constant_dims(np.float64)
    start = np.random.default_rng(7).choice(40, size=9, replace=False)

    def f(sel):
        return 0.5 * q[sel].mean() + 0.5 * BRUTE["DiSF"](x, sel)

    res = polish(x, q, start, "DiSF", 0.5, disf_exact_outs=9)
    assert res.f_start == pytest.approx(f(start), rel=1e-10)
    assert res.f_end == pytest.approx(f(res.selected), rel=1e-10)
    o, j, gain = best_swap(x, q, start, "DiSF", 0.5)
    swapped = np.array(sorted(set(start.tolist()) - {o} | {j}))
    assert gain == pytest.approx(f(swapped) - f(start), rel=1e-8, abs=1e-12)


# ---------------------------------------------------------- (c) huge values
def test_huge_finite_embeddings_do_not_overflow():
    x, q = _shard(40, 6, seed=9)
    x = (x * 1e20).astype(np.float32)  # finite in float32, squares are not
    _check_objectives(x, q, TERMS, 2e-5, 2e-6)


@pytest.mark.parametrize("term", TERMS)
def test_greedy_and_polish_on_huge_embeddings_equal_the_rescaled_shard(term):
    x, q = _shard(60, 5, seed=11)
    x = x.astype(np.float32)
    huge = x * np.float32(2.0**66)  # exact: a power of two
    assert np.isfinite(huge).all()
    assert list(greedy(huge, q, 8, term, 0.5)) == list(greedy(x, q, 8, term, 0.5))
    start = np.arange(8)
    a, b = polish(x, q, start, term, 0.5), polish(huge, q, start, term, 0.5)
    np.testing.assert_array_equal(a.selected, b.selected)
    assert b.f_end == pytest.approx(a.f_end, rel=1e-5)
