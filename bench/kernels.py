"""Hardware efficiency, the learner's time inside vs outside the objective, and before/after
ratios of the speed-ups made in the engine (the "before" code is kept here, verbatim, as the
reference it was measured against)."""

from __future__ import annotations

import numpy as np
import torch

from .common import Timer, interleaved, median, time_fn


# ----------------------------------------------------------- the "before" code
def sample_masks_before(logits_b, G, k, gen):
    """engine.learner.sample_masks before the speed-up: Exp(1) via exponential_."""
    e = torch.empty((G, logits_b.numel()), device=logits_b.device, dtype=torch.float32)
    e.exponential_(generator=gen)
    keys = logits_b.unsqueeze(0) - e.log_()
    return keys.topk(k, dim=1, sorted=False).indices


def facility_before(batch, idx, chunk=None):
    """engine.objectives.facility before the speed-up: gathers columns of S."""
    from datamask_pipeline.engine.terms.base import rollout_chunks as _rollout_chunks
    from datamask_pipeline.engine.terms.facility import similarity_matrix as _similarity_matrix

    G, k = idx.shape
    m = batch.m
    out = torch.empty(G, dtype=batch.x.dtype, device=batch.x.device)
    S = _similarity_matrix(batch)
    assert S is not None
    for s, e in _rollout_chunks(G, m * k * batch.elem_size(), batch.mem_budget // 2, chunk):
        cols = S.index_select(1, idx[s:e].reshape(-1)).view(m, e - s, k)
        out[s:e] = cols.amax(dim=2).mean(dim=0)
    return out


def fac_block_dense(Sc, b1, b2, p1, k):
    """The polish's facility block gains with dense (rows, c) passes (before the sparse
    gather/scatter of engine.polish._fac_accumulate)."""
    D1 = (Sc - b1[:, None]).clamp_(min=0)
    add = D1.sum(0)
    D2 = (Sc - b2[:, None]).clamp_(min=0).sub_(D1)
    corr = torch.zeros((k, Sc.shape[1]), dtype=Sc.dtype, device=Sc.device).index_add_(0, p1, D2)
    return add, corr


# ------------------------------------------------------------------- peaks
def peaks(device, reps: int = 5, quick: bool = False) -> dict:
    dev = torch.device(device)
    size = 1024 if quick else (8192 if dev.type == "cuda" else 2048)
    a = torch.randn(size, size, device=dev)
    b = torch.randn(size, size, device=dev)
    t = time_fn(lambda: a @ b, reps=reps, device=dev)
    mm = 2 * size**3 / t / 1e9
    nbytes = (64 << 20) if quick else ((2 << 30) if dev.type == "cuda" else (256 << 20))
    src = torch.empty(nbytes // 4, device=dev)
    src.uniform_()
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), reps=reps, device=dev)
    cp = 2 * nbytes / t / 1e9
    out = {"matmul_size": size, "matmul_gflops": mm, "copy_bytes": nbytes, "copy_gbps": cp}
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        t = time_fn(lambda: a @ b, reps=reps, device=dev)
        out["matmul_tf32_gflops"] = 2 * size**3 / t / 1e9
        torch.backends.cuda.matmul.allow_tf32 = False
        ab, bb = a.bfloat16(), b.bfloat16()
        t = time_fn(lambda: ab @ bb, reps=reps, device=dev)
        out["matmul_bf16_gflops"] = 2 * size**3 / t / 1e9
    return out


# ----------------------------------------------------------------- kernels
def kernels(x_np, q_np, device, *, G: int, partial: float, select_ratio: float, peak: dict,
            reps: int = 5) -> list:
    """Achieved GFLOP/s (compute-bound) or GB/s (memory-bound) of each term's dominant kernel,
    as a fraction of the same run's matmul / copy peak."""
    from datamask_pipeline.engine import terms
    from datamask_pipeline.engine.objectives import Batch
    from datamask_pipeline.engine.terms.disf import disf_from_points

    pairwise = terms.get("Pair_simi").batched
    facility_now = terms.get("Facility").batched

    dev = torch.device(device)
    x = torch.as_tensor(x_np, device=dev)
    q = torch.as_tensor(q_np, device=dev, dtype=x.dtype)
    n, d = x.shape
    m = max(2, int(round(partial * n)))
    kb = max(2, int(round(select_ratio * m)))
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    B = torch.randperm(n, generator=gen, device=dev)[:m]
    xb, qb = x[B], q[B]
    idx = torch.stack([torch.randperm(m, generator=gen, device=dev)[:kb] for _ in range(G)])
    es = x.element_size()
    rows = []

    def add(name, seconds, flops=None, nbytes=None, note=""):
        r = {"kernel": name, "seconds": seconds, "note": note}
        if flops is not None:
            r["gflops"] = flops / seconds / 1e9
            r["fraction_of_matmul"] = r["gflops"] / peak["matmul_gflops"]
            r["bound"] = "compute"
        if nbytes is not None:
            r["gbps"] = nbytes / seconds / 1e9
            r["fraction_of_copy"] = r["gbps"] / peak["copy_gbps"]
            r.setdefault("bound", "memory")
        rows.append(r)

    # DiSF objective over G masks: the (k', d) x (d, k') Gram or (d, k') x (k', d) products
    xu = xb[idx]
    t = time_fn(lambda: disf_from_points(xu), reps=reps, device=dev)
    fl = G * (2 * kb * kb * d if kb < d else 2 * kb * d * d)
    add(f"DiSF objective, G={G}, k'={kb}, d={d}", t, flops=fl,
        note="Gram path" if kb < d else "covariance path")
    # Facility: per-batch similarity, then the row gather + max over each mask
    bt = Batch(xb, qb)
    xn = bt.xn
    t = time_fn(lambda: (xn @ xn.T).clamp_(min=0), reps=reps, device=dev)
    add(f"Facility batch similarity, m={m}", t, flops=2 * m * m * d)
    bt2 = Batch(xb, qb)
    facility_now(bt2, idx[:1])  # builds S once
    t = time_fn(lambda: facility_now(bt2, idx), reps=reps, device=dev)
    add(f"Facility objective given S, G={G}, k'={kb}", t, nbytes=2 * G * kb * m * es,
        note="row gather + max: memory-bound")
    # Pair-wise: gather + sum of the mask's unit rows
    bt3 = Batch(xb, qb)
    _ = bt3.xn
    t = time_fn(lambda: pairwise(bt3, idx), reps=reps, device=dev)
    add(f"Pair-wise objective, G={G}, k'={kb}", t, nbytes=2 * G * kb * d * es,
        note="gather + sum: memory-bound")
    # Whole-shard kernels of greedy / polish
    from datamask_pipeline.engine.terms.disf import rank_one_fdiv, rank_one_prep

    W = torch.randn(d, d, device=dev, dtype=torch.float64)
    W = W @ W.T
    mu = x.mean(0)
    rows_c = min(n, 8192)
    xr = x[:rows_c]
    prep = rank_one_prep(W, 100, torch.full((d,), 1e-8, dtype=torch.float64, device=dev), x.dtype)
    t = time_fn(lambda: rank_one_fdiv(xr, mu, prep, 0.5, x.dtype), reps=reps, device=dev)
    add(f"DiSF rank-one keys (greedy pick / polish scores), {rows_c} rows", t,
        flops=4 * rows_c * d * d)
    xn_all = Batch(x, q).xn
    c = min(256, n)
    J = torch.arange(c, device=dev)
    t = time_fn(lambda: (xn_all @ xn_all[J].T).clamp_(min=0), reps=reps, device=dev)
    add(f"Facility polish block product, n={n}, c={c}", t, flops=2 * n * c * d)
    s = xn_all[:kb].sum(0)
    t = time_fn(lambda: xn_all @ s, reps=reps, device=dev)
    add(f"Pair-wise greedy / polish mat-vec, n={n}", t, nbytes=n * d * es,
        note="mat-vec: memory-bound")
    return rows


# --------------------------------------------------- inside vs outside f
def objective_share(x_np, q_np, cfg, device, steps: int) -> dict:
    """Run the learner with engine.learner.score wrapped by a timer: share of each step spent
    computing the objective vs sampling masks, batching and the update."""
    import time

    import datamask_pipeline.engine.learner as L

    dev = torch.device(device)
    inner = {"s": 0.0, "calls": 0}
    orig = L.score

    def timed(*a, **kw):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t = time.perf_counter()
        out = orig(*a, **kw)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        inner["s"] += time.perf_counter() - t
        inner["calls"] += 1
        return out

    L.score = timed
    try:
        with Timer(dev) as t:
            L.learn(x_np, q_np, cfg.replace(n_epochs=steps), device=dev)
    finally:
        L.score = orig
    return {"steps": steps, "total_s": t.wall, "objective_s": inner["s"],
            "outside_s": t.wall - inner["s"], "objective_share": inner["s"] / t.wall,
            "steps_per_s": steps / t.wall}


# ---------------------------------------------------------------- speedups
def speedups(x_np, q_np, device, *, G: int, reps: int = 7, quick: bool = False) -> list:
    """Before/after of each engine speed-up, interleaved in one process (medians)."""
    import datamask_pipeline.engine.learner as L
    from datamask_pipeline.engine import terms
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.numerics import unit_rows as _unit
    from datamask_pipeline.engine.objectives import Batch
    from datamask_pipeline.engine.terms.facility import DENSE_ABOVE
    from datamask_pipeline.engine.terms.facility import FacilityState as _FacState
    from datamask_pipeline.engine.terms.facility import fac_accumulate as _fac_accumulate

    fac_term = terms.get("Facility")

    dev = torch.device(device)
    out = []
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    n = x_np.shape[0]
    for m in ((300,) if quick else (500, 5000)):
        if m > n:
            continue
        kb = m // 10
        logits = torch.randn(m, device=dev)
        r = interleaved({"before": lambda: sample_masks_before(logits, G, kb, gen),
                         "after": lambda: L.sample_masks(logits, G, kb, gen)}, reps=reps, device=dev)
        out.append({"what": f"mask sampling (Gumbel keys), G={G}, m={m}",
                    "before_s": r["before"]["median_s"], "after_s": r["after"]["median_s"],
                    "speedup": r["before"]["median_s"] / r["after"]["median_s"]})
        x = torch.as_tensor(x_np[:m], device=dev)
        q = torch.as_tensor(q_np[:m], device=dev, dtype=x.dtype)
        bt = Batch(x, q)
        idx = torch.stack([torch.randperm(m, generator=gen, device=dev)[:kb] for _ in range(G)])
        fac_term.batched(bt, idx[:1])
        a, b = facility_before(bt, idx), fac_term.batched(bt, idx)
        r = interleaved({"before": lambda: facility_before(bt, idx),
                         "after": lambda: fac_term.batched(bt, idx)}, reps=reps, device=dev)
        out.append({"what": f"facility objective given S (column -> row gather), G={G}, m={m}",
                    "before_s": r["before"]["median_s"], "after_s": r["after"]["median_s"],
                    "speedup": r["before"]["median_s"] / r["after"]["median_s"],
                    "max_abs_diff": float((a - b).abs().max())})
    # the polish's facility block gains: dense passes vs sparse gather / scatter
    nn_ = min(n, 2000 if quick else 10000)
    xt = torch.as_tensor(x_np[:nn_], device=dev)
    xn = _unit(xt)
    k = max(2, nn_ // 10)
    members = torch.as_tensor(np.argsort(-q_np[:nn_])[:k].copy(), device=dev)
    st = _FacState(xn, members, 256 << 20)
    c = min(1024, nn_)
    Sc = (xn @ xn[torch.arange(c, device=dev)].T).clamp_(min=0)

    def sparse():
        add = torch.zeros(c, dtype=Sc.dtype, device=dev)
        corr = torch.zeros((k, c), dtype=Sc.dtype, device=dev)
        _fac_accumulate(Sc, st.b1, st.b2, st.p1, add, corr)
        return add, corr

    a1, c1 = fac_block_dense(Sc, st.b1, st.b2, st.p1, k)
    a2, c2 = sparse()
    r = interleaved({"before": lambda: fac_block_dense(Sc, st.b1, st.b2, st.p1, k),
                     "after": sparse}, reps=reps, device=dev)
    out.append({"what": f"polish facility block gains: dense passes -> engine (sparse below "
                        f"{DENSE_ABOVE:.0%} density), n={nn_}, c={c}",
                "before_s": r["before"]["median_s"], "after_s": r["after"]["median_s"],
                "speedup": r["before"]["median_s"] / r["after"]["median_s"],
                "max_abs_diff": float(max((a1 - a2).abs().max(), (c1 - c2).abs().max())),
                "density": float((Sc > st.b2[:, None]).float().mean())})
    # whole learner steps, before (both old functions patched in) vs after
    nl = min(n, 2000 if quick else 10000)
    steps = 20 if quick else 150
    for term in ("Facility", "Pair_simi", "DiSF"):
        cfg = LearnerConfig(algorithm=term, n_epochs=steps, n_rollout=G,
                            partial=max(0.05, 300 / nl), seed=0, solver="paper")

        def run_before():
            # the registered Facility term's objective patched for the "before" run
            old_s = L.sample_masks
            L.sample_masks, fac_term.batched = sample_masks_before, facility_before
            try:
                L.learn(x_np[:nl], q_np[:nl], cfg, device=dev)
            finally:
                L.sample_masks = old_s
                del fac_term.batched

        r = interleaved({"before": run_before,
                         "after": lambda: L.learn(x_np[:nl], q_np[:nl], cfg, device=dev)},
                        reps=max(3, reps // 2), device=dev)
        out.append({"what": f"learner, {term}, n={nl}, G={G}, m={cfg.sizes(nl)['batch']}, "
                            f"{steps} steps",
                    "before_s": r["before"]["median_s"], "after_s": r["after"]["median_s"],
                    "speedup": r["before"]["median_s"] / r["after"]["median_s"]})
    return out


# ----------------------------------------------------------- thread scaling
def thread_scaling(x_np, q_np, device, cfg, steps: int, reps: int = 3) -> dict:
    """The learner and a matmul at 1 thread vs all threads, interleaved, under whatever load the
    machine has now: on a shared machine, torch's intra-op threads spin-wait for cores that other
    processes hold, and the learner's many small ops suffer most."""
    import os

    import datamask_pipeline.engine.learner as L

    from .common import loadavg

    dev = torch.device(device)
    old = torch.get_num_threads()
    many = os.cpu_count() or old
    a = torch.randn(1024, 1024)
    out = {"loadavg": loadavg(), "cpu_count": many, "steps": steps, "n": int(x_np.shape[0])}

    def at(th, fn):
        def run():
            torch.set_num_threads(th)
            try:
                fn()
            finally:
                torch.set_num_threads(old)
        return run

    learn = lambda: L.learn(x_np, q_np, cfg.replace(n_epochs=steps), device=dev)
    r = interleaved({"learner_1": at(1, learn), f"learner_{many}": at(many, learn),
                     "matmul_1": at(1, lambda: a @ a), f"matmul_{many}": at(many, lambda: a @ a)},
                    reps=reps, device=dev)
    out.update({k: v["median_s"] for k, v in r.items()})
    out["learner_speedup_all_vs_1"] = r["learner_1"]["median_s"] / r[f"learner_{many}"]["median_s"]
    out["matmul_speedup_all_vs_1"] = r["matmul_1"]["median_s"] / r[f"matmul_{many}"]["median_s"]
    out["loadavg_end"] = loadavg()
    return out
