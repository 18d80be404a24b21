"""Sufficient statistics of a selection, for the terms whose f depends on the selected set
through a few additive numbers (docs/method.md#corpus-level):

* pair-wise: k, Σq and s = Σ x̂ (d numbers);
* DiSF: k, Σq, Σx and Σxxᵀ (d + d² numbers, float64, around a fixed reference row).

They add across shards, so the corpus's f is exact from the shards' parts, and the gradient
of f with respect to them gives every row's linearised gain: what the exchange rounds rank
candidates by (:mod:`engine.corpus.exchange`). Facility location has no such statistics
(every row's coverage depends on every selected row).
"""

from __future__ import annotations

import numpy as np
import torch

from ..numerics import unit_rows
from ..terms.disf import DISF_STD_FLOOR

__all__ = ["SelectionStats", "stats_for", "HAS_STATS"]

HAS_STATS = ("Pair_simi", "DiSF")


class SelectionStats:
    """Additive statistics of a selection for one term and λ. ``parts`` is a dict of float64
    tensors (all additive), ``k`` the selection's size."""

    term = ""

    def __init__(self, lamb: float, d: int, ref: np.ndarray | None = None):
        self.lamb = float(lamb)
        self.d = int(d)
        self.ref = None if ref is None else torch.as_tensor(np.asarray(ref, dtype=np.float64))

    # ---- per-row contributions
    def rows(self, x: np.ndarray) -> torch.Tensor:
        """The rows in the frame the statistics use ((m, d) float64)."""
        raise NotImplementedError

    def zero(self) -> dict:
        raise NotImplementedError

    def add(self, parts: dict, rows: torch.Tensor, q: np.ndarray, sign: float = 1.0) -> dict:
        raise NotImplementedError

    # ---- the objective and its gradient
    def f_div(self, parts: dict, k: int) -> torch.Tensor:
        raise NotImplementedError

    def f(self, parts: dict, k: int) -> dict:
        """f, f_qua and f_div of the selection these statistics describe."""
        f_qua = float(parts["q"]) / k
        f_div = float(self.f_div(parts, k))
        return {"f": self.lamb * f_qua + (1 - self.lamb) * f_div, "f_qua": f_qua, "f_div": f_div}

    def gradient(self, parts: dict, k: int) -> dict:
        """∂f/∂part for every part (autograd, float64)."""
        leaves = {n: p.detach().clone().requires_grad_(n != "q") for n, p in parts.items()}
        f = (1 - self.lamb) * self.f_div(leaves, k)
        f.backward()
        g = {n: (t.grad if t.grad is not None else torch.zeros_like(t))
             for n, t in leaves.items() if n != "q"}
        g["q"] = torch.tensor(self.lamb / k, dtype=torch.float64)
        return g

    def gains(self, grad: dict, rows: torch.Tensor, q: np.ndarray) -> np.ndarray:
        """Each row's linearised gain of entering the selection (its contribution · ∇f)."""
        raise NotImplementedError


class PairStats(SelectionStats):
    term = "Pair_simi"

    def rows(self, x):
        xt = torch.tensor(np.asarray(x, dtype=np.float32))  # a copy: the rows may be read-only
        return unit_rows(xt).to(torch.float64)

    def zero(self):
        return {"q": torch.zeros((), dtype=torch.float64),
                "s": torch.zeros(self.d, dtype=torch.float64)}

    def add(self, parts, rows, q, sign=1.0):
        return {"q": parts["q"] + sign * float(np.sum(q, dtype=np.float64)),
                "s": parts["s"] + sign * rows.sum(0)}

    def f_div(self, parts, k):
        s = parts["s"]
        return -((s * s).sum() - k) / (k * (k - 1))

    def gains(self, grad, rows, q):
        return (float(grad["q"]) * np.asarray(q, dtype=np.float64)
                + (rows @ grad["s"]).numpy())


class DisfStats(SelectionStats):
    term = "DiSF"

    def rows(self, x):
        xt = torch.as_tensor(np.asarray(x)).to(torch.float64)
        return xt - self.ref if self.ref is not None else xt

    def zero(self):
        d = self.d
        return {"q": torch.zeros((), dtype=torch.float64),
                "m1": torch.zeros(d, dtype=torch.float64),
                "m2": torch.zeros(d, d, dtype=torch.float64)}

    def add(self, parts, rows, q, sign=1.0):
        return {"q": parts["q"] + sign * float(np.sum(q, dtype=np.float64)),
                "m1": parts["m1"] + sign * rows.sum(0),
                "m2": parts["m2"] + sign * (rows.T @ rows)}

    def f_div(self, parts, k):
        mu = parts["m1"] / k
        cov = (parts["m2"] - k * torch.outer(mu, mu)) / (k - 1)
        sig = torch.clamp(torch.diagonal(cov), min=0).sqrt().clamp(min=DISF_STD_FLOOR)
        C = cov / (sig[:, None] * sig[None, :])
        off = (C * C).sum() - (torch.diagonal(C) ** 2).sum()
        return -off / (self.d * self.d)

    def gains(self, grad, rows, q):
        g1, g2 = grad["m1"], grad["m2"]
        quad = ((rows @ g2) * rows).sum(1)
        return (float(grad["q"]) * np.asarray(q, dtype=np.float64)
                + (rows @ g1 + quad).numpy())


def stats_for(term_name: str, lamb: float, d: int, ref=None) -> SelectionStats:
    """The statistics of a built-in term (``HAS_STATS``); ValueError for the others."""
    if term_name == "Pair_simi":
        return PairStats(lamb, d)
    if term_name == "DiSF":
        return DisfStats(lamb, d, ref)
    raise ValueError(f"{term_name} has no sufficient statistics (only {', '.join(HAS_STATS)})")
