"""An outside peer for facility location: apricot-select's lazy greedy on the same data and the
same similarity (clipped cosine, passed precomputed), against our facility-location greedy and
the learner (+ polish) at lambda = 0, all scored by engine.evaluate on the whole shard.

apricot is not a dependency of the project: install it into a folder of its own and point
``--peer-path`` at it, e.g.

    .venv/bin/python -m pip install --target bench/results/tmp/peer apricot-select
    .venv/bin/python -m bench.run --mode full --peer-path bench/results/tmp/peer ...
"""

from __future__ import annotations

import sys

import numpy as np

from .common import Scorer, Timer


def apricot_facility(x: np.ndarray, k: int):
    """apricot's FacilityLocationSelection (lazy greedy) on the clipped-cosine similarity."""
    from apricot import FacilityLocationSelection

    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    S = np.clip(xn @ xn.T, 0, None).astype(np.float64)
    sel = FacilityLocationSelection(k, metric="precomputed", optimizer="lazy", verbose=False)
    sel.fit(S)
    return np.asarray(sel.ranking, dtype=np.int64)


def run_peer(x, q, ids, opts, peer_path: str | None, log=print) -> dict:
    from datamask_pipeline.engine.baselines import greedy
    from datamask_pipeline.engine.config import n_select
    from datamask_pipeline.engine.learner import learn
    from datamask_pipeline.engine.polish import polish

    from .time_to_greedy import learner_config

    if peer_path and peer_path not in sys.path:
        sys.path.insert(0, peer_path)
    try:
        import apricot  # noqa: F401
        version = getattr(apricot, "__version__", "?")
    except Exception as exc:  # not installed, or it does not import on this Python
        return {"skipped": f"apricot-select is not importable here: {type(exc).__name__}: {exc}"}
    n = x.shape[0]
    k = n_select(opts.select_ratio, n)
    score = Scorer(x, q, "Facility", 0.0, device=opts.device)
    out = {"n": n, "d": x.shape[1], "k": k, "lamb": 0.0, "apricot_version": version, "rows": []}
    # warm-up (numba compiles on first use)
    apricot_facility(x[:300], 30)
    for rep in range(max(1, opts.reps_small)):
        with Timer() as t:
            a = apricot_facility(x, k)
        out["rows"].append({"who": "apricot lazy greedy (precomputed S)", "rep": rep, "wall_s": t.wall,
                            "f": score(a)})
        with Timer(opts.device) as t:
            g = greedy(x, q, k, "Facility", 0.0, device=opts.device)
        out["rows"].append({"who": "engine greedy (lazy)", "rep": rep, "wall_s": t.wall, "f": score(g)})
        log(f"  peer rep {rep}: apricot {out['rows'][-2]['wall_s']:.2f}s f={out['rows'][-2]['f']:.6f} | "
            f"ours {t.wall:.2f}s f={out['rows'][-1]['f']:.6f}")
    cfg = learner_config("Facility", n, opts).replace(lamb=0.0)
    with Timer(opts.device) as t:
        r = learn(x, q, cfg, ids=ids, device=opts.device)
    out["rows"].append({"who": "DATAMASK paper (lambda=0)", "rep": 0, "wall_s": t.wall,
                        "f": score(r.selected_idx)})
    with Timer(opts.device) as t2:
        p = polish(x, q, r.selected_idx, "Facility", 0.0, device=opts.device,
                   time_budget_s=opts.polish_budget_s)
    out["rows"].append({"who": "DATAMASK paper+polish (lambda=0)", "rep": 0, "wall_s": t.wall + t2.wall,
                        "f": score(p.selected)})
    return out
