"""Whole-shard evaluation: every selection (DATAMASK, greedy, random, quality top-k) is scored
here, on the same ground (V = all n samples, docs/method.md#batch-local-vs-whole-shard), with the objective
functions of :mod:`objectives` so that learning and judging use one definition.
"""

from __future__ import annotations

import numpy as np
import torch

from . import terms as _terms
from .objectives import Batch, quality, tensor_of

# The built-in diversity terms (plug-ins are scored when named in ``terms``).
ALL_TERMS = _terms.BUILTIN_NAMES


def as_indices(selected, n: int) -> np.ndarray:
    """A selection as a bool mask (n,) or an index array -> sorted unique int64 indices."""
    if torch.is_tensor(selected):
        selected = selected.detach().cpu().numpy()
    s = np.asarray(selected)
    if s.dtype == bool:
        if s.shape != (n,):
            raise ValueError(f"selection mask has shape {s.shape}, expected ({n},)")
        return np.flatnonzero(s)
    idx = s.astype(np.int64).ravel()
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"selection indices out of range [0, {n})")
    uniq = np.unique(idx)
    if uniq.size != idx.size:
        raise ValueError("selection indices contain duplicates")
    return uniq


def _tensor(a, device, dtype=None) -> torch.Tensor:
    t = tensor_of(a)
    if dtype is None:
        dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
    return t.to(device=device, dtype=dtype)


def make_ground_set(x, q, device="cpu", mem_budget: int | None = None) -> Batch:
    """The whole shard as a :class:`objectives.Batch` (embeddings kept in float64 when given
    float64, else float32). Build it once to score many selections of one shard."""
    from .device import resolve_device

    dev = resolve_device(device)
    xt = _tensor(x, dev)
    qt = _tensor(q, dev, dtype=xt.dtype)
    if xt.ndim != 2 or qt.ndim != 1 or xt.shape[0] != qt.shape[0]:
        raise ValueError(f"x must be (n, d) and q (n,), got {tuple(xt.shape)} and {tuple(qt.shape)}")
    return Batch(xt, qt, mem_budget=mem_budget)


def evaluate_selection(x, q, selected, *, lamb: float = 0.5, terms=ALL_TERMS, device="cpu",
                       mem_budget: int | None = None, ground: Batch | None = None) -> dict:
    """Score one selection on the whole shard.

    Returns ``{"n", "k", "lamb", "f_qua": float, "f_div": {term: float}, "f": {term: float}}``
    with f = lamb * f_qua + (1 - lamb) * f_div, keyed by each term's registered name. ``terms``:
    names, aliases, {name: weight} mixtures or DiversityTerm objects; "Facility" by name is the
    exact (dense) objective, ``LearnerConfig.diversity_term()`` the one the solvers optimised
    (the sparse similarity when facility_similarity picks it). ``ground`` reuses a prepared
    :func:`make_ground_set` (then ``x``/``q`` are ignored)."""
    if not (0.0 <= lamb <= 1.0):
        raise ValueError(f"lamb must be in [0, 1], got {lamb}")
    batch = ground if ground is not None else make_ground_set(x, q, device, mem_budget)
    n = batch.m
    idx_np = as_indices(selected, n)
    k = int(idx_np.size)
    if k < 2:
        raise ValueError(f"a selection needs at least 2 samples to be scored, got {k}")
    idx = torch.as_tensor(idx_np, device=batch.x.device).unsqueeze(0)
    f_qua = float(quality(batch, idx)[0])
    f_div, f = {}, {}
    for spec in terms:
        term = _terms.get(spec)
        if k < term.min_k:
            raise ValueError(f"diversity term {term.name!r} needs a selection of at least "
                             f"{term.min_k} samples, got {k}")
        f_div[term.name] = float(term.batched(batch, idx)[0])
        f[term.name] = lamb * f_qua + (1.0 - lamb) * f_div[term.name]
    return {"n": n, "k": k, "lamb": float(lamb), "f_qua": f_qua, "f_div": f_div, "f": f}
