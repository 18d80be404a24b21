"""Reference selections on the whole shard (docs/method.md#references): random, quality top-k, and
greedy / stochastic greedy on the joint objective f = lamb * f_qua + (1 - lamb) * f_div,
dispatched to the diversity term's own greedy (:mod:`engine.terms`).

Greedy starts empty and adds, k times, the sample with the largest f(U + j); every candidate
is scored at once as a tensor expression and ties go to the lowest index. For |U| < 2, where a
diversity term over pairs is undefined, f_div = 0 for pair-wise and DiSF (the first pick is the
best quality); facility location is defined for any |U|. Stochastic greedy (Mirzasoleiman et
al. 2015) scores only s uniformly drawn non-chosen samples per pick.
"""

from __future__ import annotations

import numpy as np
import torch

from . import terms
from .objectives import default_mem_budget, tensor_of

__all__ = ["random_selection", "quality_topk", "greedy", "stochastic_greedy"]


def random_selection(n: int, k: int, seed: int = 0) -> np.ndarray:
    """k distinct indices drawn uniformly from range(n) (sorted)."""
    if not (0 < k <= n):
        raise ValueError(f"need 0 < k <= n, got k={k}, n={n}")
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)


def quality_topk(q, k: int, ids=None) -> np.ndarray:
    """The k highest-quality indices (sorted), ties broken by id (or index) ascending."""
    from .ranking import order_by

    q = q.detach().cpu().numpy() if torch.is_tensor(q) else np.asarray(q)
    n = q.shape[0]
    if not (0 < k <= n):
        raise ValueError(f"need 0 < k <= n, got k={k}, n={n}")
    return np.sort(order_by(q, ids)[:k]).astype(np.int64)


def _prepare(x, q, device, dtype):
    from .device import resolve_device

    dev = resolve_device(device)
    xt = tensor_of(x)
    if dtype is None:
        dtype = torch.float64 if xt.dtype == torch.float64 else torch.float32
    xt = xt.to(device=dev, dtype=dtype)
    qt = tensor_of(q).to(device=dev, dtype=dtype)
    if xt.ndim != 2 or qt.shape != (xt.shape[0],):
        raise ValueError(f"x must be (n, d) and q (n,), got {tuple(xt.shape)} and {tuple(qt.shape)}")
    return xt, qt


def greedy(x, q, k: int, algorithm, lamb: float = 0.5, *, device="cpu", dtype=None,
           mem_budget: int | None = None, sample: int | None = None, seed: int = 0,
           **kw) -> np.ndarray:
    """Greedy selection of k samples on the joint objective; returns the indices in the order
    they were picked. ``algorithm``: a term name, alias or :class:`terms.DiversityTerm`.
    ``sample``: stochastic greedy, each pick scores only ``sample`` non-chosen samples drawn
    uniformly (torch generator seeded with ``seed``); None or >= n is exact greedy. Raises
    :class:`terms.NotSupported` for a term without a greedy move."""
    term = terms.get(algorithm)
    if not term.supports("greedy"):
        raise terms.NotSupported(f"diversity term {term.name!r} has no greedy move")
    if not (0.0 <= lamb <= 1.0):
        raise ValueError(f"lamb must be in [0, 1], got {lamb}")
    xt, qt = _prepare(x, q, device, dtype)
    n = xt.shape[0]
    if not (0 < k < n):
        raise ValueError(f"need 0 < k < n, got k={k}, n={n}")
    if sample is not None and int(sample) < 1:
        raise ValueError(f"sample must be >= 1, got {sample}")
    ground = terms.Batch(xt, qt, mem_budget=mem_budget or default_mem_budget(xt.device))
    gen = None
    if sample is not None:
        gen = torch.Generator(device=xt.device)
        gen.manual_seed(int(seed))
    picks = term.greedy(ground, int(k), float(lamb), sample=None if sample is None else int(sample),
                        generator=gen, **kw)
    return picks.cpu().numpy().astype(np.int64)


def stochastic_greedy(x, q, k: int, algorithm, lamb: float = 0.5, *, epsilon: float = 0.01,
                      sample: int | None = None, seed: int = 0, **kw) -> np.ndarray:
    """Stochastic greedy ("lazier than lazy greedy"): each pick scores s non-chosen samples
    drawn uniformly, s = ceil((n / k) · ln(1 / epsilon)) unless ``sample`` is given; within
    1 - 1/e - epsilon of the optimum in expectation for monotone submodular f. Deterministic
    for a ``seed`` on one device. Other arguments as :func:`greedy`."""
    n = int(x.shape[0]) if hasattr(x, "shape") else len(x)
    s = int(sample) if sample is not None else terms.sample_size(n, int(k), float(epsilon))
    return greedy(x, q, k, algorithm, lamb, sample=s, seed=seed, **kw)
