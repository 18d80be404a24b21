"""Selecting for the corpus: one budget and one objective over every shard.

:func:`select_corpus` is the engine's single entry for the corpus stage. Modes:

* ``gather``: one selection over the whole corpus (every shard's rows together) with the
  shard solver (:func:`engine.select.select_shard`): exact, bounded by one machine's memory.
* ``exchange``: each shard selected alone with its proportional share of the budget, then
  exchange rounds (:mod:`engine.corpus.exchange`) on the corpus's f through the selection's
  sufficient statistics: moves rows between shards until no swap improves. Pair-wise and DiSF.
* ``per_shard``: each shard alone with its proportional share (the paper's independent
  blocks, with the corpus budget met exactly).
* ``random_blocks``: the corpus re-cut into random blocks by a keyed hash of the id (the
  paper's blocks), each selected alone with its share.
* ``auto``: ``gather`` while the corpus fits (``gather_max_rows`` and the memory
  pre-flight), else ``exchange`` for the terms with statistics, else ``per_shard``.

``gather`` and ``random_blocks`` hold the corpus in one process; ``per_shard`` and
``exchange`` run one task per shard for every pass (:mod:`engine.corpus.sharded`, in this
process or on Ray) and hold O(shards · d² + candidates) here. Every mode returns a :class:`CorpusSelection` whose scores are the whole corpus's f.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..config import ConfigError, LearnerConfig
from .budget import CorpusBudget, allocate, fit_tokens
from .parts import Part, _arrays, _ratio_for, _select_part, block_of  # noqa: F401 (Part, block_of: public here too)
from .stats import HAS_STATS

__all__ = ["CorpusShard", "CorpusSelection", "MODES", "select_corpus", "block_of",
           "GATHER_MAX_ROWS", "Part"]

MODES = ("auto", "gather", "exchange", "per_shard", "random_blocks")
GATHER_MAX_ROWS = 1_000_000
# the terms with an exchange route: sufficient statistics, or facility location's blocks
EXCHANGE_TERMS = HAS_STATS + ("Facility",)
WHOLE = "whole corpus (the shard objective on all rows)"


@dataclass
class CorpusShard:
    """One shard of the corpus: its key, row count, a loader of its validated features
    (an engine ``Shard``: ids, quality, embeddings) and, for token budgets, its rows' token
    counts: an array (a small or test corpus) or a loader that returns it (e.g. a
    ``functools.partial`` of ``shards.read_tokens``), called by the shard's own task
    (:meth:`token_counts`), so the coordinator never reads a row's count.

    ``keep``: the rows that may be selected (deduplication), a bool mask or a function that
    returns it (read by the shard's own task, so the coordinator never holds every shard's
    mask); None = all. A function needs ``n_kept``, the number of rows it keeps. Loaders and
    masks must pickle (a module-level function or ``functools.partial``) for Ray tasks."""

    key: str
    n: int
    load: Callable
    tokens: object = None  # np.ndarray, a picklable function returning it, or None
    version: str | None = None  # e.g. the features file's content hash: part of checkpoint keys
    keep: object = None
    n_kept: int | None = None
    keep_of: object = None  # in a kept view: the original shard's keep (maps rows back)

    def kept(self) -> "CorpusShard":
        """This shard restricted to its kept rows (row numbers renumbered; ``own_rows`` maps
        them back)."""
        if self.keep is None:
            return self
        if callable(self.keep):
            if self.n_kept is None:
                raise ConfigError(f"shard {self.key}: a keep function needs n_kept")
            n = int(self.n_kept)
            # read where the counts are read: the shard's task (never the coordinator)
            tokens = None if self.tokens is None else \
                functools.partial(_tokens_kept, self.tokens, self.keep)
        else:
            keep = np.asarray(self.keep, dtype=bool)
            if keep.size != self.n:
                raise ConfigError(f"shard {self.key}: keep mask of {keep.size} rows, "
                                  f"{self.n} expected")
            n = int(keep.sum())
            if self.tokens is None or callable(self.tokens):
                tokens = None if self.tokens is None else \
                    functools.partial(_tokens_kept, self.tokens, keep)
            else:
                tokens = np.asarray(self.tokens)[keep]
        return CorpusShard(key=self.key, n=n, version=self.version, tokens=tokens,
                           load=functools.partial(_load_kept, self.load, self.keep),
                           keep_of=self.keep)

    def token_counts(self) -> np.ndarray:
        """This view's rows' token counts (int64): the array, or the loader's result. Called
        inside the shard's tasks (and by the gather path, which holds the corpus anyway)."""
        if self.tokens is None:
            raise ConfigError(f"shard {self.key}: no token counts")
        t = np.asarray(self.tokens() if callable(self.tokens) else self.tokens, dtype=np.int64)
        if t.shape != (self.n,):
            raise ConfigError(f"shard {self.key}: {t.size} token counts for {self.n} rows")
        return t

    def _mask(self) -> np.ndarray | None:
        keep = self.keep_of
        if keep is None:
            return None
        return np.asarray(keep() if callable(keep) else keep, dtype=bool)

    def own_rows(self, rows: np.ndarray) -> np.ndarray:
        """Row numbers of this (kept) view in the shard's own numbering."""
        m = self._mask()
        rows = np.asarray(rows, dtype=np.int64)
        return rows if m is None else np.flatnonzero(m)[rows]

    def kept_rows(self, own: np.ndarray) -> np.ndarray:
        """The shard's own row numbers in this view's numbering (rows not kept left out)."""
        m = self._mask()
        own = np.asarray(own, dtype=np.int64)
        if m is None:
            return own[(own >= 0) & (own < self.n)]
        own = own[(own >= 0) & (own < m.size)]
        own = own[m[own]]
        return np.cumsum(m)[own] - 1


def _tokens_kept(tokens, keep):
    """A shard's kept rows' token counts (``CorpusShard.kept``'s token loader; pickles)."""
    m = np.asarray(keep() if callable(keep) else keep, dtype=bool)
    t = np.asarray(tokens() if callable(tokens) else tokens, dtype=np.int64)
    if m.size != t.size:
        raise ConfigError(f"keep mask of {m.size} rows for {t.size} token counts")
    return t[m]


def _load_kept(load, keep):
    """A shard's kept rows (``CorpusShard.kept``'s loader; module-level so that it pickles)."""
    m = np.asarray(keep() if callable(keep) else keep, dtype=bool)
    part = load()
    if m.size != part.n:
        raise ConfigError(f"keep mask of {m.size} rows for a shard of {part.n}")
    return Part(*(np.asarray(a)[m] for a in _arrays(part)))


@dataclass
class CorpusSelection:
    """What :func:`select_corpus` returns. ``selected[key]`` are the selected row numbers of
    that shard (sorted): None when a ``sink`` wrote them from the shards' own tasks, which
    never sent them here; ``files[key]``: what the sink returned for that shard (its count and
    digest), None without a sink. ``scores`` the whole corpus's f, f_qua, f_div of the selection, quality
    top-k and random (``scored_by`` says how; None when they could not be computed)."""

    mode: str
    requested_mode: str
    budget: CorpusBudget
    term: str
    lamb: float
    n: int
    k: int
    selected: dict | None
    route: str
    scores: dict | None
    scored_by: str | None
    rounds: list = field(default_factory=list)
    converged: bool | None = None
    timings: dict = field(default_factory=dict)
    tokens: dict | None = None
    notes: list = field(default_factory=list)
    shard_routes: dict = field(default_factory=dict)
    n_input: int | None = None  # rows before deduplication (n: the rows that may be selected)
    engine: str = "in-process"  # where the per-shard passes ran (the executor's name)
    files: dict | None = None  # {key: what the sink returned}: the rows written by the sink

    @property
    def counts(self) -> dict:
        if self.selected is None:
            return {key: int(v["rows"]) for key, v in self.files.items()}
        return {key: int(v.size) for key, v in self.selected.items()}

    def summary(self) -> dict:
        return {"mode": self.mode, "requested_mode": self.requested_mode,
                "budget": {"kind": self.budget.kind, "value": self.budget.value},
                "term": self.term, "lamb": self.lamb, "n": self.n, "k": self.k,
                "selected_rows": int(sum(self.counts.values())), "route": self.route,
                "scores": self.scores, "scored_by": self.scored_by, "rounds": self.rounds,
                "converged": self.converged, "timings": self.timings, "tokens": self.tokens,
                "notes": self.notes, "counts": self.counts, "shard_routes": self.shard_routes,
                "n_input": self.n_input, "engine": self.engine}


# ------------------------------------------------------------------ helpers
class _Gathered:
    """Shards concatenated into one shard-like object, its rows in order of the original id
    (so the result does not depend on how the corpus was cut into files), with its position
    as the id. ``order[j]``: the global row number (shards in order) of row j."""

    def __init__(self, parts: list):
        ids = np.concatenate([np.asarray(p.ids) for p in parts])
        self.order = np.argsort(ids, kind="stable")
        pos = np.empty_like(self.order)
        pos[self.order] = np.arange(self.order.size)
        n, d = int(ids.size), int(parts[0].embeddings.shape[1])
        self.embeddings = np.empty((n, d), dtype=np.float32)
        self.quality = np.empty(n, dtype=np.float64)
        s = 0
        for p in parts:
            m = int(p.embeddings.shape[0])
            self.embeddings[pos[s:s + m]] = p.embeddings
            self.quality[pos[s:s + m]] = p.quality
            s += m
        self.ids = np.arange(n, dtype=np.int64)


def _fits_gather(n: int, d: int, cfg: LearnerConfig, device, gather_max_rows: int):
    """(fits, why) for one selection over n rows on this machine."""
    from ..learner import estimate_memory
    from ..select import route_for

    if n > gather_max_rows:
        return False, f"{n:,} rows > gather_max_rows={gather_max_rows:,}"
    route, _ = route_for(cfg, n, device)
    try:
        estimate_memory(n, d, cfg.replace(select_ratio=0.5), device,
                        learning=route in ("paper", "paper+polish"))
    except ConfigError as exc:
        return False, str(exc)
    return True, f"{n:,} rows fit one selection on {device}"


def _global_topk(q_all: np.ndarray, k: int) -> np.ndarray:
    """Global row numbers of the corpus's quality top-k (ties by row number)."""
    order = np.lexsort((np.arange(q_all.size), -q_all))
    return np.sort(order[:k])


# ------------------------------------------------------------------ scoring
def _score_whole(shards, sets: dict, cfg, device) -> dict:
    """Whole-corpus scores of several selections (global row numbers, shards in order), with
    every row at once: only for a corpus that fits one selection."""
    from ..evaluate import make_ground_set
    from ..select import score_selection

    g = _Gathered([s.load() for s in shards])
    pos = np.empty_like(g.order)
    pos[g.order] = np.arange(g.order.size)
    ground = make_ground_set(g.embeddings, g.quality, device=device)
    term = cfg.diversity_term()
    return {name: score_selection(ground, pos[idx], term, cfg.lamb).as_dict()
            for name, idx in sets.items()}


# ------------------------------------------------------------------ entry
def select_corpus(
    shards: list,
    cfg: LearnerConfig,
    budget: CorpusBudget,
    *,
    mode: str = "auto",
    device: str | torch.device = "cpu",
    mem_budget: int | None = None,
    gather_max_rows: int = GATHER_MAX_ROWS,
    blocks: int | None = None,
    candidates: int = 4096,
    max_rounds: int = 50,
    time_budget_s: float | None = None,
    on_round: Callable | None = None,
    workdir: str | None = None,
    checkpoint_dir: str | None = None,
    budget_of_input: bool = True,
    warm_start: dict | None = None,
    executor=None,
    block_rows: int | None = None,
    sink=None,
    log: Callable = lambda msg: None,
) -> CorpusSelection:
    """Select ``budget`` of the corpus made of ``shards`` (:class:`CorpusShard`) for ``cfg``'s
    objective (λ, terms, solver for the per-shard and gathered solves) and score the result on
    the whole corpus. Budget errors are raised before any shard's features are read (a token
    budget reads every shard's token counts first, in the shards' own tasks on ``executor``:
    the coordinator gets each shard's total and largest document, never a row's count).

    ``gather`` and ``random_blocks`` hold the corpus in this process (a corpus that fits one
    selection). ``per_shard`` and ``exchange`` run one task per shard for every pass on
    ``executor`` (:mod:`engine.corpus.executor`; default: in this process), and keep each
    shard's selection in the run's state under ``checkpoint_dir`` (any path or URI the storage
    layer reads: a killed run resumes from its last round there; removed when the run ends)
    or, without one, a temporary directory under ``workdir``.

    Rows outside a shard's ``keep`` mask (duplicates) are never selected; a fraction budget is
    of the input rows (``budget_of_input``, default) or of the kept rows.

    ``sink``: where each shard's selected rows go (an object whose picklable ``write(key,
    rows)`` writes a shard's rows, its own numbering, and returns a small summary with their
    count under ``"rows"``, e.g. ``outputs.SelectionFiles``). The per_shard and exchange routes
    call it in each shard's last task, so the selected rows never reach the coordinator
    (``selected`` is None); the routes that hold the rows here hand them to one task per
    shard. ``files`` holds what it returned.

    ``warm_start`` ({shard key: selected rows, or the uri of a parquet file with a ``row``
    column, read in the shard's task}, e.g. the last selection of the shards that did
    not change) starts ``exchange`` there instead of selecting every shard again: the start is
    made k rows by the linearised gains (new shards' rows enter, removed ones' leave), then the
    rounds run. Other modes ignore it."""
    from ..device import resolve_device
    from .executor import InProcess

    t_start = time.perf_counter()
    if mode not in MODES:
        raise ConfigError(f"corpus mode must be one of {MODES}, got {mode!r}")
    if not shards:
        raise ConfigError("corpus: no shard to select from")
    keys = [s.key for s in shards]
    if len(set(keys)) != len(keys):
        raise ConfigError("corpus: shard keys repeat")
    dev = resolve_device(device)
    ex = executor or InProcess()
    n_input = int(sum(s.n for s in shards))
    shards = [s.kept() for s in shards]
    n = int(sum(s.n for s in shards))
    tokens_total = tok_summary = None
    if budget.kind == "tokens":
        missing = [s.key for s in shards if s.tokens is None]
        if missing:
            raise ConfigError(f"corpus budget: select_tokens needs token counts; shard(s) "
                              f"{missing[:5]} have none (set token_column, or a text column and "
                              f"a tokenizer)")
        from .token_fit import token_totals

        # each shard's counts read by its own task: the totals and the largest document here
        tok_summary = token_totals(ex, shards)
        tokens_total = tok_summary["total"]
    if budget.kind == "fraction" and budget_of_input and n_input != n:
        k = budget.rows(n_input)
        if k >= n:
            raise ConfigError(f"corpus budget: {budget.label} of the {n_input:,} input rows is "
                              f"{k:,} rows, but only {n:,} remain after deduplication")
    else:
        k = budget.rows(n, tokens_total)
    term_name = cfg.term_label
    notes: list = []

    from .sharded import task_head

    d, ref = ex.map(task_head, [(shards[0],)])[0]
    fits, why = _fits_gather(n, d, cfg, dev, gather_max_rows)
    chosen = mode
    if mode == "auto":
        if fits:
            chosen = "gather"
        elif term_name in EXCHANGE_TERMS:
            chosen = "exchange"
        else:
            chosen = "per_shard"
            notes.append(f"{term_name} has no corpus statistics and the corpus does not fit one "
                         f"selection ({why}): each shard selected alone with its share")
        notes.append(f"auto: {chosen} ({why})")
    if chosen == "exchange" and term_name not in EXCHANGE_TERMS:
        raise ConfigError(f"corpus mode 'exchange' needs a term with sufficient statistics "
                          f"({', '.join(HAS_STATS)}) or facility location's blocks; "
                          f"{term_name} has neither: use gather or per_shard")
    log(f"corpus: {n:,} rows in {len(shards)} shard(s), budget {budget.label} -> k={k:,}; "
        f"mode {chosen}" + ("" if chosen in ("gather", "random_blocks") else f" on {ex.name}"))
    timings: dict = {}
    if chosen in ("gather", "random_blocks"):
        res = _select_held(shards, chosen, k, cfg, dev, mem_budget, blocks, budget, n,
                           tokens_total, log)
    elif chosen == "exchange" and term_name not in HAS_STATS:
        res = _select_facility_blocks(shards, k, cfg, dev, mem_budget, budget, n, fits, ex,
                                      workdir, checkpoint_dir, block_rows, timings, log,
                                      tok_summary, sink)
    else:
        res = _select_sharded(shards, chosen, k, cfg, dev, mem_budget, d, ref, budget, n,
                              fits, why, ex, candidates, max_rounds, time_budget_s, on_round,
                              workdir, checkpoint_dir, warm_start, timings, log, tok_summary,
                              sink)
    selected, route, scores, scored_by, rounds, converged, shard_routes, tokens_info, extra = res
    notes += extra
    if scored_by is not None and n != n_input:
        scored_by += f", the {n:,} rows left after deduplication"
    files = None
    if sink is not None and selected is not None and \
            all(isinstance(v, np.ndarray) for v in selected.values()):
        from .sharded import task_write

        t_w = time.perf_counter()
        files = dict(zip(keys, ex.map(task_write, [(s.key, selected[s.key]) for s in shards],
                                      shared=sink)))
        timings["write_s"] = time.perf_counter() - t_w
    elif sink is not None:  # written by the shards' own tasks
        files, selected = selected, None
    timings["total_s"] = time.perf_counter() - t_start
    result = CorpusSelection(
        mode=chosen, requested_mode=mode, budget=budget, term=term_name, lamb=cfg.lamb, n=n,
        k=0, selected=selected, route=route, scores=scores, scored_by=scored_by,
        rounds=rounds, converged=converged, timings=timings, tokens=tokens_info, notes=notes,
        shard_routes=shard_routes, n_input=n_input, files=files,
        engine="in-process" if chosen in ("gather", "random_blocks") else ex.name)
    result.k = int(sum(result.counts.values()))
    return result


def _tokens_info(target, selected_tokens, tokens_total, largest):
    return {"target": int(target), "selected": int(selected_tokens), "corpus": int(tokens_total),
            "largest_document": int(largest)}


def _select_held(shards, chosen, k, cfg, dev, mem_budget, blocks, budget, n, tokens_total, log):
    """gather and random_blocks: the corpus held in this process."""
    notes: list = []
    offsets = np.cumsum([0] + [s.n for s in shards])
    parts = [s.load() for s in shards]
    for s, p in zip(shards, parts):
        if p.n != s.n:
            raise ConfigError(f"shard {s.key}: {p.n} rows read, {s.n} expected")
    shard_routes: dict = {}
    if chosen == "gather":
        g = _Gathered(parts)
        sel = _select_gathered(g, k, cfg, dev, mem_budget)
        route = sel.route
        glob = g.order[sel.indices]
        priority = np.empty(n, dtype=np.float64)
        priority[g.order] = -sel.rank.astype(np.float64)
        scores = {name: sc.as_dict() for name, sc in sel.scores.items()
                  if name in ("selection", "quality_topk", "random")}
        notes += sel.notes
        if sel.guard:
            notes.append(sel.guard)
    else:
        glob, route, shard_routes = _random_blocks(parts, k, cfg, dev, mem_budget,
                                                   blocks or len(shards), log)
        priority, scores = None, None
    tokens_info, filled = None, None
    q_all = np.concatenate([np.asarray(p.quality, dtype=np.float64) for p in parts])
    if budget.kind == "tokens":
        tok = np.concatenate([s.token_counts() for s in shards])  # held here anyway
        filled = np.flatnonzero(fit_tokens(np.zeros(n, dtype=bool), q_all, tok,
                                           int(budget.value)))
        if chosen == "gather" and cfg.term_label in HAS_STATS:
            rows, info = _tokens_held(g, tok[g.order], sel.indices, cfg, dev, mem_budget,
                                      int(budget.value), log)
            glob = g.order[rows]
            notes.append(_token_note(info))
        else:
            mask = np.zeros(n, dtype=bool)
            mask[glob] = True
            glob = np.flatnonzero(fit_tokens(mask, q_all if priority is None else priority,
                                             tok, int(budget.value)))
        tokens_info = _tokens_info(budget.value, tok[glob].sum(), tokens_total, tok.max())
        k, scores = int(glob.size), None
    glob = np.sort(np.asarray(glob, dtype=np.int64))
    del parts
    if scores is None:
        rng = np.random.default_rng(cfg.seed)
        sets = {"selection": glob, "quality_topk": _global_topk(q_all, k),
                "random": np.sort(rng.choice(n, size=k, replace=False))}
        if filled is not None:
            sets["quality_topk_tokens"] = filled
        scores = _score_whole(shards, sets, cfg, dev)
    selected = {}
    for i, s in enumerate(shards):
        lo, hi = np.searchsorted(glob, [offsets[i], offsets[i + 1]])
        selected[s.key] = s.own_rows(glob[lo:hi] - offsets[i])
    return selected, route, scores, WHOLE, [], None, shard_routes, tokens_info, notes


def _tokens_held(g: _Gathered, tok, start, cfg, dev, mem_budget, target: int, log):
    """gather's token budget: the gathered corpus as one part through the exchange's cost-aware
    token moves (:meth:`sharded.ShardedRun.token_budget`), in this process, from the
    row-budget selection ``start``: (rows of ``g``, the search's log)."""
    import shutil
    import tempfile

    from .checkpoint import RunState
    from .executor import InProcess
    from .sharded import RunContext, ShardedRun, task_rows

    part = Part(g.embeddings, g.quality, g.ids)
    one = CorpusShard(key="gathered", n=part.n, load=lambda: part, tokens=tok)
    temp = tempfile.mkdtemp(prefix="corpus-tokens-")
    try:
        state = RunState(temp, {"tokens": target})
        state.prepare()
        ctx = RunContext(cfg=cfg, term=cfg.term_label, lamb=cfg.lamb, d=part.d,
                         ref=np.asarray(part.embeddings[0], dtype=np.float64)
                         if cfg.term_label == "DiSF" else None,
                         state=state, device=str(dev), mem_budget=mem_budget)
        run = ShardedRun([one], ctx, InProcess(), int(np.asarray(start).size), log)
        run.start({"gathered": np.asarray(start, dtype=np.int64)})
        info = run.token_budget(target, candidates=4096, max_rounds=50, rtol=1e-7)
        rows = task_rows(ctx, 0, run.versions[0])
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return rows, info


def _token_note(info: dict) -> str:
    """One line on how a token budget was met inside the objective."""
    rounds = [r for r in info["rounds"] if not r.get("undone")]
    ref = (f"; the quality order filled to the target: f={info['f_quality_filled']:.8g}"
           if "f_quality_filled" in info else "")
    return (f"token budget by gain per token: start {info['start']} (fit: "
            f"{info['dropped']:,} dropped, {info['added']:,} added, f={info['f_fitted']:.8g}"
            f"{ref}); {len(rounds)} cost-aware swap round(s) to f={info['f']:.8g}")


def _select_sharded(shards, chosen, k, cfg, dev, mem_budget, d, ref, budget, n, fits, why, ex,
                    candidates, max_rounds, time_budget_s, on_round, workdir, checkpoint_dir,
                    warm_start, timings, log, tok_summary=None, sink=None):
    """per_shard and exchange: one task per shard for every pass (:mod:`engine.corpus.sharded`).
    With a ``sink`` and a corpus past one selection, each shard's last task writes its rows
    and ``selected`` is what the sinks returned."""
    import tempfile

    from .checkpoint import RunState
    from .sharded import RunContext, ShardedRun, task_quality, task_rows

    notes: list = []
    identity = {"config": cfg.config_hash(), "mode": chosen, "k": k, "candidates": candidates,
                "warm": warm_start is not None,
                "shards": [(s.key, s.n, s.version) for s in shards]}
    temp = None
    if checkpoint_dir is None:
        temp = tempfile.mkdtemp(prefix="corpus-", dir=workdir)
    state = RunState(checkpoint_dir or temp, identity)
    state.prepare()
    ctx = RunContext(cfg=cfg, term=cfg.term_label, lamb=cfg.lamb, d=int(d),
                     ref=ref if cfg.term_label == "DiSF" else None, state=state,
                     device=str(dev), mem_budget=mem_budget)
    run = ShardedRun(shards, ctx, ex, k, log)
    run.token_summary = tok_summary
    try:
        t0 = time.perf_counter()
        warm = None
        if chosen == "exchange" and warm_start is not None:
            # rows or a file, mapped to the kept rows by the shard's own task
            warm = {s.key: warm_start.get(s.key, np.zeros(0, dtype=np.int64)) for s in shards}
        run.start(warm)
        rounds, converged = [], None
        if warm is not None:
            log(f"corpus: warm start from {run.count:,} rows of the last selection "
                f"({sum(1 for s in shards if s.key in warm_start)} of {len(shards)} shards)")
            notes.append(f"warm start: {run.count:,} rows of the last selection; no shard "
                         "selected again")
            moved = run.fit_count()
            log(f"corpus: start made {k:,} rows ({moved['added']:,} added, "
                f"{moved['removed']:,} removed by their gains)")
            route = "exchange rounds from the last selection (warm start)"
        else:
            route = ", ".join(sorted(set(run.routes.values())))
        timings["shards_s"] = time.perf_counter() - t0
        if chosen == "exchange":
            rounds, converged = run.rounds(candidates, max_rounds, 1e-7, time_budget_s, on_round)
            if warm is None:
                route = f"exchange rounds from per-shard {route}"
        timings["select_s"] = time.perf_counter() - t0
        if chosen == "exchange":
            timings["rounds_s"] = timings["select_s"] - timings["shards_s"]
        tokens_info, filled = None, None
        if budget.kind == "tokens" and run.st is not None:
            got = run.token_budget(int(budget.value), candidates, max_rounds, 1e-7,
                                   search=chosen == "exchange", reference=chosen == "exchange",
                                   time_budget_s=time_budget_s)
            notes.append(_token_note(got))
            if run.reference is not None:
                filled = run.reference
        elif budget.kind == "tokens":
            got = run.fit_tokens(int(budget.value))
        if budget.kind == "tokens":
            tokens_info = _tokens_info(budget.value, got["selected"], got["corpus"],
                                       got["largest_document"])
            timings["tokens_s"] = time.perf_counter() - t0 - timings["select_s"]
        t1 = time.perf_counter()
        if fits:
            selected_kept = run.ex.map(task_rows, [(i, run.versions[i])
                                                          for i in range(len(shards))],
                                       shared=ctx)
            offsets = np.cumsum([0] + [s.n for s in shards])
            glob = np.concatenate([r + offsets[i] for i, r in enumerate(selected_kept)])
            q_all = np.concatenate(ex.map(task_quality, [(s,) for s in shards]))
            rng = np.random.default_rng(cfg.seed)
            sets = {"selection": glob, "quality_topk": _global_topk(q_all, run.k),
                    "random": np.sort(rng.choice(n, size=run.k, replace=False))}
            if filled is not None:
                sets["quality_topk_tokens"] = run.reference_rows()
            scores, scored_by = _score_whole(shards, sets, cfg, dev), WHOLE
            selected = {s.key: s.own_rows(r) for s, r in zip(shards, selected_kept)}
        elif cfg.term_label in HAS_STATS:
            scores, selected = run.score(cfg.seed, sink)
            if filled is not None:
                scores["quality_topk_tokens"] = filled["score"]
            scored_by = "sufficient statistics (exact f of the selected rows)"
        else:
            scores, scored_by = None, None
            selected = run.selected_rows(sink)
            notes.append(f"whole-corpus f not computed: {cfg.term_label} needs every row at "
                         f"once and the corpus does not fit ({why})")
        timings["score_s"] = time.perf_counter() - t1
        state.clear()
    finally:
        if temp is not None:
            import shutil

            shutil.rmtree(temp, ignore_errors=True)
    return (selected, route, scores, scored_by, rounds, converged, dict(run.routes),
            tokens_info, notes)


def _select_facility_blocks(shards, k, cfg, dev, mem_budget, budget, n, fits, ex, workdir,
                            checkpoint_dir, block_rows, timings, log, tok_summary=None,
                            sink=None):
    """Facility location's exchange route: greedy in blocks cut by a corpus-wide k-means with
    one shared gain threshold (:mod:`engine.corpus.blocks`). Each shard's rows stay in the
    run's state; past one selection they are scored and written (with a ``sink``) by the
    shard's own tasks, so ``selected`` is what the sinks returned."""
    import shutil
    import tempfile

    from .blocks import BLOCK_ROWS, BlockContext, estimate_scores, select_blocks
    from .checkpoint import RunState
    from .sharded import task_quality, task_rows

    identity = {"config": cfg.config_hash(), "mode": "facility_blocks", "k": k,
                "block_rows": block_rows, "shards": [(s.key, s.n, s.version) for s in shards]}
    temp = None
    if checkpoint_dir is None:
        temp = tempfile.mkdtemp(prefix="corpus-", dir=workdir)
    state = RunState(checkpoint_dir or temp, identity)
    state.prepare()
    term = cfg.diversity_term()  # the corpus's objective: dense, or each row's K neighbours
    from ..terms import default_mem_budget

    sparse = term.mode(n, 4, mem_budget or default_mem_budget(dev)) == "sparse"
    ctx = BlockContext(lamb=cfg.lamb, k=k, n=n, state=state,
                       block_rows=int(block_rows or BLOCK_ROWS), seed=cfg.seed, device=str(dev),
                       neighbors=term.neighbors if sparse else None)
    try:
        t0 = time.perf_counter()
        out = select_blocks(shards, ctx, ex, log)
        timings["select_s"] = time.perf_counter() - t0
        version, tokens_info = 0, None
        if budget.kind == "tokens":  # fit_tokens by quality, each shard's counts in its task
            from .token_fit import fit_sharded, token_totals

            tok_summary = tok_summary or token_totals(ex, shards)
            got = fit_sharded(ex, shards, int(budget.value), [0] * len(shards), state,
                              outs=[(1,)] * len(shards), ctx=ctx, log=log)
            version = 1
            tokens_info = _tokens_info(budget.value, got["tokens"], tok_summary["total"],
                                       tok_summary["largest"])
            k = int(sum(got["counts"]))
        t1 = time.perf_counter()
        guard, selected = None, None
        if fits:  # the corpus fits one selection: its rows are held here anyway
            offsets = np.cumsum([0] + [s.n for s in shards])
            glob = np.sort(np.concatenate([np.zeros(0, dtype=np.int64)] + [
                r + offsets[i] for i, r in enumerate(ex.map(
                    task_rows, [(i, version) for i in range(len(shards))], shared=ctx))]))
            q_all = np.concatenate(ex.map(task_quality, [(s,) for s in shards]))
            rng = np.random.default_rng(cfg.seed)
            top = _global_topk(q_all, k)
            sets = {"selection": glob, "quality_topk": top,
                    "random": np.sort(rng.choice(n, size=k, replace=False))}
            scores, scored_by = _score_whole(shards, sets, cfg, dev), WHOLE
            if budget.kind != "tokens" and \
                    scores["quality_topk"]["f"] > scores["selection"]["f"]:
                guard, glob = "quality_topk", np.sort(top)
            selected = {}
            for i, s in enumerate(shards):
                lo, hi = np.searchsorted(glob, [offsets[i], offsets[i + 1]])
                selected[s.key] = s.own_rows(glob[lo:hi] - offsets[i])
        else:
            top = None
            if tokens_info:
                scores = scored_by = None
            else:
                scores, top = estimate_scores(shards, ex, cfg.lamb, k, out["clients"], state,
                                              version, out["q_range"], cfg.seed)
                scores["selection"]["f_blocks"] = out["f_blocks"]
                scored_by = (f"quality exact, coverage estimated on {len(out['clients']):,} "
                             "rows sampled by id hash (± f_div_se)")
                if scores["quality_topk"]["f"] > scores["selection"]["f"]:
                    guard = "quality_topk"
            res = ex.map(task_final, [(i, s, version, top[1][i] if guard else None)
                                      for i, s in enumerate(shards)],
                         shared=(state, top[0] if guard else None, sink))
            selected = {s.key: r for s, r in zip(shards, res)}
        if guard:  # the blocks' own selection stays in the scores, under its name
            scores["facility_blocks"] = scores["selection"]
            scores["selection"] = dict(scores["quality_topk"])
            log("corpus: facility blocks: the corpus's quality top-k scored higher than the "
                "blocks' selection; it is returned instead")
        timings["score_s"] = time.perf_counter() - t1
        state.clear()
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    route = (f"greedy in {out['blocks']:,} blocks of {out['clusters']:,} k-means clusters, "
             f"one gain threshold")
    notes = [f"facility blocks: {out['blocks']:,} blocks, {out['passes']} greedy pass(es)"]
    if guard:
        route = f"quality top-k (scored above {route})"
        notes.append("facility blocks: the corpus's quality top-k scored higher and was returned")
    return selected, route, scores, scored_by, [], None, {}, tokens_info, notes


def task_final(shared, i: int, shard, version: int, take_eq):
    """A facility-blocks shard's final rows, in its own numbering: its rows in the run's
    state, or (``take_eq`` not None: the guard returned the corpus's quality top-k) its rows
    above ``t`` and its first ``take_eq`` at ``t``; written by ``sink`` when given (what it
    returns), else returned."""
    from .parts import load_checked

    state, t, sink = shared
    if take_eq is None:
        rows = state.load_rows(i, version)[0]
    else:
        q = np.asarray(load_checked(shard).quality, dtype=np.float64)
        rows = np.union1d(np.flatnonzero(q > t), np.flatnonzero(q == t)[:take_eq])
    own = shard.own_rows(rows)
    return own if sink is None else sink.write(shard.key, own)


def _select_gathered(g: _Gathered, k: int, cfg, dev, mem_budget):
    from ..select import select_shard

    return select_shard(g, cfg.replace(select_ratio=_ratio_for(k, g.embeddings.shape[0])),
                        device=dev, mem_budget=mem_budget)


def _random_blocks(parts, k, cfg, dev, mem_budget, n_blocks, log):
    """The corpus (``parts``, held) re-cut into ``n_blocks`` random blocks by a keyed hash of
    the id, each selected alone with its proportional share (rows in order of id within a
    block)."""
    g = _Gathered(parts)
    ids = np.concatenate([np.asarray(p.ids) for p in parts])[g.order]
    block = block_of(ids, n_blocks, cfg.seed)
    sizes = np.bincount(block, minlength=n_blocks)
    alloc = allocate(sizes, k)
    picked, routes = [], {}
    for b in range(n_blocks):
        rows = np.flatnonzero(block == b)  # positions in id order
        if rows.size == 0:
            continue
        part = Part(g.embeddings[rows], g.quality[rows], rows)
        sel, r = _select_part(part, int(alloc[b]), cfg, dev, mem_budget)
        picked.append(g.order[rows[sel]])
        routes[f"block_{b:03d}"] = r
        log(f"corpus: random block {b}: {sel.size:,} of {rows.size:,} rows ({r})")
    return (np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64),
            ", ".join(sorted(set(routes.values()))), routes)
