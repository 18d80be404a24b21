"""Facility location, f_div = (1/|V|) sum_{i in V} max_{j in U} max(0, cos(x_i, x_j)) (docs/method.md
#facility-location): the batched objective, lazy and stochastic greedy on per-point coverage, and the
swap polish with best / second-best coverage per point (k-medoids swap search, PAM/FastPAM1).
"""

from __future__ import annotations

import torch

from .base import Batch, DiversityTerm, PolishContext, rollout_chunks
from .sampling import CandidateSampler

# Density of s_ij > b2_i above which fac_accumulate uses dense passes. Measured interleaved
# (bench/kernels.py speedups): at the ~6% density of the sample shards the dense passes are as
# fast (2 threads) or faster (1 thread) than the sparse gather / scatter, so the sparse path is
# kept only for very sparse blocks.
DENSE_ABOVE = 0.03


def similarity_matrix(batch: Batch) -> torch.Tensor | None:
    """Clipped cosine similarity of the whole ground set, if it fits in half the budget
    (cached on the batch)."""
    if "S" in batch.cache:
        return batch.cache["S"]
    m = batch.m
    if m * m * batch.elem_size() * 2 > batch.mem_budget:
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


class FacilityLocation(DiversityTerm):
    """Facility location ("Facility")."""

    name = "Facility"
    aliases = ("facility", "facility_location")
    min_k = 1

    # ------------------------------------------------------------------ objective
    def batched(self, batch: Batch, idx: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        G, k = idx.shape
        m = batch.m
        xn = batch.xn
        out = torch.empty(G, dtype=xn.dtype, device=xn.device)
        S = similarity_matrix(batch)
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
        """The chunked work, the cached unit rows and, when it fits half the budget, the
        cached m x m similarity matrix."""
        extra = m * d * itemsize
        if m * m * itemsize * 2 <= budget:
            extra += m * m * itemsize
        return int(budget) + extra

    # --------------------------------------------------------------------- greedy
    def greedy(self, ground: Batch, k: int, lamb: float, *, sample=None, generator=None,
               block: int = 64, **options) -> torch.Tensor:
        """Per-point best coverage b_i = max_{j in U} s_ij; the coverage gain
        c_j = sum_i max(0, s_ij - b_i) only shrinks as U grows, so stale gains are upper bounds
        (lazy greedy). Ranking key at size t: lamb*q_j + (1-lamb)*(t+1)*c_j/n. Exact picks
        refresh blocks of the candidates with the largest bounds until the best fresh key beats
        every stale bound; sampled picks (``sample``) score the s drawn columns against b."""
        xn, q = ground.xn, ground.q
        n, dev, dt = ground.m, xn.device, xn.dtype
        budget = ground.mem_budget
        es = xn.element_size()
        dense = n * n * es <= budget // 2
        S = similarity_matrix(ground) if dense else None

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
        A sweep without an improving swap over every allowed candidate is a local optimum."""
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
