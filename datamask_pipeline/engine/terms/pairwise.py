"""Pair-wise similarity, f_div = -mean over pairs i != j in U of cos(x_i, x_j) (docs/method.md
#pair-wise-similarity): the batched objective, greedy (running sum), the swap polish and its exact best
swap, all from s_U = sum of the unit rows, since sum_{i,j in U} x_i.x_j = ||s_U||^2.
"""

from __future__ import annotations

import torch

from .base import Batch, DiversityTerm, PolishContext, SwapSchedule, rollout_chunks
from .sampling import greedy_picks


def _pair_f(qsum: float, s: torch.Tensor, k: int, lamb: float) -> float:
    return lamb * qsum / k - (1 - lamb) * (float(s @ s) - k) / (k * (k - 1))


def _pair_best_swap(xn, g, h, beta, budget):
    """Exact best (o, j, gain) over all member/non-member pairs whose bound g_j + h_o > 0
    (g is -inf off the allowed non-members, h off the members)."""
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


class PairwiseSimilarity(DiversityTerm):
    """Pair-wise similarity ("Pair_simi")."""

    name = "Pair_simi"
    aliases = ("pair_simi", "pairwise", "pair")
    min_k = 2

    # ------------------------------------------------------------------ objective
    def batched(self, batch: Batch, idx: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        G, k = idx.shape
        if k < 2:
            raise ValueError("pair-wise similarity needs k >= 2")
        xn = batch.xn
        out = torch.empty(G, dtype=xn.dtype, device=xn.device)
        per = k * batch.d * batch.elem_size()
        for s, e in rollout_chunks(G, per, batch.mem_budget, chunk):
            ssum = xn[idx[s:e]].sum(dim=1)  # (c, d)
            sq = (ssum * ssum).sum(dim=1)
            # sum over i != j of x_i.x_j = ||s||^2 - sum_i ||x_i||^2 = ||s||^2 - k (unit rows;
            # all-zero embeddings are rejected by the data contract)
            out[s:e] = -(sq - k) / (k * (k - 1))
        return out

    def workspace_bytes(self, m, k, d, itemsize, budget) -> int:
        return int(budget) + m * d * itemsize  # the cached unit rows

    # --------------------------------------------------------------------- greedy
    def greedy(self, ground: Batch, k: int, lamb: float, *, sample=None, generator=None,
               **options) -> torch.Tensor:
        """With t selected and running sum s of their unit rows, f(U + j) ranks as
        lamb*q_j/(t+1) - (1-lamb)*2*s.x_j/(t(t+1)): one mat-vec over the candidates per pick
        (all n, or the s sampled ones)."""
        xn = ground.xn
        ssum = torch.zeros(ground.d, dtype=torch.float64, device=xn.device)

        def key_of(t, cand, qc):
            dots = (xn if cand is None else xn[cand]) @ ssum.to(xn.dtype)
            return lamb * qc / (t + 1) - (1 - lamb) * 2.0 * dots / (t * (t + 1))

        def add(t, j):
            ssum.add_(xn[j].to(torch.float64))

        return greedy_picks(ground.m, k, ground.q, key_of, add, sample=sample,
                            generator=generator, device=xn.device)

    # --------------------------------------------------------------------- polish
    def polish(self, c: PolishContext) -> dict:
        """Running sum s = sum_U x_i (unit rows), a = X s. The gain of swapping member o for
        non-member j is g_j + h_o - 2 beta (1 - x_o.x_j) with g_j = alpha q_j - 2 beta a_j,
        h_o = -alpha q_o + 2 beta a_o, alpha = lamb/k, beta = (1-lamb)/(k(k-1)); the last
        term is <= 0, so g_j + h_o bounds it from above and prunes the exact search. Block
        swaps pair the B best g with the B best h."""
        n, k, lamb = c.n, c.k, c.lamb
        xn = c.ground.xn
        alpha, beta = lamb / k, (1 - lamb) / (k * (k - 1))
        member = c.member_mask()
        s = xn[member].double().sum(0)
        qsum = float(c.q64[member].sum())
        f = _pair_f(qsum, s, k, lamb)
        f0 = f
        rounds = 0
        sched = SwapSchedule(k)
        converged, stop = False, "max_rounds"
        neg = torch.tensor(-torch.inf, dtype=xn.dtype, device=c.dev)
        while rounds < c.max_rounds:
            if c.out_of_time():
                stop = "time_budget"
                break
            rounds += 1
            a = xn @ s.to(xn.dtype)
            g = torch.where(c.allowed & ~member, alpha * c.q - 2 * beta * a, neg)
            h = torch.where(member, -alpha * c.q + 2 * beta * a, neg)
            n_in = int((c.allowed & ~member).sum())
            if min(k, n_in) < 1:
                converged, stop = True, "nothing_to_swap"
                break

            def exchange(J, O):
                nonlocal s, qsum, f
                s_new = s - xn[O].double().sum(0) + xn[J].double().sum(0)
                q_new = qsum - float(c.q64[O].sum()) + float(c.q64[J].sum())
                f_new = _pair_f(q_new, s_new, k, lamb)
                if f_new > f + c.tol:
                    member[O], member[J] = False, True
                    s, qsum, f = s_new, q_new, f_new
                    return True
                return False

            outcome = sched.block(g, h, exchange, limit=min(k, n_in))
            if outcome == "no_gain":
                converged, stop = True, "local_optimum"  # no pair has a positive upper bound
                break
            if outcome == "moved":
                c.progress(f, sched.swaps)
            if outcome in ("moved", "retry"):
                continue
            # B = 1 failed: exact best single swap over every pair the bound admits.
            best = _pair_best_swap(xn, g, h, beta, c.budget)
            if best is None or best[2] <= c.tol:
                converged, stop = True, "local_optimum"
                break
            o, j, _ = best
            s_new = s - xn[o].double() + xn[j].double()
            q_new = qsum - float(c.q64[o]) + float(c.q64[j])
            f_new = _pair_f(q_new, s_new, k, lamb)
            if f_new <= f + c.tol:
                converged, stop = True, "local_optimum"
                break
            member[o], member[j] = False, True
            s, qsum, f = s_new, q_new, f_new
            sched.single()
        return {"members": torch.nonzero(member).flatten(), "f_start": f0, "f_end": f,
                "swaps": sched.swaps, "moves": sched.moves, "rounds": rounds, "converged": converged,
                "stop": stop}

    def best_swap(self, c: PolishContext) -> tuple[int, int, float]:
        k, lamb = c.k, c.lamb
        xn = c.ground.xn
        member = c.member_mask()
        idx = torch.nonzero(member).flatten()
        nonm = torch.nonzero(c.allowed & ~member).flatten()
        alpha, beta = lamb / k, (1 - lamb) / (k * (k - 1))
        a = xn @ xn[idx].sum(0)
        gain = (alpha * c.q[nonm] - 2 * beta * a[nonm])[None, :] \
            + (-alpha * c.q[idx] + 2 * beta * a[idx])[:, None] \
            - 2 * beta * (1 - xn[idx] @ xn[nonm].T)
        flat = int(torch.argmax(gain))
        return int(idx[flat // nonm.numel()]), int(nonm[flat % nonm.numel()]), float(gain.max())


PAIRWISE = PairwiseSimilarity()
