"""The corpus stage past one process, measured: per_shard/exchange as one Ray task per shard
(engine/corpus/sharded.py) on a local Ray of this machine.

``scale``: a generated corpus (clustered low-d rows stored fp16, one .npy pair per shard)
through ``select_corpus(mode=exchange)`` on Ray tasks: the coordinator's peak RSS, each
worker's peak RSS, the time of each phase and round, whole-corpus f of the exchange against
the per-shard start and quality top-k::

    python -m bench.corpus_ray scale --rows 100000000 --shards 1000 --dim 16 --workers 2

``speedup``: the same corpus on 1 and 2 Ray workers, interleaved repetitions::

    python -m bench.corpus_ray speedup --rows 2000000 --shards 100 --dim 16 --reps 3
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import time

import numpy as np

from bench.common import cpu_model

CENTERS = 64


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def generate(workdir: str, rows: int, shards: int, dim: int, seed: int = 0,
             cut: str = "random_blocks") -> list:
    """Each shard's base path; rows are clustered (CENTERS centres, noise), quality in (0, 1).
    ``sorted_by_quality``: the rows re-cut so that the first shard holds the best."""
    per = rows // shards
    os.makedirs(workdir, exist_ok=True)
    centres = np.random.default_rng(seed).standard_normal((CENTERS, dim)).astype(np.float32)
    bases = []
    for i in range(shards):
        base = os.path.join(workdir, f"{cut}-{rows}x{dim}-of{shards}-{i:05d}")
        if not os.path.exists(base + ".q.npy"):
            rng = np.random.default_rng([seed, i])
            if cut == "sorted_by_quality":  # quality band i of the corpus (best first)
                hi = 1.0 - i / shards
                q = np.sort(rng.uniform(hi - 1.0 / shards, hi, per))[::-1]
            else:
                q = rng.uniform(0, 1, per)
            c = rng.integers(0, CENTERS, per)
            x = centres[c] + 0.6 * rng.standard_normal((per, dim)).astype(np.float32)
            np.save(base + ".x.npy", x.astype(np.float16))
            np.save(base + ".q.npy", q.astype(np.float32))
        bases.append(base)
    return bases


def load_npy(base: str, offset: int):
    """One shard's rows (fp16 on disk, float32 here), quality and ids."""
    from datamask_pipeline.engine.corpus import Part

    x = np.load(base + ".x.npy").astype(np.float32)
    q = np.load(base + ".q.npy").astype(np.float64)
    return Part(x, q, np.arange(offset, offset + q.size, dtype=np.int64))


def _worker_peaks(ray) -> dict:
    @ray.remote(num_cpus=1)
    def peak():
        time.sleep(0.2)
        return os.getpid(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    return dict(ray.get([peak.remote() for _ in range(16)]))


def run_scale(rows: int, shards: int, dim: int, workers: int, workdir: str, term: str = "Pair_simi",
              lamb: float = 0.5, ratio: float = 0.1, cut: str = "random_blocks",
              max_rounds: int = 50, per_shard_reference: bool = False) -> dict:
    import ray

    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.corpus import CorpusBudget, CorpusShard, select_corpus
    from datamask_pipeline.engine.corpus.executor import RayTasks

    t0 = time.perf_counter()
    bases = generate(workdir, rows, shards, dim, cut=cut)
    gen_s = time.perf_counter() - t0
    per = rows // shards
    cs = [CorpusShard(key=f"s{i:05d}", n=per, load=functools.partial(load_npy, b, i * per))
          for i, b in enumerate(bases)]
    cfg = LearnerConfig.profile("pipeline", algorithm=term, lamb=lamb)
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        marks = []

        def log(msg):
            marks.append((time.perf_counter(), msg))

        rss_before = _peak_rss()
        t0 = time.perf_counter()
        sel = select_corpus(cs, cfg, CorpusBudget("fraction", ratio), mode="exchange",
                            gather_max_rows=0, max_rounds=max_rounds, executor=RayTasks(),
                            log=log)
        wall = time.perf_counter() - t0
        coord = _peak_rss()
        workers_peak = _worker_peaks(ray)
        ref = None
        if per_shard_reference:
            ref = select_corpus(cs, cfg, CorpusBudget("fraction", ratio), mode="per_shard",
                                gather_max_rows=0, executor=RayTasks()).scores
    finally:
        ray.shutdown()
    return {
        "rows": per * shards, "shards": shards, "dim": dim, "workers": workers, "term": term,
        "lamb": lamb, "select_ratio": ratio, "cut": cut, "k": sel.k, "engine": sel.engine,
        "generate_s": gen_s, "wall_s": wall, "timings": sel.timings,
        "rounds": [{k: r[k] for k in ("round", "swaps", "candidates", "f_before", "f", "seconds",
                                      "bytes_exchanged")} for r in sel.rounds],
        "converged": sel.converged, "scores": sel.scores, "per_shard_scores": ref,
        "coordinator_peak_rss_bytes": coord, "coordinator_rss_before_bytes": rss_before,
        "worker_peak_rss_bytes": sorted(workers_peak.values()),
        "cpu": cpu_model(),
    }


RESULTS_GLOB = "bench/results/results_corpus_ray_*.json"


def load_results(pattern: str = RESULTS_GLOB) -> tuple[list, list]:
    """(scale runs, speedup runs) recorded under bench/results."""
    import glob

    scale, speed = [], []
    for f in sorted(glob.glob(pattern)):
        with open(f) as fh:
            r = json.load(fh)
        (speed if "reps" in r else scale).append(r)
    return sorted(scale, key=lambda r: (r["cut"], r["rows"])), speed


def table_markdown(scale: list, speed: list) -> str:
    """docs/measured.md's table of the recorded runs (tested against the page)."""
    g = 2 ** 30
    lines = ["| cut | rows × d (shards) | workers | wall | per-shard selections | rounds (s each) | "
             "scoring | coordinator peak RSS | worker peak RSS | f: exchange / per-shard / quality top-k |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in scale:
        t = r["timings"]
        per = (r.get("per_shard_scores") or {}).get("selection", {}).get("f")
        if per is None and r["rounds"]:
            per = r["rounds"][0]["f_before"]  # the exchange's start: each shard alone
        secs = ", ".join(f"{x['seconds']:.0f}" for x in r["rounds"])
        lines.append(
            f"| {r['cut']} | {r['rows']:,} × {r['dim']} ({r['shards']:,}) | {r['workers']} | "
            f"{r['wall_s']:.0f} s | {t['shards_s']:.0f} s | {len(r['rounds'])} "
            f"({secs}) | "
            f"{t['score_s']:.0f} s | {r['coordinator_peak_rss_bytes'] / g:.2f} GiB | "
            f"{max(r['worker_peak_rss_bytes']) / g:.2f} GiB | "
            f"{r['scores']['selection']['f']:.6f} / {'-' if per is None else f'{per:.6f}'} / "
            f"{r['scores']['quality_topk']['f']:.6f} |")
    for s in speed:
        lines += ["", f"1 → 2 Ray workers, {s['rows']:,} rows in {s['shards']} shards, "
                  f"{len(s['reps']) // 2} interleaved pairs: speedup "
                  f"{', '.join(f'{x:.2f}' for x in s['speedup_per_pair'])} per pair "
                  f"(median {s['speedup_median']:.2f})."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.corpus_ray", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("scale", "speedup"):
        p = sub.add_parser(name)
        p.add_argument("--rows", type=float, required=True)
        p.add_argument("--shards", type=int, required=True)
        p.add_argument("--dim", type=int, default=16)
        p.add_argument("--term", default="Pair_simi")
        p.add_argument("--cut", default="random_blocks",
                       choices=("random_blocks", "sorted_by_quality"))
        p.add_argument("--workdir", default="/tmp/datamask-corpus-ray")
        p.add_argument("--out", default=None, help="results JSON (default under bench/results)")
        p.add_argument("--max-rounds", type=int, default=50)
        p.add_argument("--per-shard-reference", action="store_true")
    sub.choices["scale"].add_argument("--workers", type=int, default=2)
    sub.choices["speedup"].add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    rows = int(a.rows)
    if a.cmd == "scale":
        r = run_scale(rows, a.shards, a.dim, a.workers, a.workdir, term=a.term, cut=a.cut,
                      max_rounds=a.max_rounds, per_shard_reference=a.per_shard_reference)
        r["command"] = "python -m bench.corpus_ray " + " ".join(argv or os.sys.argv[1:])
        out = a.out or f"bench/results/results_corpus_ray_{a.cut}_{rows}.json"
    else:
        reps = []
        for rep in range(a.reps):
            for w in (1, 2):  # interleaved
                r = run_scale(rows, a.shards, a.dim, w, a.workdir, term=a.term, cut=a.cut,
                              max_rounds=a.max_rounds)
                reps.append({"rep": rep, "workers": w, "wall_s": r["wall_s"],
                             "rounds": len(r["rounds"]), "f": r["scores"]["selection"]["f"]})
                print(json.dumps(reps[-1]), flush=True)
        pairs = [(p["wall_s"], q["wall_s"]) for p, q in zip(reps[::2], reps[1::2])]
        r = {"rows": rows, "shards": a.shards, "dim": a.dim, "reps": reps,
             "speedup_per_pair": [one / two for one, two in pairs],
             "speedup_median": float(np.median([one / two for one, two in pairs])),
             "cpu": cpu_model(),
             "command": "python -m bench.corpus_ray " + " ".join(argv or os.sys.argv[1:])}
        out = a.out or f"bench/results/results_corpus_ray_speedup_{rows}.json"
    with open(out, "w") as fh:
        json.dump(r, fh, indent=1, default=float)
    print(json.dumps({k: v for k, v in r.items() if k not in ("rounds",)}, indent=1,
                     default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
