"""Token budgets' quality-ordered fit over shards that stay with their tasks.

:func:`fit_sharded` gives exactly :func:`budget.fit_tokens`'s selection on the gathered corpus
(shards in order, each shard's rows in order) without bringing any row's token count or
quality to the coordinator. ``fit_tokens(sel, q, tok, T)``:

1. while the selection holds more than T tokens, drop its members of lowest quality (ties:
   the first rows first) until it holds at most T;
2. add the other rows in order of quality (highest first, ties: the first rows first) while
   the prefix fits as a whole;
3. then any later row, in that order, that still fits the slack left (< one document).

Each step is a cut of one total order: the row ``(q, shard, row)`` where the running token
sum first passes a bound (the *pivot*). The coordinator finds it as ``topk_threshold`` in
:mod:`sharded` finds the quality top-k, weighted by tokens: a 65,536-bin histogram of the
eligible rows' tokens by quality (refined inside the pivot's bin while that bin holds more
than ``VALUES_MAX`` rows), the bin's distinct values with their tokens, each shard's tokens at
the pivot's value, and the pivot's row from the one shard that holds it. Every shard then
applies the cut locally. Step 3 is a first-fit over the rows after the fill's pivot: each
shard sends its first ``m`` such rows that fit the slack (a row larger than the slack never
fits later: the slack only shrinks), the coordinator merges them in the global order and
decides exactly up to the earliest row past which some shard sent nothing; the next pass
starts there, with the slack left and ``m`` doubled. Rows of 0 tokens after the pivot always
fit and are added by their shards. The coordinator holds O(shards · bins + candidates) and the
tail's picks (fewer than the slack's tokens): never a row per row of the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["token_totals", "fit_sharded", "Plan", "HIST_BINS", "VALUES_MAX"]

HIST_BINS = 1 << 16
VALUES_MAX = 1 << 18  # rows in the pivot's bin before it is refined by another histogram
MAX_LEVELS = 4  # refinements of the pivot's bin (each narrows it 65,536-fold)
TAIL_BASE = 1024  # the first tail pass's rows per shard (doubled each pass, up to TAIL_MAX)
TAIL_MAX = 1 << 18


@dataclass(frozen=True)
class Pivot:
    """A row of the corpus: its quality, shard and row (kept view's numbering)."""

    q: float
    shard: int
    row: int


@dataclass
class Plan:
    """A fit's decisions, applied by each shard: drop the members at or before ``drop`` in
    ascending order; add the rows before ``fill`` in descending order (all of them when
    ``fill_all``), every row of 0 tokens after it, and ``picks`` (shard -> rows)."""

    drop: Pivot | None = None
    fill: Pivot | None = None
    fill_all: bool = False
    picks: dict = field(default_factory=dict)


# ------------------------------------------------------------------ shard side
def _upto(q: np.ndarray, i: int, p: Pivot, ascending: bool, inclusive: bool) -> np.ndarray:
    """Rows of shard ``i`` (quality ``q``) before pivot ``p`` in the order (quality ascending
    or descending, ties by (shard, row)); ``inclusive`` counts the pivot itself."""
    better = q < p.q if ascending else q > p.q
    tie = q == p.q
    if i < p.shard:
        return better | tie
    if i > p.shard:
        return better
    rows = np.arange(q.size)
    return better | (tie & ((rows <= p.row) if inclusive else (rows < p.row)))


def _rows_of(state, i: int, start, n: int) -> np.ndarray:
    """The start selection of shard ``i`` as a mask: none, given rows, or a version of the
    run's state."""
    m = np.zeros(n, dtype=bool)
    if start is None:
        return m
    if isinstance(start, (int, np.integer)):
        got = state.load_rows(i, int(start))
        rows = np.zeros(0, dtype=np.int64) if got is None else got[0]
    else:
        rows = np.asarray(start, dtype=np.int64)
    m[rows] = True
    return m


def _view(shared, i: int, shard, start):
    """(quality, tokens, selection after the plan's drop, the phase's eligible rows)."""
    from .parts import load_checked as _load

    state, plan, phase = shared[:3]
    part = _load(shard)
    q = np.asarray(part.quality, dtype=np.float64)
    t = shard.token_counts()
    if t.size != q.size:
        from ..config import ConfigError

        raise ConfigError(f"shard {shard.key}: {t.size} token counts for {q.size} rows")
    sel = _rows_of(state, i, start, q.size)
    if phase == "drop":
        return q, t, sel, sel
    if plan.drop is not None:
        sel = sel & ~_upto(q, i, plan.drop, ascending=True, inclusive=True)
    return q, t, sel, ~sel


def _bin_of(q: np.ndarray, lo: float, hi: float, bins: int) -> np.ndarray:
    if not hi > lo:
        return np.zeros(q.size, dtype=np.int64)
    return np.clip(((q - lo) / (hi - lo) * bins).astype(np.int64), 0, bins - 1)


def _in_region(q: np.ndarray, region: list) -> np.ndarray:
    m = np.ones(q.size, dtype=bool)
    for lo, hi, b in region:
        m &= _bin_of(q, lo, hi, HIST_BINS) == b
    return m


def task_token_summary(_, shard):
    """The shard's tokens: (total, largest document)."""
    t = shard.token_counts()
    return int(t.sum()), int(t.max()) if t.size else 0


def task_fit_summary(shared, i: int, shard, start):
    """The phase's eligible rows: (tokens, their quality's min and max)."""
    q, t, _, elig = _view(shared, i, shard, start)
    qe = q[elig]
    if not qe.size:
        return 0, np.inf, -np.inf
    return int(t[elig].sum()), float(qe.min()), float(qe.max())


def task_fit_hist(shared, i: int, shard, start):
    """The eligible rows of the region, counted and token-summed in the level's bins, with
    each bin's quality min and max."""
    region, lo, hi = shared[3:6]
    q, t, _, elig = _view(shared, i, shard, start)
    m = elig & _in_region(q, region)
    b = _bin_of(q[m], lo, hi, HIST_BINS)
    cnt = np.bincount(b, minlength=HIST_BINS).astype(np.int64)
    tok = np.bincount(b, weights=t[m].astype(np.float64), minlength=HIST_BINS)
    mn = np.full(HIST_BINS, np.inf)
    mx = np.full(HIST_BINS, -np.inf)
    if b.size:
        np.minimum.at(mn, b, q[m])
        np.maximum.at(mx, b, q[m])
    return cnt, np.rint(tok).astype(np.int64), mn, mx


def task_fit_values(shared, i: int, shard, start):
    """The distinct quality values of the eligible rows in the region, with their tokens."""
    region = shared[3]
    q, t, _, elig = _view(shared, i, shard, start)
    m = elig & _in_region(q, region)
    vals, inv = np.unique(q[m], return_inverse=True)
    tok = np.bincount(inv.reshape(-1), weights=t[m].astype(np.float64), minlength=vals.size)
    return vals, np.rint(tok).astype(np.int64)


def task_fit_row(shared, i: int, shard, start):
    """The eligible row at quality ``v`` where this shard's running tokens first pass ``w``:
    (row, tokens before it among those rows, its tokens)."""
    v, w = shared[3:5]
    q, t, _, elig = _view(shared, i, shard, start)
    rows = np.flatnonzero(elig & (q == v))
    cum = np.cumsum(t[rows])
    j = int(np.searchsorted(cum, w, side="right"))
    return int(rows[j]), int(cum[j] - t[rows[j]]), int(t[rows[j]])


def task_fit_tail(shared, i: int, shard, start):
    """The shard's first ``m`` eligible rows after ``after`` (descending order) of 1 to
    ``slack`` tokens: (quality, row, tokens, whether more such rows follow)."""
    after, slack, m = shared[3:6]
    q, t, _, elig = _view(shared, i, shard, start)
    cand = elig & (t >= 1) & (t <= slack) & ~_upto(q, i, after, ascending=False, inclusive=True)
    rows = np.flatnonzero(cand)
    rows = rows[np.lexsort((rows, -q[rows]))]
    more = rows.size > m
    rows = rows[:m]
    return q[rows], rows, t[rows], more


def task_fit_apply(shared, i: int, shard, start, outs, ctx, want_rows: bool):
    """The plan applied to the shard: its rows saved as each version in ``outs`` (run state
    ``ctx.state``); returns (rows kept, their tokens, their statistics or None, rows or
    None)."""
    state, plan = shared[:2]
    q, t, sel, elig = _view((state, plan, "fill"), i, shard, start)
    if plan.fill_all:
        add = elig
    elif plan.fill is not None:
        before = _upto(q, i, plan.fill, ascending=False, inclusive=False)
        after = ~_upto(q, i, plan.fill, ascending=False, inclusive=True)
        add = elig & (before | (after & (t == 0)))
    else:
        add = np.zeros(q.size, dtype=bool)
    sel = sel | add
    picks = plan.picks.get(i)
    if picks is not None and len(picks):
        sel[np.asarray(picks, dtype=np.int64)] = True
    rows = np.flatnonzero(sel)
    for v in outs:
        ctx.state.save_rows(i, v, rows)
    parts = None
    if ctx is not None and ctx.stats() is not None:
        from .exchange import statistics_of
        from .parts import load_checked as _load
        from .parts import stats_numpy as _np

        part = _load(shard)
        parts = _np(statistics_of(ctx.stats(), part.embeddings, q, rows))
    return int(rows.size), int(t[rows].sum()), parts, rows if want_rows else None


# ------------------------------------------------------------------ the coordinator
def token_totals(ex, shards: list) -> dict:
    """Every shard's tokens, read by its own task: {"total", "largest", "per_shard"}."""
    res = ex.map(task_token_summary, [(s,) for s in shards])
    per = [int(r[0]) for r in res]
    return {"total": int(sum(per)), "largest": int(max((r[1] for r in res), default=0)),
            "per_shard": per}


def _pivot(ex, args: list, base: tuple, w: int, ascending: bool, q_range: tuple):
    """The eligible row where the running tokens (in the phase's order) first pass ``w``
    (the caller knows the eligible rows hold more): (pivot, tokens before it, its tokens,
    histogram levels)."""
    region: list = []
    lo, hi = q_range
    acc = 0
    while True:
        res = ex.map(task_fit_hist, args, shared=base + (region, lo, hi))
        cnt = np.sum([r[0] for r in res], axis=0)
        tok = np.sum([r[1] for r in res], axis=0)
        mn = np.min([r[2] for r in res], axis=0)
        mx = np.max([r[3] for r in res], axis=0)
        walk = np.arange(HIST_BINS) if ascending else np.arange(HIST_BINS)[::-1]
        cum = np.cumsum(tok[walk])
        j = int(np.searchsorted(cum, w - acc, side="right"))
        b = int(walk[j])
        acc += int(cum[j] - tok[b])
        region = region + [(lo, hi, b)]
        if cnt[b] <= VALUES_MAX or not mx[b] > mn[b] or len(region) >= MAX_LEVELS:
            break
        lo, hi = float(mn[b]), float(mx[b])
    per = ex.map(task_fit_values, args, shared=base + (region,))
    vals = np.unique(np.concatenate([v for v, _ in per]))
    vtok = np.zeros(vals.size, dtype=np.int64)
    for v, t in per:
        np.add.at(vtok, np.searchsorted(vals, v), t)
    walk = np.arange(vals.size) if ascending else np.arange(vals.size)[::-1]
    cum = np.cumsum(vtok[walk])
    j = int(np.searchsorted(cum, w - acc, side="right"))
    v = float(vals[walk[j]])
    acc += int(cum[j] - vtok[walk[j]])
    for s, (vs, ts) in enumerate(per):  # shards in order: ties go to the first rows
        here = int(ts[vs == v].sum()) if vs.size else 0
        if acc + here > w:
            break
        acc += here
    row, before, t_row = ex.map(task_fit_row, [args[s]], shared=base + (v, w - acc))[0]
    return Pivot(v, s, row), acc + before, t_row, len(region)


def fit_sharded(ex, shards: list, target: int, starts: list, state=None, *, outs=None,
                ctx=None, want_rows: bool = False, log=lambda msg: None) -> dict:
    """``fit_tokens`` of the corpus (``shards``, kept views, in order) by quality from the
    start selection ``starts[i]`` of each shard (None: nothing; rows; or a version of
    ``state``), run as tasks on ``ex``. Each shard's result is saved as the versions
    ``outs[i]`` (a tuple) of ``ctx.state``. Returns {"counts", "tokens" (the result's total),
    "parts" (each shard's statistics, when ``ctx``'s term has them), "rows" (with
    ``want_rows``), "plan", "passes" (of the summaries and the tail), "levels" (the most
    histogram levels a pivot took)}."""
    plan = Plan()
    args = [(i, s, starts[i]) for i, s in enumerate(shards)]
    passes = levels = 0

    def summary(phase):
        nonlocal passes
        passes += 1
        res = ex.map(task_fit_summary, args, shared=(state, plan, phase))
        return (int(sum(r[0] for r in res)), min(r[1] for r in res), max(r[2] for r in res))

    total, qlo, qhi = summary("drop")
    if total > target:  # 1. drop the members of lowest quality while over the target
        plan.drop, before, t_d, lv = _pivot(ex, args, (state, plan, "drop"), total - target - 1,
                                        True, (qlo, qhi))
        total -= before + t_d
        levels = max(levels, lv)
    elig, qlo, qhi = summary("fill")
    slack = target - total
    if elig <= slack:  # 2. every other row fits
        plan.fill_all = True
        total += elig
    else:
        plan.fill, before, _, lv = _pivot(ex, args, (state, plan, "fill"), slack, False,
                                          (qlo, qhi))
        levels = max(levels, lv)
        total += before
        slack -= before
        after, m = plan.fill, TAIL_BASE  # 3. later rows that still fit, first-fit in order
        while slack > 0:
            passes += 1
            res = ex.map(task_fit_tail, args, shared=(state, plan, "fill", after, slack, m))
            q = np.concatenate([r[0] for r in res])
            row = np.concatenate([r[1] for r in res]).astype(np.int64)
            t = np.concatenate([r[2] for r in res]).astype(np.int64)
            sh = np.concatenate([np.full(r[1].size, i, dtype=np.int64)
                                 for i, r in enumerate(res)])
            order = np.lexsort((row, sh, -q))
            q, row, t, sh = q[order], row[order], t[order], sh[order]
            # decided up to the earliest last row of a shard that has more
            ends = [Pivot(float(r[0][-1]), i, int(r[1][-1])) for i, r in enumerate(res)
                    if r[3] and r[1].size]
            stop = q.size
            if ends:
                end = min(ends, key=lambda p: (-p.q, p.shard, p.row))
                stop = int(np.flatnonzero((q == end.q) & (sh == end.shard)
                                          & (row == end.row))[0]) + 1
            for j in range(stop):
                if t[j] <= slack:
                    plan.picks.setdefault(int(sh[j]), []).append(int(row[j]))
                    slack -= int(t[j])
                    total += int(t[j])
            if not ends:
                break
            after, m = end, min(2 * m, TAIL_MAX)
    zero = outs is None
    res = ex.map(task_fit_apply, [(i, s, starts[i], () if zero else outs[i], ctx, want_rows)
                                  for i, s in enumerate(shards)], shared=(state, plan))
    got = int(sum(r[1] for r in res))
    assert got == total, (got, total)  # the shards' sum is the coordinator's
    log(f"corpus: token fit by quality in {passes} pass(es): {got:,} tokens, "
        f"{sum(len(v) for v in plan.picks.values()):,} tail row(s)")
    return {"counts": [r[0] for r in res], "tokens": got, "parts": [r[2] for r in res],
            "rows": [r[3] for r in res] if want_rows else None, "plan": plan,
            "passes": passes, "levels": levels}

