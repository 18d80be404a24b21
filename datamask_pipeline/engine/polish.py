"""Swap-based local search ("polish") on the whole-shard objective.

The policy-gradient learner optimises a batch-local estimate of f; its read-out is judged on
the whole shard (method.md section 6). ``polish`` starts from any selection of k samples and
repeatedly exchanges members for non-members while the *whole-shard* objective

    f(U) = lamb * mean_{i in U} q_i + (1 - lamb) * f_div(U)

increases, so it never returns a selection worse than the one it was given and keeps exactly
k samples. Every step is batched torch (no Python loop over samples):

* **Pair_simi** -- running sum s = sum_U x_i (unit rows), a = X s. The gain of swapping member
  o for non-member j is  g_j + h_o - 2 beta (1 - x_o.x_j)  with g_j = alpha q_j - 2 beta a_j,
  h_o = -alpha q_o + 2 beta a_o, alpha = lamb/k, beta = (1-lamb)/(k(k-1)); since the last term
  is <= 0, g_j + h_o bounds it from above, which prunes the exact best-swap search.
* **Facility** -- per point the best and second-best coverage (and their owners), as in
  k-medoids swap search (PAM / FastPAM1): for a block of candidate columns S_J (one n x c
  similarity product) the gain of every (member, candidate) pair is
  (add_j - loss_o + corr_oj)/n, with add_j = sum_i (s_ij - b1_i)^+, loss_o = sum over the
  points o owns of (b1_i - b2_i), corr_oj = sum over the points o owns of
  (s_ij - b2_i)^+ - (s_ij - b1_i)^+ (one scatter-add). Improving swaps found in a block are
  applied one at a time, reusing the block's similarities.
* **DiSF** -- the scatter matrix of U is updated by rank one per added / removed sample (as in
  the greedy baseline); f_div of U + j for every non-member and of U - o for every member is
  two (rows x d) @ (d x d) products each.

Pair-wise and DiSF use *block swaps*: pair the B best incoming with the B best outgoing
samples (by their single-sample scores), score the exchanged set exactly, keep it if f rose
(then try 2B), else halve B; at B = 1 an exact best-swap search decides whether the current
selection is a local optimum (Pair_simi: over every pair the upper bound admits; DiSF: over
every non-member for the ``disf_exact_outs`` most promising members).

Scores used to *rank* moves may be float32; every *accepted* move is scored exactly (float64
state for pair-wise and DiSF; for facility, the per-point coverage state is rebuilt from
scratch at the end and the start is returned if float noise made the result worse).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict

import numpy as np
import torch

from .objectives import DISF_STD_FLOOR, default_mem_budget

__all__ = ["polish", "polish_readout", "best_swap", "PolishResult", "POLISH"]


@dataclass
class PolishResult:
    selected: np.ndarray  # sorted int64 indices, exactly k
    f_start: float
    f_end: float
    swaps: int  # samples exchanged (a block swap of B counts B)
    moves: int  # accepted moves (block or single)
    rounds: int  # iterations / sweeps
    elapsed_s: float
    converged: bool  # stopped at a local optimum (not by a budget)
    history: list = field(default_factory=list)  # (elapsed_s, f, swaps)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["selected"] = None
        d["k"] = int(self.selected.size)
        return d


@dataclass
class _Ctx:
    x: torch.Tensor  # (n, d) working dtype
    q: torch.Tensor  # (n,) working dtype
    q64: torch.Tensor  # (n,) float64
    members: torch.Tensor  # (k,) long
    allowed: torch.Tensor  # (n,) bool, non-members that may enter
    lamb: float
    budget: int
    deadline: float
    max_rounds: int
    tol: float
    on_progress: Callable | None
    t0: float

    @property
    def n(self) -> int:
        return self.x.shape[0]

    @property
    def k(self) -> int:
        return self.members.numel()

    @property
    def dev(self):
        return self.x.device

    def out_of_time(self) -> bool:
        return time.perf_counter() > self.deadline


PolishFn = Callable[[_Ctx], dict]
POLISH: Dict[str, PolishFn] = {}


def _register(name: str):
    def deco(fn):
        POLISH[name] = fn
        return fn

    return deco


def _unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=1)


def _member_mask(n: int, members: torch.Tensor) -> torch.Tensor:
    m = torch.zeros(n, dtype=torch.bool, device=members.device)
    m[members] = True
    return m


def _tol(dtype: torch.dtype) -> float:
    return 1e-12 if dtype == torch.float64 else 1e-9


# ---------------------------------------------------------------- pair-wise
def _pair_f(qsum: float, s: torch.Tensor, k: int, lamb: float) -> float:
    return lamb * qsum / k - (1 - lamb) * (float(s @ s) - k) / (k * (k - 1))


@_register("Pair_simi")
def _polish_pairwise(c: _Ctx) -> dict:
    n, k, lamb = c.n, c.k, c.lamb
    xn = _unit(c.x)
    alpha, beta = lamb / k, (1 - lamb) / (k * (k - 1))
    member = _member_mask(n, c.members)
    s = xn[member].double().sum(0)
    qsum = float(c.q64[member].sum())
    f = _pair_f(qsum, s, k, lamb)
    f0 = f
    swaps = moves = rounds = 0
    bcap = max(1, k // 8)
    converged = False
    neg = torch.tensor(-torch.inf, dtype=xn.dtype, device=c.dev)
    while rounds < c.max_rounds and not c.out_of_time():
        rounds += 1
        a = xn @ s.to(xn.dtype)
        g = torch.where(c.allowed & ~member, alpha * c.q - 2 * beta * a, neg)
        h = torch.where(member, -alpha * c.q + 2 * beta * a, neg)
        B = min(bcap, k, int((c.allowed & ~member).sum()))
        if B < 1:
            converged = True
            break
        gv, gi = torch.topk(g, B)
        hv, ho = torch.topk(h, B)
        pos = int(((gv + hv) > 0).sum())  # the prefix whose first-order gain is positive
        if pos == 0:
            converged = True  # no pair has a positive upper bound
            break
        B = pos
        J, O = gi[:B], ho[:B]
        s_new = s - xn[O].double().sum(0) + xn[J].double().sum(0)
        q_new = qsum - float(c.q64[O].sum()) + float(c.q64[J].sum())
        f_new = _pair_f(q_new, s_new, k, lamb)
        if f_new > f + c.tol:
            member[O] = False
            member[J] = True
            s, qsum, f = s_new, q_new, f_new
            swaps += B
            moves += 1
            bcap = min(k, 2 * B)
            if c.on_progress:
                c.on_progress(time.perf_counter() - c.t0, f, swaps)
            continue
        if B > 1:
            bcap = B // 2
            continue
        # B = 1 failed: exact best single swap over every pair the bound admits.
        best = _pair_best_swap(xn, g, h, beta, member, c.budget)
        if best is None or best[2] <= c.tol:
            converged = True
            break
        o, j, _ = best
        s_new = s - xn[o].double() + xn[j].double()
        q_new = qsum - float(c.q64[o]) + float(c.q64[j])
        f_new = _pair_f(q_new, s_new, k, lamb)
        if f_new <= f + c.tol:
            converged = True
            break
        member[o], member[j] = False, True
        s, qsum, f = s_new, q_new, f_new
        swaps += 1
        moves += 1
        bcap = 2
    return {"members": torch.nonzero(member).flatten(), "f_start": f0, "f_end": f,
            "swaps": swaps, "moves": moves, "rounds": rounds, "converged": converged}


def _pair_best_swap(xn, g, h, beta, member, budget):
    """Exact best (o, j, gain) over all member/non-member pairs whose bound g_j + h_o > 0."""
    gmax, hmax = float(g.max()), float(h.max())
    J = torch.nonzero(g + hmax > 0).flatten()
    O = torch.nonzero(h + gmax > 0).flatten()
    if J.numel() == 0 or O.numel() == 0:
        return None
    best = (None, None, -float("inf"))
    xo = xn[O]
    rows = max(1, int(budget // max(1, 3 * O.numel() * xn.element_size())))
    for s in range(0, J.numel(), rows):
        Jc = J[s : s + rows]
        gain = g[Jc][None, :] + h[O][:, None] - 2 * beta * (1 - xo @ xn[Jc].T)
        v = float(gain.max())
        if v > best[2]:
            flat = int(torch.argmax(gain))
            best = (int(O[flat // Jc.numel()]), int(Jc[flat % Jc.numel()]), v)
    return best


# --------------------------------------------------------------------- DiSF
def _disf_fdiv(W: torch.Tensor, k: int) -> float:
    """f_div of a selection of k samples from its scatter matrix W (float64)."""
    d = W.shape[0]
    var = torch.diagonal(W) / (k - 1)
    std = var.clamp(min=0).sqrt().clamp(min=DISF_STD_FLOOR)
    C = W / ((k - 1) * std[:, None] * std[None, :])
    off = float((C * C).sum() - (torch.diagonal(C) ** 2).sum())
    return -off / (d * d)


def _disf_rank_one(xb, mu, W, Wsq, c, denom, d):
    """f_div of the selection whose scatter matrix is W + c v v^T (v = row - mu), unbiased
    variance divisor ``denom``, for every row of ``xb``. c > 0 adds a sample, c < 0 removes
    one (the downdate of Welford's update)."""
    v = xb - mu
    var = (torch.diagonal(W) + c * v * v) / denom
    w = 1.0 / var.clamp(min=DISF_STD_FLOOR**2)
    y = v * w
    total = ((w @ Wsq) * w).sum(1) + 2 * c * ((y @ W) * y).sum(1) + c * c * (v * y).sum(1) ** 2
    total = total / (denom * denom)
    diag = var * w
    off = total - (diag * diag).sum(1)
    return -off / (d * d)


class _DisfState:
    def __init__(self, x: torch.Tensor, member: torch.Tensor):
        self.x = x
        xs = x[member].double()
        self.k = xs.shape[0]
        self.S1 = xs.sum(0)
        self.S2 = xs.T @ xs

    def W_mu(self, S1=None, S2=None, k=None):
        S1 = self.S1 if S1 is None else S1
        S2 = self.S2 if S2 is None else S2
        k = self.k if k is None else k
        mu = S1 / k
        return S2 - k * torch.outer(mu, mu), mu

    def fdiv(self, S1=None, S2=None) -> float:
        W, _ = self.W_mu(S1, S2)
        return _disf_fdiv(W, self.k)

    def exchanged(self, O, J):
        xo, xj = self.x[O].double(), self.x[J].double()
        return self.S1 - xo.sum(0) + xj.sum(0), self.S2 - xo.T @ xo + xj.T @ xj


def _disf_scores(x, rows_idx, W, mu, c, denom, budget):
    d = x.shape[1]
    Wd, mud = W.to(x.dtype), mu.to(x.dtype)
    Wsq = Wd * Wd
    out = torch.empty(rows_idx.numel(), dtype=x.dtype, device=x.device)
    rows = max(1, int(budget // max(1, 6 * d * x.element_size())))
    for s in range(0, rows_idx.numel(), rows):
        out[s : s + rows] = _disf_rank_one(x[rows_idx[s : s + rows]], mud, Wd, Wsq, c, denom, d)
    return out


def _disf_swap_gains_for_out(st: _DisfState, o: int, cand: torch.Tensor, q, lamb, budget):
    """Exact f(U - o + j) - f(U)'s diversity part and quality part, for every j in cand."""
    k = st.k
    xo = st.x[o].double()
    S1m = st.S1 - xo
    S2m = st.S2 - torch.outer(xo, xo)
    Wm, mum = st.W_mu(S1m, S2m, k - 1)
    fd = _disf_scores(st.x, cand, Wm, mum, (k - 1) / k, k - 1, budget)
    return fd, (q[cand] - q[o]) * (lamb / k)


@_register("DiSF")
def _polish_disf(c: _Ctx, exact_outs: int = 4) -> dict:
    n, k, lamb = c.n, c.k, c.lamb
    x = c.x
    member = _member_mask(n, c.members)
    st = _DisfState(x, member)
    qsum = float(c.q64[member].sum())
    fd = st.fdiv()
    f = lamb * qsum / k + (1 - lamb) * fd
    f0 = f
    swaps = moves = rounds = 0
    bcap = max(1, k // 8)
    converged = False
    while rounds < c.max_rounds and not c.out_of_time():
        rounds += 1
        W, mu = st.W_mu()
        nonm = torch.nonzero(c.allowed & ~member).flatten()
        mem = torch.nonzero(member).flatten()
        if nonm.numel() == 0:
            converged = True
            break
        # single-sample scores (first-order swap gains split into an "in" and an "out" part)
        g = lamb * c.q[nonm] / k + (1 - lamb) * (_disf_scores(x, nonm, W, mu, k / (k + 1), k, c.budget) - fd)
        h = -lamb * c.q[mem] / k + (1 - lamb) * (
            _disf_scores(x, mem, W, mu, -k / (k - 1), k - 2, c.budget) - fd)
        B = min(bcap, nonm.numel())
        gv, gi = torch.topk(g, B)
        hv, hi = torch.topk(h, B)
        pos = int(((gv + hv) > 0).sum())
        if pos > 0:
            B = pos
            J, O = nonm[gi[:B]], mem[hi[:B]]
            S1n, S2n = st.exchanged(O, J)
            q_new = qsum - float(c.q64[O].sum()) + float(c.q64[J].sum())
            fd_new = st.fdiv(S1n, S2n)
            f_new = lamb * q_new / k + (1 - lamb) * fd_new
            if f_new > f + c.tol:
                member[O], member[J] = False, True
                st.S1, st.S2, qsum, fd, f = S1n, S2n, q_new, fd_new, f_new
                swaps += B
                moves += 1
                bcap = min(k, 2 * B)
                if c.on_progress:
                    c.on_progress(time.perf_counter() - c.t0, f, swaps)
                continue
            if B > 1:
                bcap = B // 2
                continue
        # Exact best swap for the most promising members: every non-member scored on U - o.
        n_out = min(exact_outs, mem.numel())
        outs = mem[torch.topk(h, n_out).indices]
        best = (None, None, c.tol)
        for o in outs.tolist():
            if c.out_of_time():
                break
            fdj, dq = _disf_swap_gains_for_out(st, o, nonm, c.q, lamb, c.budget)
            gain = dq + (1 - lamb) * (fdj - fd)
            v, jj = torch.max(gain, 0)
            if float(v) > best[2]:
                best = (o, int(nonm[jj]), float(v))
        if best[0] is None:
            converged = not c.out_of_time()
            break
        o, j = best[0], best[1]
        O, J = torch.tensor([o], device=c.dev), torch.tensor([j], device=c.dev)
        S1n, S2n = st.exchanged(O, J)
        q_new = qsum - float(c.q64[o]) + float(c.q64[j])
        fd_new = st.fdiv(S1n, S2n)
        f_new = lamb * q_new / k + (1 - lamb) * fd_new
        if f_new <= f + c.tol:
            converged = True
            break
        member[o], member[j] = False, True
        st.S1, st.S2, qsum, fd, f = S1n, S2n, q_new, fd_new, f_new
        swaps += 1
        moves += 1
        bcap = 2
        if c.on_progress:
            c.on_progress(time.perf_counter() - c.t0, f, swaps)
    return {"members": torch.nonzero(member).flatten(), "f_start": f0, "f_end": f,
            "swaps": swaps, "moves": moves, "rounds": rounds, "converged": converged}


# ---------------------------------------------------------------- facility
class _FacState:
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


def _fac_terms(Sc, b1, b2):
    """Per candidate column: D1 = (s - b1)^+ (the coverage an added sample brings) and
    D2 = (s - b2)^+ - D1 (what it gives back to the points of a removed owner)."""
    D1 = (Sc - b1[:, None]).clamp_(min=0)
    D2 = (Sc - b2[:, None]).clamp_(min=0).sub_(D1)
    return D1, D2


# Density of s_ij > b2_i above which _fac_accumulate uses dense passes. Measured interleaved
# (bench/kernels.py speedups): at the ~6% density of the sample shards the dense passes are as
# fast (2 threads) or faster (1 thread) than the sparse gather / scatter, so the sparse path is
# kept only for very sparse blocks.
DENSE_ABOVE = 0.03


def _fac_accumulate(Sc, b1, b2, p1, add, corr, sign: float = 1.0) -> None:
    """Add ``sign`` times the rows' contributions to add (c,) and corr (k, c) for a block of
    candidate columns ``Sc`` (rows, c) given the rows' coverage state (b1, b2, p1). Only
    entries with s_ij > b2_i contribute; when they are rare (below DENSE_ABOVE) they are
    gathered sparsely and scattered into corr by owner, else dense passes are used."""
    nc = Sc.shape[1]
    # density estimated on every 16th row: no extra full pass
    probe = (Sc[::16] > b2[::16, None]).float().mean() if Sc.shape[0] >= 256 else None
    if probe is not None and float(probe) > DENSE_ABOVE:  # dense passes win above this density
        D1 = (Sc - b1[:, None]).clamp_(min=0)
        D2 = (Sc - b2[:, None]).clamp_(min=0).sub_(D1)
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


def _fac_gains(Sc, st: _FacState, loss, dq, scale_div):
    """(k, c) swap gains for the candidate columns of ``Sc`` (n, c), from scratch."""
    D1, D2 = _fac_terms(Sc, st.b1, st.b2)
    add = D1.sum(0)
    corr = torch.zeros((st.members.numel(), Sc.shape[1]), dtype=Sc.dtype, device=Sc.device)
    corr.index_add_(0, st.p1, D2)
    return (corr.add_(add[None, :]).sub_(loss[:, None])).mul_(scale_div).add_(dq)


@_register("Facility")
def _polish_facility(c: _Ctx, max_swaps_per_block: int = 64) -> dict:
    n, k, lamb = c.n, c.k, c.lamb
    xn = _unit(c.x)
    st = _FacState(xn, c.members, c.budget)
    member = _member_mask(n, st.members)

    def fval():
        return lamb * float(c.q64[st.members].sum()) / k + (1 - lamb) * float(st.b1.double().sum()) / n

    f0 = fval()
    es = xn.element_size()
    cols = max(1, int(c.budget // max(1, (3 * n + 3 * k) * es)))
    swaps = rounds = 0
    converged = False
    scale_div = (1 - lamb) / n
    wq = lamb / k
    if scale_div <= 0:
        raise ValueError("facility polish needs lamb < 1")
    while rounds < c.max_rounds and not c.out_of_time():
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
            _fac_accumulate(Sc, st.b1, st.b2, st.p1, add, corr)
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
                    _fac_accumulate(ScR, old[0][R], old[1][R], old[2][R], add, corr, -1.0)
                    _fac_accumulate(ScR, st.b1[R], st.b2[R], st.p1[R], add, corr, 1.0)
                A = add + c.q[J] * qw
                A.masked_fill_(member[J], -torch.inf)
                swaps += 1
                improved += 1
                block_swaps += 1
            if c.on_progress and block_swaps:
                c.on_progress(time.perf_counter() - c.t0, fval(), swaps)
        if improved == 0 and not c.out_of_time():
            converged = True
            break
    # Rebuild the coverage state from scratch: the returned f is exact, not accumulated.
    st2 = _FacState(xn, st.members, c.budget)
    f_end = lamb * float(c.q64[st2.members].sum()) / k + (1 - lamb) * float(st2.b1.double().sum()) / n
    return {"members": st.members.clone(), "f_start": f0, "f_end": f_end, "swaps": swaps,
            "moves": swaps, "rounds": rounds, "converged": converged}


# ------------------------------------------------------------------ driver
def _prepare(x, q, device, dtype):
    from .learner import resolve_device

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


def polish(x, q, selected, algorithm: str, lamb: float = 0.5, *, device="cpu", dtype=None,
           allowed=None, time_budget_s: float | None = None, max_rounds: int = 10_000,
           mem_budget: int | None = None, disf_exact_outs: int = 4,
           on_progress: Callable[[float, float, int], None] | None = None) -> PolishResult:
    """Improve ``selected`` (k indices or a bool mask) by swaps on the whole-shard objective.

    ``allowed``: bool (n,) of samples that may enter (e.g. the pool left by quality pruning;
    default all). Stops at a local optimum (see the module docstring), after ``max_rounds``
    iterations, or when ``time_budget_s`` has passed. ``disf_exact_outs``: members whose every
    swap is scored exactly before DiSF declares a local optimum (k makes it exhaustive). ``on_progress(elapsed_s, f, swaps)`` is
    called after accepted moves. Never returns a selection with lower f than the input (up to
    the float tolerance of the working dtype)."""
    from .config import canonical_algorithm
    from .evaluate import as_indices

    t0 = time.perf_counter()
    algorithm = canonical_algorithm(algorithm)
    if not (0.0 <= lamb <= 1.0):
        raise ValueError(f"lamb must be in [0, 1], got {lamb}")
    xt, qt, q64 = _prepare(x, q, device, dtype)
    n = xt.shape[0]
    idx = as_indices(selected, n)
    k = idx.size
    members = torch.as_tensor(idx, device=xt.device)
    if allowed is None:
        allowed_t = torch.ones(n, dtype=torch.bool, device=xt.device)
    else:
        allowed_t = torch.as_tensor(np.asarray(allowed), device=xt.device).bool()
        if allowed_t.shape != (n,):
            raise ValueError(f"allowed must be a bool mask of shape ({n},)")
    min_k = 3
    if lamb == 1.0 or k < min_k or k >= n:
        # lamb = 1: f is modular, quality top-k is already optimal and the learner reads it
        # out exactly; tiny k: nothing to polish with the identities used here.
        return PolishResult(np.sort(idx), float("nan"), float("nan"), 0, 0, 0,
                            time.perf_counter() - t0, True)
    ctx = _Ctx(
        x=xt, q=qt, q64=q64, members=members, allowed=allowed_t, lamb=float(lamb),
        budget=mem_budget or default_mem_budget(xt.device),
        deadline=t0 + (time_budget_s if time_budget_s is not None else float("inf")),
        max_rounds=int(max_rounds), tol=_tol(xt.dtype), on_progress=on_progress, t0=t0,
    )
    extra = {"exact_outs": int(disf_exact_outs)} if algorithm == "DiSF" else {}
    out = POLISH[algorithm](ctx, **extra)
    sel = np.sort(out["members"].cpu().numpy().astype(np.int64))
    f_start, f_end = out["f_start"], out["f_end"]
    if not (f_end >= f_start):  # float noise (facility) or NaN: keep what we were given
        sel, f_end = np.sort(idx), f_start
    return PolishResult(sel, f_start, f_end, out["swaps"], out["moves"], out["rounds"],
                        time.perf_counter() - t0, out["converged"])


def best_swap(x, q, selected, algorithm: str, lamb: float = 0.5, *, device="cpu",
              mem_budget: int | None = None) -> tuple[int, int, float]:
    """The exact best single swap (member o out, non-member j in) and its gain in f, found with
    the batched identities polish uses (for tests and diagnostics)."""
    from .config import canonical_algorithm
    from .evaluate import as_indices

    algorithm = canonical_algorithm(algorithm)
    xt, qt, q64 = _prepare(x, q, device, None)
    n = xt.shape[0]
    idx = torch.as_tensor(as_indices(selected, n), device=xt.device)
    k = idx.numel()
    budget = mem_budget or default_mem_budget(xt.device)
    member = _member_mask(n, idx)
    nonm = torch.nonzero(~member).flatten()
    if algorithm == "Pair_simi":
        xn = _unit(xt)
        alpha, beta = lamb / k, (1 - lamb) / (k * (k - 1))
        a = xn @ xn[member].sum(0)
        gain = (alpha * qt[nonm] - 2 * beta * a[nonm])[None, :] \
            + (-alpha * qt[idx] + 2 * beta * a[idx])[:, None] \
            - 2 * beta * (1 - xn[idx] @ xn[nonm].T)
    elif algorithm == "DiSF":
        st = _DisfState(xt, member)
        fd = st.fdiv()
        rows = []
        for o in idx.tolist():
            fdj, dq = _disf_swap_gains_for_out(st, o, nonm, qt, lamb, budget)
            rows.append(dq + (1 - lamb) * (fdj - fd))
        gain = torch.stack(rows)
    else:
        st = _FacState(_unit(xt), idx, budget)
        Sc = (st.xn @ st.xn[nonm].T).clamp_(min=0)
        dq = (qt[nonm][None, :] - qt[st.members][:, None]) * (lamb / k)
        gain = _fac_gains(Sc, st, st.loss(), dq, (1 - lamb) / n)
    flat = int(torch.argmax(gain))
    return int(idx[flat // nonm.numel()]), int(nonm[flat % nonm.numel()]), float(gain.max())


def polish_readout(x, q, logits: np.ndarray, selected: np.ndarray, cfg, *, ids=None,
                   device="cpu", mem_budget: int | None = None):
    """The learner's hook for solver ``paper+polish``: polish the read-out ``selected`` (bool)
    on the whole shard, only admitting samples of the learning pool (finite logits). Returns
    (selected bool, rank, info): the polished selection ranks first (by logit, ties by id),
    then the rest by logit, so ``rank < k`` is the selection. Logits are left as learned."""
    from .learner import _id_rank

    allowed = np.isfinite(logits)
    res = polish(x, q, np.flatnonzero(selected), cfg.algorithm, cfg.lamb, device=device,
                 allowed=allowed, mem_budget=mem_budget)
    n = logits.shape[0]
    sel = np.zeros(n, dtype=bool)
    sel[res.selected] = True
    order = np.lexsort((_id_rank(ids, n), -logits.astype(np.float64), ~sel))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return sel, rank, res.as_dict()
