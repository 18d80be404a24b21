"""Candidate sets for stochastic greedy ("lazier than lazy greedy", Mirzasoleiman et al.
2015): s of the not-yet-chosen samples, drawn uniformly without replacement, in O(s) per pick.
"""

from __future__ import annotations

import math

import torch


def sample_size(n: int, k: int, epsilon: float) -> int:
    """s = ceil((n / k) · ln(1 / epsilon)), at least 1: the sample per pick that gives
    stochastic greedy its (1 - 1/e - epsilon) guarantee in expectation."""
    if not (0.0 < epsilon < 1.0):
        raise ValueError(f"epsilon must be in (0, 1), got {epsilon}")
    if not (0 < k <= n):
        raise ValueError(f"need 0 < k <= n, got k={k}, n={n}")
    return max(1, math.ceil(n / k * math.log(1.0 / epsilon)))


class CandidateSampler:
    """The pool of non-chosen samples; :meth:`draw` returns s of them (sorted, so ties in a
    pick go to the lowest index) or None when s covers the whole pool (then a pick scores
    every candidate, exactly as greedy). :meth:`remove` takes a pick out in O(1)."""

    def __init__(self, n: int, s: int, generator: torch.Generator | None, device):
        if s < 1:
            raise ValueError(f"stochastic greedy needs a sample of at least 1, got {s}")
        self.s = int(s)
        self.gen = generator
        self.dev = torch.device(device)
        self.rem = torch.arange(n, device=self.dev)  # rem[:N] = the pool, in no order
        self.pos = torch.arange(n, device=self.dev)  # pos[i] = where i sits in rem
        self.N = n

    def draw(self) -> torch.Tensor | None:
        N, s = self.N, self.s
        if s >= N:
            return None
        if 2 * s > N:
            p = torch.randperm(N, generator=self.gen, device=self.dev)[:s]
        else:
            # s distinct positions: draw, drop repeats, redraw the shortfall. Symmetric in
            # the positions, so every s-subset is equally likely; few rounds when s <= N / 2.
            p = torch.unique(torch.randint(0, N, (s,), generator=self.gen, device=self.dev))
            while p.numel() < s:
                more = torch.randint(0, N, (s - p.numel(),), generator=self.gen, device=self.dev)
                p = torch.unique(torch.cat([p, more]))
        return torch.sort(self.rem[p]).values

    def remove(self, j: int) -> None:
        p = self.pos[j].clone()
        last = self.rem[self.N - 1].clone()
        self.rem[p] = last
        self.pos[last] = p
        self.N -= 1


def greedy_picks(n: int, k: int, q: torch.Tensor, key_of, add, *, sample: int | None = None,
                 generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """The greedy skeleton shared by the terms without lazy bounds: k picks, each the
    unchosen candidate with the largest key. At pick t (t >= 1), ``key_of(t, cand, q_cand)``
    scores the candidates (``cand`` None: all n rows, chosen ones masked here; else the
    ``sample`` rows drawn uniformly from the unchosen with ``generator``: stochastic
    greedy); the first pick is the best quality (f_div of one sample is 0 by convention).
    ``add(t, j)`` updates the term's state with pick j. Returns the picks in order."""
    chosen = torch.zeros(n, dtype=torch.bool, device=device)
    picks = torch.empty(k, dtype=torch.long, device=device)
    sampler = CandidateSampler(n, sample, generator, device) if sample else None
    for t in range(k):
        cand = sampler.draw() if sampler else None
        qc = q if cand is None else q[cand]
        key = qc.clone() if t == 0 else key_of(t, cand, qc)
        if cand is None:
            j = int(torch.argmax(key.masked_fill(chosen, -torch.inf)))
        else:
            j = int(cand[torch.argmax(key)])
        picks[t] = j
        chosen[j] = True
        add(t, j)
        if sampler:
            sampler.remove(j)
    return picks
