"""Time to greedy's objective, per term and shard size, and the solvers that try to beat it.

For one (term, n) cell, all on the whole shard (V = all n samples):

* quality top-k and random: f_topk, f_random;
* greedy (engine.baselines.greedy): f_greedy and wall time;
* ``paper``: the learner with its read-out scored on the whole shard every few steps
  (learn()'s on_eval hook; evaluation time is excluded from the learner's elapsed time);
* ``paper+polish``: the same run, then engine.polish from its read-out (what
  ``LearnerConfig(solver="paper+polish")`` does at the end of learn());
* ``topk+polish``: polish from quality top-k with no learning (an ablation: what the learner's
  steps add before the polish);
* ``greedy+polish``: polish from greedy's selection (how far greedy is from a swap optimum).

Every contender is repeated ``reps`` times round-robin (greedy, paper(+polish), topk+polish,
greedy, ...), times are medians. Curves come from the first repetition.
"""

from __future__ import annotations

import math

import numpy as np

from .common import Scorer, Timer, median

TARGETS = (0.99, 0.995, 1.0)


def _frac(f, f_ref):
    return None if f_ref is None or f_ref <= 0 else f / f_ref


def _gap(f, f_topk, f_ref):
    if f_ref is None or abs(f_ref - f_topk) <= 1e-12 * max(1.0, abs(f_ref)):
        return None
    return (f - f_topk) / (f_ref - f_topk)


def time_to(curve, f_ref, targets=TARGETS) -> dict:
    """First elapsed time at which f >= target * f_ref on a [(t, f), ...] curve."""
    out = {}
    for tg in targets:
        hit = None
        if f_ref is not None and f_ref > 0:
            for t, f in curve:
                if f >= tg * f_ref - 1e-12 * abs(f_ref):
                    hit = t
                    break
        out[f"{tg:g}"] = hit
    return out


def summarize(curve, f_ref, f_topk) -> dict:
    fs = [f for _, f in curve]
    best = max(fs)
    return {
        "final_f": fs[-1], "best_f": best,
        "final_fraction": _frac(fs[-1], f_ref), "best_fraction": _frac(best, f_ref),
        "gap_closed_final": _gap(fs[-1], f_topk, f_ref), "gap_closed_best": _gap(best, f_topk, f_ref),
        "time_to": time_to(curve, f_ref),
    }


def _median_time_to(runs: list) -> dict:
    out = {}
    for tg in TARGETS:
        key = f"{tg:g}"
        vals = [r["time_to"][key] for r in runs]
        hit = [v for v in vals if v is not None]
        out[key] = median(hit) if len(hit) == len(vals) else None
        out[key + "_reached_in"] = f"{len(hit)}/{len(vals)}"
    return out


def learner_config(term: str, n: int, opts) -> "LearnerConfig":
    from datamask_pipeline.engine.config import LearnerConfig

    # Batches of at most max_batch rows: the calibration run found the steps needed barely
    # depend on partial, so large shards use a smaller partial (recorded per cell).
    cap = getattr(opts, "max_batch_term", {}).get(term, opts.max_batch)
    partial = min(opts.partial, max(cap / n, 0.0))
    partial = max(partial, 30.0 / (opts.select_ratio * n))  # k' >= ~30 per mask
    return LearnerConfig(algorithm=term, lamb=opts.lamb, select_ratio=opts.select_ratio,
                         n_epochs=opts.steps, n_rollout=opts.rollouts, partial=min(1.0, partial),
                         max_lr=10.0, min_lr=1.0, init="quality", term_norm="none", seed=opts.seed,
                         solver="paper")  # the polish is run (and timed) separately


def run_cell(x, q, ids, term: str, opts, *, run_greedy: bool, log=print) -> dict:
    from datamask_pipeline.engine.baselines import greedy, quality_topk, random_selection
    from datamask_pipeline.engine.config import n_select
    from datamask_pipeline.engine.learner import learn
    from datamask_pipeline.engine.polish import polish

    n, d = x.shape
    k = n_select(opts.select_ratio, n)
    dev = opts.device
    score = Scorer(x, q, term, opts.lamb, device=dev)
    topk = quality_topk(q, k, ids)
    f_topk = score(topk)
    f_random = score(random_selection(n, k, seed=opts.seed))
    cfg = learner_config(term, n, opts)
    sizes = cfg.sizes(n)
    n_evals = int(max(6, min(40, round(40 * 20000 / max(n, 1)))))
    if term == "Facility":  # a whole-shard facility evaluation costs n*k*d: fewer of them
        n_evals = max(6, n_evals // 2)
    eval_every = max(1, opts.steps // n_evals)

    cell = {"term": term, "n": n, "d": d, "k": k, "lamb": opts.lamb, "f_topk": f_topk,
            "f_random": f_random, "learner_config": cfg.to_dict(), "learner_sizes": sizes,
            "eval_every": eval_every, "reps": opts.reps}
    g_runs, paper_runs, pp_runs, tp_runs = [], [], [], []
    g_sel = None
    f_greedy = None
    curves = {}
    for rep in range(opts.reps):
        # ---- greedy
        if run_greedy:
            with Timer(dev) as t:
                g_sel = greedy(x, q, k, term, opts.lamb, device=dev)
            f_greedy = score(g_sel)
            g_runs.append({"wall_s": t.wall, "cpu_s": t.cpu})
            log(f"  [{term} n={n} rep {rep}] greedy {t.wall:.2f}s f={f_greedy:.6f}")
        # ---- paper, with whole-shard evaluation of its read-out
        curve = []

        def on_eval(step, sel, elapsed):
            curve.append((float(elapsed), score(sel), int(step)))

        with Timer(dev) as t:
            res = learn(x, q, cfg, ids=ids, device=dev, on_eval=on_eval, eval_every=eval_every)
        learner_s = curve[-1][0]
        paper_runs.append({"learner_s": learner_s, "wall_incl_eval_s": t.wall, "cpu_s": t.cpu,
                           "steps": res.steps, "steps_per_s": res.steps / max(learner_s, 1e-9),
                           "curve": [(a, b) for a, b, _ in curve]})
        # ---- paper + polish (the read-out polished on the whole shard)
        pc = []
        with Timer(dev) as t:
            pr = polish(x, q, res.selected_idx, term, opts.lamb, device=dev,
                        time_budget_s=opts.polish_budget_s,
                        on_progress=lambda el, f, s: pc.append((learner_s + el, f)))
        f_pp = score(pr.selected)
        pcurve = [(a, b) for a, b, _ in curve] + pc + [(learner_s + t.wall, f_pp)]
        pp_runs.append({"learner_s": learner_s, "polish_s": t.wall, "total_s": learner_s + t.wall,
                        "f": f_pp, "swaps": pr.swaps, "moves": pr.moves, "rounds": pr.rounds,
                        "converged": pr.converged, "curve": pcurve})
        # ---- quality top-k + polish (no learning)
        if n > getattr(opts, "ablation_max_n", 10**12):
            log(f"  [{term} n={n} rep {rep}] paper {learner_s:.2f}s f={curve[-1][1]:.6f} | "
                f"+polish {pp_runs[-1]['polish_s']:.2f}s f={f_pp:.6f} ({pr.swaps} swaps)")
            continue
        tc = [(0.0, f_topk)]
        with Timer(dev) as t:
            tr = polish(x, q, topk, term, opts.lamb, device=dev, time_budget_s=opts.polish_budget_s,
                        on_progress=lambda el, f, s: tc.append((el, f)))
        f_tp = score(tr.selected)
        tc.append((t.wall, f_tp))
        tp_runs.append({"total_s": t.wall, "f": f_tp, "swaps": tr.swaps, "moves": tr.moves,
                        "rounds": tr.rounds, "converged": tr.converged, "curve": tc})
        log(f"  [{term} n={n} rep {rep}] paper {learner_s:.2f}s f={curve[-1][1]:.6f} | "
            f"+polish {pp_runs[-1]['polish_s']:.2f}s f={f_pp:.6f} ({pr.swaps} swaps) | "
            f"topk+polish {t.wall:.2f}s f={f_tp:.6f}")
    # ---- greedy + polish (once)
    gp = None
    if g_sel is not None:
        with Timer(dev) as t:
            gr = polish(x, q, g_sel, term, opts.lamb, device=dev, time_budget_s=opts.polish_budget_s)
        gp = {"polish_s": t.wall, "f": score(gr.selected), "swaps": gr.swaps,
              "converged": gr.converged}

    if g_runs:
        cell["greedy"] = {"measured": True, "extrapolated": False, "f": f_greedy,
                          "wall_s": median([r["wall_s"] for r in g_runs]),
                          "cpu_s": median([r["cpu_s"] for r in g_runs]), "runs": g_runs}
    else:
        cell["greedy"] = {"measured": False, "extrapolated": None, "f": None, "wall_s": None}
    fg = f_greedy

    def _paper_summary():
        runs = [dict(r, **summarize(r["curve"], fg, f_topk)) for r in paper_runs]
        s = {k2: median([r[k2] for r in runs]) for k2 in
             ("learner_s", "steps_per_s", "final_f", "best_f")}
        s["steps"] = runs[0]["steps"]
        s.update({k2: runs[0][k2] for k2 in ("final_fraction", "best_fraction",
                                              "gap_closed_final", "gap_closed_best")})
        s["best_fraction_all_reps"] = [r["best_fraction"] for r in runs]
        s["time_to"] = _median_time_to(runs)
        s["curve"] = runs[0]["curve"]
        return s

    def _polish_summary(runs, time_key):
        runs = [dict(r, **summarize(r["curve"], fg, f_topk)) for r in runs]
        s = {time_key: median([r[time_key] for r in runs]), "f": runs[0]["f"],
             "fraction": _frac(runs[0]["f"], fg), "gap_closed": _gap(runs[0]["f"], f_topk, fg),
             "swaps": runs[0]["swaps"], "moves": runs[0]["moves"], "rounds": runs[0]["rounds"],
             "converged": all(r["converged"] for r in runs), "time_to": _median_time_to(runs),
             "curve": runs[0]["curve"]}
        for extra in ("learner_s", "polish_s"):
            if extra in runs[0]:
                s[extra] = median([r[extra] for r in runs])
        return s

    cell["paper"] = _paper_summary()
    sps = cell["paper"]["steps_per_s"]
    cell["paper"]["projected_s"] = {str(T): T / sps for T in (1000, 5000, 10000)} if sps else None
    cell["paper+polish"] = _polish_summary(pp_runs, "total_s")
    cell["topk+polish"] = _polish_summary(tp_runs, "total_s") if tp_runs else None
    if gp is not None:
        gp["fraction"] = _frac(gp["f"], fg)
        gp["total_s"] = cell["greedy"]["wall_s"] + gp["polish_s"]
        cell["greedy+polish"] = gp
    cell["evaluation_s"] = score.seconds
    return cell


# ----------------------------------------------------------- greedy growth
def fit_growth(points) -> dict | None:
    """Least-squares fit of log t = p log n + c over measured (n, t) points."""
    pts = [(n, t) for n, t in points if t and t > 0]
    if len(pts) < 2:
        return None
    ln = np.log([p[0] for p in pts])
    lt = np.log([p[1] for p in pts])
    p, c = np.polyfit(ln, lt, 1)
    return {"exponent": float(p), "log_coeff": float(c), "points": [[int(a), float(b)] for a, b in pts]}


def extrapolate(fit: dict, n: int) -> float:
    return float(math.exp(fit["log_coeff"]) * n ** fit["exponent"])


def add_extrapolations(cells: list, extra_points: dict | None = None) -> dict:
    """Fill greedy wall time by the fitted growth where greedy was not run (``extra_points``:
    {term: [(n, seconds), ...]} measured by an earlier run on the same machine). Returns the
    fits."""
    fits = {}
    extra_points = extra_points or {}
    for term in sorted({c["term"] for c in cells}):
        pts = [(c["n"], c["greedy"]["wall_s"]) for c in cells
               if c["term"] == term and c["greedy"]["measured"]]
        have = {n for n, _ in pts}
        pts += [(int(n), float(t)) for n, t in extra_points.get(term, []) if int(n) not in have]
        fit = fit_growth(pts)
        fits[term] = fit
        for c in cells:
            if c["term"] != term or c["greedy"]["measured"] or fit is None:
                continue
            c["greedy"]["wall_s"] = extrapolate(fit, c["n"])
            c["greedy"]["extrapolated"] = True
    for c in cells:
        gw = c["greedy"]["wall_s"]
        for name in ("paper+polish", "topk+polish"):
            if c.get(name) is None:
                continue
            tot = c[name]["total_s"]
            c[name]["time_over_greedy"] = None if not gw else tot / gw
        tt = c["paper"]["time_to"]
        c["paper"]["time_to_over_greedy"] = {
            key: (None if (v is None or not gw) else v / gw)
            for key, v in tt.items() if not key.endswith("reached_in")}
        for name in ("paper+polish", "topk+polish"):
            if c.get(name) is None:
                continue
            tt = c[name]["time_to"]
            c[name]["time_to_over_greedy"] = {
                key: (None if (v is None or not gw) else v / gw)
                for key, v in tt.items() if not key.endswith("reached_in")}
    return fits
