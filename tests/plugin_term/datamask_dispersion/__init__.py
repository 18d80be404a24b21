"""Dispersion: how far the selected samples spread around their centroid on the unit sphere.

    f_div(U) = mean_{i in U} ||x̂_i - c||²  with c = mean_{i in U} x̂_i,  which equals 1 - ||c||²

Higher = more spread out. It only implements the batched objective (what the learner and the
whole-shard evaluation need); solvers that need greedy or swap moves fall back to the learner.
"""

import torch

from datamask_pipeline.engine.terms import DiversityTerm, rollout_chunks


class Dispersion(DiversityTerm):
    name = "Dispersion"
    aliases = ("spread",)
    min_k = 2

    def batched(self, batch, idx, chunk=None):
        G, k = idx.shape
        xn = batch.xn  # exact unit rows, cached on the batch
        out = torch.empty(G, dtype=xn.dtype, device=xn.device)
        per_rollout = k * batch.d * batch.elem_size()
        for s, e in rollout_chunks(G, per_rollout, batch.mem_budget, chunk):
            c = xn[idx[s:e]].mean(dim=1)  # (c, d) centroids
            out[s:e] = 1.0 - (c * c).sum(dim=1)
        return out
