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

Every mode returns a :class:`CorpusSelection` whose scores are the whole corpus's f.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..config import ConfigError, LearnerConfig
from .budget import CorpusBudget, allocate, fit_tokens
from .stats import HAS_STATS, stats_for

__all__ = ["CorpusShard", "CorpusSelection", "MODES", "select_corpus", "block_of",
           "GATHER_MAX_ROWS"]

MODES = ("auto", "gather", "exchange", "per_shard", "random_blocks")
GATHER_MAX_ROWS = 1_000_000
WHOLE = "whole corpus (the shard objective on all rows)"


@dataclass
class CorpusShard:
    """One shard of the corpus: its key, row count, a loader of its validated features
    (an engine ``Shard``: ids, quality, embeddings) and, for token budgets, its rows' tokens."""

    key: str
    n: int
    load: Callable
    tokens: np.ndarray | None = None
    version: str | None = None  # e.g. the features file's content hash: part of checkpoint keys
    keep: np.ndarray | None = None  # rows that may be selected (deduplication); None = all

    def kept(self) -> "CorpusShard":
        """This shard restricted to its kept rows (row numbers renumbered; ``keep`` maps them
        back)."""
        if self.keep is None:
            return self
        keep = np.asarray(self.keep, dtype=bool)
        if keep.size != self.n:
            raise ConfigError(f"shard {self.key}: keep mask of {keep.size} rows, {self.n} expected")
        load = self.load
        return CorpusShard(
            key=self.key, n=int(keep.sum()), version=self.version,
            tokens=None if self.tokens is None else np.asarray(self.tokens)[keep],
            load=lambda: Part(*(np.asarray(a)[keep] for a in _arrays(load()))))


@dataclass
class CorpusSelection:
    """What :func:`select_corpus` returns. ``selected[key]`` are the selected row numbers of
    that shard (sorted); ``scores`` the whole corpus's f, f_qua, f_div of the selection, quality
    top-k and random (``scored_by`` says how; None when they could not be computed)."""

    mode: str
    requested_mode: str
    budget: CorpusBudget
    term: str
    lamb: float
    n: int
    k: int
    selected: dict
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

    @property
    def counts(self) -> dict:
        return {key: int(v.size) for key, v in self.selected.items()}

    def summary(self) -> dict:
        return {"mode": self.mode, "requested_mode": self.requested_mode,
                "budget": {"kind": self.budget.kind, "value": self.budget.value},
                "term": self.term, "lamb": self.lamb, "n": self.n, "k": self.k,
                "selected_rows": int(sum(self.counts.values())), "route": self.route,
                "scores": self.scores, "scored_by": self.scored_by, "rounds": self.rounds,
                "converged": self.converged, "timings": self.timings, "tokens": self.tokens,
                "notes": self.notes, "counts": self.counts, "shard_routes": self.shard_routes,
                "n_input": self.n_input}


# ------------------------------------------------------------------ helpers
def _arrays(sh):
    return sh.embeddings, sh.quality, sh.ids


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


def _ratio_for(k: int, n: int) -> float:
    """A select_ratio r with round(r · n) == k exactly."""
    from ..config import n_select

    r = k / n
    for nudge in (0.0, 1e-12, -1e-12, 1e-9, -1e-9):
        if n_select(r + nudge, n) == k:
            return r + nudge
    raise AssertionError(f"no ratio gives k={k} of n={n}")  # pragma: no cover


def _select_part(shard, k: int, cfg: LearnerConfig, device, mem_budget):
    """k rows of one part (shard or block): (row numbers, route)."""
    from ..baselines import quality_topk
    from ..select import select_shard

    n = int(shard.embeddings.shape[0])
    if k <= 0:
        return np.zeros(0, dtype=np.int64), "empty"
    if k >= n:
        return np.arange(n, dtype=np.int64), "all"
    min_k = max(cfg.diversity_term().min_k, 1)
    if k < min_k or n - k < 1:
        return (np.sort(quality_topk(shard.quality, k, shard.ids)),
                "topk (k below the term's minimum)")
    sel = select_shard(shard, cfg.replace(select_ratio=_ratio_for(k, n)), device=device,
                       mem_budget=mem_budget, references=False)
    return sel.indices, sel.route


def _splitmix64(v: np.ndarray) -> np.ndarray:
    z = v.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z


def block_of(ids: np.ndarray, n_blocks: int, seed: int = 0) -> np.ndarray:
    """Each id's random block (0..n_blocks-1) by a keyed hash of the id: the same id lands in
    the same block whatever file it came in."""
    ids = np.asarray(ids)
    if ids.dtype.kind in "iu":
        key = _splitmix64(np.asarray([seed], dtype=np.uint64))[0]
        h = _splitmix64(ids.astype(np.int64).view(np.uint64) ^ key)
    else:
        k = seed.to_bytes(8, "little", signed=True)
        h = np.fromiter((int.from_bytes(hashlib.blake2b(str(i).encode(), digest_size=8,
                                                         key=k).digest(), "little")
                         for i in ids), dtype=np.uint64, count=len(ids))
    return (h % np.uint64(n_blocks)).astype(np.int64)


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
def _score_sets(shards, loaded, quality, spill, sets: dict, term_name: str, cfg, device,
                whole: bool) -> tuple:
    """Whole-corpus scores of several selections (global row numbers); beyond memory, from the
    selected rows' statistics, read from the shards' spilled copies where there are some."""
    from ..evaluate import make_ground_set
    from ..select import score_selection

    if whole:
        g = _Gathered([loaded(i) for i in range(len(shards))])
        pos = np.empty_like(g.order)
        pos[g.order] = np.arange(g.order.size)
        ground = make_ground_set(g.embeddings, g.quality, device=device)
        term = cfg.diversity_term()
        return ({name: score_selection(ground, pos[idx], term, cfg.lamb).as_dict()
                 for name, idx in sets.items()}, WHOLE)
    if term_name not in HAS_STATS:
        return None, None
    offsets = np.cumsum([0] + [s.n for s in shards])
    d = None
    parts, st = {}, None
    for i in range(len(shards)):
        x = spill.rows[i] if spill is not None and i in spill.rows else loaded(i).embeddings
        q = quality(i)
        if st is None:
            d = x.shape[1]
            st = stats_for(term_name, cfg.lamb, d, ref=np.asarray(x[0]))
            parts = {name: st.zero() for name in sets}
        for name, idx in sets.items():
            lo, hi = np.searchsorted(idx, [offsets[i], offsets[i + 1]])
            rows = idx[lo:hi] - offsets[i]
            if rows.size:
                parts[name] = st.add(parts[name], st.rows(x[rows]), q[rows])
    return ({name: st.f(parts[name], len(idx)) for name, idx in sets.items()},
            "sufficient statistics (exact f of the selected rows)")


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
    log: Callable = lambda msg: None,
) -> CorpusSelection:
    """Select ``budget`` of the corpus made of ``shards`` (:class:`CorpusShard`) for ``cfg``'s
    objective (λ, terms, solver for the per-shard and gathered solves) and score the result on
    the whole corpus. Budget errors are raised before any shard is read. Shards are held in
    memory together only when the corpus fits one selection; otherwise they are read one at a
    time, and the exchange rounds read them back from float32 copies under ``workdir`` (a
    temporary directory when unset), removed at the end. With ``checkpoint_dir`` (a local
    directory) each shard's start selection and every exchange round are checkpointed, so a
    killed run resumes where it stopped; the checkpoints are removed when it finishes.

    Rows outside a shard's ``keep`` mask (duplicates) are never selected; a fraction budget is
    of the input rows (``budget_of_input``, default) or of the kept rows.

    ``warm_start`` ({shard key: selected rows}, e.g. the last selection of the shards that did
    not change) starts ``exchange`` there instead of selecting every shard again: the start is
    made k rows by the linearised gains (new shards' rows enter, removed ones' leave), then the
    rounds run. Other modes ignore it."""
    from ..device import resolve_device

    t_start = time.perf_counter()
    if mode not in MODES:
        raise ConfigError(f"corpus mode must be one of {MODES}, got {mode!r}")
    if not shards:
        raise ConfigError("corpus: no shard to select from")
    keys = [s.key for s in shards]
    if len(set(keys)) != len(keys):
        raise ConfigError("corpus: shard keys repeat")
    dev = resolve_device(device)
    n_input = int(sum(s.n for s in shards))
    maps = [None if s.keep is None else np.flatnonzero(np.asarray(s.keep, dtype=bool))
            for s in shards]
    shards = [s.kept() for s in shards]
    n = int(sum(s.n for s in shards))
    tokens_total = None
    if budget.kind == "tokens":
        missing = [s.key for s in shards if s.tokens is None]
        if missing:
            raise ConfigError(f"corpus budget: select_tokens needs token counts; shard(s) "
                              f"{missing[:5]} have none (set token_column, or a text column and "
                              f"a tokenizer)")
        tokens_total = int(sum(int(np.sum(s.tokens, dtype=np.int64)) for s in shards))
    if budget.kind == "fraction" and budget_of_input and n_input != n:
        k = budget.rows(n_input)
        if k >= n:
            raise ConfigError(f"corpus budget: {budget.label} of the {n_input:,} input rows is "
                              f"{k:,} rows, but only {n:,} remain after deduplication")
    else:
        k = budget.rows(n, tokens_total)
    term_name = cfg.term_label
    notes: list = []

    cache: dict = {}  # shards held in memory: all of them when the corpus fits, else none
    qual: dict = {}  # every shard's quality, kept from its first read
    spill = None  # exchange beyond memory: each shard's float32 copy on disk, from its first read

    def loaded(i):
        if i in cache:
            return cache[i]
        sh = shards[i].load()
        if sh.n != shards[i].n:
            raise ConfigError(f"shard {shards[i].key}: {sh.n} rows read, {shards[i].n} expected")
        qual[i] = np.asarray(sh.quality, dtype=np.float64)
        if hold:
            cache[i] = sh
        if spill is not None:
            spill.put(i, sh.embeddings)
        return sh

    def quality(i):
        if i not in qual:
            loaded(i)
        return qual[i]

    def quality_of_all():
        return np.concatenate([quality(i) for i in range(len(shards))])

    hold = True
    d = loaded(0).d
    fits, why = _fits_gather(n, d, cfg, dev, gather_max_rows)
    hold = fits
    chosen = mode
    if mode == "auto":
        if fits:
            chosen = "gather"
        elif term_name in HAS_STATS:
            chosen = "exchange"
        else:
            chosen = "per_shard"
            notes.append(f"{term_name} has no corpus statistics and the corpus does not fit one "
                         f"selection ({why}): each shard selected alone with its share")
        notes.append(f"auto: {chosen} ({why})")
    if chosen == "exchange" and term_name not in HAS_STATS:
        raise ConfigError(f"corpus mode 'exchange' needs a term with sufficient statistics "
                          f"({', '.join(HAS_STATS)}); {term_name} has none: use gather or "
                          "per_shard")
    log(f"corpus: {n:,} rows in {len(shards)} shard(s), budget {budget.label} -> k={k:,}; "
        f"mode {chosen}")
    if chosen == "exchange" and not hold:
        spill = _Spill(workdir)
        spill.put(0, cache[0].embeddings)
    if not hold:
        cache.clear()
    try:

        offsets = np.cumsum([0] + [s.n for s in shards])
        rounds, converged, route = [], None, ""
        shard_routes: dict = {}
        timings: dict = {}
        from .checkpoint import Checkpoints

        ckpt = Checkpoints(checkpoint_dir if chosen in ("per_shard", "exchange") else None, {
            "config": cfg.config_hash(), "mode": chosen, "k": k, "candidates": candidates,
            "shards": [(s.key, s.n, s.version) for s in shards]})
        t0 = time.perf_counter()
        if chosen == "gather":
            g = _Gathered([loaded(i) for i in range(len(shards))])
            sel = _select_gathered(g, k, cfg, dev, mem_budget)
            route = sel.route
            glob = g.order[sel.indices]
            priority = np.empty(n, dtype=np.float64)
            priority[g.order] = -sel.rank.astype(np.float64)
            scores = {name: sc.as_dict() for name, sc in sel.scores.items()
                      if name in ("selection", "quality_topk", "random")}
            scored_by = WHOLE
            notes += sel.notes
            if sel.guard:
                notes.append(sel.guard)
        else:
            if chosen == "random_blocks":
                glob, route, shard_routes = _random_blocks(shards, loaded, k, cfg, dev, mem_budget,
                                                           blocks or len(shards), log)
                priority = None
            elif chosen == "exchange" and warm_start is not None:
                per = []
                for i, s in enumerate(shards):
                    rows = np.asarray(warm_start.get(s.key, []), dtype=np.int64)
                    if maps[i] is not None and rows.size:  # to the kept rows' numbering
                        pos = np.searchsorted(maps[i], rows)
                        last = maps[i].size - 1
                        ok = (pos <= last) & (maps[i][np.minimum(pos, last)] == rows)
                        rows = pos[ok]
                    per.append(rows[(rows >= 0) & (rows < s.n)])
                warm = int(sum(r.size for r in per))
                log(f"corpus: warm start from {warm:,} rows of the last selection "
                    f"({sum(1 for s in shards if s.key in warm_start)} of {len(shards)} shards)")
                notes.append(f"warm start: {warm:,} rows of the last selection; no shard selected "
                             "again")
                timings["shards_s"] = time.perf_counter() - t0
                glob, rounds, converged = _exchange(
                    shards, loaded, quality, spill, per, k, cfg, candidates, max_rounds,
                    time_budget_s, on_round, log, ckpt=ckpt, fit=True)
                route = "exchange rounds from the last selection (warm start)"
                priority = None
            else:
                alloc = allocate([s.n for s in shards], k)
                per = []
                for i, s in enumerate(shards):
                    done = ckpt.load_part(i)
                    if done is not None:
                        rows, r = done
                        log(f"corpus: {s.key}: {rows.size:,} of {s.n:,} rows ({r}), from the "
                            "checkpoint of an earlier attempt")
                    else:
                        rows, r = _select_part(loaded(i), int(alloc[i]), cfg, dev, mem_budget)
                        ckpt.save_part(i, rows, r)
                        log(f"corpus: {s.key}: {rows.size:,} of {s.n:,} rows ({r})")
                    per.append(rows)
                    shard_routes[s.key] = r
                route = ", ".join(sorted(set(shard_routes.values())))
                timings["shards_s"] = time.perf_counter() - t0
                if chosen == "exchange":
                    glob, rounds, converged = _exchange(
                        shards, loaded, quality, spill, per, k, cfg, candidates, max_rounds,
                        time_budget_s, on_round, log, ckpt=ckpt)
                    route = f"exchange rounds from per-shard {route}"
                    priority = None
                else:
                    glob = np.concatenate([r + offsets[i] for i, r in enumerate(per)])
                    priority = None
            scores, scored_by = None, None
        timings["select_s"] = time.perf_counter() - t0
        if "shards_s" in timings and chosen == "exchange":
            timings["rounds_s"] = timings["select_s"] - timings["shards_s"]

        tokens_info = None
        if budget.kind == "tokens":
            tok = np.concatenate([np.asarray(s.tokens, dtype=np.int64) for s in shards])
            selected_mask = np.zeros(n, dtype=bool)
            selected_mask[glob] = True
            if priority is None:  # by quality: the rows a shard solver would drop / add last
                priority = quality_of_all()
            selected_mask = fit_tokens(selected_mask, priority, tok, int(budget.value))
            glob = np.flatnonzero(selected_mask)
            tokens_info = {"target": int(budget.value), "selected": int(tok[glob].sum()),
                           "corpus": tokens_total,
                           "largest_document": int(tok.max())}
            k = int(glob.size)
            scores = None  # the size changed: score again below
        glob = np.sort(np.asarray(glob, dtype=np.int64))
        if np.unique(glob).size != glob.size:  # pragma: no cover - every mode selects each row once
            raise AssertionError("a row was selected twice")

        if scores is None:
            t1 = time.perf_counter()
            q_all = quality_of_all()
            rng = np.random.default_rng(cfg.seed)
            sets = {"selection": glob, "quality_topk": _global_topk(q_all, k),
                    "random": np.sort(rng.choice(n, size=k, replace=False))}
            scores, scored_by = _score_sets(shards, loaded, quality, spill, sets, term_name, cfg,
                                        dev, whole=fits)
            timings["score_s"] = time.perf_counter() - t1
            if scores is None:
                notes.append(f"whole-corpus f not computed: {term_name} needs every row at "
                             f"once and the corpus does not fit ({why})")
        selected = {}
        for i, s in enumerate(shards):
            lo, hi = np.searchsorted(glob, [offsets[i], offsets[i + 1]])
            rows = glob[lo:hi] - offsets[i]
            selected[s.key] = rows if maps[i] is None else maps[i][rows]  # the shard's own rows
        if scored_by is not None and n != n_input:
            scored_by += f", the {n:,} rows left after deduplication"
        timings["total_s"] = time.perf_counter() - t_start
        ckpt.clear()
        return CorpusSelection(
            mode=chosen, requested_mode=mode, budget=budget, term=term_name, lamb=cfg.lamb, n=n,
            k=int(glob.size), selected=selected, route=route, scores=scores, scored_by=scored_by,
            rounds=rounds, converged=converged, timings=timings, tokens=tokens_info, notes=notes,
            shard_routes=shard_routes, n_input=n_input)
    finally:
        if spill is not None:
            spill.close()


def _select_gathered(g: _Gathered, k: int, cfg, dev, mem_budget):
    from ..select import select_shard

    return select_shard(g, cfg.replace(select_ratio=_ratio_for(k, g.embeddings.shape[0])),
                        device=dev, mem_budget=mem_budget)


def _random_blocks(shards, loaded, k, cfg, dev, mem_budget, n_blocks, log):
    """The corpus re-cut into ``n_blocks`` random blocks by a keyed hash of the id, each
    selected alone with its proportional share (rows in order of id within a block)."""
    g = _Gathered([loaded(i) for i in range(len(shards))])
    ids = np.concatenate([np.asarray(loaded(i).ids) for i in range(len(shards))])[g.order]
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


@dataclass
class Part:
    """A shard's arrays in memory (what a ``CorpusShard.load`` may return)."""

    embeddings: np.ndarray
    quality: np.ndarray
    ids: np.ndarray

    @property
    def n(self):
        return int(self.embeddings.shape[0])

    @property
    def d(self):
        return int(self.embeddings.shape[1])


class _DiskRows:
    """Float32 rows in a file, read on demand (a slice, one row or a list of rows) into
    ordinary memory that is freed after use: a round's pass over a shard holds one chunk."""

    def __init__(self, path: str, n: int, d: int):
        self.path, self.shape = path, (n, d)
        self._row = d * 4

    @classmethod
    def write(cls, path: str, x) -> "_DiskRows":
        n, d = x.shape
        with open(path, "wb") as fh:
            for s in range(0, n, 65536):
                fh.write(np.ascontiguousarray(x[s:s + 65536], dtype=np.float32).tobytes())
        return cls(path, n, d)

    def __getitem__(self, key):
        import os

        n, d = self.shape
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if isinstance(key, slice):
                s, e, _ = key.indices(n)
                buf = os.pread(fd, (e - s) * self._row, s * self._row)
                return np.frombuffer(buf, dtype=np.float32).reshape(e - s, d)
            if np.isscalar(key):
                buf = os.pread(fd, self._row, int(key) * self._row)
                return np.frombuffer(buf, dtype=np.float32)
            rows = np.asarray(key, dtype=np.int64)
            out = np.empty((rows.size, d), dtype=np.float32)
            for j, r in enumerate(rows):
                out[j] = np.frombuffer(os.pread(fd, self._row, int(r) * self._row), np.float32)
            return out
        finally:
            os.close(fd)


class _Spill:
    """Each shard's embeddings as a float32 copy on disk (:class:`_DiskRows`), written when the
    shard is first read, so the exchange rounds read them back one chunk at a time; removed
    by :meth:`close`."""

    def __init__(self, workdir: str | None):
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="corpus-", dir=workdir)
        self.rows: dict = {}

    def put(self, i: int, x) -> None:
        if i not in self.rows:
            self.rows[i] = _DiskRows.write(f"{self.dir}/{i}.f32", x)

    def close(self) -> None:
        import shutil

        self.rows.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def _exchange(shards, loaded, quality, spill, per, k, cfg, candidates, max_rounds, time_budget_s,
              on_round, log, *, ckpt=None, fit: bool = False):
    """The exchange rounds from ``per`` (each shard's start rows): (global rows, rounds,
    converged). With ``spill`` the rounds read the shards' copies on disk, else the shards
    held in memory."""
    from .exchange import exchange_rounds, fit_count

    data, sel, st = [], [], None
    for i, s in enumerate(shards):
        if spill is not None and i in spill.rows:
            x = spill.rows[i]
        else:
            sh = loaded(i)  # held in memory, or read now (and spilled)
            x = spill.rows[i] if spill is not None else sh.embeddings
            del sh
        if st is None:
            st = stats_for(cfg.term_label, cfg.lamb, x.shape[1], ref=np.asarray(x[0]))
        data.append((x, quality(i)))
        m = np.zeros(s.n, dtype=bool)
        m[per[i]] = True
        sel.append(m)

    def report(info):
        log(f"corpus: exchange round {info['round']}: {info['swaps']:,} swaps, "
            f"f={info['f']:.8g} ({info['seconds']:.1f}s)")
        if on_round is not None:
            on_round(info)

    if fit:
        sel, moved = fit_count(data, sel, st, k)
        log(f"corpus: start made {k:,} rows ({moved['added']:,} added, "
            f"{moved['removed']:,} removed by their gains)")
    resume = ckpt.load_round() if ckpt is not None else None
    if resume is not None:
        log(f"corpus: resuming the exchange after round {resume[0]} (checkpoint of an "
            "earlier attempt)")
    res = exchange_rounds(data, sel, st, k, candidates=candidates, max_rounds=max_rounds,
                          time_budget_s=time_budget_s, on_round=report, resume=resume,
                          on_state=None if ckpt is None else ckpt.save_round)
    offsets = np.cumsum([0] + [s.n for s in shards])
    glob = np.concatenate([np.flatnonzero(m) + offsets[i] for i, m in enumerate(res.selected)])
    return glob, res.rounds, res.converged
