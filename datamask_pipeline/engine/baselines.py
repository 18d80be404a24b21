"""Reference selections on the whole shard (method.md section 6): random, quality top-k and
greedy on the joint objective f = lamb * f_qua + (1 - lamb) * f_div for each diversity term.

Greedy starts empty and adds, k times, the sample with the largest f(U + j). Every candidate
is scored at once as a tensor expression (no Python loop over samples); ties go to the lowest
index. Conventions for |U| < 2, where a diversity term over pairs is undefined: f_div = 0 for
pair-wise and DiSF (the first pick is the best quality), facility location is defined for any
|U| (empty set covers nothing).

* **pair-wise**: running sum s = sum of the selected unit vectors; with t selected,
  f(U + j) ranks as lamb*q_j/(t+1) - (1-lamb)*2*s.x_j/(t(t+1)). One n x d mat-vec per pick.
* **facility location**: per-point best coverage b_i = max_{j in U} s_ij; the coverage gain
  c_j = sum_i max(0, s_ij - b_i) only shrinks as U grows, so stale gains are upper bounds
  (lazy greedy). Ranking key at size t: lamb*q_j + (1-lamb)*(t+1)*c_j/n. Each round takes the
  candidates with the largest upper bounds, refreshes a block of them exactly (one
  block x n similarity product, or rows of a dense similarity matrix when it fits the memory
  budget), and stops when the best fresh key beats every stale bound.
* **DiSF**: the scatter matrix W of the selection is updated by rank one per pick (Welford);
  for every candidate the correlation matrix of U + j is W + c v v^T rescaled, whose squared
  Frobenius norm expands into two d x d quadratic forms, so all n candidates cost two
  (n x d) @ (d x d) products per pick: O(k n d^2) in total, the cost the paper quotes.
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import torch

from .objectives import DISF_STD_FLOOR, default_mem_budget, tensor_of

__all__ = ["random_selection", "quality_topk", "greedy", "GREEDY", "register_greedy"]


def random_selection(n: int, k: int, seed: int = 0) -> np.ndarray:
    """k distinct indices drawn uniformly from range(n) (sorted)."""
    if not (0 < k <= n):
        raise ValueError(f"need 0 < k <= n, got k={k}, n={n}")
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)


def quality_topk(q, k: int, ids=None) -> np.ndarray:
    """The k highest-quality indices (sorted), ties broken by id (or index) ascending."""
    from .learner import _id_rank

    q = q.detach().cpu().numpy() if torch.is_tensor(q) else np.asarray(q)
    n = q.shape[0]
    if not (0 < k <= n):
        raise ValueError(f"need 0 < k <= n, got k={k}, n={n}")
    order = np.lexsort((_id_rank(ids, n), -q.astype(np.float64)))
    return np.sort(order[:k]).astype(np.int64)


GreedyFn = Callable[..., torch.Tensor]
GREEDY: Dict[str, GreedyFn] = {}


def register_greedy(name: str):
    def deco(fn: GreedyFn) -> GreedyFn:
        GREEDY[name] = fn
        return fn

    return deco


def _prepare(x, q, device, dtype):
    from .learner import resolve_device

    dev = resolve_device(device)
    xt = tensor_of(x)
    if dtype is None:
        dtype = torch.float64 if xt.dtype == torch.float64 else torch.float32
    xt = xt.to(device=dev, dtype=dtype)
    qt = tensor_of(q).to(device=dev, dtype=dtype)
    if xt.ndim != 2 or qt.shape != (xt.shape[0],):
        raise ValueError(f"x must be (n, d) and q (n,), got {tuple(xt.shape)} and {tuple(qt.shape)}")
    return xt, qt


def greedy(x, q, k: int, algorithm: str, lamb: float = 0.5, *, device="cpu", dtype=None,
           mem_budget: int | None = None, **kw) -> np.ndarray:
    """Greedy selection of k samples on the joint objective; returns the indices in the order
    they were picked."""
    from .config import canonical_algorithm

    algorithm = canonical_algorithm(algorithm)
    if algorithm not in GREEDY:
        raise ValueError(f"no greedy baseline registered for {algorithm!r}")
    if not (0.0 <= lamb <= 1.0):
        raise ValueError(f"lamb must be in [0, 1], got {lamb}")
    xt, qt = _prepare(x, q, device, dtype)
    n = xt.shape[0]
    if not (0 < k < n):
        raise ValueError(f"need 0 < k < n, got k={k}, n={n}")
    budget = mem_budget or default_mem_budget(xt.device)
    picks = GREEDY[algorithm](xt, qt, int(k), float(lamb), budget, **kw)
    return picks.cpu().numpy().astype(np.int64)


def _pick(key: torch.Tensor, chosen: torch.Tensor) -> int:
    key = key.masked_fill(chosen, -torch.inf)
    return int(torch.argmax(key))


@register_greedy("Pair_simi")
def _greedy_pairwise(x, q, k, lamb, budget):
    xn = torch.nn.functional.normalize(x, dim=1)
    n = x.shape[0]
    chosen = torch.zeros(n, dtype=torch.bool, device=x.device)
    dots = torch.zeros(n, dtype=x.dtype, device=x.device)  # s . x_j for the running sum s
    picks = torch.empty(k, dtype=torch.long, device=x.device)
    for t in range(k):
        if t == 0:
            key = q.clone()
        else:
            key = lamb * q / (t + 1) - (1 - lamb) * 2.0 * dots / (t * (t + 1))
        j = _pick(key, chosen)
        picks[t] = j
        chosen[j] = True
        dots += xn @ xn[j]
    return picks


@register_greedy("Facility")
def _greedy_facility(x, q, k, lamb, budget, block: int = 64):
    xn = torch.nn.functional.normalize(x, dim=1)
    n = x.shape[0]
    es = x.element_size()
    dense = n * n * es <= budget // 2
    S = (xn @ xn.T).clamp_(min=0) if dense else None

    def rows(j: torch.Tensor) -> torch.Tensor:  # (b, n) clipped similarities
        return S.index_select(0, j) if dense else (xn[j] @ xn.T).clamp_(min=0)

    best = torch.zeros(n, dtype=x.dtype, device=x.device)  # per-point best coverage
    gain = torch.full((n,), torch.inf, dtype=x.dtype, device=x.device)  # stale upper bounds
    chosen = torch.zeros(n, dtype=torch.bool, device=x.device)
    picks = torch.empty(k, dtype=torch.long, device=x.device)
    neg_inf = torch.tensor(-torch.inf, dtype=x.dtype, device=x.device)
    b = max(1, min(block, n))
    # First pick: every gain is needed, in blocks of rows bounded by the memory budget.
    rows_per = max(1, min(n, int(budget // max(1, 2 * n * es))))
    for s in range(0, n, rows_per):
        gain[s : s + rows_per] = rows(torch.arange(s, min(n, s + rows_per), device=x.device)).sum(1)
    for t in range(k):
        fresh = torch.zeros(n, dtype=torch.bool, device=x.device)
        scale = (1 - lamb) * (t + 1) / n
        while True:
            key = lamb * q + scale * gain
            key = torch.where(chosen, neg_inf, key)
            stale_key = torch.where(fresh, neg_inf, key)
            if fresh.any():
                fresh_key = torch.where(fresh, key, neg_inf)
                j = int(torch.argmax(fresh_key))
                top_stale = stale_key.max()
                if fresh_key[j] >= top_stale:
                    break
            m_left = int((~chosen & ~fresh).sum())
            cand = torch.topk(stale_key, min(b, m_left)).indices
            gain[cand] = (rows(cand) - best).clamp_(min=0).sum(dim=1)
            fresh[cand] = True
        picks[t] = j
        chosen[j] = True
        best = torch.maximum(best, rows(picks[t : t + 1])[0])
        gain[j] = 0
    return picks


def _disf_keys(xb, mu, W, Wsq, t, d):
    """-(sum of squared off-diagonal correlations)/d^2 of U + j for every row of ``xb``.
    t = |U| >= 1; W = scatter matrix of U, Wsq = W * W."""
    c = t / (t + 1.0)
    v = xb - mu
    var = (torch.diagonal(W) + c * v * v) / t  # unbiased variance of U + j
    w = 1.0 / var.clamp(min=DISF_STD_FLOOR**2)  # 1 / std^2 (std floored)
    y = v * w
    total = ((w @ Wsq) * w).sum(1) + 2 * c * ((y @ W) * y).sum(1) + c * c * (v * y).sum(1) ** 2
    total = total / (t * t)
    diag = var * w  # C_aa (1 unless the std was floored)
    off = total - (diag * diag).sum(1)
    return -off / (d * d)


@register_greedy("DiSF")
def _greedy_disf(x, q, k, lamb, budget):
    n, d = x.shape
    es = x.element_size()
    chosen = torch.zeros(n, dtype=torch.bool, device=x.device)
    picks = torch.empty(k, dtype=torch.long, device=x.device)
    mu = torch.zeros(d, dtype=x.dtype, device=x.device)
    W = torch.zeros(d, d, dtype=x.dtype, device=x.device)
    rows = max(1, min(n, int(budget // max(1, 6 * d * es))))
    key = torch.empty(n, dtype=x.dtype, device=x.device)
    for t in range(k):
        if t == 0:
            key = q.clone()
        else:
            Wsq = W * W
            for s in range(0, n, rows):
                key[s : s + rows] = _disf_keys(x[s : s + rows], mu, W, Wsq, t, d)
            key = lamb * q / (t + 1) + (1 - lamb) * key
        j = _pick(key, chosen)
        picks[t] = j
        chosen[j] = True
        v = x[j] - mu
        W += (t / (t + 1.0)) * torch.outer(v, v)
        mu += v / (t + 1)
        key = torch.empty(n, dtype=x.dtype, device=x.device)
    return picks
