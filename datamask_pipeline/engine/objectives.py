"""The joint objective f = lamb · f_qua + (1 - lamb) · f_div of docs/method.md#terms, batched
over G rollouts: quality here, each diversity term in :mod:`engine.terms` (one class per term,
one registry; a new term is one :class:`terms.DiversityTerm` registered with
:func:`terms.register` or shipped as an entry point).

A rollout is a set of k indices into a ground set ("batch") of m samples; ``idx`` is a (G, k)
long tensor and every score is (G,), higher = better.
"""

from __future__ import annotations

import torch

from .terms import DISF_STD_FLOOR, Batch, DiversityTerm, default_mem_budget, get  # noqa: F401

__all__ = ["Batch", "DISF_STD_FLOOR", "default_mem_budget", "quality", "score", "standardize",
           "tensor_of"]


def tensor_of(a) -> torch.Tensor:
    """``a`` as a CPU tensor without a copy when possible; read-only numpy arrays (pyarrow's
    zero-copy views) are copied, since torch cannot share memory it may not write."""
    if torch.is_tensor(a):
        return a
    import numpy as np

    arr = np.asarray(a)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.as_tensor(arr)


def quality(batch: Batch, idx: torch.Tensor) -> torch.Tensor:
    """f_qua: mean quality over the mask."""
    return batch.q[idx].mean(dim=1)


def standardize(v: torch.Tensor) -> torch.Tensor:
    return (v - v.mean()) / (v.std(unbiased=False) + 1e-8)


def score(batch: Batch, idx: torch.Tensor, term, lamb: float, term_norm: str = "none",
          chunk: int | None = None):
    """Return (f, f_qua, f_div), each (G,). ``term``: a registered name or alias, a
    {name: weight} mapping (a :class:`terms.Mixture`) or a :class:`terms.DiversityTerm`.
    ``chunk``: rollouts scored at once (the ``rollout_chunk`` knob; None = by memory budget).
    ``term_norm='standardize'`` standardises each term across the G rollouts before mixing
    (f is then a rollout-relative score)."""
    fq = quality(batch, idx)
    fd = get(term).batched(batch, idx, chunk)
    if term_norm == "standardize":
        f = lamb * standardize(fq) + (1 - lamb) * standardize(fd)
    else:
        f = lamb * fq + (1 - lamb) * fd
    return f, fq, fd
