"""Token budgets inside the objective: cost-aware gains (docs/method.md#budgets-in-tokens).

A token budget is a knapsack constraint: Σ_{i∈U} t_i ≤ T, with U maximal (no unselected row
still fits: within one document of T). The row count k floats, and f's mean quality depends on
it, so a row's value is its linearised gain with k moving too:

    v_j = ∇f · c_j + ∂f/∂k        (c_j: the row's share of the selection's statistics)

(entering adds v_j, leaving takes it away), and its **gain per token** is ρ_j = v_j / max(t_j, 1)
(Leskovec et al., KDD 2007: cost-aware greedy ranks by gain per unit of cost). Every move of the
token budget ranks rows by ρ: the fit (drop the members of lowest ρ while over T, then add the
non-members of highest ρ while one fits), and the swap search (the best entering rows by ρ
against the fewest leaving rows of lowest ρ whose tokens make room, blocks halving until the
exact f rises). The maths only; :mod:`engine.corpus.sharded` runs it one task per shard, for
the exchange and, on one gathered part, for ``gather``.
"""

from __future__ import annotations

import numpy as np

from .exchange import CHUNK_ROWS
from .stats import SelectionStats

__all__ = ["k_slope", "values_of", "per_token", "token_candidates", "pick_fill", "pick_drop",
           "token_swap_search"]


def k_slope(stats: SelectionStats, parts: dict, k: int) -> float:
    """∂f/∂k at fixed statistics (a central difference; f is smooth in k): the part of a row's
    value that comes from changing the selection's size (for f_qua: −f_qua/k)."""
    k = float(k)
    return float(stats.f(parts, k + 0.5)["f"] - stats.f(parts, k - 0.5)["f"])


def values_of(stats: SelectionStats, grad: dict, dk: float, x, q) -> np.ndarray:
    """Every row's value v = ∇f · c + ∂f/∂k, one chunk at a time. (n,)"""
    n = x.shape[0]
    v = np.empty(n, dtype=np.float64)
    for s in range(0, n, CHUNK_ROWS):
        e = min(n, s + CHUNK_ROWS)
        v[s:e] = stats.gains(grad, stats.rows(np.asarray(x[s:e])), np.asarray(q)[s:e])
    return v + dk


def per_token(v: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Gain per token (a row of 0 tokens counts as 1: it always fits)."""
    return np.asarray(v, dtype=np.float64) / np.maximum(np.asarray(t, dtype=np.float64), 1.0)


def _best(idx: np.ndarray, key: np.ndarray, m: int) -> np.ndarray:
    """The m entries of ``idx`` of largest ``key`` (all when fewer), sorted by key descending."""
    if idx.size > m:
        sel = np.argpartition(-key, m - 1)[:m]
        idx, key = idx[sel], key[sel]
    return idx[np.argsort(-key, kind="stable")]


def token_candidates(rho: np.ndarray, t: np.ndarray, sel: np.ndarray, m: int, want: str,
                     slack: int | None = None) -> np.ndarray:
    """Row numbers of one shard's candidates for a move of the token budget, best first:

    * ``in``: the m non-members of highest ρ;
    * ``out``: the m members of lowest ρ;
    * ``fill``: the m non-members of highest ρ among those with t ≤ ``slack``."""
    if want == "in":
        pool = np.flatnonzero(~sel)
        return _best(pool, rho[pool], m)
    if want == "out":
        pool = np.flatnonzero(sel)
        return _best(pool, -rho[pool], m)
    if want == "fill":
        pool = np.flatnonzero(~sel & (t <= slack))
        return _best(pool, rho[pool], m)
    raise ValueError(f"want must be in, out or fill, got {want!r}")


def pick_fill(rho: np.ndarray, t: np.ndarray, slack: int) -> np.ndarray:
    """Positions of the candidates to add: in order of ρ, each one that still fits."""
    chosen = []
    for j in np.argsort(-rho, kind="stable"):
        if t[j] <= slack:
            chosen.append(j)
            slack -= int(t[j])
    return np.asarray(chosen, dtype=np.int64)


def pick_drop(rho: np.ndarray, t: np.ndarray, excess: int) -> np.ndarray:
    """Positions of the members to drop: lowest ρ first until ``excess`` tokens are freed (all
    of them when they do not free enough)."""
    order = np.argsort(rho, kind="stable")
    cum = np.cumsum(t[order])
    n = int(np.searchsorted(cum, excess, side="left")) + 1
    return order[:n]


def token_swap_search(stats: SelectionStats, parts: dict, k: int, total: int, target: int,
                      xin, qin, tin, xout, qout, tout):
    """The accepted moves among one round's candidates under the token budget:
    (parts, k, total, f, entering positions, leaving positions).

    ``xin``/``xout`` are the entering and leaving candidates' rows in the statistics' frame
    (``stats.rows``), ``qin``/``qout`` their quality, ``tin``/``tout`` their tokens. Each
    move takes the b best entering rows by ρ and the fewest leaving rows of lowest ρ whose
    tokens keep the total within ``target``, and fills the room left from the other entering
    rows in the same order (so a move is judged on a set that is full again); b is the one of
    largest linearised gain, halving until the exact f rises; values are re-taken after each
    accepted move. The total never exceeds the target and f rises at every accepted move."""
    tin = np.asarray(tin, dtype=np.int64)
    tout = np.asarray(tout, dtype=np.int64)
    f_now = stats.f(parts, k)["f"]
    alive_in = np.ones(xin.shape[0], dtype=bool)
    alive_out = np.ones(xout.shape[0], dtype=bool)
    ins: list = []
    outs: list = []
    while True:
        ai, ao = np.flatnonzero(alive_in), np.flatnonzero(alive_out)
        if ai.size == 0:
            break
        grad = stats.gradient(parts, k)
        dk = k_slope(stats, parts, k)
        vin = stats.gains(grad, xin[ai], qin[ai]) + dk
        vout = stats.gains(grad, xout[ao], qout[ao]) + dk if ao.size else np.zeros(0)
        oi = np.argsort(-per_token(vin, tin[ai]), kind="stable")
        oo = np.argsort(per_token(vout, tout[ao]), kind="stable")
        cin_t, cin_v = np.cumsum(tin[ai][oi]), np.cumsum(vin[oi])
        cout_t = np.concatenate([[0], np.cumsum(tout[ao][oo])])
        cout_v = np.concatenate([[0.0], np.cumsum(vout[oo])])
        need = cin_t - (target - total)  # tokens to free for the b best entering rows
        n_out = np.searchsorted(cout_t, np.maximum(need, 0), side="left")
        valid = (n_out < cout_t.size) & (k + np.arange(1, ai.size + 1) - n_out >= 2)
        lin = np.where(valid, cin_v - cout_v[np.minimum(n_out, cout_t.size - 1)], -np.inf)
        if not np.any(lin > 0):
            break
        b = int(np.argmax(lin)) + 1
        accepted = False
        while b >= 1:
            if valid[b - 1] and lin[b - 1] > 0:
                J, O = ai[oi[:b]], ao[oo[:int(n_out[b - 1])]]
                # the room left is filled from the other entering candidates in the same
                # order, so that the move is judged on a set that is full again
                slack = target - total - int(tin[J].sum() - tout[O].sum())
                rest = oi[b:]
                J = np.concatenate([J, ai[rest[pick_fill(-np.arange(rest.size, dtype=float),
                                                         tin[ai][rest], slack)]]])
                k2 = k + J.size - O.size
                trial = stats.add(parts, xin[J], qin[J])
                if O.size:
                    trial = stats.add(trial, xout[O], qout[O], sign=-1.0)
                f_trial = stats.f(trial, k2)["f"]
                if f_trial > f_now + 1e-13 * max(1.0, abs(f_now)):
                    parts, k, f_now = trial, k2, f_trial
                    total += int(tin[J].sum() - tout[O].sum())
                    alive_in[J] = False
                    alive_out[O] = False
                    ins += J.tolist()
                    outs += O.tolist()
                    accepted = True
                    break
            b //= 2
        if not accepted:
            break
    return parts, k, total, f_now, np.asarray(ins, dtype=np.int64), np.asarray(outs,
                                                                                dtype=np.int64)
