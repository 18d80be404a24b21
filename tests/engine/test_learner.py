"""The policy-gradient learner: sampling, convergence to the exhaustive optimum, determinism,
checkpoint/resume, the lambda sweep, progress and configuration errors."""

import itertools
import math

import numpy as np
import pytest
import torch

from datamask_pipeline.engine.config import ConfigError, LearnerConfig
from datamask_pipeline.engine.learner import (
    DeviceError,
    estimate_memory,
    learn,
    quality_pool,
    readout,
    resolve_device,
    sample_masks,
)
from datamask_pipeline.engine.objectives import Batch, score

TERMS = ("DiSF", "Facility", "Pair_simi")


def clustered(n, d, seed=0, n_clusters=4):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_clusters, d))
    lab = rng.integers(0, n_clusters, size=n)
    spread = np.linspace(0.2, 1.0, n_clusters)[lab][:, None]
    x = centers[lab] + spread * rng.normal(size=(n, d))
    q = (1.0 - spread[:, 0]) + 0.3 * rng.random(n)
    return x.astype(np.float32), q.astype(np.float64)


# ------------------------------------------------------------ sampling
def test_masks_are_exact_k_and_distinct():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(50)
    idx = sample_masks(logits, G=64, k=7, gen=gen)
    assert idx.shape == (64, 7)
    for row in idx.tolist():
        assert len(set(row)) == 7
        assert all(0 <= i < 50 for i in row)


def test_gumbel_topk_matches_softmax_sampling_without_replacement():
    # k = 1: pick frequencies equal softmax; k = 2: inclusion matches the sequential process.
    gen = torch.Generator().manual_seed(1)
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    p = torch.softmax(logits, 0).numpy()
    draws = sample_masks(logits, G=40000, k=1, gen=gen)[:, 0].numpy()
    freq = np.bincount(draws, minlength=4) / draws.size
    np.testing.assert_allclose(freq, p, atol=0.01)
    draws2 = sample_masks(logits, G=40000, k=2, gen=gen).numpy()
    incl = np.array([(draws2 == i).any(1).mean() for i in range(4)])
    exact = np.zeros(4)
    for i, j in itertools.permutations(range(4), 2):
        pr = p[i] * p[j] / (1 - p[i])
        exact[i] += pr
        exact[j] += pr
    np.testing.assert_allclose(incl, exact, atol=0.012)


# ------------------------------------------------------ exhaustive optimum
def _all_subsets_f(x, q, k, algorithm, lamb):
    batch = Batch(torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64))
    subsets = torch.tensor(list(itertools.combinations(range(len(q)), k)))
    f, _, _ = score(batch, subsets, algorithm, lamb)
    return batch, f


def test_learner_reaches_exhaustive_optimum():
    """n = 14, k = 4: all 1001 subsets scored. The plain method (independent logits,
    mean-field policy gradient) can lock onto a local optimum, so this asserts what it does
    measurably achieve: within 1% of the optimum (as a share of the f range over all subsets)
    in at least 2/3 of 27 (term, lambda, instance) cases, at least once per term, and never
    further than 25% away."""
    n, k = 14, 4
    gaps = {}
    for seed in range(3):
        x, q = clustered(n, 6, seed=seed)
        for algorithm in TERMS:
            for lamb in (0.2, 0.5, 0.8):
                batch, f_all = _all_subsets_f(x, q, k, algorithm, lamb)
                cfg = LearnerConfig(algorithm=algorithm, lamb=lamb, select_ratio=k / n,
                                    n_epochs=600, n_rollout=128, partial=1.0, max_lr=1,
                                    min_lr=0.1, init="same", seed=0)
                res = learn(x, q, cfg, device="cpu")
                sel = torch.as_tensor(np.flatnonzero(res.selected)).view(1, -1)
                assert sel.numel() == k
                f_sel = float(score(batch, sel, algorithm, lamb)[0][0])
                f_opt, f_min = float(f_all.max()), float(f_all.min())
                gaps[(algorithm, lamb, seed)] = (f_opt - f_sel) / (f_opt - f_min)
    ok = {key for key, g in gaps.items() if g <= 0.01}
    assert len(ok) >= 18, gaps
    assert {a for a, _, _ in ok} == set(TERMS), gaps
    assert max(gaps.values()) <= 0.25, gaps


# --------------------------------------------------------- determinism
def test_same_seed_same_selection_and_different_seed_runs():
    x, q = clustered(400, 8, seed=5)
    cfg = LearnerConfig(algorithm="Pair_simi", select_ratio=0.1, n_epochs=60, n_rollout=16,
                        partial=0.25, seed=7)
    a = learn(x, q, cfg, device="cpu")
    b = learn(x, q, cfg, device="cpu")
    np.testing.assert_array_equal(a.selected, b.selected)
    np.testing.assert_array_equal(a.logits, b.logits)
    assert a.selected.sum() == 40
    c = learn(x, q, cfg.replace(seed=8), device="cpu")
    assert not np.array_equal(a.logits, c.logits)


@pytest.mark.parametrize("algorithm", TERMS)
def test_kill_and_resume_equals_uninterrupted(tmp_path, algorithm):
    x, q = clustered(300, 8, seed=2)
    cfg = LearnerConfig(algorithm=algorithm, select_ratio=0.1, n_epochs=50, n_rollout=16,
                        partial=0.3, seed=3)
    full = learn(x, q, cfg, device="cpu")
    ck = str(tmp_path / "ck.pt")
    part = learn(x, q, cfg, device="cpu", checkpoint_path=ck, checkpoint_every=10, max_steps=23)
    assert part.steps == 23
    resumed = learn(x, q, cfg, device="cpu", checkpoint_path=ck, checkpoint_every=10)
    assert resumed.resumed_from == 23
    np.testing.assert_array_equal(resumed.logits, full.logits)
    np.testing.assert_array_equal(resumed.selected, full.selected)
    assert [h["step"] for h in resumed.history] == [h["step"] for h in full.history]


def test_checkpoint_of_another_config_is_not_resumed(tmp_path):
    x, q = clustered(200, 4, seed=2)
    cfg = LearnerConfig(algorithm="Pair_simi", select_ratio=0.1, n_epochs=20, n_rollout=8,
                        partial=0.5)
    ck = str(tmp_path / "ck.pt")
    learn(x, q, cfg, device="cpu", checkpoint_path=ck, checkpoint_every=5, max_steps=10)
    other = learn(x, q, cfg.replace(lamb=0.3), device="cpu", checkpoint_path=ck, checkpoint_every=5)
    assert other.resumed_from is None
    fresh = learn(x, q, cfg.replace(lamb=0.3), device="cpu")
    np.testing.assert_array_equal(other.logits, fresh.logits)


def test_checkpoint_loads_without_pickled_code(tmp_path):
    # A checkpoint carrying an arbitrary object must be refused by the weights-only loader.
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    ck = tmp_path / "ck.pt"
    torch.save({"logits": torch.zeros(3), "evil": Evil()}, ck)
    x, q = clustered(100, 4)
    cfg = LearnerConfig(algorithm="Pair_simi", select_ratio=0.1, n_epochs=5, n_rollout=4,
                        partial=1.0)
    with pytest.raises(pickle.UnpicklingError):
        learn(x, q, cfg, device="cpu", checkpoint_path=str(ck), checkpoint_every=2)


# ------------------------------------------------------------ read-out
def test_readout_breaks_ties_by_id():
    logits = np.array([1.0, 2.0, 2.0, 2.0, 0.5], dtype=np.float32)
    ids = np.array([50, 40, 10, 30, 20])
    sel, rank = readout(logits, 2, ids)
    assert sel.tolist() == [False, False, True, True, False]
    assert rank.tolist() == [3, 2, 0, 1, 4]
    sel_s, _ = readout(logits, 2, np.array(["e", "d", "a", "c", "b"], dtype=object))
    assert sel_s.tolist() == sel.tolist()


def test_quality_pruning_never_selects_pruned_rows():
    x, q = clustered(500, 6, seed=9)
    cfg = LearnerConfig(algorithm="Facility", select_ratio=0.1, n_epochs=30, n_rollout=8,
                        partial=0.3, prune_ratio=0.5)
    res = learn(x, q, cfg, device="cpu")
    pool = set(quality_pool(q, 0.5).tolist())
    assert set(np.flatnonzero(res.selected).tolist()) <= pool
    assert res.selected.sum() == 50
    assert np.isneginf(res.logits[~np.isin(np.arange(500), list(pool))]).all()


def test_quality_init_starts_at_quality_order():
    x, q = clustered(300, 4, seed=1)
    cfg = LearnerConfig(algorithm="DiSF", select_ratio=0.1, n_epochs=1, n_rollout=4,
                        partial=0.2, max_lr=1e-9, min_lr=0.0, solver="paper")
    res = learn(x, q, cfg, device="cpu")
    top = np.argsort(-q)[:30]
    assert set(np.flatnonzero(res.selected)) == set(top)


# ------------------------------------------------------ lambda monotone
def collapsed(n, d, seed=0):
    """Quality rises with dimensional collapse: high-quality rows lie along one direction,
    low-quality rows are isotropic. DiSF measures correlation between embedding dimensions,
    so it needs data with correlation structure; ``clustered`` (isotropic clusters) has
    almost none and its DiSF values sit at the small-sample noise floor."""
    rng = np.random.default_rng(seed)
    a = rng.random(n)
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    t = rng.normal(size=(n, 1))
    x = a[:, None] * 3 * t * u + (1 - 0.9 * a[:, None]) * rng.normal(size=(n, d))
    q = a + 0.2 * rng.random(n)
    return x.astype(np.float32), q


def _sweep(algorithm, term_norm, lambs):
    from datamask_pipeline.engine.evaluate import evaluate_selection

    x, q = (collapsed if algorithm == "DiSF" else clustered)(600, 8, seed=4)
    fq, fd = [], []
    for lamb in lambs:
        cfg = LearnerConfig(algorithm=algorithm, lamb=lamb, select_ratio=0.1, n_epochs=150,
                            n_rollout=32, partial=0.3, term_norm=term_norm, seed=0)
        res = learn(x, q, cfg, device="cpu")
        ev = evaluate_selection(x, q, res.selected, lamb=lamb, terms=(algorithm,))
        fq.append(ev["f_qua"])
        fd.append(ev["f_div"][algorithm])
    return fq, fd


@pytest.mark.parametrize("algorithm", TERMS)
def test_lambda_sweep_is_monotone_on_the_whole_shard(algorithm):
    """The default (term_norm='none'): strictly monotone, no tolerance beyond float noise."""
    fq, fd = _sweep(algorithm, "none", [1.0, 0.8, 0.5, 0.2, 0.0])
    tol = 1e-9
    assert all(b <= a + tol for a, b in zip(fq, fq[1:])), fq
    assert all(b >= a - tol for a, b in zip(fd, fd[1:])), fd
    assert fq[0] > fq[-1] and fd[-1] > fd[0]


@pytest.mark.parametrize("algorithm", TERMS)
def test_lambda_sweep_with_standardized_terms_is_monotone_up_to_noise(algorithm):
    """term_norm='standardize' turns the tiny differences near lambda = 0 into full-size
    advantages, so the last two points sit at the optimiser's noise floor (measured: a
    difference of up to ~0.5% of the sweep's range). Monotone within 2% of the range."""
    fq, fd = _sweep(algorithm, "standardize", [1.0, 0.8, 0.5, 0.2, 0.0])
    tq, td = 0.02 * (fq[0] - fq[-1]), 0.02 * (fd[-1] - fd[0])
    assert tq > 0 and td > 0, (fq, fd)
    assert all(b <= a + tq for a, b in zip(fq, fq[1:])), fq
    assert all(b >= a - td for a, b in zip(fd, fd[1:])), fd


def test_lambda_one_is_exactly_quality_topk():
    from datamask_pipeline.engine.baselines import quality_topk

    x, q = clustered(300, 4, seed=2)
    ids = np.arange(300)[::-1].copy()
    for init in ("same", "quality"):
        cfg = LearnerConfig(algorithm="Pair_simi", lamb=1.0, select_ratio=0.1, n_epochs=50,
                            n_rollout=8, partial=0.5, init=init)
        res = learn(x, q, cfg, device="cpu", ids=ids)
        assert set(np.flatnonzero(res.selected)) == set(quality_topk(q, 30, ids))
        assert res.steps == 0 and res.history == []


# ------------------------------------------------------------- progress
def test_progress_callback_reports_every_n_steps():
    x, q = clustered(200, 4)
    seen = []
    cfg = LearnerConfig(algorithm="Pair_simi", select_ratio=0.1, n_epochs=40, n_rollout=8,
                        partial=0.5)
    res = learn(x, q, cfg, device="cpu", progress=seen.append, progress_every=10)
    assert [p.step for p in seen] == [10, 20, 30, 40]
    last = seen[-1]
    assert last.n_steps == 40 and last.eta_s == 0
    assert math.isclose(last.lr, 1.0)
    assert math.isclose(seen[0].lr, 10 + (1 - 10) * 9 / 39)
    assert last.best_f >= last.mean_f
    assert all(p.elapsed_s >= 0 for p in seen)
    assert len(res.history) == 4 and set(res.history[0]) >= {"mean_f_qua", "mean_f_div"}


# ----------------------------------------------------- config and device
@pytest.mark.parametrize(
    "changes, msg",
    [
        (dict(select_ratio=0.0), "select_ratio must be in (0, 1)"),
        (dict(select_ratio=1.0), "select_ratio must be in (0, 1)"),
        (dict(lamb=1.5), "lamb (lambda) must be in [0, 1]"),
        (dict(lamb=-0.1), "lamb (lambda) must be in [0, 1]"),
        (dict(partial=0.001), "needs k' >= 2"),
        (dict(algorithm="Pair_simi", partial=0.01), "needs k' >= 2"),
        (dict(n_rollout=1), "n_rollout must be >= 2"),
        (dict(init="zeros"), "init must be one of"),
        (dict(prune_ratio=0.95), "leaves 50 rows, fewer than k=100"),
    ],
)
def test_impossible_configs_fail_before_any_work(changes, msg):
    # a knob out of its range fails at construction, one that does not fit the shard at validate
    with pytest.raises(ConfigError) as ei:
        LearnerConfig(**{**dict(algorithm="DiSF", select_ratio=0.1, partial=0.1),
                         **changes}).validate(1000)
    assert msg in str(ei.value)


def test_unknown_algorithm():
    with pytest.raises(ConfigError, match="unknown algorithm 'kmeans'"):
        LearnerConfig(algorithm="kmeans")


def test_algorithm_aliases():
    assert LearnerConfig(algorithm="pairwise").algorithm == "Pair_simi"
    assert LearnerConfig(algorithm="facility").algorithm == "Facility"
    assert LearnerConfig(algorithm="disf").algorithm == "DiSF"


def test_device_resolution():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(DeviceError, match="unknown device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="CUDA is not available"):
            resolve_device("cuda:0")


def test_memory_preflight_refuses_and_names_the_knob():
    cfg = LearnerConfig(algorithm="DiSF", n_rollout=4096, partial=1.0)
    with pytest.raises(ConfigError, match="lower n_rollout or partial"):
        estimate_memory(10_000_000, 8, cfg, "cpu")
    est = estimate_memory(1000, 8, LearnerConfig(), "cpu")
    assert est["total_bytes"] > 1000 * 8 * 4


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_quality_and_is_deterministic():
    from datamask_pipeline.engine.evaluate import evaluate_selection

    x, q = clustered(3000, 32, seed=6)
    for algorithm in TERMS:
        cfg = LearnerConfig(algorithm=algorithm, select_ratio=0.1, n_epochs=200, n_rollout=64,
                            partial=0.2)
        a = learn(x, q, cfg, device="cuda")
        b = learn(x, q, cfg, device="cuda")
        np.testing.assert_array_equal(a.selected, b.selected)
        c = learn(x, q, cfg, device="cpu")
        fa = evaluate_selection(x, q, a.selected, terms=(algorithm,))["f"][algorithm]
        fc = evaluate_selection(x, q, c.selected, terms=(algorithm,))["f"][algorithm]
        assert abs(fa - fc) <= 0.02 * abs(fc) + 1e-3
