"""Swap-based local search ("polish") on the whole-shard objective: the driver.

The policy-gradient learner optimises a batch-local estimate of f; its read-out is judged on
the whole shard (docs/method.md#batch-local-vs-whole-shard). ``polish`` starts from any selection of k samples and
repeatedly exchanges members for non-members while the *whole-shard* objective

    f(U) = lamb * mean_{i in U} q_i + (1 - lamb) * f_div(U)

increases, so it never returns a selection worse than the one it was given and keeps exactly
k samples. The moves are the diversity term's own (:meth:`terms.DiversityTerm.polish`, see
``terms/pairwise.py``, ``terms/facility.py``, ``terms/disf.py``); a term without them raises
:class:`terms.NotSupported`.

Scores used to *rank* moves may be float32; every *accepted* move is scored exactly (float64
state for pair-wise and DiSF; for facility, the per-point coverage state is rebuilt from
scratch at the end and the start is returned if float noise made the result worse).
``converged`` is True only when no single swap improves f by more than the working dtype's
tolerance; ``stop`` says why the search ended (local_optimum, nothing_to_swap, partial_check:
DiSF checked only ``disf_exact_outs`` members, max_rounds, time_budget).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from . import terms
from .objectives import default_mem_budget

__all__ = ["polish", "best_swap", "PolishResult", "default_time_budget_s"]

# The smallest selection polished: the swap identities need k >= 3 (facility's best and
# second-best coverage, DiSF's downdate to k - 1 >= 2 samples).
MIN_K = 3

# The swap search's time budget when ``polish_time_budget_s`` is unset (select_shard): it grows
# with the shard, max(DEFAULT_BUDGET_MIN_S, DEFAULT_BUDGET_S_PER_ROW * n), 120 s up to 2*10^5
# rows and 600 s at 10^6. Every cell the solver bench measured (up to 10^5 rows, at most 32 s
# of polish) ended well inside it, so it changes no measured result; at 10^6 x 768 one DiSF
# round takes ~46 s and the default stop (max_rounds) alone would allow 10,000 of them.
DEFAULT_BUDGET_MIN_S = 120.0
DEFAULT_BUDGET_S_PER_ROW = 6e-4


def default_time_budget_s(n: int) -> float:
    """The polish's time budget for a shard of n rows when none is configured."""
    return max(DEFAULT_BUDGET_MIN_S, DEFAULT_BUDGET_S_PER_ROW * int(n))


def default_budget_rule() -> str:
    return (f"max({DEFAULT_BUDGET_MIN_S:g} s, {DEFAULT_BUDGET_S_PER_ROW * 1e3:g} ms × n)")


@dataclass
class PolishResult:
    selected: np.ndarray  # sorted int64 indices, exactly k
    f_start: float
    f_end: float
    swaps: int  # samples exchanged (a block swap of B counts B)
    moves: int  # accepted moves (block or single)
    rounds: int  # iterations / sweeps
    elapsed_s: float
    converged: bool  # no single improving swap exists (not stopped by a budget or a partial check)
    history: list = field(default_factory=list)  # (elapsed_s, f, swaps)
    stop: str = ""  # why the search ended
    time_budget_s: float | None = None  # the wall-clock cap it ran under (None: none)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["selected"] = None
        d["k"] = int(self.selected.size)
        return d


def _tol(dtype: torch.dtype) -> float:
    return 1e-12 if dtype == torch.float64 else 1e-9


# ------------------------------------------------------------------ driver
def _prepare(x, q, device, dtype):
    from .device import resolve_device

    dev = resolve_device(device)
    xt = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
    if dtype is None:
        dtype = torch.float64 if xt.dtype == torch.float64 else torch.float32
    if dtype not in (torch.float32, torch.float64):
        dtype = torch.float32  # polish scores in fp32 at least (bf16 learner runs included)
    xt = xt.to(device=dev, dtype=dtype)
    qt = (q if torch.is_tensor(q) else torch.as_tensor(np.asarray(q))).to(device=dev)
    if xt.ndim != 2 or qt.shape != (xt.shape[0],):
        raise ValueError(f"x must be (n, d) and q (n,), got {tuple(xt.shape)} and {tuple(qt.shape)}")
    return xt, qt.to(dtype), qt.to(torch.float64)


def _allowed_mask(allowed, n: int, dev) -> torch.Tensor:
    if allowed is None:
        return torch.ones(n, dtype=torch.bool, device=dev)
    a = torch.as_tensor(np.asarray(allowed), device=dev).bool()
    if a.shape != (n,):
        raise ValueError(f"allowed must be a bool mask of shape ({n},)")
    return a


def polish(x, q, selected, algorithm, lamb: float = 0.5, *, device="cpu", dtype=None,
           allowed=None, time_budget_s: float | None = None, max_rounds: int = 10_000,
           mem_budget: int | None = None, disf_exact_outs: int | None = 4,
           on_progress: Callable[[float, float, int], None] | None = None) -> PolishResult:
    """Improve ``selected`` (k indices or a bool mask) by swaps on the whole-shard objective.

    ``algorithm``: a term name, alias or :class:`terms.DiversityTerm` with polish moves.
    ``allowed``: bool (n,) of samples that may enter (e.g. the pool left by quality pruning;
    default all). Stops at a local optimum (see the module docstring), after ``max_rounds``
    iterations, or when ``time_budget_s`` has passed. ``disf_exact_outs``: members whose every
    swap DiSF scores exactly before it stops (None: all, in batches; only then can DiSF report
    converged=True, since fewer members leave improving swaps unchecked).
    ``on_progress(elapsed_s, f, swaps)`` is called after accepted moves. Never returns a
    selection with lower f than the input (up to the float tolerance of the working dtype)."""
    from .evaluate import as_indices

    t0 = time.perf_counter()
    term = terms.get(algorithm)
    if not term.supports("polish"):
        raise terms.NotSupported(f"diversity term {term.name!r} has no polish (swap) move")
    if not (0.0 <= lamb <= 1.0):
        raise ValueError(f"lamb must be in [0, 1], got {lamb}")
    xt, qt, q64 = _prepare(x, q, device, dtype)
    n = xt.shape[0]
    idx = as_indices(selected, n)
    k = idx.size
    members = torch.as_tensor(idx, device=xt.device)
    allowed_t = _allowed_mask(allowed, n, xt.device)
    if lamb == 1.0 or k < MIN_K or k >= n:
        # lamb = 1: f is modular, quality top-k is already optimal and the learner reads it
        # out exactly; tiny k: nothing to polish with the identities used here.
        return PolishResult(np.sort(idx), float("nan"), float("nan"), 0, 0, 0,
                            time.perf_counter() - t0, lamb == 1.0,
                            stop="modular" if lamb == 1.0 else "too_small",
                            time_budget_s=time_budget_s)
    ctx = terms.PolishContext(
        ground=terms.Batch(xt, qt, mem_budget=mem_budget or default_mem_budget(xt.device)),
        q64=q64, members=members, allowed=allowed_t, lamb=float(lamb),
        deadline=t0 + (time_budget_s if time_budget_s is not None else float("inf")),
        max_rounds=int(max_rounds), tol=_tol(xt.dtype), on_progress=on_progress, t0=t0,
        exact_outs=None if disf_exact_outs is None else int(disf_exact_outs),
    )
    out = term.polish(ctx)
    sel = np.sort(out["members"].cpu().numpy().astype(np.int64))
    f_start, f_end = out["f_start"], out["f_end"]
    converged = bool(out["converged"])
    if not (f_end >= f_start):  # float noise (facility) or NaN: keep what we were given
        sel, f_end, converged = np.sort(idx), f_start, False
    return PolishResult(sel, f_start, f_end, out["swaps"], out["moves"], out["rounds"],
                        time.perf_counter() - t0, converged, stop=out.get("stop", ""),
                        time_budget_s=time_budget_s)


def best_swap(x, q, selected, algorithm, lamb: float = 0.5, *, device="cpu",
              mem_budget: int | None = None, allowed=None) -> tuple[int, int, float]:
    """The exact best single swap (member o out, allowed non-member j in) and its gain in f,
    found with the batched identities the polish uses (for tests and diagnostics)."""
    from .evaluate import as_indices

    term = terms.get(algorithm)
    if not term.supports("best_swap"):
        raise terms.NotSupported(f"diversity term {term.name!r} has no exact best-swap search")
    xt, qt, q64 = _prepare(x, q, device, None)
    n = xt.shape[0]
    idx = torch.as_tensor(as_indices(selected, n), device=xt.device)
    ctx = terms.PolishContext(
        ground=terms.Batch(xt, qt, mem_budget=mem_budget or default_mem_budget(xt.device)),
        q64=q64, members=idx, allowed=_allowed_mask(allowed, n, xt.device), lamb=float(lamb),
        tol=_tol(xt.dtype))
    return term.best_swap(ctx)
