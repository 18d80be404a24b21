"""Selecting one shard: the engine's single entry for "choose k rows, then judge them".

:func:`select_shard` runs the configured solver (the policy-gradient learner, a swap polish,
greedy, or ``auto``'s measured choice), then scores the selection on the whole shard next to
quality top-k and random, and returns one typed :class:`Selection`. The CLI, the ``mask``
asset, the λ trade-off and the bench call it; nothing else repeats that sequence.
See docs/method.md#solvers and the README's "Solvers" section for what each solver does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from .config import LEARNING_SOLVERS, LearnerConfig
from .device import resolve_device
from .ranking import quality_pool, rank_selection_first, readout

__all__ = ["Score", "Selection", "select_shard", "score_selection", "route_for"]


@dataclass(frozen=True)
class Score:
    """One selection judged on the whole shard (V = all n rows)."""

    f: float
    f_qua: float
    f_div: float

    def as_dict(self) -> dict:
        return {"f": self.f, "f_qua": self.f_qua, "f_div": self.f_div}


@dataclass
class Selection:
    """What :func:`select_shard` returns.

    ``selected``/``rank``/``logits`` are per row of the shard; ``rank < k`` is the selection.
    ``scores`` holds the whole-shard :class:`Score` of ``"selection"``, ``"quality_topk"``,
    ``"random"`` and, when the learner ran, ``"learner_readout"`` (its top-k by logit).
    ``route`` is what actually ran (``auto`` resolved, fallbacks applied) and ``guard`` says
    when a reference selection scored higher and was returned instead."""

    selected: np.ndarray
    rank: np.ndarray
    logits: np.ndarray
    solver: str
    route: str
    term: str
    scores: dict
    timings: dict
    sizes: dict
    config_hash: str
    device: str
    history: list = field(default_factory=list)
    steps: int = 0
    resumed_from: int | None = None
    polish: dict | None = None
    guard: str | None = None
    notes: list = field(default_factory=list)

    @property
    def indices(self) -> np.ndarray:
        return np.flatnonzero(self.selected)

    @property
    def k(self) -> int:
        return int(self.selected.sum())


# ------------------------------------------------------------------- scoring
def score_selection(ground, idx: np.ndarray, term, lamb: float) -> Score:
    """Whole-shard f, f_qua and f_div of the selection ``idx`` on ``ground`` (a prepared
    :func:`evaluate.make_ground_set`) for the diversity term ``term``."""
    from .objectives import quality

    t = torch.as_tensor(np.asarray(idx, dtype=np.int64), device=ground.x.device).unsqueeze(0)
    f_qua = float(quality(ground, t)[0])
    f_div = float(term.batched(ground, t)[0])
    return Score(lamb * f_qua + (1.0 - lamb) * f_div, f_qua, f_div)


# -------------------------------------------------------------------- routes
def route_for(cfg: LearnerConfig, n: int, device: torch.device | str = "cpu") -> tuple[str, str | None]:
    """The solver that runs for ``cfg`` on a shard of n rows: ``auto`` looks up the bench's
    measured table (:mod:`engine.solver_table`); a solver the term cannot run (a plug-in or
    a mixture without greedy/polish moves) falls back to the learner. Returns (route, why)."""
    from . import solver_table

    term = cfg.diversity_term()
    if cfg.lamb == 1.0 and cfg.solver != "paper":
        return "topk", "λ = 1: quality top-k is the exact optimum"
    solver = cfg.solver
    why = []
    if solver == "auto":
        solver, auto_why = solver_table.choose(cfg.term_spec, n, resolve_device(device).type,
                                                  lamb=cfg.lamb)
        why.append(auto_why)
        # The table's facility rows were measured on the dense similarity. On the sparse one
        # (large n) topk+polish hit its time cap below random at 10^5 while sparse greedy beat
        # apricot's objective in less time (bench/results/REPORT_peers.md): run greedy there.
        mode = getattr(term, "mode", None)
        if solver == "topk+polish" and mode is not None:
            from .objectives import default_mem_budget

            if mode(n, 4, default_mem_budget(resolve_device(device))) == "sparse":
                solver = "greedy"
                why.append("facility location on the sparse similarity: greedy (the table's "
                           "topk+polish was measured on dense)")
    needs = {"paper+polish": ("polish",), "topk+polish": ("polish",),
             "sgreedy+polish": ("greedy", "polish"), "greedy": ("greedy",)}.get(solver, ())
    missing = [cap for cap in needs if not term.supports(cap)]
    if missing:
        fallback = "paper+polish" if term.supports("polish") else "paper"
        why.append(f"{cfg.term_label} has no {' / '.join(missing)} moves: {solver} runs as "
                   f"{fallback}")
        solver = fallback
    return solver, "; ".join(why) or None


def _mask(n: int, idx) -> np.ndarray:
    sel = np.zeros(n, dtype=bool)
    sel[np.asarray(idx, dtype=np.int64)] = True
    return sel


# -------------------------------------------------------------------- entry
def select_shard(
    shard,
    cfg: LearnerConfig,
    *,
    device: str | torch.device = "auto",
    dtype: torch.dtype = torch.float32,
    checkpoint_path: str | None = None,
    checkpoint_every: int = 0,
    progress: Callable | None = None,
    progress_every: int | None = None,
    mem_budget: int | None = None,
    polish_time_budget_s: float | None = None,
    on_eval: Callable | None = None,
    eval_every: int = 0,
    max_steps: int | None = None,
    references: bool = True,
) -> Selection:
    """Select k = round(select_ratio · n) rows of ``shard`` (anything with ``embeddings``
    (n, d), ``quality`` (n,) and ``ids``) with ``cfg.solver`` and score the result on the whole
    shard next to quality top-k and random (``references=False`` skips random).

    Every solver except ``paper`` (upstream's method, returned as the paper defines it) is
    guarded: if quality top-k, or the learner's own read-out, scores higher on the whole shard,
    that selection is returned and ``guard`` says so. Checkpointing, progress, ``on_eval`` and
    ``max_steps`` are the learner's (:func:`learner.learn`)."""
    from .baselines import greedy, quality_topk, random_selection, stochastic_greedy
    from .evaluate import make_ground_set
    from .learner import check_quality_scale, initial_logits, learn
    from .objectives import default_mem_budget
    from .polish import default_budget_rule, default_time_budget_s, polish
    from .terms.facility import facility_part

    t_start = time.perf_counter()
    x, q, ids = shard.embeddings, np.asarray(shard.quality), shard.ids
    n = int(x.shape[0])
    dev = resolve_device(device)
    cfg.validate(n)
    sizes = cfg.sizes(n)
    k = sizes["k"]
    term = cfg.diversity_term()
    check_quality_scale(q, dtype)
    route, why = route_for(cfg, n, dev)
    notes = [why] if why else []
    fac = facility_part(term)
    if fac is not None:  # which similarity facility location runs on (greedy, polish, scores)
        budget = mem_budget or default_mem_budget(dev)
        notes.append(f"facility location on the {fac.mode(n, 4, budget)} similarity "
                     f"(facility_similarity={fac.similarity}, facility_neighbors={fac.neighbors}, "
                     f"facility_knn={fac.knn})")
    timings: dict = {}
    pool = quality_pool(q.astype(np.float64), cfg.prune_ratio, ids)
    allowed = _mask(n, pool)
    # the shard's quality top-k; pruning keeps the best by the same order, so it is the pool's too
    topk = quality_topk(q, k, ids)

    history: list = []
    steps, resumed_from, polish_info = 0, None, None
    learner_readout = None
    if route in LEARNING_SOLVERS:
        res = learn(x, q, cfg, ids=ids, device=dev, dtype=dtype, checkpoint_path=checkpoint_path,
                    checkpoint_every=checkpoint_every, progress=progress,
                    progress_every=progress_every, mem_budget=mem_budget, on_eval=on_eval,
                    eval_every=eval_every, max_steps=max_steps)
        timings["learn_s"] = res.wall_time_s
        logits, history, steps, resumed_from = res.logits, res.history, res.steps, res.resumed_from
        start = res.selected_idx
        learner_readout = start
    else:
        qt = torch.as_tensor(q[pool], dtype=torch.float32)
        logits = np.full(n, -np.inf, dtype=np.float32)
        logits[pool] = initial_logits(qt, "quality").numpy()
        t0 = time.perf_counter()
        # the pool's rows; without pruning the shard itself (x[pool] would copy n x d)
        xp, qp = (x, q) if pool.size == n else (x[pool], q[pool])
        if route in ("topk", "topk+polish"):
            start = topk
        elif route == "sgreedy+polish":
            start = pool[stochastic_greedy(xp, qp, k, term, cfg.lamb, seed=cfg.seed,
                                           device=dev, mem_budget=mem_budget)]
        elif route == "greedy":
            start = pool[greedy(xp, qp, k, term, cfg.lamb, device=dev, mem_budget=mem_budget)]
        else:  # pragma: no cover - route_for returns only the names above
            raise ValueError(f"unknown route {route!r}")
        timings["start_s"] = time.perf_counter() - t0
        del xp, qp  # a pruned pool's copy is not held through the polish and the scoring
    start = np.sort(np.asarray(start, dtype=np.int64))

    chosen = start
    if route.endswith("+polish"):
        t0 = time.perf_counter()
        budget_s = (polish_time_budget_s if polish_time_budget_s is not None
                    else cfg.polish_time_budget_s)
        budget_source = "polish_time_budget_s"
        if budget_s is None:  # bounded by default, in a time that grows with n
            budget_s = default_time_budget_s(n)
            budget_source = f"default: {default_budget_rule()} at n={n:,}"
        pr = polish(x, q, start, term, cfg.lamb, device=dev, allowed=allowed,
                    mem_budget=mem_budget, time_budget_s=budget_s)
        timings["polish_s"] = time.perf_counter() - t0
        chosen = pr.selected
        polish_info = pr.as_dict()
        polish_info["time_budget_source"] = budget_source
        if pr.stop == "time_budget":
            notes.append(f"the polish stopped at its time budget of {budget_s:g} s "
                         f"({budget_source}) with the best swap set found so far; set "
                         "polish_time_budget_s to search longer")

    # ---- whole-shard scores (V = all n rows)
    t0 = time.perf_counter()
    ground = make_ground_set(x, q, device=dev, mem_budget=mem_budget)
    scores = {"selection": score_selection(ground, chosen, term, cfg.lamb),
              "quality_topk": score_selection(ground, topk, term, cfg.lamb)}
    if learner_readout is not None:
        scores["learner_readout"] = score_selection(ground, learner_readout, term, cfg.lamb)
    if references:
        scores["random"] = score_selection(ground, random_selection(n, k, seed=cfg.seed),
                                           term, cfg.lamb)
    del ground
    timings["evaluate_s"] = time.perf_counter() - t0

    guard = None
    if cfg.solver != "paper":  # upstream's method is returned as the paper defines it
        rivals = {"quality_topk": topk}
        if learner_readout is not None:
            rivals["learner_readout"] = learner_readout
        best = max(rivals, key=lambda r: scores[r].f)
        if scores[best].f > scores["selection"].f:
            guard = (f"{best} scored f={scores[best].f:.8g} on the whole shard, above "
                     f"{route}'s {scores['selection'].f:.8g}: returned {best}")
            chosen = np.sort(rivals[best])
            scores["selection"] = scores[best]
    if route == "paper" and guard is None:
        selected, rank = readout(logits, k, ids)  # top-k by logit, ties by id
    else:
        selected = _mask(n, chosen)
        rank = rank_selection_first(selected, logits, ids)
    timings["total_s"] = time.perf_counter() - t_start
    return Selection(
        selected=selected, rank=rank, logits=np.asarray(logits, dtype=np.float32),
        solver=cfg.solver, route=route, term=cfg.term_label, scores=scores, timings=timings,
        sizes=sizes, config_hash=cfg.config_hash(), device=str(dev), history=history,
        steps=steps, resumed_from=resumed_from, polish=polish_info, guard=guard, notes=notes,
    )
