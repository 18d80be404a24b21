"""DiSF (docs/method.md#disf): f_div = -(sum of squared off-diagonal correlations of the
selection's embedding dimensions)/d^2. The batched objective, greedy and the swap polish, all
computed in DiSF's exact frame (:func:`numerics.disf_frame`); greedy and polish score every
candidate with one rank-one update of the selection's scatter matrix (:func:`rank_one_fdiv`).
"""

from __future__ import annotations

import threading

import torch

from .base import Batch, DiversityTerm, PolishContext, SwapSchedule, rollout_chunks
from .sampling import greedy_picks

DISF_STD_FLOOR = 1e-8
# Scratch buffers up to this size are kept between calls (see _Scratch).
SCRATCH_MAX_BYTES = 64 << 20
# The batched objective runs over blocks of rollouts of about this many bytes of (k, d) stacks,
# so that a block's intermediates stay in cache between passes (CPU).
CACHE_BLOCK_BYTES = 1 << 20


class _Scratch(threading.local):
    """Reusable CPU buffers of the batched objective, one per role, kept while the shape
    repeats (every step of a learning run scores the same (chunk, k', d) stacks). A fresh
    multi-MB tensor per call costs page faults each time (the allocator hands such blocks back
    to the OS): at the learner's k' ~ 100 that was a third of the kernel's time. Buffers over
    SCRATCH_MAX_BYTES are not kept (there the products dwarf the faults); CUDA has its own
    caching allocator and gets fresh tensors."""

    def __init__(self):
        self.bufs: dict = {}

    def get(self, role: str, shape, dtype: torch.dtype, device: torch.device):
        shape = tuple(int(v) for v in shape)
        numel = 1
        for v in shape:
            numel *= v
        if device.type != "cpu" or numel * dtype.itemsize > SCRATCH_MAX_BYTES:
            return None
        b = self.bufs.get((role, dtype))
        if b is None or b.numel() < numel:
            b = self.bufs[(role, dtype)] = torch.empty(numel, dtype=dtype)
        return b[:numel].view(shape)


_SCRATCH = _Scratch()


def _out(role, shape, dtype, device):
    return {"out": b} if (b := _SCRATCH.get(role, shape, dtype, device)) is not None else {}


# ------------------------------------------------------------------ objective
def block_rollouts(k: int, d: int, itemsize: int) -> int:
    """Rollouts per cache block of the batched objective (at least 1)."""
    return max(1, CACHE_BLOCK_BYTES // max(1, k * d * itemsize))


def disf_from_points(xu: torch.Tensor, floor=DISF_STD_FLOOR,
                     stats_dtype: torch.dtype | None = None) -> torch.Tensor:
    """DiSF for a stack of selections ``xu`` (c, k, d): standardise each dimension (unbiased
    std, floored at ``floor``: a number or a (d,) tensor), then -(sum of squared off-diagonal
    correlations)/d^2, with the Gram (k x k) or covariance (d x d) product by shape. The
    per-dimension statistics are computed in ``stats_dtype`` (default: xu's). On CPU the stack
    is scored in cache-sized blocks of rollouts (:data:`CACHE_BLOCK_BYTES`)."""
    c, k, d = xu.shape
    b = block_rollouts(k, d, xu.element_size())
    if xu.device.type != "cpu" or c <= b:
        return _disf_block(xu, floor, stats_dtype)
    out = torch.empty(c, dtype=xu.dtype)
    for s in range(0, c, b):
        out[s : s + b] = _disf_block(xu[s : s + b], floor, stats_dtype)
    return out


def _disf_block(xu: torch.Tensor, floor, stats_dtype) -> torch.Tensor:
    c, k, d = xu.shape
    sd = stats_dtype or xu.dtype
    xs = xu.to(sd)
    # Few passes over the (c, k, d) stack (the learner's inner kernel), each a plain
    # elementwise op or an inner-friendly reduction (torch.var_mean and vector_norm over
    # dim 1 are 10-40x slower here on CPU).
    # The (c, k, d) and (c, k, k) intermediates live in reused scratch buffers (_Scratch).
    dev = xu.device
    mean = xs.mean(dim=1, keepdim=True)
    xc = torch.sub(xs, mean, **_out("xc", xs.shape, sd, dev))
    del xs
    sq = torch.mul(xc, xc, **_out("sq", xc.shape, sd, dev))
    var = sq.sum(dim=1, keepdim=True).div_(k - 1)  # (c, 1, d)
    del sq
    fl = torch.as_tensor(floor, dtype=sd, device=dev)
    inv = torch.maximum(var.sqrt(), fl).reciprocal_()
    z = xc.mul_(inv).to(xu.dtype)  # |z| <= sqrt(k - 1): in range
    if k < d:
        # (c, k, k); ||Z^T Z||_F = ||Z Z^T||_F
        gram = torch.bmm(z, z.transpose(1, 2), **_out("gram", (c, k, k), z.dtype, dev))
        fro2 = torch.linalg.vector_norm(gram, dim=(1, 2)).square_()
        diag = (var * inv * inv).squeeze(1).to(xu.dtype)  # (c, d): C_aa (1 unless floored)
        off = fro2 / (k - 1) ** 2 - diag.square_().sum(dim=1)
    else:
        cov = torch.bmm(z.transpose(1, 2), z).div_(k - 1)  # (c, d, d)
        cov.diagonal(dim1=1, dim2=2).zero_()  # off-diagonal sum directly: no cancellation
        off = torch.linalg.vector_norm(cov, dim=(1, 2)).square_()
    return -off / (d * d)


def fdiv_from_scatter(W: torch.Tensor, k: int, floor: torch.Tensor) -> float:
    """f_div of a selection of k samples from its scatter matrix W (float64, frame units)."""
    d = W.shape[0]
    sig = torch.maximum((torch.diagonal(W) / (k - 1)).clamp(min=0).sqrt(), floor)
    C = W / ((k - 1) * sig[:, None] * sig[None, :])
    C.fill_diagonal_(0)
    return -float((C * C).sum()) / (d * d)


def scatter(xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, scatter matrix) of the rows ``xs``, two-pass in float64."""
    xs = xs.to(torch.float64)
    mu = xs.mean(0)
    xc = xs - mu
    return mu, xc.T @ xc


# ------------------------------------------------------------- rank-one scores
def rank_one_prep(W: torch.Tensor, denom: float, floor: torch.Tensor, dtype: torch.dtype) -> dict:
    """What :func:`rank_one_fdiv` needs from a scatter matrix W (..., d, d) (float64), computed
    once per selection: the normalised Wn = W / (denom r r^T) with r = max(sqrt(W_aa/denom),
    floor) (so |Wn_ab| <= 1) and Wn * Wn, both in ``dtype``."""
    Wd = torch.diagonal(W, dim1=-2, dim2=-1)
    rhat = torch.maximum((Wd.clamp(min=0) / denom).sqrt(), floor)
    Wn = W / (denom * rhat[..., :, None] * rhat[..., None, :])
    return {"Wd": Wd, "rhat": rhat, "Wn": Wn.to(dtype), "Wn2": (Wn * Wn).to(dtype),
            "denom": float(denom), "floor": floor}


def rank_one_fdiv(xb: torch.Tensor, mu: torch.Tensor, prep: dict, c: float,
                  stats_dtype: torch.dtype) -> torch.Tensor:
    """f_div of the selection whose scatter matrix is W + c v v^T (v = row - mu) and whose
    unbiased variance divisor is ``prep['denom']``, for every row of ``xb`` (r, d); c > 0 adds
    a sample, c < 0 removes one (Welford's downdate). W and mu may carry leading batch
    dimensions (..., d, d) / (..., d): the result is then (..., r).

    With sigma = the candidate's floored std per dimension, rho = r / sigma and u = v / sigma,
    the new correlation matrix is rho rho^T * Wn + (c/denom) u u^T, whose squared Frobenius
    norm expands into two (r x d) @ (d x d) products; every factor is bounded (|Wn| <= 1,
    rho <= 1 and u^2 <= denom/c when adding), so float32 is safe for the products."""
    dt = xb.dtype
    sd = stats_dtype
    D = prep["denom"]
    a = c / D
    floor = prep["floor"].to(sd)
    # In-place passes over (..., r, d) buffers: this is greedy's and polish's inner loop.
    v = xb.to(sd) - mu.to(sd)[..., None, :]  # (..., r, d)
    var = (v * v).mul_(c).add_(prep["Wd"].to(sd)[..., None, :]).div_(D).clamp_(min=0)
    inv = torch.maximum(var.sqrt(), floor).reciprocal_()  # 1 / sigma
    u = v.mul_(inv)  # v / sigma
    uu = torch.einsum("...i,...i->...", u, u)
    diag = var.mul_(inv).mul_(inv)  # C_aa of the new selection (1 unless the std is floored)
    d2 = torch.einsum("...i,...i->...", diag, diag)
    rho = inv.mul_(prep["rhat"].to(sd)[..., None, :])  # rhat / sigma
    r2 = (rho * rho).to(dt)
    ru = rho.mul_(u).to(dt)
    total = torch.einsum("...i,...i->...", r2 @ prep["Wn2"], r2) \
        + (2 * a) * torch.einsum("...i,...i->...", ru @ prep["Wn"], ru)
    off = total.to(sd) + (a * a) * uu * uu - d2
    return (-off / (xb.shape[-1] ** 2)).to(dt)


def _rows_per_chunk(budget: int, d: int, lead: int = 1) -> int:
    return max(1, int(budget // max(1, 10 * lead * d * 8)))


def rank_one_scores(x, rows_idx, mu, W, c, denom, floor, stats_dtype, budget):
    """:func:`rank_one_fdiv` for the rows ``rows_idx`` of ``x`` (None: every row), chunked."""
    n_rows = x.shape[0] if rows_idx is None else rows_idx.numel()
    prep = rank_one_prep(W, denom, floor, x.dtype)
    out = torch.empty(n_rows, dtype=x.dtype, device=x.device)
    step = _rows_per_chunk(budget, x.shape[1])
    for s in range(0, n_rows, step):
        xb = x[s : s + step] if rows_idx is None else x[rows_idx[s : s + step]]
        out[s : s + step] = rank_one_fdiv(xb, mu, prep, c, stats_dtype)
    return out


def swap_fdiv(x, outs, cand, mu, W, k, floor, stats_dtype, budget) -> torch.Tensor:
    """f_div of U - o + j for every member o in ``outs`` and every j in ``cand``: (|outs|,
    |cand|). Each U - o is a rank-one downdate; its additions are scored in batches of
    members (one batched (r x d) @ (d x d) product per batch)."""
    d = x.shape[1]
    out = torch.empty((outs.numel(), cand.numel()), dtype=x.dtype, device=x.device)
    per_member = 3 * d * d * 8
    g = max(1, min(outs.numel(), int(budget // 2 // max(1, per_member))))
    for s in range(0, outs.numel(), g):
        o = outs[s : s + g]
        v = x[o].to(torch.float64) - mu  # (g, d)
        Wo = W - (k / (k - 1)) * v[:, :, None] * v[:, None, :]
        muo = mu - v / (k - 1)
        prep = rank_one_prep(Wo, k - 1, floor, x.dtype)
        step = _rows_per_chunk(budget // 2, d, lead=o.numel())
        for r in range(0, cand.numel(), step):
            out[s : s + g, r : r + step] = rank_one_fdiv(
                x[cand[r : r + step]], muo, prep, (k - 1) / k, stats_dtype)
    return out


class DiSF(DiversityTerm):
    """DiSF: decorrelated embedding dimensions ("DiSF")."""

    name = "DiSF"
    aliases = ("disf",)
    min_k = 2

    # ------------------------------------------------------------------ objective
    def batched(self, batch: Batch, idx: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        G, k = idx.shape
        if k < 2:
            raise ValueError("DiSF needs k >= 2")
        fr = batch.disf_frame(DISF_STD_FLOOR)
        x, d = fr.x, batch.d
        out = torch.empty(G, dtype=x.dtype, device=x.device)
        per = (3 * k * d + min(k, d) ** 2) * batch.elem_size() + 3 * k * d * 8
        blk = block_rollouts(k, d, x.element_size()) if x.device.type == "cpu" else G
        for s, e in rollout_chunks(G, per, batch.mem_budget, chunk):
            for bs in range(s, e, blk):  # gather and score one cache block at a time
                be = min(e, bs + blk)
                sel = idx[bs:be].reshape(-1)
                xu = torch.index_select(x, 0, sel, **_out("gather", (sel.numel(), d),
                                                            x.dtype, x.device))
                out[bs:be] = _disf_block(xu.view(be - bs, k, d), fr.floor, fr.stats_dtype)
        return out

    def workspace_bytes(self, m, k, d, itemsize, budget) -> int:
        return int(budget) + m * d * itemsize  # the cached frame

    # --------------------------------------------------------------------- greedy
    def greedy(self, ground: Batch, k: int, lamb: float, *, sample=None, generator=None,
               **options) -> torch.Tensor:
        """The scatter matrix W of the selection is updated by rank one per pick (Welford,
        float64); every candidate (all n, or the s sampled) is scored by
        :func:`rank_one_fdiv`: two (rows x d) @ (d x d) products, O(k n d^2) in total."""
        fr = ground.disf_frame(DISF_STD_FLOOR)
        x = fr.x
        n, d = x.shape
        mu = torch.zeros(d, dtype=torch.float64, device=x.device)
        W = torch.zeros(d, d, dtype=torch.float64, device=x.device)

        def key_of(t, cand, qc):
            fd = rank_one_scores(x, cand, mu, W, t / (t + 1.0), t, fr.floor, fr.stats_dtype,
                                 ground.mem_budget)
            return lamb * qc / (t + 1) + (1 - lamb) * fd

        def add(t, j):  # Welford: rank-one update of the scatter matrix, then the mean
            v = x[j].to(torch.float64) - mu
            W.add_(torch.outer(v, v), alpha=t / (t + 1.0))
            mu.add_(v / (t + 1))

        return greedy_picks(n, k, ground.q, key_of, add, sample=sample, generator=generator,
                            device=x.device)

    # --------------------------------------------------------------------- polish
    def polish(self, c: PolishContext) -> dict:
        """Block swaps: the B best incoming (f_div of U + j) paired with the B best outgoing
        (f_div of U - o) samples, the exchanged set scored exactly (float64, from scratch);
        kept if f rose (then 2B), else B halves. At B = 1 every non-member is scored on U - o
        for the ``ctx.exact_outs`` most promising members (None: all of them, in batches);
        converged=True only when every member was checked and no swap improves f."""
        n, k, lamb = c.n, c.k, c.lamb
        fr = c.ground.disf_frame(DISF_STD_FLOOR)
        x, floor, sd = fr.x, fr.floor, fr.stats_dtype
        member = c.member_mask()

        def evaluate(mask):
            idx = torch.nonzero(mask).flatten()
            mu, W = scatter(x[idx])
            fd = fdiv_from_scatter(W, k, floor)
            return lamb * float(c.q64[idx].sum()) / k + (1 - lamb) * fd, fd, mu, W

        f, fd, mu, W = evaluate(member)
        f0 = f
        rounds = 0
        sched = SwapSchedule(k)
        converged, stop = False, "max_rounds"
        while rounds < c.max_rounds:
            if c.out_of_time():
                stop = "time_budget"
                break
            rounds += 1
            nonm = torch.nonzero(c.allowed & ~member).flatten()
            mem = torch.nonzero(member).flatten()
            if nonm.numel() == 0:
                converged, stop = True, "nothing_to_swap"
                break
            # single-sample scores (first-order swap gains split into an "in" and an "out" part)
            g = lamb * c.q[nonm] / k + (1 - lamb) * (
                rank_one_scores(x, nonm, mu, W, k / (k + 1), k, floor, sd, c.budget) - fd)
            h = -lamb * c.q[mem] / k + (1 - lamb) * (
                rank_one_scores(x, mem, mu, W, -k / (k - 1), k - 2, floor, sd, c.budget) - fd)

            def exchange(gi, hi):
                nonlocal member, f, fd, mu, W
                trial = member.clone()
                trial[mem[hi]], trial[nonm[gi]] = False, True
                f_new, fd_new, mu_new, W_new = evaluate(trial)
                if f_new > f + c.tol:
                    member, f, fd, mu, W = trial, f_new, fd_new, mu_new, W_new
                    return True
                return False

            outcome = sched.block(g, h, exchange)
            if outcome == "moved":
                c.progress(f, sched.swaps)
            if outcome in ("moved", "retry"):
                continue
            # "no_gain" / "single": g + h is no bound for DiSF, so the exact search decides.
            # Exact single swaps, members in order of promise, a batch of members at a time.
            order = mem[torch.argsort(h, descending=True)]
            n_out = order.numel() if c.exact_outs is None else min(c.exact_outs, order.numel())
            found, checked_all, timed_out = None, False, False
            group = max(1, min(n_out, int(c.budget // 2 // max(1, 3 * x.shape[1] ** 2 * 8))))
            for s in range(0, n_out, group):
                if c.out_of_time():
                    timed_out = True
                    break
                outs = order[s : min(n_out, s + group)]
                gain = (c.q[nonm][None, :] - c.q[outs][:, None]) * (lamb / k) + (1 - lamb) * (
                    swap_fdiv(x, outs, nonm, mu, W, k, floor, sd, c.budget) - fd)
                # verify the most promising pairs exactly: float32 scores can be off by ~1e-7
                vals, flat = torch.topk(gain.flatten(), min(8, gain.numel()))
                for v, fl in zip(vals.tolist(), flat.tolist()):
                    if v <= c.tol:
                        break
                    o, j = int(outs[fl // nonm.numel()]), int(nonm[fl % nonm.numel()])
                    trial = member.clone()
                    trial[o], trial[j] = False, True
                    res = evaluate(trial)
                    if res[0] > f + c.tol:
                        found = (trial, res)
                        break
                if found:
                    break
            else:
                checked_all = n_out == order.numel()
            if found is None:
                if timed_out:
                    stop = "time_budget"
                elif checked_all:
                    converged, stop = True, "local_optimum"
                else:
                    stop = "partial_check"  # no improving swap among the members checked
                break
            member, (f, fd, mu, W) = found
            sched.single()
            c.progress(f, sched.swaps)
        return {"members": torch.nonzero(member).flatten(), "f_start": f0, "f_end": f,
                "swaps": sched.swaps, "moves": sched.moves, "rounds": rounds, "converged": converged,
                "stop": stop}

    def best_swap(self, c: PolishContext) -> tuple[int, int, float]:
        k, lamb = c.k, c.lamb
        fr = c.ground.disf_frame(DISF_STD_FLOOR)
        member = c.member_mask()
        idx = torch.nonzero(member).flatten()
        nonm = torch.nonzero(c.allowed & ~member).flatten()
        mu, W = scatter(fr.x[idx])
        fd = fdiv_from_scatter(W, k, fr.floor)
        gain = (c.q[nonm][None, :] - c.q[idx][:, None]) * (lamb / k) + (1 - lamb) * (
            swap_fdiv(fr.x, idx, nonm, mu, W, k, fr.floor, fr.stats_dtype, c.budget) - fd)
        flat = int(torch.argmax(gain))
        return int(idx[flat // nonm.numel()]), int(nonm[flat % nonm.numel()]), float(gain.max())


DISF = DiSF()
