"""The corpus selection over shards that stay with their tasks (modes ``per_shard`` and
``exchange``): one task per shard for every pass (the shard's own selection, each round's
candidates, the scoring), mapped by an executor (:mod:`engine.corpus.executor`: in this
process or as Ray tasks).

The coordinator holds the budget's allocation, the selection's sufficient statistics and
one round's candidates: O(shards · d² + candidates), never a row of every shard. Each shard's
selected rows live in the run's state (:class:`checkpoint.RunState`, on the data root's
storage), one small file per shard and version, written by the shard's own task; the
coordinator's round is saved there too, so a killed run resumes from its last round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .. import storage
from .budget import allocate
from .checkpoint import RunState
from .parts import _select_part
from .parts import load_checked as _load
from .parts import stats_numpy as _np
from .exchange import (finished, gains_of, next_candidates, shard_candidates, statistics_of,
                       swap_search)
from .stats import HAS_STATS, stats_for

__all__ = ["RunContext", "ShardedRun", "HIST_BINS"]

HIST_BINS = 1 << 16  # the quality histogram that finds the corpus's quality top-k threshold
# the candidates of one round, all shards together, each way, before a round that swapped
# most of its candidates doubles them (up to 8×, and within CANDIDATE_BYTES)
CANDIDATES_TOTAL = 1 << 18
# the coordinator's memory for one round's candidate rows, both ways: each row arrives as
# float32 and is held in the statistics' float64 frame with its quality and place (12·d + 24
# bytes); the doubling stops here, so the coordinator's round stays bounded at every d
CANDIDATE_BYTES = 1 << 31
# token budgets: the run state's version that holds the quality order filled to the target
REFERENCE = 99_999


def candidate_cap(shards: int, d: int, base: int) -> int:
    """The most candidates a shard sends each way in one round: ``CANDIDATE_BYTES`` over both
    ways of every shard's rows, never below ``base`` (the first round's count)."""
    per_row = 12 * int(d) + 24
    return max(int(base), CANDIDATE_BYTES // (2 * per_row * max(1, int(shards))))


@dataclass
class RunContext:
    """What every task of one run shares (one object in Ray's store)."""

    cfg: object  # LearnerConfig
    term: str
    lamb: float
    d: int
    ref: np.ndarray | None
    state: RunState
    device: str
    mem_budget: int | None

    def stats(self):
        """The term's sufficient statistics; None for a term without (facility location)."""
        if self.term not in HAS_STATS:
            return None
        return stats_for(self.term, self.lamb, self.d, ref=self.ref)


def _torch(parts: dict) -> dict:
    return {n: torch.as_tensor(np.asarray(v, dtype=np.float64)) for n, v in parts.items()}


def _sum_parts(st, many: list) -> dict:
    total = st.zero()
    for p in many:
        total = {n: total[n] + torch.as_tensor(np.array(p[n], dtype=np.float64)) for n in total}
    return total


def _moves(in_shard, in_row, out_shard, out_row) -> dict:
    """{shard: (rows entering, rows leaving)} of a round's swaps, from each side's shard and
    row (what :meth:`ShardedRun._apply` takes)."""
    moves: dict = {}
    for side, (shard, row) in enumerate(((in_shard, in_row), (out_shard, out_row))):
        for i in np.unique(shard):
            moves.setdefault(int(i), ([], []))[side].extend(row[shard == i].tolist())
    return moves


def _mask(n: int, rows: np.ndarray) -> np.ndarray:
    m = np.zeros(n, dtype=bool)
    m[rows] = True
    return m


# ------------------------------------------------------------------ tasks (one shard each)
def task_head(_, shard):
    """The shard's width and first row (the DiSF statistics' reference point)."""
    part = _load(shard)
    return part.d, np.asarray(part.embeddings[0], dtype=np.float64)


def task_start(ctx: RunContext, i: int, shard, k: int, warm):
    """The shard's start selection (its own k rows by the shard solver, the rows of an earlier
    attempt's state, or ``warm``: rows in the shard's own numbering, or the uri of its file
    of the last selection), saved as version 0, with its statistics and the
    range of its quality."""
    from ..device import resolve_device

    done = ctx.state.load_rows(i, 0)
    part = _load(shard)
    if done is not None:
        rows, route = done
        how = "resumed"
    elif warm is not None:
        if isinstance(warm, str):  # the last selection's file of this shard (own numbering)
            warm = storage.read_table(warm, ["row"]).column("row").to_numpy()
        rows = np.unique(shard.kept_rows(warm))
        rows, route, how = rows[(rows >= 0) & (rows < part.n)], "warm start", "warm"
    else:
        rows, route = _select_part(part, int(k), ctx.cfg, resolve_device(ctx.device),
                                   ctx.mem_budget)
        how = "selected"
    rows = np.sort(np.asarray(rows, dtype=np.int64))
    if done is None:
        ctx.state.save_rows(i, 0, rows, route)
    st = ctx.stats()
    q = np.asarray(part.quality, dtype=np.float64)
    return {"route": route, "count": int(rows.size), "how": how,
            "parts": None if st is None else _np(statistics_of(st, part.embeddings, q, rows)),
            "q_min": float(q.min()), "q_max": float(q.max())}


def task_candidates(shared, i: int, shard, version: int):
    """One round's candidates of a shard: its best ``m`` non-members and worst ``m`` members
    under the gradient, with their rows (float32) and quality."""
    ctx, grad, m = shared
    st = ctx.stats()
    rows, _ = ctx.state.load_rows(i, version)
    part = _load(shard)
    q = np.asarray(part.quality, dtype=np.float64)
    non, mem = shard_candidates(st, _torch(grad), part.embeddings, q, _mask(part.n, rows), m)
    x = part.embeddings
    return (non, np.asarray(x[non], dtype=np.float32), q[non],
            mem, np.asarray(x[mem], dtype=np.float32), q[mem])


def task_fit(shared, i: int, shard, version: int):
    """For a start of the wrong size: the shard's ``need`` rows of best gain to add (or of
    worst gain to remove), with their gains."""
    ctx, grad, need, adding = shared
    rows, _ = ctx.state.load_rows(i, version)
    part = _load(shard)
    a = gains_of(ctx.stats(), _torch(grad), part.embeddings,
                 np.asarray(part.quality, dtype=np.float64))
    sel = _mask(part.n, rows)
    pool = np.flatnonzero(~sel if adding else sel)
    key = -a[pool] if adding else a[pool]
    if pool.size > need:
        pool = pool[np.argpartition(key, need - 1)[:need]]
    return pool, a[pool]


def task_apply(ctx: RunContext, i: int, v_in: int, v_out: int, add, remove):
    """A shard's accepted swaps: version ``v_out`` = ``v_in`` + ``add`` − ``remove``."""
    rows, route = ctx.state.load_rows(i, v_in)
    rows = np.union1d(np.setdiff1d(rows, np.asarray(remove, dtype=np.int64)),
                      np.asarray(add, dtype=np.int64))
    ctx.state.save_rows(i, v_out, rows, route)
    return int(rows.size)


def task_tokens_selected(ctx: RunContext, i: int, shard, version: int):
    """The tokens of the shard's selected rows (token budgets)."""
    rows, _ = ctx.state.load_rows(i, version)
    return int(shard.token_counts()[rows].sum())


def task_token_pass(shared, i: int, shard, version: int):
    """One shard's candidates for a move of the token budget (:mod:`engine.corpus.knapsack`):
    every row's gain per token under the corpus's statistics, then for each of ``wants``
    (``in``, ``out``, ``fill``) its best ``m`` rows with their rows (float32), quality, tokens
    and gain per token; for ``fill`` also how many non-members still fit ``slack``."""
    from .knapsack import per_token, token_candidates, values_of

    ctx, grad, dk, m, wants, slack = shared
    st = ctx.stats()
    rows, _ = ctx.state.load_rows(i, version)
    part = _load(shard)
    q = np.asarray(part.quality, dtype=np.float64)
    t = shard.token_counts()
    sel = _mask(part.n, rows)
    rho = per_token(values_of(st, _torch(grad), dk, part.embeddings, q), t)
    out = {}
    for want in wants:
        idx = token_candidates(rho, t, sel, m, want, slack)
        out[want] = (idx, np.asarray(part.embeddings[idx], dtype=np.float32), q[idx], t[idx],
                     rho[idx])
    if "fill" in wants:
        out["fits"] = int(np.count_nonzero(~sel & (t <= slack)))
    return out


def task_quality(_, shard):
    """The shard's quality (whole-corpus scoring; the values :func:`topk_threshold` ranks)."""
    return np.asarray(_load(shard).quality, dtype=np.float64)


def task_rows(ctx: RunContext, i: int, version: int):
    return ctx.state.load_rows(i, version)[0]


def task_histogram(shared, *args):
    """A task's values (``values(inner, *args)``) counted in the corpus's bins."""
    values, inner, lo, hi, bins = shared
    v = values(inner, *args)
    return np.histogram(v, bins=bins, range=(lo, hi))[0].astype(np.int64)


def task_bin_values(shared, *args):
    """The distinct values of a task inside one bin, with their counts."""
    values, inner, lo, hi, bins, b = shared
    v = values(inner, *args)
    idx = np.clip(((v - lo) / (hi - lo) * bins).astype(np.int64), 0, bins - 1) if hi > lo \
        else np.zeros(v.size, dtype=np.int64)
    return np.unique(v[idx == b], return_counts=True)


def task_score(shared, i: int, shard, version: int, take_eq: int, n_random: int):
    """The statistics of the shard's part of three selections (the run's, the corpus's
    quality top-k: rows above ``t`` and the first ``take_eq`` rows at ``t``, and ``n_random``
    random rows), and the run's selected rows in the shard's own numbering (or, with a
    ``sink``, what the sink returns after writing them)."""
    ctx, t, seed, sink = shared
    st = ctx.stats()
    rows, _ = ctx.state.load_rows(i, version)
    part = _load(shard)
    q = np.asarray(part.quality, dtype=np.float64)
    top = np.union1d(np.flatnonzero(q > t), np.flatnonzero(q == t)[:take_eq])
    rng = np.random.default_rng([seed, i])
    rnd = np.sort(rng.choice(part.n, size=n_random, replace=False)) if n_random else \
        np.zeros(0, dtype=np.int64)
    x = part.embeddings
    own = shard.own_rows(rows)
    return ({"selection": _np(statistics_of(st, x, q, rows)),
             "quality_topk": _np(statistics_of(st, x, q, top)),
             "random": _np(statistics_of(st, x, q, rnd))},
            own if sink is None else sink.write(shard.key, own))


def task_publish(shared, i: int, shard, version: int):
    """The shard's selected rows written by ``sink`` (its own numbering); returns what the
    sink returns (the count and digest)."""
    ctx, sink = shared
    rows, _ = ctx.state.load_rows(i, version)
    return sink.write(shard.key, shard.own_rows(rows))


def task_write(sink, key: str, rows):
    """Rows the coordinator holds (a route that gathered them) written by ``sink``."""
    return sink.write(key, rows)


def kth_largest(ex, values, inner, args: list, k: int, v_range: tuple) -> tuple[float, list]:
    """The k-th largest of values spread over tasks, without gathering them: (t, how many of
    its values at t each task takes), from a histogram of every task's values
    (``values(inner, *a)`` for each ``a`` of ``args``, all in ``v_range``) and the distinct
    values of the bin that holds the k-th; ties at t go to the tasks in order. At least k
    values in all."""
    lo, hi = v_range
    bins = HIST_BINS
    hist = np.sum(ex.map(task_histogram, args, shared=(values, inner, lo, hi, bins)), axis=0)
    above = np.cumsum(hist[::-1])[::-1]  # values in bin b or higher
    b = int(np.flatnonzero(above >= k).max())
    over = int(above[b + 1]) if b + 1 < bins else 0  # values in higher bins
    per = ex.map(task_bin_values, args, shared=(values, inner, lo, hi, bins, b))
    vals = np.unique(np.concatenate([v for v, _ in per]))
    cnt = np.zeros(vals.size, dtype=np.int64)
    for v, c in per:
        cnt[np.searchsorted(vals, v)] += c
    above_v = over + np.cumsum(cnt[::-1])[::-1]  # values at or above each value
    j = int(np.flatnonzero(above_v >= k).max())
    t = float(vals[j])
    gt = int(above_v[j] - cnt[j])
    rest = k - gt
    takes = []
    for v, c in per:
        here = int(c[v == t].sum()) if v.size else 0
        takes.append(min(here, rest))
        rest -= takes[-1]
    return t, takes


def topk_threshold(ex, shards: list, k: int, q_range: tuple) -> tuple[float, list]:
    """The corpus's quality top-k without its rows: (t, rows at t each shard takes)
    (:func:`kth_largest` of the shards' quality); ties at t go to the first rows in (shard,
    row) order."""
    return kth_largest(ex, task_quality, None, [(s,) for s in shards], k, q_range)


# ------------------------------------------------------------------ the coordinator
class ShardedRun:
    """One per_shard or exchange run over ``shards`` (kept views) with ``executor``."""

    def __init__(self, shards: list, ctx: RunContext, executor, k: int, log):
        self.shards, self.ctx, self.ex, self.k, self.log = shards, ctx, executor, k, log
        self.st = ctx.stats()
        self.versions = [0] * len(shards)
        self.parts = None
        self.routes: dict = {}
        self.q_range = (np.inf, -np.inf)
        self.reference = None  # token budgets: the quality order filled to the target
        self.token_summary = None  # token budgets: {"total", "largest", "per_shard"}

    # ---- the start
    def start(self, warm: dict | None) -> None:
        """Every shard's start selection (its proportional share, or the warm rows)."""
        alloc = allocate([s.n for s in self.shards], self.k)
        args = [(i, s, int(alloc[i]), None if warm is None else warm.get(s.key, []))
                for i, s in enumerate(self.shards)]
        res = self.ex.map(task_start, args, shared=self.ctx)
        for s, r in zip(self.shards, res):
            self.routes[s.key] = r["route"]
            if r["how"] == "resumed":
                self.log(f"corpus: {s.key}: {r['count']:,} of {s.n:,} rows ({r['route']}), "
                         "from the checkpoint of an earlier attempt")
            elif r["how"] == "selected":
                self.log(f"corpus: {s.key}: {r['count']:,} of {s.n:,} rows ({r['route']})")
        if self.st is not None:
            self.parts = _sum_parts(self.st, [r["parts"] for r in res])
        self.count = int(sum(r["count"] for r in res))
        self.q_range = (min(r["q_min"] for r in res), max(r["q_max"] for r in res))

    def fit_count(self) -> dict:
        """A start of any size made k rows by the linearised gains across all shards."""
        have, k = self.count, self.k
        if have == k:
            return {"added": 0, "removed": 0}
        adding, need = k > have, abs(k - have)
        grad = _np(self.st.gradient(self.parts, max(have, 2)))
        res = self.ex.map(task_fit, [(i, s, self.versions[i]) for i, s in enumerate(self.shards)],
                          shared=(self.ctx, grad, need, adding))
        rows = np.concatenate([r[0] for r in res])
        owner = np.concatenate([np.full(r[0].size, i) for i, r in enumerate(res)])
        gains = np.concatenate([r[1] for r in res])
        order = np.argsort(-gains if adding else gains, kind="stable")[:need]
        moves = {i: rows[order][owner[order] == i] for i in set(owner[order].tolist())}
        self._apply({i: (m, []) if adding else ([], m) for i, m in moves.items()})
        self.parts = self._recount()
        self.count = k
        return {"added": need if adding else 0, "removed": 0 if adding else need}

    def _recount(self) -> dict:
        res = self.ex.map(task_score, [(i, s, self.versions[i], 0, 0)
                                       for i, s in enumerate(self.shards)],
                          shared=(self.ctx, np.inf, 0, None))
        return _sum_parts(self.st, [r[0]["selection"] for r in res])

    def _apply(self, moves: dict) -> None:
        """Each shard's (add, remove) rows as its next version (only the shards that move)."""
        args = [(i, self.versions[i], self.versions[i] + 1, a, r) for i, (a, r) in moves.items()]
        self.ex.map(task_apply, args, shared=self.ctx)
        for i in moves:
            self.versions[i] += 1

    # ---- the rounds
    def rounds(self, candidates: int, max_rounds: int, rtol: float, time_budget_s, on_round):
        """Exchange rounds until no swap improves f: (rounds log, converged)."""
        t_start = time.perf_counter()
        state = self.ctx.state
        resume = state.load_round()
        log_, first = [], 0
        base = max(16, min(candidates, CANDIDATES_TOTAL // max(1, len(self.shards))))
        cap = candidate_cap(len(self.shards), self.ctx.d, base)
        m = base
        if resume is not None:
            first, self.versions, parts, log_, extra = resume
            self.parts = _torch(parts)
            m = int(extra["m"])
            self.log(f"corpus: resuming the exchange after round {first} (checkpoint of an "
                     "earlier attempt)")
            if log_ and finished(log_[-1], rtol):
                return log_, True
        converged = False
        for r in range(first, max_rounds):
            t0 = time.perf_counter()
            f_before = self.st.f(self.parts, self.k)["f"]
            grad = _np(self.st.gradient(self.parts, self.k))
            res = self.ex.map(task_candidates,
                              [(i, s, self.versions[i]) for i, s in enumerate(self.shards)],
                              shared=(self.ctx, grad, m))
            # each candidate's shard and row (arrays: a round can hold millions)
            in_shard = np.concatenate([np.full(c[0].size, i, dtype=np.int64)
                                       for i, c in enumerate(res)])
            out_shard = np.concatenate([np.full(c[3].size, i, dtype=np.int64)
                                        for i, c in enumerate(res)])
            if not in_shard.size or not out_shard.size:
                converged = True
                break
            in_row = np.concatenate([c[0] for c in res]).astype(np.int64)
            out_row = np.concatenate([c[3] for c in res]).astype(np.int64)
            xin = self.st.rows(np.concatenate([c[1] for c in res]))
            qin = np.concatenate([c[2] for c in res])
            xout = self.st.rows(np.concatenate([c[4] for c in res]))
            qout = np.concatenate([c[5] for c in res])
            sent = (xin.shape[0] + xout.shape[0]) * (self.ctx.d * 4 + 8 + 8)
            self.parts, f_now, swaps = swap_search(self.st, self.parts, self.k, xin, qin,
                                                   xout, qout)
            J = np.asarray([j for j, _ in swaps], dtype=np.int64)
            O = np.asarray([o for _, o in swaps], dtype=np.int64)
            self._apply(_moves(in_shard[J], in_row[J], out_shard[O], out_row[O]))
            info = {"round": r + 1, "swaps": len(swaps), "candidates": m,
                    "f_before": f_before, "f": f_now, "seconds": time.perf_counter() - t0,
                    "bytes_exchanged": int(sent)}
            m = next_candidates(m, len(swaps), in_shard.size, out_shard.size, base, cap)
            info["next_candidates"] = m
            log_.append(info)
            state.save_round(r + 1, self.versions, _np(self.parts), log_, {"m": m})
            self.log(f"corpus: exchange round {r + 1}: {len(swaps):,} swaps, "
                     f"f={f_now:.8g} ({info['seconds']:.1f}s)")
            if on_round is not None:
                on_round(info)
            if finished(info, rtol):
                converged = True
                break
            if time_budget_s is not None and time.perf_counter() - t_start > time_budget_s:
                break
        return log_, converged

    # ---- the end
    def tokens(self) -> dict:
        """Every shard's tokens and the largest document, read by the shards' own tasks
        (once: :func:`token_fit.token_totals`)."""
        from .token_fit import token_totals

        if self.token_summary is None:
            self.token_summary = token_totals(self.ex, self.shards)
        return self.token_summary

    def fit_tokens(self, target: int) -> dict:
        """Token budgets: the selection fitted to the target by quality, exactly as
        ``budget.fit_tokens`` on the gathered corpus (:func:`token_fit.fit_sharded`: token-
        weighted quality histograms and bounded tail candidates; no row's tokens or quality
        here)."""
        from .token_fit import fit_sharded

        got = fit_sharded(self.ex, self.shards, target, list(self.versions), self.ctx.state,
                          outs=[(v + 1,) for v in self.versions], ctx=self.ctx, log=self.log)
        self.versions = [v + 1 for v in self.versions]
        self.k = int(sum(got["counts"]))
        summary = self.tokens()
        return {"selected": got["tokens"], "largest_document": summary["largest"],
                "corpus": summary["total"]}

    def reference_rows(self) -> np.ndarray:
        """The rows (global numbering, shards in order) of the quality order filled to the
        target (:meth:`token_budget`'s reference): for a corpus that fits one selection."""
        rows = self.ex.map(task_rows, [(i, REFERENCE) for i in range(len(self.shards))],
                           shared=self.ctx)
        offsets = np.cumsum([0] + [s.n for s in self.shards])
        return np.concatenate([np.zeros(0, dtype=np.int64)] +
                              [np.asarray(r, dtype=np.int64) + offsets[i]
                               for i, r in enumerate(rows)])

    # ---- token budgets: cost-aware moves (engine.corpus.knapsack)
    def _token_pass(self, m: int, wants: tuple, slack: int | None = None):
        """Every shard's candidates for a token move, joined: {want: (shard of each row, row,
        rows in the statistics' frame, quality, tokens, gain per token)}, and the number of
        non-members that still fit ``slack``."""
        from .knapsack import k_slope

        grad = _np(self.st.gradient(self.parts, self.k))
        dk = k_slope(self.st, self.parts, self.k)
        res = self.ex.map(task_token_pass,
                          [(i, s, self.versions[i]) for i, s in enumerate(self.shards)],
                          shared=(self.ctx, grad, dk, m, wants, slack))
        out = {}
        for want in wants:
            got = [r[want] for r in res]
            out[want] = (np.concatenate([np.full(g[0].size, i) for i, g in enumerate(got)]),
                         np.concatenate([g[0] for g in got]),
                         self.st.rows(np.concatenate([g[1] for g in got])),
                         np.concatenate([g[2] for g in got]),
                         np.concatenate([g[3] for g in got]).astype(np.int64),
                         np.concatenate([g[4] for g in got]))
        return out, sum(r.get("fits", 0) for r in res)

    def _token_move(self, cand, pos, sign: float) -> dict:
        """Add (sign 1) or remove (-1) the candidates at ``pos``: statistics, k and tokens
        here; {shard: rows} for :meth:`_apply`."""
        owner, rows, x, q, t, _ = cand
        self.parts = self.st.add(self.parts, x[pos], q[pos], sign=sign)
        self.k += int(sign) * int(pos.size)
        self.total += int(sign) * int(t[pos].sum())
        return {int(i): rows[pos][owner[pos] == i] for i in np.unique(owner[pos])}

    def _token_fit(self, target: int, m: int) -> dict:
        """Drop the members of lowest gain per token while over ``target``, then add the
        non-members of highest gain per token while one fits: at most ``target`` tokens and
        no unselected row that still fits."""
        from .knapsack import pick_drop, pick_fill

        dropped = added = 0
        while self.total > target:
            cand, _ = self._token_pass(m, ("out",))
            pos = pick_drop(cand["out"][5], cand["out"][4], self.total - target)
            moves = self._token_move(cand["out"], pos, -1.0)
            self._apply({i: ([], r) for i, r in moves.items()})
            dropped += int(pos.size)
        while True:
            slack = target - self.total
            cand, fits = self._token_pass(m, ("fill",), slack)
            if fits == 0:
                break
            pos = pick_fill(cand["fill"][5], cand["fill"][4], slack)
            moves = self._token_move(cand["fill"], pos, 1.0)
            self._apply({i: (r, []) for i, r in moves.items()})
            added += int(pos.size)
        return {"dropped": dropped, "added": added}

    def token_budget(self, target: int, candidates: int, max_rounds: int, rtol: float,
                     search: bool = True, reference: bool = True,
                     time_budget_s: float | None = None) -> dict:
        """A token budget inside the objective, for a term with statistics: the start (the
        row-budget selection) fitted to ``target`` by gain per token; with ``reference``, the
        corpus's quality order filled to the target (``fit_tokens`` from nothing) is scored too
        and the better of the two is the start; with ``search``, cost-aware swap rounds
        (:func:`knapsack.token_swap_search`, then the fit) while a round raises f. The result
        holds at most ``target`` tokens, no unselected row still fits, and f is never below
        the start's; no round starts after ``time_budget_s``. The reference is fitted by the
        shards' tasks (:func:`token_fit.fit_sharded`); its rows stay in the run's state
        (version ``REFERENCE``)."""
        from .knapsack import token_swap_search

        m = max(16, min(candidates, CANDIDATES_TOTAL // max(1, len(self.shards))))
        self.total = int(sum(self.ex.map(task_tokens_selected,
                                         [(i, s, self.versions[i])
                                          for i, s in enumerate(self.shards)],
                                         shared=self.ctx)))
        fit = self._token_fit(target, m)
        info = {"start": "the row-budget selection fitted by gain per token", **fit,
                "rounds": [], "f_fitted": self.st.f(self.parts, self.k)["f"]}
        self.log(f"corpus: token budget: start fitted by gain per token ({fit['dropped']:,} "
                 f"dropped, {fit['added']:,} added), f={info['f_fitted']:.8g}")
        self.reference = None
        if reference:  # fit_tokens from nothing, by the shards' tasks (token_fit)
            from .token_fit import fit_sharded

            got = fit_sharded(self.ex, self.shards, target, [None] * len(self.shards),
                              self.ctx.state, outs=[(REFERENCE, v + 1) for v in self.versions],
                              ctx=self.ctx, log=self.log)
            parts = _sum_parts(self.st, got["parts"])
            k_ref = int(sum(got["counts"]))
            f_ref = self.st.f(parts, k_ref)
            self.reference = {"version": REFERENCE, "score": f_ref}
            info["f_quality_filled"] = f_ref["f"]
            if f_ref["f"] > info["f_fitted"]:
                self.versions = [v + 1 for v in self.versions]
                self.parts, self.k = _torch(_np(parts)), k_ref
                self.total = int(got["tokens"])
                info["start"] = "the quality order filled to the target (scored above the fit)"
                self.log("corpus: token budget: the quality order filled to the target scores "
                         f"f={f_ref['f']:.8g}, above the fit: the rounds start there")
        t_search = time.perf_counter()
        for r in range(max_rounds if search else 0):
            t0 = time.perf_counter()
            if time_budget_s is not None and t0 - t_search > time_budget_s:
                info["stopped"] = "time_budget"
                break
            before = (list(self.versions), self.parts, self.k, self.total)
            f_before = self.st.f(self.parts, self.k)["f"]
            cand, _ = self._token_pass(m, ("in", "out"))
            ci, co = cand["in"], cand["out"]
            self.parts, self.k, self.total, _, J, O = token_swap_search(
                self.st, self.parts, self.k, self.total, target, ci[2], ci[3], ci[4],
                co[2], co[3], co[4])
            self._apply(_moves(ci[0][J], ci[1][J], co[0][O], co[1][O]))
            fit = self._token_fit(target, m)
            f_now = self.st.f(self.parts, self.k)["f"]
            step = {"round": r + 1, "entered": int(J.size), "left": int(O.size),
                    "filled": fit["added"], "f_before": f_before, "f": f_now,
                    "seconds": time.perf_counter() - t0}
            if not f_now > f_before + 1e-13 * max(1.0, abs(f_before)):
                self.versions, self.parts, self.k, self.total = before  # undone: no gain
                step.update(f=f_before, undone=True)
                info["rounds"].append(step)
                break
            info["rounds"].append(step)
            self.log(f"corpus: token round {r + 1}: {J.size:,} in, {O.size:,} out, "
                     f"{fit['added']:,} filled, f={f_now:.8g}")
            if f_now - f_before < rtol * max(abs(f_now), 1e-12):
                break
        info["f"] = self.st.f(self.parts, self.k)["f"]
        summary = self.tokens()
        info.update(selected=int(self.total), largest_document=summary["largest"],
                    corpus=summary["total"])
        return info

    def topk_threshold(self) -> tuple[float, list]:
        """The corpus's quality top-k threshold (:func:`topk_threshold`)."""
        return topk_threshold(self.ex, self.shards, self.k, self.q_range)

    def score(self, seed: int, sink=None) -> tuple[dict, dict]:
        """Whole-corpus f of the selection, quality top-k and random from their statistics,
        and each shard's selected rows in its own numbering (with a ``sink``: written by the
        shard's task, and what the sink returned)."""
        t, takes = self.topk_threshold()
        sizes = np.array([s.n for s in self.shards], dtype=np.int64)
        n_random = np.random.default_rng(seed).multivariate_hypergeometric(sizes, self.k)
        res = self.ex.map(task_score, [(i, s, self.versions[i], takes[i], int(n_random[i]))
                                       for i, s in enumerate(self.shards)],
                          shared=(self.ctx, t, seed, sink))
        scores = {}
        for name in ("selection", "quality_topk", "random"):
            scores[name] = self.st.f(_sum_parts(self.st, [r[0][name] for r in res]), self.k)
        return scores, {s.key: r[1] for s, r in zip(self.shards, res)}

    def selected_rows(self, sink=None) -> dict:
        """Each shard's selected rows in its own numbering (with a ``sink``: written by the
        shard's task, and what the sink returned)."""
        if sink is not None:
            got = self.ex.map(task_publish, [(i, s, self.versions[i])
                                             for i, s in enumerate(self.shards)],
                              shared=(self.ctx, sink))
            return {s.key: g for s, g in zip(self.shards, got)}
        rows = self.ex.map(task_rows, [(i, self.versions[i]) for i in range(len(self.shards))],
                           shared=self.ctx)
        return {s.key: s.own_rows(r) for s, r in zip(self.shards, rows)}
