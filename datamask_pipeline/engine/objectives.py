"""Objectives of method.md section 2, batched over G rollouts.

A rollout is a set of k indices into a ground set ("batch") of m samples. Every term maps
``(batch, idx)`` with ``idx`` a ``(G, k)`` long tensor to a ``(G,)`` tensor, higher = better.
Terms are chunked over rollouts (and, for facility location, over ground-set rows) so memory
stays within ``batch.mem_budget`` bytes.

A new diversity term is one function registered with :func:`register_diversity`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict

import torch

DISF_STD_FLOOR = 1e-8

DiversityFn = Callable[["Batch", torch.Tensor], torch.Tensor]
DIVERSITY: Dict[str, DiversityFn] = {}


def register_diversity(name: str):
    """Register ``fn(batch, idx) -> (G,)`` as diversity term ``name``."""

    def deco(fn: DiversityFn) -> DiversityFn:
        DIVERSITY[name] = fn
        return fn

    return deco


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


def default_mem_budget(device: torch.device) -> int:
    return (2 << 30) if device.type == "cuda" else (256 << 20)


@dataclass
class Batch:
    """A ground set: embeddings ``x`` (m, d) and quality ``q`` (m,), on one device."""

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
        """Unit-normalised embeddings (cached)."""
        if "xn" not in self.cache:
            self.cache["xn"] = torch.nn.functional.normalize(self.x, dim=1)
        return self.cache["xn"]

    def elem_size(self) -> int:
        return self.x.element_size()


def _rollout_chunks(G: int, per_rollout_bytes: int, budget: int, override: int | None = None):
    c = override or max(1, int(budget // max(1, per_rollout_bytes)))
    c = min(G, c)
    for s in range(0, G, c):
        yield s, min(G, s + c)


# ---------------------------------------------------------------- quality
def quality(batch: Batch, idx: torch.Tensor) -> torch.Tensor:
    """f_qua: mean quality over the mask."""
    return batch.q[idx].mean(dim=1)


# ---------------------------------------------------------------- pair-wise
@register_diversity("Pair_simi")
def pairwise(batch: Batch, idx: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """-mean over pairs i != j of cosine similarity, via sum_{i,j} x_i.x_j = ||sum x_i||^2."""
    G, k = idx.shape
    if k < 2:
        raise ValueError("pair-wise similarity needs k >= 2")
    xn = batch.xn
    out = torch.empty(G, dtype=xn.dtype, device=xn.device)
    per = k * batch.d * batch.elem_size()
    for s, e in _rollout_chunks(G, per, batch.mem_budget, chunk):
        ssum = xn[idx[s:e]].sum(dim=1)  # (c, d)
        sq = (ssum * ssum).sum(dim=1)
        # sum over i != j of x_i.x_j = ||s||^2 - sum_i ||x_i||^2 = ||s||^2 - k (unit rows;
        # all-zero embeddings are rejected by the data contract)
        out[s:e] = -(sq - k) / (k * (k - 1))
    return out


# ------------------------------------------------------- facility location
def _similarity_matrix(batch: Batch) -> torch.Tensor | None:
    """Clipped cosine similarity of the whole ground set, if it fits in half the budget."""
    if "S" in batch.cache:
        return batch.cache["S"]
    m = batch.m
    if m * m * batch.elem_size() * 2 > batch.mem_budget:
        return None
    xn = batch.xn
    S = (xn @ xn.T).clamp_(min=0)
    batch.cache["S"] = S
    return S


@register_diversity("Facility")
def facility(batch: Batch, idx: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """(1/|V|) sum_{i in V} max_{j in U} max(0, cos(x_i, x_j)), V = the ground set."""
    G, k = idx.shape
    m = batch.m
    xn = batch.xn
    out = torch.empty(G, dtype=xn.dtype, device=xn.device)
    S = _similarity_matrix(batch)
    es = batch.elem_size()
    if S is not None:
        # Reuse the per-batch similarity matrix: gather the mask's rows (S is symmetric;
        # contiguous row gathers are ~6x faster than column gathers on CPU).
        per = m * k * es
        for s, e in _rollout_chunks(G, per, batch.mem_budget // 2, chunk):
            rows = S.index_select(0, idx[s:e].reshape(-1)).view(e - s, k, m)
            out[s:e] = rows.amax(dim=1).mean(dim=1)
        return out
    # Ground set too large for S: similarities block by block of rows.
    rows = max(1, min(m, int(batch.mem_budget // max(1, 2 * k * es))))
    for g in range(G):
        xu = xn[idx[g]]  # (k, d)
        acc = torch.zeros((), dtype=xn.dtype, device=xn.device)
        for r in range(0, m, rows):
            sims = xn[r : r + rows] @ xu.T
            acc = acc + sims.amax(dim=1).clamp_(min=0).sum()
        out[g] = acc / m
    return out


# ------------------------------------------------------------------- DiSF
def disf_from_points(xu: torch.Tensor) -> torch.Tensor:
    """DiSF for a stack of selections ``xu`` (c, k, d): -(sum of squared off-diagonal
    correlations)/d^2, choosing the Gram (k x k) or covariance (d x d) product by shape."""
    c, k, d = xu.shape
    mean = xu.mean(dim=1, keepdim=True)
    xc = xu - mean
    var = (xc * xc).sum(dim=1, keepdim=True) / (k - 1)
    std = var.sqrt().clamp_(min=DISF_STD_FLOOR)
    z = xc / std
    if k < d:
        gram = z @ z.transpose(1, 2)  # (c, k, k); ||Z^T Z||_F = ||Z Z^T||_F
        fro2 = (gram * gram).sum(dim=(1, 2))
    else:
        cov = z.transpose(1, 2) @ z  # (c, d, d)
        fro2 = (cov * cov).sum(dim=(1, 2))
    diag = (z * z).sum(dim=1) / (k - 1)  # (c, d): C_aa
    off = fro2 / (k - 1) ** 2 - (diag * diag).sum(dim=1)
    return -off / (d * d)


@register_diversity("DiSF")
def disf(batch: Batch, idx: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    G, k = idx.shape
    if k < 2:
        raise ValueError("DiSF needs k >= 2")
    d = batch.d
    x = batch.x
    out = torch.empty(G, dtype=x.dtype, device=x.device)
    per = (3 * k * d + min(k, d) ** 2) * batch.elem_size()
    for s, e in _rollout_chunks(G, per, batch.mem_budget, chunk):
        out[s:e] = disf_from_points(x[idx[s:e]])
    return out


# ------------------------------------------------------------------ joint
def diversity_fn(name: str) -> DiversityFn:
    from .config import canonical_algorithm

    key = name if name in DIVERSITY else canonical_algorithm(name)
    return DIVERSITY[key]


def standardize(v: torch.Tensor) -> torch.Tensor:
    return (v - v.mean()) / (v.std(unbiased=False) + 1e-8)


def score(
    batch: Batch, idx: torch.Tensor, algorithm: str, lamb: float, term_norm: str = "none"
):
    """Return (f, f_qua, f_div), each (G,). ``term_norm='standardize'`` standardises each
    term across the G rollouts before mixing (f is then a rollout-relative score)."""
    fq = quality(batch, idx)
    fd = diversity_fn(algorithm)(batch, idx)
    if term_norm == "standardize":
        f = lamb * standardize(fq) + (1 - lamb) * standardize(fd)
    else:
        f = lamb * fq + (1 - lamb) * fd
    return f, fq, fd
