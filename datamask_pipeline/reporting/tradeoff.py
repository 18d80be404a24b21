"""The lambda trade-off view (issue 6, item 3): what a selection gives up in quality to gain
diversity.

:func:`sweep_lambda` runs the learner once per lambda on one shard and scores every read-out on
the **whole shard** (V = all n rows, :func:`engine.evaluate.evaluate_selection`), together with
the reference points: one random subset and quality top-k (both independent of lambda; their f
at a given lambda is lambda * f_qua + (1 - lambda) * f_div) and greedy on the joint objective
at each lambda of ``greedy_lambs``. :func:`plot_frontier` draws

* left: the quality-vs-diversity plane (x = f_div of the chosen term, higher = more diverse;
  y = f_qua, the subset's mean quality), DATAMASK's points joined in lambda order, greedy's
  likewise, random and quality top-k as single markers;
* right: the joint objective f against lambda for DATAMASK, greedy, quality top-k and random.

Command line (writes ``frontier_<algorithm>.png`` and ``frontier_<algorithm>.json`` under
``--out``, each published atomically, and prints the JSON summary)::

    python -m datamask_pipeline.reporting.tradeoff --input shard.parquet \\
        --algorithm Pair_simi --lambs 0,0.2,0.5,0.8,1 --out DIR [--n_epochs 400 ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Callable, Sequence

import numpy as np

from .shard_report import COLORS, _new_figure, _png, _style

__all__ = ["sweep_lambda", "plot_frontier", "parse_lambs", "main"]


def parse_lambs(spec) -> list[float]:
    """``"0,0.2,0.5"`` or a sequence of numbers -> sorted unique floats in [0, 1]."""
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",") if p.strip()]
        try:
            vals = [float(p) for p in parts]
        except ValueError as exc:
            raise ValueError(f"lambda values must be numbers separated by commas, got {spec!r}") from exc
    else:
        vals = [float(v) for v in spec]
    if not vals:
        raise ValueError("need at least one lambda value")
    bad = [v for v in vals if not (0.0 <= v <= 1.0) or math.isnan(v)]
    if bad:
        raise ValueError(f"lambda values must be in [0, 1], got {bad}")
    return sorted(set(vals))


class _Arrays:
    """A shard given as arrays, for :func:`engine.select.select_shard`."""

    def __init__(self, x, q, ids):
        self.embeddings, self.quality, self.ids = x, q, ids


def _scores(ev: dict, algorithm: str) -> dict:
    return {"f_qua": float(ev["f_qua"]), "f_div": float(ev["f_div"][algorithm])}


def _f(point: dict, lamb: float) -> float:
    return lamb * point["f_qua"] + (1.0 - lamb) * point["f_div"]


def sweep_lambda(
    x,
    q,
    algorithm: str,
    lambs: Sequence[float] | str,
    cfg=None,
    *,
    ids=None,
    device="cpu",
    greedy_lambs: Sequence[float] | str | None = None,
    random_seed: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Learn one selection per lambda and score it, and the references, on the whole shard.

    ``cfg``: a :class:`engine.config.LearnerConfig` whose other knobs are used for every run
    (default: the engine's CPU demo preset); its ``algorithm`` and ``lamb`` are replaced.
    ``greedy_lambs``: the lambdas greedy runs at (default: all of ``lambs``; ``[]`` or
    ``"none"``: no greedy). ``random_seed``: seed of the random subset (default ``cfg.seed``).
    ``progress``: called with a one-line message after each run.

    Returns a JSON-ready dict::

        {"algorithm", "n", "d", "k", "config": {...}, "lambs": [...],
         "points": [{"lamb", "f_qua", "f_div", "f", "f_quality_topk", "f_random",
                     "f_greedy"?, "gap_closed_vs_greedy"?, "overlap_with_topk", "steps",
                     "wall_time_s"}, ...],            # DATAMASK, one per lambda, ascending
         "random": {"f_qua", "f_div"}, "quality_topk": {"f_qua", "f_div"},
         "greedy": [{"lamb", "f_qua", "f_div", "f", "wall_time_s"}, ...],
         "wall_time_s"}

    Every number is a finite float (``gap_closed_vs_greedy`` is left out where greedy and
    top-k tie)."""
    import torch

    from ..engine.baselines import greedy as greedy_sel
    from ..engine.baselines import quality_topk, random_selection
    from ..engine.config import CPU_DEMO_PRESET, LearnerConfig, canonical_algorithm
    from ..engine.evaluate import evaluate_selection, make_ground_set
    from ..engine.select import select_shard

    t_start = time.perf_counter()
    algorithm = canonical_algorithm(algorithm)
    lambs = parse_lambs(lambs)
    if greedy_lambs is None:
        g_lambs = list(lambs)
    elif isinstance(greedy_lambs, str) and greedy_lambs.strip().lower() in ("none", ""):
        g_lambs = []
    elif isinstance(greedy_lambs, str) and greedy_lambs.strip().lower() == "all":
        g_lambs = list(lambs)
    else:
        g_lambs = parse_lambs(greedy_lambs) if len(greedy_lambs) else []
    if cfg is None:
        cfg = LearnerConfig.profile("pipeline", algorithm=algorithm, **CPU_DEMO_PRESET)
    base = cfg.replace(algorithm=algorithm)

    x_np = x.detach().cpu().numpy() if torch.is_tensor(x) else np.asarray(x)
    q_np = (q.detach().cpu().numpy() if torch.is_tensor(q) else np.asarray(q)).astype(np.float64)
    if x_np.ndim != 2 or q_np.shape != (x_np.shape[0],):
        raise ValueError(f"x must be (n, d) and q (n,), got {x_np.shape} and {q_np.shape}")
    n, d = x_np.shape
    for lamb in lambs:  # every configuration is checked before any work starts
        base.replace(lamb=lamb).validate(n)
    k = base.sizes(n)["k"]
    say = progress or (lambda _msg: None)

    ground = make_ground_set(x_np, q_np, device=device)

    def ev(sel):
        return evaluate_selection(None, None, sel, lamb=0.5, terms=(algorithm,), ground=ground)

    topk_idx = quality_topk(q_np, k, ids)
    rand_idx = random_selection(n, k, seed=base.seed if random_seed is None else random_seed)
    ref_topk = _scores(ev(topk_idx), algorithm)
    ref_random = _scores(ev(rand_idx), algorithm)

    greedy_pts = []
    for lamb in g_lambs:
        t0 = time.perf_counter()
        idx = greedy_sel(x_np, q_np, k, algorithm, lamb, device=device)
        wall = time.perf_counter() - t0
        pt = {"lamb": lamb, **_scores(ev(idx), algorithm)}
        pt["f"] = _f(pt, lamb)
        pt["wall_time_s"] = wall
        greedy_pts.append(pt)
        say(f"greedy   λ={lamb:g}: f_qua={pt['f_qua']:.5g} f_div={pt['f_div']:.5g} "
            f"f={pt['f']:.5g} ({wall:.1f}s)")
    greedy_at = {p["lamb"]: p for p in greedy_pts}

    topk_set = set(topk_idx.tolist())
    points = []
    shard = _Arrays(x_np, q_np, ids)
    for lamb in lambs:
        res = select_shard(shard, base.replace(lamb=lamb), device=device, references=False)
        sel = res.indices
        score = res.scores["selection"]
        pt = {"lamb": lamb, "f_qua": score.f_qua, "f_div": score.f_div}
        pt["f"] = _f(pt, lamb)
        pt["f_quality_topk"] = _f(ref_topk, lamb)
        pt["f_random"] = _f(ref_random, lamb)
        if lamb in greedy_at:
            fg = greedy_at[lamb]["f"]
            pt["f_greedy"] = fg
            if abs(fg - pt["f_quality_topk"]) > 1e-12 * max(1.0, abs(fg)):
                pt["gap_closed_vs_greedy"] = (pt["f"] - pt["f_quality_topk"]) / (fg - pt["f_quality_topk"])
        pt["overlap_with_topk"] = len(topk_set.intersection(sel.tolist())) / max(1, sel.size)
        pt["steps"] = int(res.steps)
        pt["route"] = res.route
        pt["wall_time_s"] = float(res.timings["total_s"])
        points.append(pt)
        say(f"DATAMASK λ={lamb:g}: f_qua={pt['f_qua']:.5g} f_div={pt['f_div']:.5g} "
            f"f={pt['f']:.5g} ({res.route}, {res.steps} steps, {pt['wall_time_s']:.1f}s)")

    cfg_dict = base.to_dict()
    cfg_dict.pop("lamb", None)
    return {
        "algorithm": algorithm,
        "n": int(n),
        "d": int(d),
        "k": int(k),
        "config": cfg_dict,
        "lambs": lambs,
        "points": points,
        "random": ref_random,
        "quality_topk": ref_topk,
        "greedy": greedy_pts,
        "wall_time_s": time.perf_counter() - t_start,
    }


def _label_points(ax, pts, min_px: float = 34.0) -> None:
    """Write "λ=..." next to the DATAMASK points, skipping a label whose point lies within
    ``min_px`` pixels of one already labelled (the extremes are labelled first)."""
    if not pts:
        return
    ax.autoscale_view()
    xy = ax.transData.transform(np.array([[p["f_div"], p["f_qua"]] for p in pts], dtype=float))
    order = [0, len(pts) - 1] + list(range(1, len(pts) - 1))
    placed: list = []
    for i in dict.fromkeys(order):
        if any(np.hypot(*(xy[i] - xy[j])) < min_px for j in placed):
            continue
        placed.append(i)
        ax.annotate(f"λ={pts[i]['lamb']:g}", (pts[i]["f_div"], pts[i]["f_qua"]),
                    textcoords="offset points", xytext=(6, 5), fontsize=8.2,
                    color=COLORS["datamask"], zorder=5)


def plot_frontier(sweep: dict, *, title: str | None = None) -> bytes:
    """PNG of the quality-vs-diversity frontier (left) and f against lambda (right) of a
    :func:`sweep_lambda` result."""
    alg = sweep["algorithm"]
    pts = sorted(sweep["points"], key=lambda p: p["lamb"])
    gpts = sorted(sweep.get("greedy") or [], key=lambda p: p["lamb"])
    rnd, tk = sweep["random"], sweep["quality_topk"]

    fig = _new_figure(13.0, 5.4)
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.25, 1.0]})

    # ---- left: the (f_div, f_qua) plane
    if gpts:
        ax1.plot([p["f_div"] for p in gpts], [p["f_qua"] for p in gpts], color=COLORS["greedy"],
                 ls="--", lw=1.3, marker="s", ms=5.5, mfc="white", mew=1.3, zorder=3,
                 label="greedy on f (per λ)")
    ax1.plot([p["f_div"] for p in pts], [p["f_qua"] for p in pts], color=COLORS["datamask"],
             lw=1.8, marker="o", ms=6.5, zorder=4, label="DATAMASK (per λ)")
    ax1.plot([tk["f_div"]], [tk["f_qua"]], ls="none", marker="D", ms=9, color=COLORS["topk"],
             mec="black", mew=0.6, zorder=6, label="quality top-k")
    ax1.plot([rnd["f_div"]], [rnd["f_qua"]], ls="none", marker="X", ms=10, color=COLORS["random"],
             mec="black", mew=0.6, zorder=6, label="random")
    ax1.set_xlabel(f"diversity f_div ({alg}) →  more diverse", fontsize=9.5)
    ax1.set_ylabel("quality f_qua (mean quality of the subset) →", fontsize=9.5)
    ax1.set_title("Quality vs diversity on the whole shard (up and right is better)", fontsize=10.5)
    ax1.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4), useMathText=True)
    ax1.legend(fontsize=8.5, frameon=True, framealpha=0.9, edgecolor="none", loc="best")
    ax1.margins(x=0.12, y=0.08)
    _style(ax1)
    _label_points(ax1, pts)

    # ---- right: the joint objective against lambda, relative to quality top-k (f's own scale
    # changes with lambda and would hide the differences between the selections)
    def f_topk(lmb):
        return lmb * tk["f_qua"] + (1 - lmb) * tk["f_div"]

    lam = np.linspace(0.0, 1.0, 101)
    ax2.axhline(0.0, color=COLORS["topk"], ls="--", lw=1.4, label="quality top-k (= 0)")
    ax2.plot(lam, lam * rnd["f_qua"] + (1 - lam) * rnd["f_div"] - f_topk(lam),
             color=COLORS["random"], ls=":", lw=1.5, label="random")
    if gpts:
        ax2.plot([p["lamb"] for p in gpts], [p["f"] - f_topk(p["lamb"]) for p in gpts],
                 color=COLORS["greedy"], ls="--", lw=1.0, marker="s", ms=6, mfc="white", mew=1.3,
                 label="greedy on f")
    ax2.plot([p["lamb"] for p in pts], [p["f"] - f_topk(p["lamb"]) for p in pts],
             color=COLORS["datamask"], lw=1.4, marker="o", ms=6.5, label="DATAMASK")
    ax2.set_xlabel("λ (weight of quality)", fontsize=9.5)
    ax2.set_ylabel("f − f(quality top-k)", fontsize=9.5)
    ax2.set_title("Joint objective f = λ·f_qua + (1 − λ)·f_div, gain over quality top-k",
                  fontsize=10.5)
    ax2.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4), useMathText=True)
    ax2.set_xlim(-0.03, 1.03)
    ax2.legend(fontsize=8.5, frameon=False, loc="best")
    _style(ax2)

    heading = frontier_title(sweep, title)
    fig.suptitle(heading, fontsize=11 if len(heading) <= 140 else 9)
    fig.tight_layout(rect=(0, 0, 1, 0.965))
    return _png(fig, title=heading)


def what_ran(sweep: dict) -> str:
    """What the selections of a sweep did, by route: the λ values each route ran at (when
    there are several routes) and the learning steps it took, with the learner's G and
    partial only where it took some (a route that learns nothing says so, whatever
    ``n_epochs`` was configured). A sweep recorded without routes names its configuration as
    configured."""
    cfg = sweep.get("config") or {}
    pts = sorted(sweep.get("points") or [], key=lambda p: p["lamb"])
    learner = (f", G={cfg['n_rollout']}, partial={cfg['partial']:g}"
               if {"n_rollout", "partial"} <= set(cfg) else "")
    if not pts or any("steps" not in p or "route" not in p for p in pts):
        return (f"configured: {cfg['n_epochs']} steps{learner}" if "n_epochs" in cfg else "")
    routes: dict = {}
    for p in pts:
        routes.setdefault(p["route"], []).append(p)
    parts = []
    for route, ps in routes.items():
        steps = sorted({int(p["steps"]) for p in ps})
        if steps[-1] == 0:
            did = "no learning steps"
        else:
            did = (f"{steps[0]}" if len(steps) == 1 else f"{steps[0]}–{steps[-1]}") + \
                f" steps{learner}"
        at = "" if len(routes) == 1 else "λ=" + ", ".join(f"{p['lamb']:g}" for p in ps) + ": "
        parts.append(f"{at}{route}, {did}")
    return "; ".join(parts)


def frontier_title(sweep: dict, title: str | None = None) -> str:
    """The figure's title: the given one (or "λ trade-off, <term>"), the shard's size and
    what the routes did (:func:`what_ran`)."""
    sub = f"n={sweep['n']:,}, d={sweep['d']}, k={sweep['k']:,}"
    did = what_ran(sweep)
    head = title or f"λ trade-off, {sweep['algorithm']}"
    return f"{head}  ({sub}; {did})" if did else f"{head}  ({sub})"


# ----------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m datamask_pipeline.reporting.tradeoff",
        description="Sweep lambda on one shard and draw the quality-vs-diversity frontier with "
                    "the random, quality top-k and greedy reference points.",
    )
    p.add_argument("--input", required=True, help="parquet shard (path or URI)")
    p.add_argument("--out", required=True, help="output directory (path or URI)")
    p.add_argument("--lambs", default="0,0.2,0.5,0.8,1", help="comma-separated lambda values")
    p.add_argument("--greedy-lambs", "--greedy_lambs", default="all",
                   help="lambdas greedy runs at: all (default), none, or comma-separated values")
    p.add_argument("--device", default="cpu", help="auto | cpu | cuda:N (default cpu)")
    from ..engine.cli import add_knob_arguments

    add_knob_arguments(p.add_argument_group("method knobs (default: the pipeline profile with "
                                            "the CPU demo preset, algorithm Pair_simi)"),
                       exclude=("lamb",))
    p.add_argument("--id-column", default="chunk_id")
    p.add_argument("--quality-column", action="append", default=None,
                   help="quality column (repeat to sum several; default quality_score)")
    p.add_argument("--embedding-column", default="feature_arr")
    p.add_argument("--title", default=None)
    p.add_argument("--quiet", action="store_true", help="no per-run lines on stderr")
    return p


def main(argv=None) -> int:
    from ..engine import storage
    from ..engine.config import CPU_DEMO_PRESET, ConfigError, LearnerConfig
    from ..engine.data import Columns, DataContractError, read_shard
    from ..engine.device import DeviceError

    args = build_parser().parse_args(argv)
    try:
        lambs = parse_lambs(args.lambs)
        g = args.greedy_lambs.strip().lower()
        greedy_lambs = lambs if g == "all" else [] if g == "none" else parse_lambs(args.greedy_lambs)
        given = {f: getattr(args, f) for f in LearnerConfig.model_fields if hasattr(args, f)}
        cfg = LearnerConfig.profile("pipeline", **{**CPU_DEMO_PRESET, "algorithm": "Pair_simi",
                                                   **given})
        columns = Columns(id=args.id_column, quality=tuple(args.quality_column or ("quality_score",)),
                          embedding=args.embedding_column)
        shard = read_shard(args.input, columns)
        say = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
        sweep = sweep_lambda(shard.embeddings, shard.quality, cfg.algorithm, lambs, cfg,
                             ids=shard.ids, device=args.device, greedy_lambs=greedy_lambs,
                             progress=say)
    except (ConfigError, DataContractError, DeviceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sweep["input"] = str(args.input)
    png = plot_frontier(sweep, title=args.title)
    stem = f"frontier_{sweep['algorithm']}"
    png_uri = storage.join(args.out, f"{stem}.png")
    json_uri = storage.join(args.out, f"{stem}.json")
    storage.atomic_write_bytes(png_uri, png)
    storage.atomic_write_bytes(json_uri, json.dumps(sweep, indent=1, allow_nan=False).encode("utf-8"))
    print(json.dumps({"png": str(png_uri), "json": str(json_uri), "algorithm": sweep["algorithm"],
                      "n": sweep["n"], "k": sweep["k"],
                      "points": [{kk: p[kk] for kk in ("lamb", "f_qua", "f_div", "f")}
                                 for p in sweep["points"]],
                      "wall_time_s": round(sweep["wall_time_s"], 3)}))
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through a subprocess in the tests
    sys.exit(main())
