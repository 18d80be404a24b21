"""Exchange rounds: a swap search on the corpus's f across shards, coordinated through the
selection's sufficient statistics (:mod:`engine.corpus.stats`).

Each round, every shard ranks its rows by their linearised gain under the corpus's current
statistics (one pass over the shard: a mat-vec for pair-wise, a d×d quadratic form for DiSF)
and sends its best ``candidates`` non-members and its worst members, with their rows. The
coordinator pairs the best entering rows with the worst leaving ones, in blocks that halve
until the exact corpus f of the block swap rises, re-ranks with the new gradient and goes
on until no pair improves. Shards apply the accepted swaps; the next round re-ranks. f rises
at every accepted block, so the result is never below the start. A round moves rows between
shards, so the allocation of the budget follows the marginal gains.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .stats import SelectionStats

__all__ = ["ExchangeResult", "exchange_rounds"]

_CHUNK_ROWS = 65536


@dataclass
class ExchangeResult:
    selected: list  # per shard: bool (n_s,)
    rounds: list = field(default_factory=list)  # per round: swaps, f, seconds, bytes
    converged: bool = False
    f: dict | None = None


def _shard_candidates(stats, grad, x, q, sel, m):
    """(in_rows, out_rows): the m non-members of highest gain and the m members of lowest."""
    n = x.shape[0]
    a = np.empty(n, dtype=np.float64)
    for s in range(0, n, _CHUNK_ROWS):
        e = min(n, s + _CHUNK_ROWS)
        a[s:e] = stats.gains(grad, stats.rows(x[s:e]), q[s:e])
    non = np.flatnonzero(~sel)
    mem = np.flatnonzero(sel)
    if non.size > m:
        non = non[np.argpartition(-a[non], m - 1)[:m]]
    if mem.size > m:
        mem = mem[np.argpartition(a[mem], m - 1)[:m]]
    return non, mem


def _statistics(shards: list, sel: list, stats: SelectionStats) -> dict:
    """The statistics of the selection ``sel`` (per-shard masks), one chunk at a time."""
    parts = stats.zero()
    for (x, q), s in zip(shards, sel):
        for c in range(0, s.size, _CHUNK_ROWS):
            m = s[c:c + _CHUNK_ROWS]
            if m.any():
                parts = stats.add(parts, stats.rows(np.asarray(x[c:c + m.size])[m]),
                                  q[c:c + m.size][m])
    return parts


def fit_count(shards: list, selected: list, stats: SelectionStats, k: int) -> tuple[list, dict]:
    """A start of any size made k rows: the members of lowest linearised gain leave, or the
    non-members of highest gain enter, across all shards (one pass over each shard). Returns
    the masks and what moved."""
    sel = [np.asarray(s, dtype=bool).copy() for s in selected]
    have = sum(int(s.sum()) for s in sel)
    if have == k:
        return sel, {"added": 0, "removed": 0}
    parts = _statistics(shards, sel, stats)
    # the gradient at the start (a size of at least 2 keeps the statistics defined)
    grad = stats.gradient(parts, max(have, 2))
    need = abs(k - have)
    best_rows, best_gain = [], []
    for si, ((x, q), s) in enumerate(zip(shards, sel)):
        n = x.shape[0]
        a = np.empty(n, dtype=np.float64)
        for c in range(0, n, _CHUNK_ROWS):
            e = min(n, c + _CHUNK_ROWS)
            a[c:e] = stats.gains(grad, stats.rows(x[c:e]), q[c:e])
        pool = np.flatnonzero(~s if k > have else s)
        key = -a[pool] if k > have else a[pool]
        if pool.size > need:
            pool = pool[np.argpartition(key, need - 1)[:need]]
        best_rows += [(si, int(r)) for r in pool]
        best_gain.append(a[pool])
    gains = np.concatenate(best_gain) if best_gain else np.zeros(0)
    order = np.argsort(-gains if k > have else gains, kind="stable")[:need]
    for j in order:
        si, r = best_rows[j]
        sel[si][r] = k > have
    return sel, {"added": need if k > have else 0, "removed": need if k < have else 0}


def exchange_rounds(
    shards: list,
    selected: list,
    stats: SelectionStats,
    k: int,
    *,
    candidates: int = 4096,
    max_rounds: int = 50,
    rtol: float = 1e-7,
    time_budget_s: float | None = None,
    on_round: Callable | None = None,
    resume: tuple | None = None,
    on_state: Callable | None = None,
) -> ExchangeResult:
    """Run exchange rounds from ``selected`` (per shard bool masks, k members in all).

    ``shards`` are (x, q) pairs per shard (arrays or memory maps, read one chunk at a time);
    only the candidates' rows are held at once. Stops when a round accepts no swap or raises
    f by less than ``rtol`` · |f| (``converged``), after ``max_rounds``, or when
    ``time_budget_s`` runs out. ``resume`` = (rounds done, masks, round log) continues a
    killed run; ``on_state(rounds done, masks, round log)`` is called after every round (to
    checkpoint it)."""
    t_start = time.perf_counter()
    first, done_log = 0, []
    if resume is not None:
        first, selected, done_log = resume
    sel = [np.asarray(s, dtype=bool).copy() for s in selected]
    if sum(int(s.sum()) for s in sel) != k:
        raise ValueError("exchange: the start does not hold k rows")
    parts = _statistics(shards, sel, stats)
    f_now = stats.f(parts, k)["f"]
    out = ExchangeResult(selected=sel, rounds=list(done_log))
    # a round that swaps most of its candidate pairs is limited by them: the next round sends
    # twice as many (up to 8x), so a budget far from its place moves in few rounds
    m_round = int(done_log[-1]["next_candidates"]) if done_log else candidates
    if done_log and (done_log[-1]["swaps"] == 0 or done_log[-1]["f"] - done_log[-1]["f_before"]
                     < rtol * max(abs(done_log[-1]["f"]), 1e-12)):
        out.converged = True  # the killed run had finished its last round
        out.f = stats.f(parts, k)
        return out
    for r in range(first, max_rounds):
        t0 = time.perf_counter()
        f_before = f_now
        grad = stats.gradient(parts, k)
        ins, outs = [], []  # (shard, row) of the candidates
        for si, ((x, q), s) in enumerate(zip(shards, sel)):
            non, mem = _shard_candidates(stats, grad, x, q, s, m_round)
            ins += [(si, int(i)) for i in non]
            outs += [(si, int(i)) for i in mem]
        if not ins or not outs:
            out.converged = True
            break

        def rows_of(cands):
            xs = np.stack([shards[si][0][i] for si, i in cands]).astype(np.float32)
            qs = np.array([shards[si][1][i] for si, i in cands], dtype=np.float64)
            return stats.rows(xs), qs

        xin, qin = rows_of(ins)
        xout, qout = rows_of(outs)
        sent = (xin.shape[0] + xout.shape[0]) * (xin.shape[1] * 4 + 8 + 8)
        alive_in = np.ones(len(ins), dtype=bool)
        alive_out = np.ones(len(outs), dtype=bool)
        swaps = []
        b_prev = None
        while True:
            ai = np.flatnonzero(alive_in)
            ao = np.flatnonzero(alive_out)
            if ai.size == 0 or ao.size == 0:
                break
            gin = stats.gains(grad, xin[ai], qin[ai])
            gout = stats.gains(grad, xout[ao], qout[ao])
            oi = ai[np.argsort(-gin, kind="stable")]
            oo = ao[np.argsort(gout, kind="stable")]
            diff = np.sort(gin)[::-1][: min(ai.size, ao.size)] - np.sort(gout)[: min(ai.size, ao.size)]
            P = int(np.count_nonzero(diff > 0))
            if P == 0:
                break
            b = P if b_prev is None else min(P, 2 * b_prev)
            accepted = False
            while b >= 1:
                J, O = oi[:b], oo[:b]
                trial = stats.add(stats.add(parts, xin[J], qin[J]), xout[O], qout[O], sign=-1.0)
                f_trial = stats.f(trial, k)["f"]
                if f_trial > f_now + 1e-13 * max(1.0, abs(f_now)):
                    parts, f_now = trial, f_trial
                    alive_in[J] = False
                    alive_out[O] = False
                    swaps += [(ins[j], outs[o]) for j, o in zip(J, O)]
                    accepted = True
                    break
                b //= 2
            if not accepted:
                break
            b_prev = b
            grad = stats.gradient(parts, k)
        for (si, i), (so, o) in swaps:
            sel[si][i] = True
            sel[so][o] = False
        info = {"round": r + 1, "swaps": len(swaps), "candidates": m_round,
                "f_before": f_before, "f": f_now,
                "seconds": time.perf_counter() - t0, "bytes_exchanged": int(sent)}
        if len(swaps) >= 0.5 * min(len(ins), len(outs)):
            m_round = min(8 * candidates, 2 * m_round)
        info["next_candidates"] = m_round
        out.rounds.append(info)
        if on_state is not None:
            on_state(r + 1, sel, out.rounds)
        if on_round is not None:
            on_round(info)
        if not swaps or f_now - f_before < rtol * max(abs(f_now), 1e-12):
            out.converged = True
            break
        if time_budget_s is not None and time.perf_counter() - t_start > time_budget_s:
            break
    out.f = stats.f(parts, k)
    return out
