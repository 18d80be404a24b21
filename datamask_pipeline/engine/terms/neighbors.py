"""The sparse similarity of facility location: every row's K nearest neighbours by cosine
(itself included, clipped at 0 like the dense term) and the reverse lists (which rows list a
sample), found with a faiss inverted-file index (IVF-Flat) or an exact blockwise torch top-k.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

__all__ = ["KNN_METHODS", "NeighborGraph", "build_graph", "graph_bytes", "knn_method"]

KNN_METHODS = ("auto", "faiss", "exact")
# faiss.IndexIVFFlat with inner product on unit rows: the whole shard queries itself, and
# IVF answers that batch as blocked matrix products over the nprobe nearest of nlist k-means
# cells (exact inner products of the rows it visits). Measured on 10^4 x 128 clustered rows,
# one thread, K = 64 (bench/results/REPORT_sparse_facility.md): IVF 1.3 s at recall 0.97,
# HNSW (M = 32, efSearch 128) 4.6 s at 0.985, the exact top-k 2.8 s; IVF's search grows as
# n^1.5, the exact one as n^2. tests/engine/test_sparse_facility.py bounds its recall.
IVF_NPROBE = 16
IVF_TRAIN_PER_CELL = 39  # faiss's minimum training points per centroid


def ivf_lists(n: int) -> int:
    """Cells of the IVF index for n rows: 4·sqrt(n), with at least 39 rows per cell."""
    return max(1, min(int(4 * math.sqrt(n)), n // IVF_TRAIN_PER_CELL))


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def knn_method(knn: str, device: torch.device) -> str:
    """``auto``: faiss on CPU when it imports, else (and on CUDA, where a blockwise top-k of
    matrix products is fast) the exact top-k. ``faiss`` without faiss installed is an error."""
    if knn not in KNN_METHODS:
        raise ValueError(f"facility_knn must be one of {KNN_METHODS}, got {knn!r}")
    if knn == "exact":
        return "exact"
    if knn == "faiss":
        if not faiss_available():
            raise ImportError("facility_knn='faiss' needs the faiss-cpu package "
                              "(pip install faiss-cpu), or use facility_knn='exact'")
        return "faiss"
    return "faiss" if torch.device(device).type == "cpu" and faiss_available() else "exact"


def graph_bytes(n: int, K: int, d: int, itemsize: int, method: str) -> int:
    """Resident bytes of a graph of n rows and K neighbours (forward lists and reverse CSR,
    int64 indices), plus the index faiss builds (a float32 copy of the rows, their list ids, the
    centroids) and its (n, K) distance and label outputs."""
    K = min(K, n)
    lists = 2 * n * K * (8 + itemsize) + (n + 1) * 8
    build = n * d * 4 + n * 8 + ivf_lists(n) * d * 4 + n * K * 12 if method == "faiss" else 0
    return int(lists + build)


@dataclass
class NeighborGraph:
    """``nbr`` (n, K) and ``sim`` (n, K): row i's neighbours and their clipped cosines (i is
    one of them); the reverse lists in CSR form: the rows that list sample j are
    ``rev_row[indptr[j]:indptr[j + 1]]``, with similarities ``rev_sim``."""

    nbr: torch.Tensor
    sim: torch.Tensor
    indptr: torch.Tensor
    rev_row: torch.Tensor
    rev_sim: torch.Tensor
    method: str

    @property
    def n(self) -> int:
        return self.nbr.shape[0]

    @property
    def K(self) -> int:
        return self.nbr.shape[1]

    def rows_of(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows that list sample j, and their similarity to it."""
        a, b = int(self.indptr[j]), int(self.indptr[j + 1])
        return self.rev_row[a:b], self.rev_sim[a:b]

    def columns(self, J: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The entries of the columns ``J`` as (position in J, row, similarity), one per entry."""
        start = self.indptr[J]
        counts = self.indptr[J + 1] - start
        col = torch.repeat_interleave(torch.arange(J.numel(), device=J.device), counts)
        first = torch.cumsum(counts, 0) - counts  # where each column's run starts in the output
        e = torch.arange(col.numel(), device=J.device) - first[col] + start[col]
        return col, self.rev_row[e], self.rev_sim[e]


def _exact(xn: torch.Tensor, K: int, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = xn.shape[0]
    rows = max(1, int(budget // max(1, 2 * n * xn.element_size())))
    sim = torch.empty((n, K), dtype=xn.dtype, device=xn.device)
    nbr = torch.empty((n, K), dtype=torch.long, device=xn.device)
    for s in range(0, n, rows):
        v, i = (xn[s : s + rows] @ xn.T).topk(K, dim=1)  # (rows, K)
        sim[s : s + rows], nbr[s : s + rows] = v, i
    return sim, nbr


def _faiss(xn: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    import faiss
    import numpy as np

    a = np.ascontiguousarray(xn.detach().cpu().numpy(), dtype=np.float32)
    n, d = a.shape
    nlist = ivf_lists(n)
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.train(a)
    index.add(a)
    index.nprobe = min(IVF_NPROBE, nlist)
    sim, nbr = index.search(a, K)  # cosines (unit rows); label -1 where fewer than K were found
    sim = torch.from_numpy(sim).to(device=xn.device, dtype=xn.dtype)
    return sim, torch.from_numpy(nbr).to(device=xn.device, dtype=torch.long)


def build_graph(xn: torch.Tensor, K: int, method: str, budget: int) -> NeighborGraph:
    """The K-neighbour graph of the unit rows ``xn`` (n, d) with ``method`` (``faiss`` or
    ``exact``). Slots the index leaves empty become (self, 0); a row whose own index is
    missing gets it in its last slot, so that a selected row always covers itself."""
    n = xn.shape[0]
    K = min(int(K), n)
    sim, nbr = _exact(xn, K, budget) if method == "exact" else _faiss(xn, K)
    row = torch.arange(n, device=xn.device)[:, None]
    empty = nbr < 0
    nbr = torch.where(empty, row, nbr)
    zero = torch.zeros((), dtype=sim.dtype, device=sim.device)
    sim = torch.where(empty, zero, sim).clamp_(min=0)
    self_dot = (xn * xn).sum(1).clamp_(min=0)
    own = (nbr == row) & ~empty
    sim = torch.where(own, self_dot[:, None].expand_as(sim), sim)
    missing = torch.nonzero(~own.any(1)).flatten()
    if missing.numel():
        e = empty[missing]  # an empty slot if there is one, else the last (farthest) one
        slot = torch.where(e.any(1), e.int().argmax(1), torch.full_like(missing, K - 1))
        nbr[missing, slot] = missing
        sim[missing, slot] = self_dot[missing]
    # reverse lists: entries sorted by column (stable: rows ascending within a column)
    flat = nbr.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n)
    indptr = torch.zeros(n + 1, dtype=torch.long, device=xn.device)
    indptr[1:] = torch.cumsum(counts, 0)
    return NeighborGraph(nbr.contiguous(), sim.contiguous(), indptr, order // K,
                         sim.reshape(-1)[order], method)


def fingerprint(xn: torch.Tensor) -> str | None:
    """A content hash of the rows (CPU tensors only): ground sets with equal rows share a graph."""
    if xn.device.type != "cpu":
        return None
    h = hashlib.blake2b(digest_size=16)
    h.update(str((tuple(xn.shape), str(xn.dtype))).encode())
    h.update(memoryview(xn.contiguous().numpy()).cast("B"))
    return h.hexdigest()
