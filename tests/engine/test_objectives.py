"""Each objective against a brute-force reference over explicit pairs, for every rollout."""

import itertools

import numpy as np
import pytest
import torch

from datamask_pipeline.engine import terms
from datamask_pipeline.engine.objectives import Batch, score


def _data(m=23, d=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(m, d)) + 0.5
    q = rng.random(m)
    return x, q


def _unit(v):
    return v / np.linalg.norm(v)


def brute_pairwise(x, sel):
    vals = [float(_unit(x[i]) @ _unit(x[j])) for i, j in itertools.permutations(sel, 2)]
    return -sum(vals) / len(vals)


def brute_facility(x, sel):
    tot = 0.0
    for i in range(len(x)):
        tot += max(max(0.0, float(_unit(x[i]) @ _unit(x[j]))) for j in sel)
    return tot / len(x)


def brute_disf(x, sel):
    xs = x[list(sel)]
    k, d = xs.shape
    mean = xs.sum(0) / k
    std = np.array([max(np.sqrt(sum((xs[r, a] - mean[a]) ** 2 for r in range(k)) / (k - 1)), 1e-8)
                    for a in range(d)])
    z = (xs - mean) / std
    off = 0.0
    for a in range(d):
        for b in range(d):
            if a != b:
                c = sum(z[r, a] * z[r, b] for r in range(k)) / (k - 1)
                off += c * c
    return -off / (d * d)


BRUTE = {"Pair_simi": brute_pairwise, "Facility": brute_facility, "DiSF": brute_disf}


@pytest.mark.parametrize("term", sorted(BRUTE))
@pytest.mark.parametrize("k", [2, 4, 9])  # k < d and k >= d exercise DiSF's Gram and covariance paths
@pytest.mark.parametrize("chunk_budget", [None, 64])  # tiny budget: chunked over rollouts/rows
def test_objective_matches_brute_force_for_every_rollout(term, k, chunk_budget):
    x, q = _data()
    rng = np.random.default_rng(k)
    idx = np.stack([rng.choice(len(q), size=k, replace=False) for _ in range(7)])
    batch = Batch(torch.as_tensor(x), torch.as_tensor(q), mem_budget=chunk_budget)
    lamb = 0.3
    f, fq, fd = score(batch, torch.as_tensor(idx), term, lamb)
    for g, sel in enumerate(idx):
        ref_d = BRUTE[term](x, sel)
        ref_q = float(np.mean(q[sel]))
        assert fd[g].item() == pytest.approx(ref_d, rel=1e-9, abs=1e-12)
        assert fq[g].item() == pytest.approx(ref_q, rel=1e-12)
        assert f[g].item() == pytest.approx(lamb * ref_q + (1 - lamb) * ref_d, rel=1e-9, abs=1e-12)


def test_facility_similarity_matrix_and_row_block_paths_agree():
    x, q = _data(m=60, d=5, seed=3)
    idx = torch.as_tensor(np.random.default_rng(0).choice(60, size=(5, 8)))
    fac = terms.get("Facility")
    with_s = fac.batched(Batch(torch.as_tensor(x), torch.as_tensor(q)), idx)
    no_s = fac.batched(Batch(torch.as_tensor(x), torch.as_tensor(q), mem_budget=600), idx)
    torch.testing.assert_close(with_s, no_s)


def test_standardize_term_norm_is_per_term_zscore():
    x, q = _data()
    batch = Batch(torch.as_tensor(x), torch.as_tensor(q))
    idx = torch.as_tensor(np.random.default_rng(1).choice(23, size=(16, 5)))
    f, fq, fd = score(batch, idx, "Pair_simi", 0.4, term_norm="standardize")
    z = lambda v: (v - v.mean()) / (v.std(unbiased=False) + 1e-8)
    torch.testing.assert_close(f, 0.4 * z(fq) + 0.6 * z(fd))


def test_a_new_term_is_one_registered_class():
    class NegMeanNorm(terms.DiversityTerm):
        name = "NegMeanNorm"

        def batched(self, batch, idx, chunk=None):
            return -batch.x[idx].mean(dim=1).norm(dim=1)

    terms.register(NegMeanNorm)
    try:
        x, q = _data()
        batch = Batch(torch.as_tensor(x), torch.as_tensor(q))
        idx = torch.as_tensor([[0, 1, 2], [3, 4, 5]])
        f, fq, fd = score(batch, idx, "negmeannorm", 0.5)
        assert fd[0].item() == pytest.approx(-np.linalg.norm(x[[0, 1, 2]].mean(0)))
    finally:
        terms.unregister("NegMeanNorm")


@pytest.mark.parametrize("term", sorted(BRUTE))
def test_rollout_chunk_is_passed_to_the_term_and_changes_nothing(term):
    x, q = _data()
    batch = Batch(torch.as_tensor(x), torch.as_tensor(q))
    idx = torch.as_tensor(np.random.default_rng(2).choice(23, size=(9, 5)))
    seen = []
    real = terms.get(term)

    class Spy(type(real)):
        def batched(self, batch, idx, chunk=None):
            seen.append(chunk)
            return super().batched(batch, idx, chunk)

    whole = score(batch, idx, term, 0.3)[0]
    chunked = score(batch, idx, Spy(), 0.3, chunk=2)[0]
    assert seen == [2]
    torch.testing.assert_close(whole, chunked)
