"""What a diversity term is: :class:`DiversityTerm` (the batched objective every term has, and
the optional greedy / polish / best-swap moves and memory estimate), the ground set
:class:`Batch` it is computed on, and the context the swap search hands to a term's moves.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..numerics import DisfFrame, disf_frame, unit_rows

__all__ = ["Batch", "DiversityTerm", "NotSupported", "PolishContext", "TermError",
           "SwapSchedule", "block_swap", "default_mem_budget", "rollout_chunks", "CAPABILITIES"]

# Optional moves a term may implement (``DiversityTerm.supports``).
CAPABILITIES = ("greedy", "polish", "best_swap")


class TermError(ValueError):
    """An unknown diversity term, a bad mixture or a plug-in that cannot be loaded."""


class NotSupported(NotImplementedError):
    """The term does not implement this optional move (greedy, polish or best_swap); the
    solver layer catches it (or asks :meth:`DiversityTerm.supports` first)."""


def default_mem_budget(device: torch.device) -> int:
    """Working memory the objectives may use per call (bytes)."""
    return (2 << 30) if device.type == "cuda" else (256 << 20)


def rollout_chunks(G: int, per_rollout_bytes: int, budget: int, override: int | None = None):
    """(start, end) slices of G rollouts; ``override`` (the ``rollout_chunk`` knob) wins over
    the size the memory budget allows."""
    c = override or max(1, int(budget // max(1, per_rollout_bytes)))
    c = min(G, c)
    for s in range(0, G, c):
        yield s, min(G, s + c)


@dataclass
class Batch:
    """A ground set: embeddings ``x`` (m, d) and quality ``q`` (m,), on one device, with the
    prepared views the terms share (computed once, cached): exact unit rows and DiSF's frame."""

    x: torch.Tensor
    q: torch.Tensor
    mem_budget: int | None = None
    cache: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.mem_budget is None:
            self.mem_budget = default_mem_budget(self.x.device)

    @property
    def m(self) -> int:
        return self.x.shape[0]

    @property
    def d(self) -> int:
        return self.x.shape[1]

    @property
    def xn(self) -> torch.Tensor:
        """Unit-normalised embeddings, exact (:func:`numerics.unit_rows`)."""
        if "xn" not in self.cache:
            self.cache["xn"] = unit_rows(self.x, self.mem_budget)
        return self.cache["xn"]

    def disf_frame(self, std_floor: float) -> DisfFrame:
        """DiSF's exact working frame (:func:`numerics.disf_frame`)."""
        key = ("disf", float(std_floor))
        if key not in self.cache:
            self.cache[key] = disf_frame(self.x, std_floor, self.mem_budget)
        return self.cache[key]

    def elem_size(self) -> int:
        return self.x.element_size()


@dataclass
class PolishContext:
    """Everything a term's swap search needs: the whole shard (``ground``: x and q in the
    working dtype), float64 quality, the current members, which non-members may enter, and
    the search's limits."""

    ground: Batch
    q64: torch.Tensor  # (n,) float64
    members: torch.Tensor  # (k,) long
    allowed: torch.Tensor  # (n,) bool, samples that may enter
    lamb: float
    deadline: float = float("inf")
    max_rounds: int = 10_000
    tol: float = 1e-12
    on_progress: Callable | None = None
    t0: float = 0.0
    # members whose every swap is scored exactly before a term that ranks members by a
    # heuristic (DiSF) declares a local optimum; None = all of them
    exact_outs: int | None = None

    @property
    def x(self) -> torch.Tensor:
        return self.ground.x

    @property
    def q(self) -> torch.Tensor:
        return self.ground.q

    @property
    def budget(self) -> int:
        return self.ground.mem_budget

    @property
    def n(self) -> int:
        return self.ground.m

    @property
    def k(self) -> int:
        return self.members.numel()

    @property
    def dev(self) -> torch.device:
        return self.ground.x.device

    def out_of_time(self) -> bool:
        return time.perf_counter() > self.deadline

    def progress(self, f: float, swaps: int) -> None:
        if self.on_progress:
            self.on_progress(time.perf_counter() - self.t0, f, swaps)

    def member_mask(self, members: torch.Tensor | None = None) -> torch.Tensor:
        m = torch.zeros(self.n, dtype=torch.bool, device=self.dev)
        m[self.members if members is None else members] = True
        return m


def block_swap(g: torch.Tensor, h: torch.Tensor, bcap: int, exchange) -> tuple[str, int, int]:
    """One block-swap attempt of the polish: pair the B = bcap best incoming samples (scores
    ``g``, one per candidate) with the B best outgoing ones (``h``), keep the prefix whose
    first-order gain g + h is positive, and call ``exchange(gi, hi)`` with their positions in
    ``g`` and ``h``; it scores the exchanged set exactly and returns whether it kept it.

    Returns (outcome, next bcap, samples swapped): ``"moved"`` (kept; bcap doubles, capped by
    the caller), ``"retry"`` (rejected with B > 1; bcap halves), ``"single"`` (rejected at
    B = 1: the caller's exact single-swap search decides), ``"no_gain"`` (no pair has a
    positive first-order gain) or ``"empty"`` (nothing to swap)."""
    B = min(bcap, g.numel(), h.numel())
    if B < 1:
        return "empty", bcap, 0
    gv, gi = torch.topk(g, B)
    hv, hi = torch.topk(h, B)
    pos = int(((gv + hv) > 0).sum())
    if pos == 0:
        return "no_gain", bcap, 0
    if exchange(gi[:pos], hi[:pos]):
        return "moved", 2 * pos, pos
    if pos > 1:
        return "retry", pos // 2, 0
    return "single", bcap, 0


class SwapSchedule:
    """The block-swap schedule of a polish: the block size cap B (starts at k/8, doubles after
    a kept block, halves after a rejected one, 2 after a single swap) and the swap counts."""

    def __init__(self, k: int):
        self.k, self.cap, self.swaps, self.moves = k, max(1, k // 8), 0, 0

    def block(self, g: torch.Tensor, h: torch.Tensor, exchange, limit: int | None = None) -> str:
        """One :func:`block_swap` at the current cap (no larger than ``limit``); returns its
        outcome after updating the cap and the counts."""
        cap = self.cap if limit is None else min(self.cap, limit)
        outcome, next_cap, moved = block_swap(g, h, cap, exchange)
        if outcome == "moved":
            self.swaps, self.moves, self.cap = self.swaps + moved, self.moves + 1, min(self.k, next_cap)
        elif outcome == "retry":
            self.cap = next_cap
        return outcome

    def single(self) -> None:
        """A single swap found by the exact search was kept."""
        self.swaps, self.moves, self.cap = self.swaps + 1, self.moves + 1, 2


class DiversityTerm(ABC):
    """A diversity term f_div (higher = more diverse).

    Required: ``name`` and :meth:`batched`. Optional moves (the default raises
    :class:`NotSupported`; :meth:`supports` says which a term has): :meth:`greedy`,
    :meth:`polish`, :meth:`best_swap`. :meth:`workspace_bytes` feeds the learner's pre-flight
    memory estimate. Register an instance with :func:`terms.register` or ship it as an entry
    point of the group ``datamask.diversity_terms``."""

    name: str = ""
    aliases: tuple = ()
    # the smallest selection the term is defined on (masks of k' >= min_k)
    min_k: int = 2

    @abstractmethod
    def batched(self, batch: Batch, idx: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """f_div of G selections: ``idx`` (G, k) long indices into ``batch`` -> (G,). Used on
        the learner's batches and on the whole shard (evaluation). ``chunk``: rollouts scored
        at once (None: as the memory budget allows)."""

    # ------------------------------------------------------------ optional moves
    def greedy(self, ground: Batch, k: int, lamb: float, *, sample: int | None = None,
               generator: torch.Generator | None = None, **options) -> torch.Tensor:
        """k picks (in order) maximising lamb·f_qua + (1-lamb)·f_div on ``ground``; with
        ``sample`` each pick only considers that many non-chosen samples drawn uniformly
        with ``generator`` (stochastic greedy)."""
        raise NotSupported(f"diversity term {self.name!r} has no greedy move")

    def polish(self, ctx: PolishContext, **options) -> dict:
        """Swap local search from ``ctx.members``; returns {"members", "f_start", "f_end",
        "swaps", "moves", "rounds", "converged", "stop"}. converged=True only when no single
        swap improves f by more than ``ctx.tol``."""
        raise NotSupported(f"diversity term {self.name!r} has no polish (swap) move")

    def best_swap(self, ctx: PolishContext) -> tuple[int, int, float]:
        """The exact best single swap (member out, allowed non-member in) and its gain in f."""
        raise NotSupported(f"diversity term {self.name!r} has no exact best-swap search")

    def workspace_bytes(self, m: int, k: int, d: int, itemsize: int, budget: int) -> int:
        """Peak working memory of :meth:`batched` on a ground set of m rows with masks of k
        (the learner's pre-flight estimate): the chunked work is bounded by ``budget``."""
        return int(budget)

    def supports(self, capability: str) -> bool:
        """Whether the term implements ``capability`` (one of :data:`CAPABILITIES`)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}: one of {CAPABILITIES}")
        return getattr(type(self), capability) is not getattr(DiversityTerm, capability)

    def __repr__(self) -> str:
        return f"<diversity term {self.name}>"
