"""Exchange rounds: a swap search on the corpus's f across shards, coordinated through the
selection's sufficient statistics (:mod:`engine.corpus.stats`). The maths only; the rounds
themselves run in :mod:`engine.corpus.sharded`, one task per shard.

Each round, every shard ranks its rows by their linearised gain under the corpus's current
statistics (one pass over the shard: a mat-vec for pair-wise, a d×d quadratic form for DiSF)
and sends its best ``m`` non-members and its worst ``m`` members, with their rows. The
coordinator pairs the best entering rows with the worst leaving ones, in blocks that halve
until the exact corpus f of the block swap rises, re-ranks with the new gradient and goes
on until no pair improves (:func:`swap_search`). Shards apply the accepted swaps; the next
round re-ranks. f rises at every accepted block, so the result is never below the start. A
round moves rows between shards, so the allocation of the budget follows the marginal gains.
"""

from __future__ import annotations

import numpy as np

from .stats import SelectionStats

__all__ = ["gains_of", "shard_candidates", "swap_search", "next_candidates", "finished",
           "CHUNK_ROWS"]

CHUNK_ROWS = 65536


def gains_of(stats: SelectionStats, grad: dict, x, q) -> np.ndarray:
    """Every row's linearised gain of entering the selection, one chunk at a time. (n,)"""
    n = x.shape[0]
    a = np.empty(n, dtype=np.float64)
    for s in range(0, n, CHUNK_ROWS):
        e = min(n, s + CHUNK_ROWS)
        a[s:e] = stats.gains(grad, stats.rows(x[s:e]), q[s:e])
    return a


def shard_candidates(stats: SelectionStats, grad: dict, x, q, sel: np.ndarray, m: int):
    """(in_rows, out_rows): the m non-members of highest gain and the m members of lowest."""
    a = gains_of(stats, grad, x, q)
    non = np.flatnonzero(~sel)
    mem = np.flatnonzero(sel)
    if non.size > m:
        non = non[np.argpartition(-a[non], m - 1)[:m]]
    if mem.size > m:
        mem = mem[np.argpartition(a[mem], m - 1)[:m]]
    return np.sort(non), np.sort(mem)


def statistics_of(stats: SelectionStats, x, q, rows: np.ndarray) -> dict:
    """The statistics of the rows ``rows`` (sorted) of one shard, one chunk at a time."""
    parts = stats.zero()
    for c in range(0, rows.size, CHUNK_ROWS):
        r = rows[c:c + CHUNK_ROWS]
        parts = stats.add(parts, stats.rows(np.asarray(x[r])), np.asarray(q)[r])
    return parts


def swap_search(stats: SelectionStats, parts: dict, k: int, xin, qin, xout, qout):
    """The accepted swaps among one round's candidates: (parts, f, [(j_in, o_out), ...]).

    ``xin``/``xout`` are the entering and leaving candidates' rows in the statistics' frame
    (``stats.rows``), ``qin``/``qout`` their quality. Blocks of the best pairs by linearised
    gain are tried, halving until the exact f rises; the gradient is re-taken after each
    accepted block."""
    f_now = stats.f(parts, k)["f"]
    grad = stats.gradient(parts, k)
    alive_in = np.ones(xin.shape[0], dtype=bool)
    alive_out = np.ones(xout.shape[0], dtype=bool)
    swaps: list = []
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
        p = min(ai.size, ao.size)
        diff = np.sort(gin)[::-1][:p] - np.sort(gout)[:p]
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
                swaps += list(zip(J.tolist(), O.tolist()))
                accepted = True
                break
            b //= 2
        if not accepted:
            break
        b_prev = b
        grad = stats.gradient(parts, k)
    return parts, f_now, swaps


def next_candidates(m: int, swaps: int, n_in: int, n_out: int, base: int,
                    cap: int | None = None) -> int:
    """A round that swapped most of its candidate pairs was limited by them: the next round
    sends twice as many (up to 8 × ``base`` and ``cap``), so a budget far from its place moves
    in few rounds."""
    if swaps >= 0.5 * min(n_in, n_out):
        grown = min(8 * base, 2 * m)
        return grown if cap is None else max(m, min(grown, cap))
    return m


def finished(info: dict, rtol: float) -> bool:
    """Whether a round ends the rounds: no swap, or f rose by less than ``rtol`` · |f|."""
    return info["swaps"] == 0 or info["f"] - info["f_before"] < rtol * max(abs(info["f"]), 1e-12)
