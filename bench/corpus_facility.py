"""Facility location past one process, measured: the corpus stage's ``exchange`` route for
facility location (greedy in k-means blocks, one gain threshold; engine/corpus/blocks.py) on
a local Ray of this machine, against per-shard selection of the same files and the corpus's
quality top-k, every f exact on the whole corpus (computed here, in chunks)::

    python -m bench.corpus_facility --rows 1000000 --shards 100 --dim 16 --workers 2

The corpus is bench.corpus_ray's generated one (clustered low-d rows stored fp16), by default
cut into files sorted by quality (the cut where per-file selection fails).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import numpy as np
import torch

from bench.common import cpu_model
from bench.corpus_ray import _peak_rss, _worker_peaks, generate, load_npy


def facility_f(x: torch.Tensor, q: np.ndarray, sel: np.ndarray, lamb: float,
               chunk: int = 2048) -> float:
    """λ·mean q over the selection + (1−λ)·mean over every row of its best clipped cosine to
    a selected row (the shard objective of docs/method.md on the whole corpus)."""
    xn = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    xs = xn[torch.as_tensor(sel)].T.contiguous()
    cover = 0.0
    for s in range(0, xn.shape[0], chunk):
        cover += float((xn[s:s + chunk] @ xs).amax(dim=1).clamp_(min=0).sum(dtype=torch.float64))
    return lamb * float(np.mean(q[sel])) + (1 - lamb) * cover / xn.shape[0]


def run(rows: int, shards: int, dim: int, workers: int, workdir: str, lamb: float = 0.5,
        ratio: float = 0.1, cut: str = "sorted_by_quality") -> dict:
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
    cfg = LearnerConfig.profile("pipeline", algorithm="Facility", lamb=lamb)
    budget = CorpusBudget("fraction", ratio)
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        rss_before = _peak_rss()
        marks = []
        t0 = time.perf_counter()
        blocks = select_corpus(cs, cfg, budget, mode="exchange", gather_max_rows=0,
                               executor=RayTasks(), workdir=workdir,
                               log=lambda m: marks.append((time.perf_counter() - t0, m)))
        blocks_s = time.perf_counter() - t0
        coord = _peak_rss()
        workers_peak = _worker_peaks(ray)
        t0 = time.perf_counter()
        pershard = select_corpus(cs, cfg, budget, mode="per_shard", gather_max_rows=0,
                                 executor=RayTasks())
        per_s = time.perf_counter() - t0
    finally:
        ray.shutdown()

    def union(sel):
        return np.concatenate([np.asarray(sel.selected[s.key]) + i * per
                               for i, s in enumerate(cs)])

    t0 = time.perf_counter()
    x = torch.as_tensor(np.concatenate([np.load(b + ".x.npy").astype(np.float32) for b in bases]))
    q = np.concatenate([np.load(b + ".q.npy").astype(np.float64) for b in bases])
    k = blocks.k
    topk = np.argsort(-q, kind="stable")[:k]
    f = {"exchange": facility_f(x, q, union(blocks), lamb),
         "per_shard": facility_f(x, q, union(pershard), lamb),
         "quality_topk": facility_f(x, q, topk, lamb)}
    score_s = time.perf_counter() - t0
    return {
        "rows": per * shards, "shards": shards, "dim": dim, "workers": workers, "lamb": lamb,
        "select_ratio": ratio, "cut": cut, "k": k, "generate_s": gen_s,
        "exchange_s": blocks_s, "per_shard_s": per_s, "exact_scoring_s": score_s,
        "route": blocks.route, "notes": blocks.notes, "log": marks,
        "rows_selected": {"exchange": int(union(blocks).size),
                          "per_shard": int(union(pershard).size)},
        "f": f, "run_scores": blocks.scores, "scored_by": blocks.scored_by,
        "coordinator_peak_rss_bytes": coord, "coordinator_rss_before_bytes": rss_before,
        "worker_peak_rss_bytes": sorted(workers_peak.values()), "cpu": cpu_model(),
    }


def markdown(r: dict) -> str:
    g = 2 ** 30
    f = r["f"]
    guard = "facility_blocks" in r["run_scores"]
    blk = r["run_scores"]["facility_blocks" if guard else "selection"]
    return "\n".join([
        f"{r['rows']:,} generated rows × {r['dim']} (fp16 on disk) in {r['shards']:,} files cut "
        f"{r['cut']}, facility location, λ = {r['lamb']}, budget {r['select_ratio']:.0%} "
        f"(k = {r['k']:,}), {r['workers']} Ray workers; {r['cpu']}.", "",
        "| what | value |", "|---|---:|",
        f"| `exchange` ({r['route']}) | {r['exchange_s']:.0f} s |",
        f"| `per_shard` (each file alone) | {r['per_shard_s']:.0f} s |",
        f"| coordinator peak RSS / worker peak RSS | {r['coordinator_peak_rss_bytes'] / g:.2f} / "
        f"{max(r['worker_peak_rss_bytes']) / g:.2f} GiB |",
        f"| whole-corpus f: exchange / per_shard / quality top-k | {f['exchange']:.6f} / "
        f"{f['per_shard']:.6f} / {f['quality_topk']:.6f} |",
        f"| the run's own estimate: the blocks' selection / quality top-k (± se of the "
        f"difference) | {blk['f']:.6f} / {r['run_scores']['quality_topk']['f']:.6f} "
        f"(± {blk['f_minus_quality_topk_se']:.6f}) |",
        f"| returned | {'quality top-k (it scored higher)' if guard else 'the blocks selection'} |",
        "", "Every f is exact on the whole corpus (each row's best clipped cosine to the "
        "selection, computed by this bench); whole-corpus greedy is out of reach at this size.",
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.corpus_facility", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=1e6)
    ap.add_argument("--shards", type=int, default=100)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cut", default="sorted_by_quality",
                    choices=("random_blocks", "sorted_by_quality"))
    ap.add_argument("--workdir", default="/tmp/datamask-corpus-ray")
    ap.add_argument("--tag", default="corpus_facility")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args(argv)
    r = run(int(a.rows), a.shards, a.dim, a.workers, a.workdir, cut=a.cut)
    r["command"] = "python -m bench.corpus_facility " + " ".join(
        argv if argv is not None else os.sys.argv[1:])
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"results_{a.tag}.json"), "w") as fh:
        json.dump(r, fh, indent=1, default=float)
    md = markdown(r)
    with open(os.path.join(a.out, f"REPORT_{a.tag}.md"), "w") as fh:
        fh.write(f"# {a.tag}\n\nCommand: `{r['command']}`\n\n{md}\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
