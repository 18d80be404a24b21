"""Facility location, f_div = (1/|V|) sum_{i in V} max_{j in U} max(0, cos(x_i, x_j)) (docs/method.md
#facility-location): the batched objective, lazy and stochastic greedy on per-point coverage, and the
swap polish with best / second-best coverage per point (k-medoids swap search, PAM/FastPAM1), on
the dense similarity or on the sparse one of each row's K nearest neighbours
(:mod:`.neighbors`; ``similarity="sparse"``).
"""

from __future__ import annotations

import torch

from . import neighbors as _nb
from .base import Batch, DiversityTerm, PolishContext, rollout_chunks
from .sampling import CandidateSampler

SIMILARITIES = ("auto", "dense", "sparse")
# Candidate columns per block of the sparse polish (see sparse_polish).
SPARSE_POLISH_COLS = 1024

# Density of s_ij > b2_i above which fac_accumulate uses dense passes. Measured interleaved
# (bench/kernels.py speedups): at the ~6% density of the sample shards the dense passes are as
# fast (2 threads) or faster (1 thread) than the sparse gather / scatter, so the sparse path is
# kept only for very sparse blocks.
DENSE_ABOVE = 0.03


def similarity_matrix(batch: Batch, force: bool = False) -> torch.Tensor | None:
    """Clipped cosine similarity of the whole ground set, if it fits in half the budget or
    ``force`` (cached on the batch)."""
    if "S" in batch.cache:
        return batch.cache["S"]
    m = batch.m
    if not force and m * m * batch.elem_size() * 2 > batch.mem_budget:
        return None
    xn = batch.xn
    S = (xn @ xn.T).clamp_(min=0)
    batch.cache["S"] = S
    return S


# ------------------------------------------------------------------ polish state
class FacilityState:
    """Per point: best coverage b1 by member position p1, second best b2 by p2."""

    def __init__(self, xn: torch.Tensor, members: torch.Tensor, budget: int):
        self.xn = xn
        self.members = members.clone()
        self.n = xn.shape[0]
        self.budget = budget
        n = self.n
        self.b1 = torch.empty(n, dtype=xn.dtype, device=xn.device)
        self.b2 = torch.empty_like(self.b1)
        self.p1 = torch.empty(n, dtype=torch.long, device=xn.device)
        self.p2 = torch.empty_like(self.p1)
        self.refresh(torch.arange(n, device=xn.device))

    def refresh(self, rows: torch.Tensor) -> None:
        """Recompute best / second best coverage of ``rows`` over all members."""
        k = self.members.numel()
        xm = self.xn[self.members]
        chunk = max(1, int(self.budget // max(1, 2 * k * self.xn.element_size())))
        for s in range(0, rows.numel(), chunk):
            r = rows[s : s + chunk]
            sims = (self.xn[r] @ xm.T).clamp_(min=0)
            v, p = sims.topk(2, dim=1)
            self.b1[r], self.b2[r] = v[:, 0], v[:, 1]
            self.p1[r], self.p2[r] = p[:, 0], p[:, 1]

    def loss(self) -> torch.Tensor:
        k = self.members.numel()
        return torch.zeros(k, dtype=self.b1.dtype, device=self.b1.device).index_add_(
            0, self.p1, self.b1 - self.b2)

    def swap(self, pos: int, j: int, col: torch.Tensor) -> None:
        """Member at position ``pos`` leaves, sample j (similarities ``col``, clipped) enters."""
        self.members[pos] = j
        # Points whose best or second best was the leaving member need a recount, unless that
        # coverage was 0 (clipped): a tie at 0 stays 0 with any other member (k >= 3).
        hit = ((self.p1 == pos) & (self.b1 > 0)) | ((self.p2 == pos) & (self.b2 > 0))
        rest = ~hit
        s = col
        up1 = rest & (s > self.b1)
        up2 = rest & ~up1 & (s > self.b2)
        self.b2 = torch.where(up1, self.b1, torch.where(up2, s, self.b2))
        self.p2 = torch.where(up1, self.p1, torch.where(up2, pos, self.p2))
        self.b1 = torch.where(up1, s, self.b1)
        self.p1 = torch.where(up1, pos, self.p1)
        rows = torch.nonzero(hit).flatten()
        if rows.numel():
            self.refresh(rows)


def fac_terms(Sc, b1, b2):
    """Per candidate column: D1 = (s - b1)^+ (the coverage an added sample brings) and
    D2 = (s - b2)^+ - D1 (what it gives back to the points of a removed owner)."""
    D1 = (Sc - b1[:, None]).clamp_(min=0)
    D2 = (Sc - b2[:, None]).clamp_(min=0).sub_(D1)
    return D1, D2


def fac_accumulate(Sc, b1, b2, p1, add, corr, sign: float = 1.0) -> None:
    """Add ``sign`` times the rows' contributions to add (c,) and corr (k, c) for a block of
    candidate columns ``Sc`` (rows, c) given the rows' coverage state (b1, b2, p1). Only
    entries with s_ij > b2_i contribute; when they are rare (below DENSE_ABOVE) they are
    gathered sparsely and scattered into corr by owner, else dense passes are used."""
    nc = Sc.shape[1]
    # density estimated on every 16th row: no extra full pass
    probe = (Sc[::16] > b2[::16, None]).float().mean() if Sc.shape[0] >= 256 else None
    if probe is not None and float(probe) > DENSE_ABOVE:  # dense passes win above this density
        D1, D2 = fac_terms(Sc, b1, b2)
        if sign != 1.0:
            D1.mul_(sign)
            D2.mul_(sign)
        add.add_(D1.sum(0))
        corr.index_add_(0, p1, D2)
        return
    i, j = (Sc > b2[:, None]).nonzero(as_tuple=True)
    s = Sc[i, j]
    d1 = (s - b1[i]).clamp_(min=0)
    d2 = (s - b2[i]).sub_(d1)
    add.index_add_(0, j, d1, alpha=sign)
    corr.view(-1).index_add_(0, p1[i] * nc + j, d2, alpha=sign)


def fac_gains(Sc, st: FacilityState, loss, dq, scale_div):
    """(k, c) swap gains for the candidate columns of ``Sc`` (n, c), from scratch."""
    D1, D2 = fac_terms(Sc, st.b1, st.b2)
    add = D1.sum(0)
    corr = torch.zeros((st.members.numel(), Sc.shape[1]), dtype=Sc.dtype, device=Sc.device)
    corr.index_add_(0, st.p1, D2)
    return (corr.add_(add[None, :]).sub_(loss[:, None])).mul_(scale_div).add_(dq)


# ------------------------------------------------------------ sparse similarity
# On the K-neighbour graph G (neighbors.NeighborGraph) the similarity is s'_ij = s_ij when j is
# one of row i's K nearest neighbours, else 0: facility location on s' is
#     f_sparse(U) = (1/n) sum_i max(0, max_{j in U, j in N_K(i)} s_ij)  <= f_div(U),
# equal where every row has a selected neighbour among its K, and 0 (the clip floor) for a row
# whose K neighbours are all unselected, instead of its largest similarity to U.
def sparse_objective(graph: _nb.NeighborGraph, idx: torch.Tensor, budget: int) -> torch.Tensor:
    """f_sparse of G selections ``idx`` (G, k) -> (G,), row blocks bounded by ``budget``."""
    n, K = graph.n, graph.K
    rows = max(1, int(budget // max(1, 4 * K * (graph.sim.element_size() + 1))))
    out = torch.empty(idx.shape[0], dtype=graph.sim.dtype, device=idx.device)
    member = torch.zeros(n, dtype=torch.bool, device=idx.device)
    for g in range(idx.shape[0]):
        member.zero_()
        member[idx[g]] = True
        acc = torch.zeros((), dtype=torch.float64, device=idx.device)
        for r in range(0, n, rows):
            cov = (graph.sim[r : r + rows] * member[graph.nbr[r : r + rows]]).amax(dim=1)
            acc += cov.double().sum()
        out[g] = acc / n
    return out


def sparse_greedy(graph: _nb.NeighborGraph, q: torch.Tensor, k: int, lamb: float, *,
                  sample=None, generator=None) -> torch.Tensor:
    """Greedy on f_sparse with exact gains, kept up to date: c_j = sum over the rows i that
    list j of (s_ij - b_i)^+; a pick raises b_i on the rows that list it, and only their
    neighbours' gains move (by (s - b_old)^+ - (s - b_new)^+). Ranking key as the dense greedy:
    lamb*q_j + (1-lamb)*(t+1)*c_j/n; ``sample``: stochastic greedy on the same gains."""
    n, dev = graph.n, q.device
    best = torch.zeros(n, dtype=graph.sim.dtype, device=dev)
    gain = torch.zeros(n, dtype=torch.float64, device=dev).index_add_(
        0, graph.nbr.reshape(-1), graph.sim.reshape(-1).double())
    q64 = q.double()
    chosen = torch.zeros(n, dtype=torch.bool, device=dev)
    picks = torch.empty(k, dtype=torch.long, device=dev)
    sampler = CandidateSampler(n, sample, generator, dev) if sample else None
    for t in range(k):
        scale = (1 - lamb) * (t + 1) / n
        cand = sampler.draw() if sampler else None
        if cand is None:
            j = int(torch.argmax((lamb * q64 + scale * gain).masked_fill_(chosen, -torch.inf)))
        else:
            j = int(cand[torch.argmax(lamb * q64[cand] + scale * gain[cand])])
        picks[t] = j
        chosen[j] = True
        rows, s = graph.rows_of(j)
        up = s > best[rows]
        if bool(up.any()):
            r, bn = rows[up], s[up]
            bo = best[r]
            best[r] = bn
            S = graph.sim[r]  # (u, K): the gains of these rows' neighbours change
            delta = (S - bo[:, None]).clamp_(min=0).sub_((S - bn[:, None]).clamp_(min=0))
            gain.index_add_(0, graph.nbr[r].reshape(-1), delta.reshape(-1).double(), alpha=-1.0)
        if sampler:
            sampler.remove(j)
    return picks


class SparseFacilityState:
    """Per row on the graph: best coverage b1 by member position p1 (-1: no member among its
    neighbours, b1 = 0) and second best b2, over the members that are its neighbours."""

    def __init__(self, graph: _nb.NeighborGraph, members: torch.Tensor, budget: int):
        self.g = graph
        self.members = members.clone()
        n, dev = graph.n, members.device
        self.pos_of = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.pos_of[self.members] = torch.arange(self.members.numel(), device=dev)
        self.b1 = torch.zeros(n, dtype=graph.sim.dtype, device=dev)
        self.b2 = torch.zeros_like(self.b1)
        self.p1 = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.rows_per = max(1, int(budget // max(1, 6 * graph.K * 8)))
        self.refresh(torch.arange(n, device=dev))

    def refresh(self, rows: torch.Tensor) -> None:
        g = self.g
        for s in range(0, rows.numel(), self.rows_per):
            r = rows[s : s + self.rows_per]
            P = self.pos_of[g.nbr[r]]  # (r, K) member positions, -1 = not a member
            S = torch.where(P >= 0, g.sim[r], torch.full_like(g.sim[r], -1.0))
            v, a = S.topk(2, dim=1)
            self.b1[r], self.b2[r] = v[:, 0].clamp(min=0), v[:, 1].clamp(min=0)
            self.p1[r] = torch.where(v[:, 0] >= 0, P.gather(1, a[:, :1])[:, 0], -1)

    def loss(self) -> torch.Tensor:
        has = self.p1 >= 0
        return torch.zeros(self.members.numel(), dtype=self.b1.dtype,
                           device=self.b1.device).index_add_(0, self.p1[has], (self.b1 - self.b2)[has])

    def affected(self, pos: int, j: int) -> torch.Tensor:
        """The rows whose coverage a swap (member at ``pos`` out, j in) can change: the rows
        that list either."""
        o = int(self.members[pos])
        return torch.unique(torch.cat([self.g.rows_of(o)[0], self.g.rows_of(j)[0]]))

    def swap(self, pos: int, j: int, rows: torch.Tensor) -> None:
        """Member at ``pos`` leaves, j enters; ``rows``: :meth:`affected`."""
        o = int(self.members[pos])
        self.members[pos] = j
        self.pos_of[o], self.pos_of[j] = -1, pos
        self.refresh(rows)


def sparse_accumulate(col, row, s, b1, b2, p1, add, corr, sign: float = 1.0) -> None:
    """The block's entries (column position, row, similarity) added ``sign`` times to
    add (c,) and corr (k, c), with the rows' coverage (b1, b2, p1) (fac_terms, on entries)."""
    b1e, b2e = b1[row], b2[row]
    d1 = (s - b1e).clamp_(min=0)
    add.index_add_(0, col, d1, alpha=sign)
    p = p1[row]
    keep = (s > b2e) & (p >= 0)
    d2 = (s[keep] - b2e[keep]).sub_(d1[keep])
    corr.view(-1).index_add_(0, p[keep] * corr.shape[1] + col[keep], d2, alpha=sign)


def sparse_polish(c: PolishContext, graph: _nb.NeighborGraph,
                  max_swaps_per_block: int = 64) -> dict:
    """The dense polish's swap search on f_sparse: gain(o, j) = (add_j - loss_o + corr_oj)/n
    with the sums over the graph's entries of column j; a swap re-scores only the rows that
    list the leaving or the entering sample."""
    n, k, lamb = c.n, c.k, c.lamb
    st = SparseFacilityState(graph, c.members, c.budget)
    member = c.member_mask(st.members)

    def fval(state):
        return (lamb * float(c.q64[state.members].sum()) / k
                + (1 - lamb) * float(state.b1.double().sum()) / n)

    f0 = fval(st)
    scale_div = (1 - lamb) / n
    if scale_div <= 0:
        raise ValueError("facility polish needs lamb < 1")
    qw = (lamb / k) / scale_div
    # candidate columns per block: each swap scans a (k, cols) gain table, so small blocks
    # (the budget permitting) keep a swap cheap; every block costs one pass over its entries
    cols = max(1, min(SPARSE_POLISH_COLS, int(c.budget // max(1, (3 * k + 6 * graph.K) * 8))))
    changed = torch.zeros(n, dtype=torch.bool, device=c.dev)
    swaps = rounds = 0
    converged, stop = False, "max_rounds"
    while rounds < c.max_rounds:
        if c.out_of_time():
            stop = "time_budget"
            break
        rounds += 1
        improved = 0
        cand_all = torch.nonzero(c.allowed & ~member).flatten()
        for s0 in range(0, cand_all.numel(), cols):
            if c.out_of_time():
                break
            J = cand_all[s0 : s0 + cols]
            nc = J.numel()
            col, row, s = graph.columns(J)
            add = torch.zeros(nc, dtype=s.dtype, device=c.dev)
            corr = torch.zeros((k, nc), dtype=s.dtype, device=c.dev)
            sparse_accumulate(col, row, s, st.b1, st.b2, st.p1, add, corr)
            A = add + c.q[J] * qw
            block_swaps = 0
            while block_swaps < max_swaps_per_block:
                L = st.loss() + c.q[st.members] * qw
                gain = (corr + A[None, :]).sub_(L[:, None])
                flat = int(torch.argmax(gain))
                pos, jc = flat // nc, flat % nc
                if float(gain[pos, jc]) * scale_div <= c.tol:
                    break
                o, j = int(st.members[pos]), int(J[jc])
                rows = st.affected(pos, j)
                changed[rows] = True
                hit = changed[row]  # the block's entries on rows whose coverage may move
                changed[rows] = False
                ch, rh, sh = col[hit], row[hit], s[hit]
                # take those rows' contributions out, swap, put the new ones in (no full pass)
                sparse_accumulate(ch, rh, sh, st.b1, st.b2, st.p1, add, corr, -1.0)
                st.swap(pos, j, rows)
                sparse_accumulate(ch, rh, sh, st.b1, st.b2, st.p1, add, corr, 1.0)
                member[o], member[j] = False, True
                A = add + c.q[J] * qw
                A.masked_fill_(member[J], -torch.inf)
                swaps += 1
                improved += 1
                block_swaps += 1
            if block_swaps:
                c.progress(fval(st), swaps)
        if c.out_of_time():
            stop = "time_budget"
            break
        if improved == 0:
            converged, stop = True, "local_optimum"
            break
    f_end = fval(SparseFacilityState(graph, st.members, c.budget))  # exact, not accumulated
    return {"members": st.members.clone(), "f_start": f0, "f_end": f_end, "swaps": swaps,
            "moves": swaps, "rounds": rounds, "converged": converged, "stop": stop}


def sparse_best_swap(c: PolishContext, graph: _nb.NeighborGraph) -> tuple[int, int, float]:
    """The exact best single swap on f_sparse (every allowed non-member in one block)."""
    n, k, lamb = c.n, c.k, c.lamb
    st = SparseFacilityState(graph, c.members, c.budget)
    J = torch.nonzero(c.allowed & ~c.member_mask()).flatten()
    col, row, s = graph.columns(J)
    add = torch.zeros(J.numel(), dtype=s.dtype, device=c.dev)
    corr = torch.zeros((k, J.numel()), dtype=s.dtype, device=c.dev)
    sparse_accumulate(col, row, s, st.b1, st.b2, st.p1, add, corr)
    scale_div = (1 - lamb) / n
    dq = (c.q[J][None, :] - c.q[st.members][:, None]) * (lamb / k)
    gain = (corr + add[None, :]).sub_(st.loss()[:, None]).mul_(scale_div).add_(dq)
    flat = int(torch.argmax(gain))
    return int(st.members[flat // J.numel()]), int(J[flat % J.numel()]), float(gain.max())


class FacilityLocation(DiversityTerm):
    """Facility location ("Facility").

    ``similarity``: None (the registered term: the exact objective, the n x n similarity kept
    when it fits half the memory budget, else recomputed in blocks), ``"dense"`` (exact, the
    n x n similarity always kept: the pre-flight counts it), ``"sparse"`` (f_sparse on each
    row's ``neighbors`` nearest neighbours, found by ``knn``: see :mod:`.neighbors`) or
    ``"auto"`` (dense when the n x n similarity fits half the memory budget, else sparse).
    ``LearnerConfig.diversity_term()`` builds it from the facility_* knobs."""

    name = "Facility"
    aliases = ("facility", "facility_location")
    min_k = 1

    def __init__(self, similarity: str | None = None, neighbors: int = 64, knn: str = "auto"):
        if similarity is not None and similarity not in SIMILARITIES:
            raise ValueError(f"facility_similarity must be one of {SIMILARITIES}, got {similarity!r}")
        if knn not in _nb.KNN_METHODS:
            raise ValueError(f"facility_knn must be one of {_nb.KNN_METHODS}, got {knn!r}")
        if int(neighbors) < 2:
            raise ValueError(f"facility_neighbors must be >= 2, got {neighbors}")
        self.similarity, self.neighbors, self.knn = similarity, int(neighbors), knn
        self._graphs: dict = {}  # content hash of the unit rows -> NeighborGraph (the last two)

    def mode(self, m: int, itemsize: int, budget: int) -> str:
        """``dense`` or ``sparse`` on a ground set of m rows (sparse only when it drops
        something: K < m)."""
        if self.similarity == "sparse" or (self.similarity == "auto" and m * m * itemsize * 2 > budget):
            return "sparse" if self.neighbors < m else "dense"
        return "dense"

    def _sparse(self, batch: Batch) -> bool:
        return self.mode(batch.m, batch.elem_size(), batch.mem_budget) == "sparse"

    def graph(self, batch: Batch) -> _nb.NeighborGraph:
        """The K-neighbour graph of ``batch`` (cached on it, and on this term by content)."""
        method = _nb.knn_method(self.knn, batch.x.device)
        key = ("knn", self.neighbors, method)
        if key in batch.cache:
            return batch.cache[key]
        xn = batch.xn
        fp = _nb.fingerprint(xn)
        g = self._graphs.get((fp, key)) if fp is not None else None
        if g is None:
            g = _nb.build_graph(xn, self.neighbors, method, batch.mem_budget)
            if fp is not None:
                while len(self._graphs) >= 2:
                    self._graphs.pop(next(iter(self._graphs)))
                self._graphs[(fp, key)] = g
        batch.cache[key] = g
        return g

    def similarity_bytes(self, n: int, d: int, itemsize: int, budget: int, device="cpu") -> int:
        """What the whole-shard similarity of n rows keeps resident: the n x n matrix (dense)
        or the K-neighbour graph and its index (sparse)."""
        if self.similarity is None:
            return n * n * itemsize if n * n * itemsize * 2 <= budget else 0
        if self.mode(n, itemsize, budget) == "dense":
            return n * n * itemsize
        method = _nb.knn_method(self.knn, torch.device(device))
        return _nb.graph_bytes(n, self.neighbors, d, itemsize, method)

    def __repr__(self) -> str:
        if self.similarity is None:
            return "<diversity term Facility>"
        return (f"<diversity term Facility similarity={self.similarity} "
                f"neighbors={self.neighbors} knn={self.knn}>")

    # ------------------------------------------------------------------ objective
    def batched(self, batch: Batch, idx: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        if self._sparse(batch):
            return sparse_objective(self.graph(batch), idx, batch.mem_budget)
        G, k = idx.shape
        m = batch.m
        xn = batch.xn
        out = torch.empty(G, dtype=xn.dtype, device=xn.device)
        S = similarity_matrix(batch, force=self.similarity is not None)
        es = batch.elem_size()
        if S is not None:
            # Reuse the per-batch similarity matrix: gather the mask's rows (S is symmetric;
            # contiguous row gathers are ~6x faster than column gathers on CPU).
            per = m * k * es
            for s, e in rollout_chunks(G, per, batch.mem_budget // 2, chunk):
                rows = S.index_select(0, idx[s:e].reshape(-1)).view(e - s, k, m)
                out[s:e] = rows.amax(dim=1).mean(dim=1)
            return out
        # Ground set too large for S: similarities block by block of rows, one rollout at a time.
        rows = max(1, min(m, int(batch.mem_budget // max(1, 2 * k * es))))
        for g in range(G):
            xu = xn[idx[g]]  # (k, d)
            acc = torch.zeros((), dtype=xn.dtype, device=xn.device)
            for r in range(0, m, rows):
                sims = xn[r : r + rows] @ xu.T
                acc = acc + sims.amax(dim=1).clamp_(min=0).sum()
            out[g] = acc / m
        return out

    def workspace_bytes(self, m, k, d, itemsize, budget) -> int:
        """The chunked work, the cached unit rows and the whole-ground similarity
        (:meth:`similarity_bytes`: the m x m matrix when it is kept, or the sparse graph)."""
        return int(budget) + m * d * itemsize + self.similarity_bytes(m, d, itemsize, budget)

    # --------------------------------------------------------------------- greedy
    def greedy(self, ground: Batch, k: int, lamb: float, *, sample=None, generator=None,
               block: int = 64, **options) -> torch.Tensor:
        """Per-point best coverage b_i = max_{j in U} s_ij; the coverage gain
        c_j = sum_i max(0, s_ij - b_i) only shrinks as U grows, so stale gains are upper bounds
        (lazy greedy). Ranking key at size t: lamb*q_j + (1-lamb)*(t+1)*c_j/n. Exact picks
        refresh blocks of the candidates with the largest bounds until the best fresh key beats
        every stale bound; sampled picks (``sample``) score the s drawn columns against b.
        On the sparse similarity: :func:`sparse_greedy`."""
        if self._sparse(ground):
            return sparse_greedy(self.graph(ground), ground.q, k, lamb, sample=sample,
                                 generator=generator)
        xn, q = ground.xn, ground.q
        n, dev, dt = ground.m, xn.device, xn.dtype
        budget = ground.mem_budget
        es = xn.element_size()
        dense = self.similarity is not None or n * n * es <= budget // 2
        S = similarity_matrix(ground, force=self.similarity is not None) if dense else None

        def rows(j: torch.Tensor) -> torch.Tensor:  # (b, n) clipped similarities
            return S.index_select(0, j) if dense else (xn[j] @ xn.T).clamp_(min=0)

        best = torch.zeros(n, dtype=dt, device=dev)  # per-point best coverage
        gain = torch.full((n,), torch.inf, dtype=dt, device=dev)  # stale upper bounds
        chosen = torch.zeros(n, dtype=torch.bool, device=dev)
        picks = torch.empty(k, dtype=torch.long, device=dev)
        neg_inf = torch.tensor(-torch.inf, dtype=dt, device=dev)
        b = max(1, min(block, n))
        rows_per = max(1, min(n, int(budget // max(1, 2 * n * es))))
        sampler = CandidateSampler(n, sample, generator, dev) if sample else None
        all_fresh = False  # gains of every sample computed at least once (exact path)
        for t in range(k):
            scale = (1 - lamb) * (t + 1) / n
            cand = sampler.draw() if sampler else None
            if cand is not None:
                g = torch.empty(cand.numel(), dtype=dt, device=dev)
                for s in range(0, cand.numel(), rows_per):
                    g[s : s + rows_per] = (rows(cand[s : s + rows_per]) - best).clamp_(min=0).sum(1)
                gain[cand] = g  # exact now, upper bounds later
                j = int(cand[torch.argmax(lamb * q[cand] + scale * g)])
            else:
                if not all_fresh:
                    # every gain is needed once, in blocks of rows bounded by the budget
                    for s in range(0, n, rows_per):
                        r = torch.arange(s, min(n, s + rows_per), device=dev)
                        gain[r] = (rows(r) - best).clamp_(min=0).sum(1)
                    gain[chosen] = 0
                    all_fresh = True
                    fresh = ~chosen
                else:
                    fresh = torch.zeros(n, dtype=torch.bool, device=dev)
                while True:
                    key = lamb * q + scale * gain
                    key = torch.where(chosen, neg_inf, key)
                    stale_key = torch.where(fresh, neg_inf, key)
                    if fresh.any():
                        fresh_key = torch.where(fresh, key, neg_inf)
                        j = int(torch.argmax(fresh_key))
                        if fresh_key[j] >= stale_key.max():
                            break
                    m_left = int((~chosen & ~fresh).sum())
                    cnd = torch.topk(stale_key, min(b, m_left)).indices
                    gain[cnd] = (rows(cnd) - best).clamp_(min=0).sum(dim=1)
                    fresh[cnd] = True
            picks[t] = j
            chosen[j] = True
            best = torch.maximum(best, rows(picks[t : t + 1])[0])
            gain[j] = 0
            if sampler:
                sampler.remove(j)
        return picks

    # --------------------------------------------------------------------- polish
    def polish(self, c: PolishContext, max_swaps_per_block: int = 64) -> dict:
        """For a block of candidate columns S_J (one n x c similarity product) the gain of
        every (member, candidate) pair is (add_j - loss_o + corr_oj)/n, with
        add_j = sum_i (s_ij - b1_i)^+, loss_o = sum over the points o owns of (b1_i - b2_i),
        corr_oj = sum over the points o owns of (s_ij - b2_i)^+ - (s_ij - b1_i)^+. Improving
        swaps found in a block are applied one at a time, reusing the block's similarities.
        A sweep without an improving swap over every allowed candidate is a local optimum.
        On the sparse similarity: :func:`sparse_polish`."""
        if self._sparse(c.ground):
            return sparse_polish(c, self.graph(c.ground), max_swaps_per_block)
        n, k, lamb = c.n, c.k, c.lamb
        xn = c.ground.xn
        st = FacilityState(xn, c.members, c.budget)
        member = c.member_mask(st.members)

        def fval():
            return (lamb * float(c.q64[st.members].sum()) / k
                    + (1 - lamb) * float(st.b1.double().sum()) / n)

        f0 = fval()
        es = xn.element_size()
        cols = max(1, int(c.budget // max(1, (3 * n + 3 * k) * es)))
        swaps = rounds = 0
        converged, stop = False, "max_rounds"
        scale_div = (1 - lamb) / n
        wq = lamb / k
        if scale_div <= 0:
            raise ValueError("facility polish needs lamb < 1")
        while rounds < c.max_rounds:
            if c.out_of_time():
                stop = "time_budget"
                break
            rounds += 1
            improved = 0
            cand_all = torch.nonzero(c.allowed & ~member).flatten()
            for s0 in range(0, cand_all.numel(), cols):
                if c.out_of_time():
                    break
                J = cand_all[s0 : s0 + cols]
                nc = J.numel()
                Sc = (xn @ xn[J].T).clamp_(min=0)  # one n x c product, reused for every swap below
                add = torch.zeros(nc, dtype=Sc.dtype, device=c.dev)
                corr = torch.zeros((k, nc), dtype=Sc.dtype, device=c.dev)
                fac_accumulate(Sc, st.b1, st.b2, st.p1, add, corr)
                # gain(o, j) = scale_div * (corr_oj + A_j - L_o): the quality part is separable.
                qw = wq / scale_div
                A = add + c.q[J] * qw  # live candidates; a used column becomes -inf
                block_swaps = 0
                while block_swaps < max_swaps_per_block:
                    L = st.loss() + c.q[st.members] * qw
                    gain = (corr + A[None, :]).sub_(L[:, None])
                    flat = int(torch.argmax(gain))
                    pos, jc = flat // nc, flat % nc
                    if float(gain[pos, jc]) * scale_div <= c.tol:
                        break
                    o, j = int(st.members[pos]), int(J[jc])
                    old = (st.b1, st.b2, st.p1)
                    st.swap(pos, j, Sc[:, jc])
                    member[o], member[j] = False, True
                    # Update add / corr on the rows whose coverage state changed (no full pass).
                    R = torch.nonzero((st.b1 != old[0]) | (st.b2 != old[1]) | (st.p1 != old[2])).flatten()
                    if R.numel():
                        ScR = Sc[R]
                        fac_accumulate(ScR, old[0][R], old[1][R], old[2][R], add, corr, -1.0)
                        fac_accumulate(ScR, st.b1[R], st.b2[R], st.p1[R], add, corr, 1.0)
                    A = add + c.q[J] * qw
                    A.masked_fill_(member[J], -torch.inf)
                    swaps += 1
                    improved += 1
                    block_swaps += 1
                if block_swaps:
                    c.progress(fval(), swaps)
            if c.out_of_time():
                stop = "time_budget"
                break
            if improved == 0:
                converged, stop = True, "local_optimum"
                break
        # Rebuild the coverage state from scratch: the returned f is exact, not accumulated.
        st2 = FacilityState(xn, st.members, c.budget)
        f_end = (lamb * float(c.q64[st2.members].sum()) / k
                 + (1 - lamb) * float(st2.b1.double().sum()) / n)
        return {"members": st.members.clone(), "f_start": f0, "f_end": f_end, "swaps": swaps,
                "moves": swaps, "rounds": rounds, "converged": converged, "stop": stop}

    def best_swap(self, c: PolishContext) -> tuple[int, int, float]:
        if self._sparse(c.ground):
            return sparse_best_swap(c, self.graph(c.ground))
        k, lamb, n = c.k, c.lamb, c.n
        st = FacilityState(c.ground.xn, c.members, c.budget)
        member = c.member_mask()
        nonm = torch.nonzero(c.allowed & ~member).flatten()
        Sc = (st.xn @ st.xn[nonm].T).clamp_(min=0)
        dq = (c.q[nonm][None, :] - c.q[st.members][:, None]) * (lamb / k)
        gain = fac_gains(Sc, st, st.loss(), dq, (1 - lamb) / n)
        flat = int(torch.argmax(gain))
        return (int(st.members[flat // nonm.numel()]), int(nonm[flat % nonm.numel()]),
                float(gain.max()))


FACILITY = FacilityLocation()


def facility_part(term) -> FacilityLocation | None:
    """The facility-location term in ``term`` (itself or a part of a Mixture), or None."""
    parts = [t for t, _ in term.parts.values()] if hasattr(term, "parts") else [term]
    return next((t for t in parts if isinstance(t, FacilityLocation)), None)
