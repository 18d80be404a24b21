"""Outside peers on the same data, scored by the same whole-shard objective (engine.evaluate).

Two sections:

* ``facility`` — pure facility location (λ = 0, clipped cosine): apricot-select (lazy and
  stochastic optimizers, on the dense similarity and on a K-neighbour sparse one, plus
  apricot's own ``n_neighbors`` mode), submodlib (lazy and stochastic, dense), the engine's
  exact greedy and ``auto`` on the dense similarity, and the engine's sparse mode
  (``facility_similarity="sparse"``) when the engine has it. At the large size only the
  sparse modes run; dense ones are listed as not run with the memory they need.
* ``joint`` — λ = 0.5 for each term: the engine's solvers against its stochastic greedy
  (plain and ``sgreedy+polish``), quality top-k and random, as f / f_greedy against time.

Peers come from the ``bench`` extra (``pip install -e '.[bench]'``); a peer that does not
import is listed under ``skipped`` with the import error, and its rows are left out.

    .venv/bin/python -m bench.peers --threads 1            # the committed results (~20 min)
    .venv/bin/python -m bench.peers --quick                # seconds: CI smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from .common import DataSource, Timer, loadavg, machine_info, median, torch_threads
from .solvers import TIE, _Shard, _solve_time

OUT = Path(__file__).resolve().parent / "results"
TERMS = ("DiSF", "Facility", "Pair_simi")


# ----------------------------------------------------------------- plumbing
def peer_versions(wanted=("apricot", "submodlib")) -> tuple[dict, dict]:
    """({peer: version} of the peers that import, {peer: why not} of the others)."""
    found, skipped = {}, {}
    for name, module, dist in (("apricot", "apricot", "apricot-select"),
                               ("submodlib", "submodlib", "submodlib-py")):
        if name not in wanted:
            skipped[name] = "not asked for (--peers)"
            continue
        try:
            __import__(module)
            from importlib.metadata import version

            found[name] = version(dist)
        except Exception as exc:  # not installed, or it does not import here
            skipped[name] = f"{dist} does not import: {type(exc).__name__}: {exc}"
    return found, skipped


def engine_has_sparse() -> bool:
    """Whether the engine's LearnerConfig knows ``facility_similarity`` / ``facility_neighbors``."""
    from datamask_pipeline.engine.config import LearnerConfig

    try:
        LearnerConfig(algorithm="Facility", facility_similarity="sparse", facility_neighbors=8)
    except Exception:
        return False
    return True


def available_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def clipped_cosine(x: np.ndarray, dtype=np.float32) -> np.ndarray:
    """The dense n x n similarity of the Facility term: max(0, cos(x_i, x_j))."""
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    S = xn @ xn.T
    np.clip(S, 0, None, out=S)
    return S.astype(dtype, copy=False)


def neighbour_csr(x: np.ndarray, K: int, knn: str = "auto"):
    """The sparse similarity as apricot reads it (row j: the points j covers, j's similarity
    to them): each row i's K nearest neighbours by clipped cosine, transposed. Built by the
    engine's neighbour graph (the same K-neighbour lists as our sparse mode) when it has one,
    else by an exact blockwise top-K. ``knn``: the engine's facility_knn (auto, faiss, exact)."""
    import scipy.sparse as sp
    import torch

    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    xn = torch.nn.functional.normalize(xt, dim=1)
    n = xn.shape[0]
    try:
        from datamask_pipeline.engine.terms import neighbors as nb

        g = nb.build_graph(xn, K, nb.knn_method(knn, xn.device), 2**30)
        nbr, sim, method = g.nbr.numpy(), g.sim.numpy(), g.method
    except ImportError:
        sims, idx = [], []
        for s in range(0, n, 2048):
            v, i = (xn[s:s + 2048] @ xn.T).clamp_(min=0).topk(min(K, n), dim=1)
            sims.append(v)
            idx.append(i)
        sim, nbr, method = torch.cat(sims).numpy(), torch.cat(idx).numpy(), "exact"
    rows = np.repeat(np.arange(n), nbr.shape[1])
    C = sp.csr_matrix((sim.ravel().astype(np.float64), (nbr.ravel(), rows)), shape=(n, n))
    C.indices, C.indptr = C.indices.astype(np.int32), C.indptr.astype(np.int32)  # apricot's kernels
    return C, method


# -------------------------------------------------------------- contenders
def apricot_select(S, k: int, optimizer: str, seed: int, **kw) -> np.ndarray:
    from apricot import FacilityLocationSelection

    # stochastic: epsilon 0.01 as ours and submodlib's (apricot's default 0.9 draws ~n/(10k))
    extra = ({"random_state": seed, "optimizer_kwds": {"epsilon": 0.01}}
             if optimizer == "stochastic" else {})
    sel = FacilityLocationSelection(k, metric=kw.pop("metric", "precomputed"), optimizer=optimizer,
                                    verbose=False, **extra, **kw)
    sel.fit(S)
    return np.asarray(sel.ranking, dtype=np.int64)


def submodlib_select(S, k: int, optimizer: str) -> np.ndarray:
    from submodlib import FacilityLocationFunction

    f = FacilityLocationFunction(n=S.shape[0], mode="dense", sijs=S, separate_rep=False)
    picks = f.maximize(budget=k, optimizer=optimizer, stopIfZeroGain=False,
                       stopIfNegativeGain=False, epsilon=0.01, verbose=False, show_progress=False)
    return np.asarray([i for i, _ in picks], dtype=np.int64)


def facility_contenders(x, q, ids, n_large: bool, opts, peers: dict, sparse: bool) -> tuple[dict, dict]:
    """{name: fn() -> (indices, solver seconds or None = wall time)} and {name: why not run}."""
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.select import select_shard

    n = x.shape[0]
    k = max(1, int(round(opts.select_ratio * n)))
    shard = _Shard(x, q, ids)
    K = min(opts.neighbors, n - 1)
    fns, not_run = {}, {}
    avail = available_bytes()
    dense32, dense64 = n * n * 4, n * n * 8
    fits32 = 2 * dense32 < avail  # the matrix and the product it is made from
    fits64 = 3 * dense64 < avail  # apricot / submodlib: float64 copies of it
    base = LearnerConfig(algorithm="Facility", lamb=0.0, select_ratio=opts.select_ratio,
                         n_epochs=opts.steps, seed=opts.seed)

    def ours(solver, **knobs):
        def run():
            sel = select_shard(shard, base.replace(solver=solver, **knobs), device="cpu",
                               references=False, polish_time_budget_s=opts.polish_budget_s)
            stop = (sel.polish or {}).get("stop")
            return sel.indices, _solve_time(sel), sel.route + (f" (polish stop: {stop})" if stop else "")
        return run

    def gib(b):
        return f"{b / 2**30:.1f} GiB"

    dense_knobs = {"facility_similarity": "dense"} if sparse else {}
    if fits32 and not n_large:
        fns["ours: exact greedy (dense)"] = ours("greedy", **dense_knobs)
        fns["ours: auto (dense)"] = ours("auto", **dense_knobs)
    else:
        why = (f"dense n x n similarity is {gib(dense32)} in float32, {gib(avail)} available"
               if not fits32 else "dense rows run at the small size only")
        not_run["ours: exact greedy / auto (dense)"] = why
    if sparse:
        kn = {"facility_similarity": "sparse", "facility_neighbors": K}
        fns[f"ours: greedy (sparse, K={K})"] = ours("greedy", **kn)
        fns[f"ours: auto (sparse, K={K})"] = ours("auto", **kn)
    else:
        not_run["ours: sparse"] = ("the engine's LearnerConfig has no facility_similarity / "
                                   "facility_neighbors knobs in this checkout")
    if "apricot" in peers:
        if fits64 and not n_large:
            def ap_dense(opt):
                def run():
                    return apricot_select(clipped_cosine(x, np.float64), k, opt, opts.seed), None, "dense"
                return run
            fns["apricot: lazy (dense)"] = ap_dense("lazy")
            fns["apricot: stochastic (dense, ε=0.01)"] = ap_dense("stochastic")
            name = f"apricot: lazy, n_neighbors={K}, metric=cosine (its own graph)"
            try:  # a probe on 200 rows: this mode does not run with every scipy
                apricot_select(x[:200].astype(np.float64), 20, "lazy", opts.seed,
                               metric="cosine", n_neighbors=min(K, 199))
                fns[name] = lambda: (apricot_select(x.astype(np.float64), k, "lazy", opts.seed,
                                                    metric="cosine", n_neighbors=K), None,
                                     "apricot-nn (its similarity is cos², not clipped cos)")
            except Exception as exc:
                msg = str(exc).splitlines()[0][:200]
                not_run[name] = f"fails in apricot here: {type(exc).__name__}: {msg}"
        else:
            not_run["apricot: dense and its own n_neighbors mode"] = (
                f"apricot holds the n x n similarity in float64 ({gib(dense64)}; its n_neighbors "
                f"mode with metric='cosine' builds the same dense matrix first), "
                f"{gib(avail)} available" if not fits64 else "dense rows run at the small size only")

        def ap_sparse(opt):
            def run():
                C, method = neighbour_csr(x, K)
                return apricot_select(C, k, opt, opts.seed), None, f"csr K={K} ({method})"
            return run
        fns[f"apricot: lazy (sparse, K={K})"] = ap_sparse("lazy")
        fns[f"apricot: stochastic (sparse, K={K}, ε=0.01)"] = ap_sparse("stochastic")
    if "submodlib" in peers:
        if fits64 and not n_large:
            def sm(opt):
                return lambda: (submodlib_select(clipped_cosine(x, np.float32), k, opt), None, "dense")
            fns["submodlib: LazyGreedy (dense)"] = sm("LazyGreedy")
            fns["submodlib: StochasticGreedy (dense, ε=0.01)"] = sm("StochasticGreedy")
        else:
            not_run["submodlib: dense"] = (f"dense n x n similarity is {gib(dense32)} in float32, "
                                           f"{gib(avail)} available" if not fits64 else
                                           "dense rows run at the small size only")
        not_run["submodlib: sparse"] = ("not run: its sparse mode copies the kernel into Python "
                                        "lists (7.8 s for n=2,000, K=32 against 1.9 s dense)")
    return fns, not_run


class CachedScorer:
    """Whole-shard f via engine.evaluate (bench.common.Scorer), each distinct selection once."""

    def __init__(self, x, q, term, lamb):
        from .common import Scorer

        self.scorer = Scorer(x, q, term, lamb)
        self.cache: dict = {}

    def __call__(self, idx) -> float:
        key = hashlib.sha1(np.sort(np.asarray(idx, dtype=np.int64)).tobytes()).hexdigest()
        if key not in self.cache:
            self.cache[key] = self.scorer(idx)
        return self.cache[key]


def run_interleaved(fns: dict, reps: int, score, log) -> dict:
    """Each contender ``reps`` times round-robin; medians and spread of time, f of each run."""
    runs = {name: [] for name in fns}
    for rep in range(reps):
        for name, fn in fns.items():
            with Timer() as t:
                idx, solver_s, how = fn()
            secs = t.wall if solver_s is None else solver_s
            runs[name].append({"time_s": secs, "wall_s": t.wall, "how": how, "f": score(idx),
                               "k": int(len(idx))})
            log(f"  rep {rep} {name:55s} f={runs[name][-1]['f']:.6f} t={secs:.2f}s")
    out = {}
    for name, rs in runs.items():
        ts = [r["time_s"] for r in rs]
        out[name] = {"f": median([r["f"] for r in rs]), "f_min": min(r["f"] for r in rs),
                     "f_max": max(r["f"] for r in rs), "time_s": median(ts), "time_min_s": min(ts),
                     "time_max_s": max(ts), "reps": len(rs), "how": rs[0]["how"], "runs": rs}
    return out


def references(x, q, ids, k, score, seed) -> dict:
    from datamask_pipeline.engine.baselines import quality_topk, random_selection

    return {"quality top-k": score(quality_topk(q, k, ids)),
            "random": score(random_selection(x.shape[0], k, seed=seed))}


def facility_section(data, n, large, opts, peers, sparse, log) -> dict:
    x, q, ids = data.get(n)
    k = max(1, int(round(opts.select_ratio * n)))
    la0 = loadavg()
    score = CachedScorer(x, q, "Facility", 0.0)
    fns, not_run = facility_contenders(x, q, ids, large, opts, peers, sparse)
    # warm-up: numba compiles apricot's kernels on first use
    if "apricot" in peers:
        xs = x[:200]
        apricot_select(clipped_cosine(xs, np.float64), 20, "lazy", 0)
        apricot_select(clipped_cosine(xs, np.float64), 20, "stochastic", 0)
        apricot_select(neighbour_csr(xs, min(8, 199))[0], 20, "lazy", 0)
        apricot_select(neighbour_csr(xs, min(8, 199))[0], 20, "stochastic", 0)
    rows = run_interleaved(fns, opts.reps_large if large else opts.reps, score, log)
    return {"n": n, "d": int(x.shape[1]), "k": k, "lamb": 0.0, "neighbors": min(opts.neighbors, n - 1),
            "objective": ("exact facility location f = (1/n) Σ_i max_{j∈U} max(0, cos(x_i, x_j)) "
                          "by engine.evaluate (n x n similarity kept when it fits, else in row "
                          "blocks: no approximation at either size)"),
            "rows": rows, "not_run": not_run, "references": references(x, q, ids, k, score, opts.seed),
            "loadavg_start": la0, "loadavg_end": loadavg()}


def joint_section(data, n, term, opts, log) -> dict:
    from datamask_pipeline.engine.baselines import stochastic_greedy
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.select import select_shard

    x, q, ids = data.get(n)
    k = max(1, int(round(opts.select_ratio * n)))
    la0 = loadavg()
    shard = _Shard(x, q, ids)
    partial = min(1.0, max(opts.partial, 30 / (opts.select_ratio * n)))
    base = LearnerConfig(algorithm=term, lamb=opts.lamb, select_ratio=opts.select_ratio,
                         n_epochs=opts.steps, n_rollout=opts.rollouts, partial=partial, seed=opts.seed)
    score = CachedScorer(x, q, term, opts.lamb)
    readout: dict = {}

    def ours(solver):
        def run():
            sel = select_shard(shard, base.replace(solver=solver), device="cpu", references=False)
            if "learner_readout" in sel.scores:  # the learner alone (solver "paper") comes free
                readout.setdefault("runs", []).append((sel.scores["learner_readout"].f,
                                                       sel.timings.get("learn_s", 0.0)))
            return sel.indices, _solve_time(sel), sel.route
        return run

    fns = {"greedy (exact)": ours("greedy"), "auto": ours("auto"),
           "paper+polish": ours("paper+polish"), "sgreedy+polish": ours("sgreedy+polish"),
           "stochastic greedy (ε=0.01)": lambda: (stochastic_greedy(x, q, k, term, opts.lamb,
                                                                    seed=opts.seed), None, "sgreedy")}
    rows = run_interleaved(fns, opts.reps, score, log)
    if readout.get("runs"):
        fs, ts = zip(*readout["runs"])
        rows["paper (learner read-out)"] = {
            "f": median(fs), "f_min": min(fs), "f_max": max(fs), "time_s": median(ts),
            "time_min_s": min(ts), "time_max_s": max(ts), "reps": len(ts),
            "how": "the learner's top-k by logit inside the paper+polish runs", "runs": []}
    refs = references(x, q, ids, k, score, opts.seed)
    fg = rows["greedy (exact)"]["f"]
    for r in rows.values():
        r["frac_of_greedy"] = r["f"] / fg
    return {"term": term, "n": n, "d": int(x.shape[1]), "k": k, "lamb": opts.lamb,
            "steps": opts.steps, "rollouts": opts.rollouts, "partial": partial, "rows": rows,
            "references": {name: {"f": f, "frac_of_greedy": f / fg} for name, f in refs.items()},
            "loadavg_start": la0, "loadavg_end": loadavg()}


# ----------------------------------------------------------------- report
def _t(r) -> str:
    return f"{r['time_s']:.3g} s [{r['time_min_s']:.3g}–{r['time_max_s']:.3g}]"


def verdict(sec: dict) -> str:
    """The goal, ≥ apricot's objective in less time, checked on one facility section."""
    ap = {k: r for k, r in sec["rows"].items() if k.startswith("apricot")}
    ours = {k: r for k, r in sec["rows"].items() if k.startswith("ours")}
    if not ap or not ours:
        return "Goal (≥ apricot's f in less time): not measured here (apricot or ours missing)."
    best = max(ap, key=lambda k: ap[k]["f"])
    fastest_ap = min(ap, key=lambda k: ap[k]["time_s"])
    # equal within TIE (float noise of the whole-shard evaluation) counts as reaching it
    hits = [k for k, r in ours.items() if r["f"] >= ap[best]["f"] * (1 - TIE)]
    if not hits:
        return (f"Goal (≥ apricot's f in less time): **not met** — no engine row reaches "
                f"apricot's best f = {ap[best]['f']:.6f} ({best}).")
    win = min(hits, key=lambda k: ours[k]["time_s"])
    faster = ours[win]["time_s"] < ap[best]["time_s"]
    return (f"Goal (≥ apricot's f in less time): **{'met' if faster else 'not met on time'}** — "
            f"{win} reaches f = {ours[win]['f']:.6f} in {ours[win]['time_s']:.3g} s; apricot's "
            f"best f is {ap[best]['f']:.6f} ({best}, {ap[best]['time_s']:.3g} s); apricot's "
            f"fastest row is {fastest_ap} ({ap[fastest_ap]['time_s']:.3g} s, f = "
            f"{ap[fastest_ap]['f']:.6f}).")


def markdown(res: dict) -> str:
    m = res["machine"]
    L = ["# Outside peers, side by side", "", "Produced by:", "", "```", res["command"], "```", "",
         f"Machine: {m.get('cpu_model')}, {m.get('cpu_count')} cores, torch threads "
         f"{m.get('torch_threads')}, {m.get('memory_gib')} GiB. **Shared with other agents' "
         f"tests and benches while this ran**: load average {m.get('loadavg_start')} at the "
         f"start, {m.get('loadavg_end')} at the end (per section below). Times are medians of "
         f"{res['reps']} interleaved reps ({res['reps_large']} at the large size) with [min–max]; ours are solver seconds (learning + "
         "start + polish, the whole-shard scoring excluded), a peer's is the wall time of the "
         "call including building its similarity (dense matrix or neighbour graph).",
         "", f"Peers: {res['peers'] or 'none'}; skipped: {res['skipped'] or 'none'}. "
         f"Engine sparse facility mode: {'present' if res['engine_sparse'] else 'absent'}.", "",
         "Same similarity for everyone: apricot's own `metric='cosine'` is cos², not the clipped "
         "cosine of our Facility term, so each peer is handed the clipped cosine precomputed "
         "(dense: float64 for apricot, float32 for submodlib; sparse: the K-neighbour lists "
         "of the engine's sparse mode, `engine.terms.neighbors.build_graph`, transposed into "
         "the csr apricot reads). Stochastic optimizers all use ε = 0.01 (apricot's default "
         "is 0.9). quality top-k and random are references (not timed).", ""]
    if res.get("notes"):
        L += ["Notes on this run:", ""] + [f"- {note}" for note in res["notes"]] + [""]
    for sec in res["facility"]:
        best_peer = max((r["f"] for name, r in sec["rows"].items() if not name.startswith("ours")),
                        default=None)
        L += [f"## Facility location, λ = 0, n = {sec['n']:,} (d = {sec['d']}, k = {sec['k']:,})", "",
              f"Objective: {sec['objective']}. Load {sec['loadavg_start']} → {sec['loadavg_end']}.", "",
              "| who | f | f − best peer's f | time | reps | how |", "|---|---|---|---|---|---|"]
        for name, r in sorted(sec["rows"].items(), key=lambda kv: -kv[1]["f"]):
            d = "—" if best_peer is None else f"{r['f'] - best_peer:+.6f}"
            L.append(f"| {name} | {r['f']:.6f} | {d} | {_t(r)} | {r['reps']} | {r['how']} |")
        for name, f in sec["references"].items():
            L.append(f"| {name} | {f:.6f} | — | — | — | reference |")
        L += ["", verdict(sec)]
        if sec["not_run"]:
            L += ["", "Not run:", ""] + [f"- {name}: {why}" for name, why in sec["not_run"].items()]
        L.append("")
    for sec in res["joint"]:
        L += [f"## Joint objective, λ = {sec['lamb']}, {sec['term']}, n = {sec['n']:,} "
              f"(d = {sec['d']}, k = {sec['k']:,}; learner {sec['steps']} steps, G = "
              f"{sec['rollouts']}, partial {sec['partial']:.3g})", "",
              f"Load {sec['loadavg_start']} → {sec['loadavg_end']}.", "",
              "| who | f / f_greedy | f | time | reps | route |", "|---|---|---|---|---|---|"]
        for name, r in sec["rows"].items():
            L.append(f"| {name} | {100 * r['frac_of_greedy']:.3f}% | {r['f']:.6f} | {_t(r)} | "
                     f"{r['reps']} | {r['how']} |")
        for name, r in sec["references"].items():
            L.append(f"| {name} | {100 * r['frac_of_greedy']:.3f}% | {r['f']:.6f} | — | — | reference |")
        L.append("")
    return "\n".join(L)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CI smoke run: n=300 and 600, d=16")
    p.add_argument("--n", type=int, default=10_000, help="facility (dense + sparse) and joint size")
    p.add_argument("--n-large", type=int, default=100_000, help="facility, sparse modes only; 0 = skip")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--neighbors", type=int, default=64, help="K of the sparse similarities")
    p.add_argument("--terms", default=",".join(TERMS), help="joint section's terms ('' = skip)")
    p.add_argument("--sections", default="facility,joint")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rollouts", type=int, default=128)
    p.add_argument("--partial", type=float, default=0.05)
    p.add_argument("--lamb", type=float, default=0.5)
    p.add_argument("--select-ratio", type=float, default=0.1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--reps-large", type=int, default=3, help="reps at --n-large")
    p.add_argument("--polish-budget-s", type=float, default=None,
                   help="time budget of our polish in the facility section (None = to convergence)")
    p.add_argument("--also", default=None, metavar="RESULTS.json",
                   help="an earlier run of other sections: its sections join this report")
    p.add_argument("--peers", default="apricot,submodlib", help="outside peers to try")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--render", default=None, metavar="RESULTS.json",
                   help="only re-render REPORT_peers.md (next to it) from a results file")
    a = p.parse_args(argv)
    if a.render:
        path = Path(a.render)
        (path.parent / "REPORT_peers.md").write_text(markdown(json.loads(path.read_text())) + "\n")
        return 0
    if a.quick:
        a.n, a.n_large, a.dim, a.neighbors, a.steps, a.rollouts = 300, 600, 16, 16, 20, 8
        a.reps = a.reps_large = 1
    out = Path(a.out) if a.out else (OUT / "tmp" / "peers_quick" if a.quick else OUT)
    out.mkdir(parents=True, exist_ok=True)
    command = ".venv/bin/python -m bench.peers " + " ".join(
        shlex.quote(s) for s in (argv if argv is not None else sys.argv[1:]))
    sections = [s for s in a.sections.split(",") if s]
    t0 = time.perf_counter()

    def log(msg):
        print(msg, flush=True)

    peers, skipped = peer_versions(tuple(a.peers.split(",")))
    with torch_threads(a.threads):
        info = machine_info("cpu")
        data = DataSource(a.dim, a.seed)
        sparse = engine_has_sparse()
        res = {"command": command, "machine": info, "data": data.describe(), "reps": a.reps, "reps_large": a.reps_large,
               "peers": peers, "skipped": skipped, "engine_sparse": sparse,
               "facility": [], "joint": []}
        if "facility" in sections:
            log(f"facility λ=0 n={a.n}")
            res["facility"].append(facility_section(data, a.n, False, a, peers, sparse, log))
            if a.n_large:
                log(f"facility λ=0 n={a.n_large} (sparse modes)")
                res["facility"].append(facility_section(data, a.n_large, True, a, peers, sparse, log))
        if "joint" in sections:
            for term in [t for t in a.terms.split(",") if t]:
                log(f"joint λ={a.lamb} {term} n={a.n}")
                res["joint"].append(joint_section(data, a.n, term, a, log))
        info["loadavg_end"] = loadavg()
    res["wall_s"] = time.perf_counter() - t0
    if a.also:  # sections this run did not do, from an earlier run (its command kept)
        other = json.loads(Path(a.also).read_text())
        for key in ("facility", "joint"):
            if not res[key]:
                res[key] = other[key]
        res["command"] = other["command"] + "\n" + res["command"]
    tmp = out / "results_peers.json.tmp"
    tmp.write_text(json.dumps(res, indent=1, default=float))
    os.replace(tmp, out / "results_peers.json")
    tmp = out / "REPORT_peers.md.tmp"
    tmp.write_text(markdown(res) + "\n")
    os.replace(tmp, out / "REPORT_peers.md")
    log(f"wrote {out / 'results_peers.json'} and REPORT_peers.md in {res['wall_s']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
