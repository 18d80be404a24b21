"""The corpus stage, measured: how the cut of a corpus into files changes what is selected.

``cuts``: one generated corpus cut three ways (one file per source, random blocks, files sorted
by quality); every corpus mode (gather, exchange, per_shard, random_blocks) selects the same
budget; the union is scored on the whole corpus, with the share of the gap from whole-corpus
quality top-k to whole-corpus greedy that it closes ("gap closed", 1 = greedy)::

    python -m bench.corpus cuts --rows 20000 --dim 384 --disf-rows 5000 --tag corpus_cuts

``scale``: ≥ 10⁷ rows in ≥ 10 shards through ``exchange`` (shards selected alone, then
exchange rounds): per-shard time, rounds, bytes exchanged, peak RSS before and after the rounds,
whole-corpus f against per-shard selection (the start), quality top-k and random::

    python -m bench.corpus scale --rows 10000000 --shards 10 --dim 256 --tag corpus_scale
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

import numpy as np

from bench.common import cpu_model, write_report
from datamask_pipeline.engine.corpus.select import Part

CUTS = ("by_source", "random_blocks", "sorted_by_quality")
MODES = ("gather", "exchange", "per_shard", "random_blocks")


def make_cuts(q: np.ndarray, source: np.ndarray, n_files: int, seed: int = 0) -> dict:
    """Row numbers of each file, per cut: one file per source (uneven sizes), random blocks,
    and files sorted by quality (the best rows in the first file)."""
    rng = np.random.default_rng(seed)
    n = q.size
    return {
        "by_source": [np.flatnonzero(source == s) for s in sorted(set(source.tolist()))],
        "random_blocks": np.array_split(rng.permutation(n), n_files),
        "sorted_by_quality": np.array_split(np.argsort(-q, kind="stable"), n_files),
    }


def gap_closed(f: float, f_topk: float, f_greedy: float) -> float:
    return (f - f_topk) / (f_greedy - f_topk)


def real_corpus(dim: int, seed: int = 0, n_man: int = 200) -> dict:
    """Real documents, the same for every term: man pages in English, German, French and
    Spanish (rendered by ``man``, bench.quality) and the Python reference manual and
    docstrings, embedded by the shipped wordllama model at ``dim``, quality by the default
    heuristic scorer from the text, ``source`` = where each came from (the by_source cut)."""
    from bench.quality import MAIN_LANGUAGES, docstring_docs, man_docs, reference_docs
    from datamask_pipeline.engine.embed import WordLlamaEmbedder
    from datamask_pipeline.engine.quality import load_scorer

    texts, source = [], []
    for lang in MAIN_LANGUAGES:
        docs = man_docs(n_man, seed, lang=lang)
        texts += docs
        source += [f"man_{lang}"] * len(docs)
    for name, docs in (("reference", reference_docs()), ("docstrings", docstring_docs())):
        texts += docs
        source += [name] * len(docs)
    first: dict = {}
    for t, s in zip(texts, source):
        first.setdefault(t, s)  # an exact copy once, with its first source
    texts = list(first)
    return {"texts": texts, "source": np.asarray(list(first.values())),
            "x": WordLlamaEmbedder(dim=dim).embed(texts),
            "q": np.asarray(load_scorer().score(texts), dtype=np.float64)}


def run_cuts(rows: int, dim: int, disf_rows: int, files: int, lamb: float, ratio: float,
             terms: list, seed: int, block_rows: int | None = None,
             real: bool = False) -> dict:
    from datamask_pipeline.engine.baselines import greedy, quality_topk
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.corpus import CorpusBudget, CorpusShard, select_corpus
    from datamask_pipeline.engine.data import table_to_shard
    from datamask_pipeline.engine.evaluate import make_ground_set
    from datamask_pipeline.engine.sample import make_table
    from datamask_pipeline.engine.select import score_selection

    from datamask_pipeline.engine.corpus.blocks import BLOCK_ROWS

    out = {"rows": rows, "dim": dim, "disf_rows": disf_rows, "files": files, "lamb": lamb,
           "select_ratio": ratio, "block_rows": block_rows or BLOCK_ROWS, "terms": {}}
    if real:
        rc = real_corpus(dim, seed)
        out.update(rows=len(rc["texts"]), disf_rows=len(rc["texts"]), corpus="real",
                   sources={k: int(v) for k, v in zip(*np.unique(rc["source"],
                                                                 return_counts=True))})
    for term in terms:
        if real:
            x, q = rc["x"], rc["q"]
            ids, source = np.arange(q.size, dtype=np.int64), rc["source"]
            n = q.size
        else:
            n = disf_rows if term == "DiSF" else rows
            t = make_table(n, dim=dim, seed=seed)
            sh = table_to_shard(t, "corpus")
            x, q, ids = sh.embeddings, sh.quality, sh.ids
            source = np.asarray(t.column("source").to_pylist())
        cfg = LearnerConfig.profile("pipeline", algorithm=term, lamb=lamb)
        tm = cfg.diversity_term()
        k = int(round(ratio * n))
        ground = make_ground_set(x, q)
        t0 = time.perf_counter()
        g = greedy(x, q, k, tm, lamb)
        greedy_s = time.perf_counter() - t0
        f_g = score_selection(ground, g, tm, lamb).f
        f_t = score_selection(ground, quality_topk(q, k, ids), tm, lamb).f
        res = {"n": n, "k": k, "f_greedy": f_g, "greedy_s": greedy_s, "f_quality_topk": f_t,
               "cuts": {}}
        for cut, files_rows in make_cuts(q, source, files, seed).items():
            shards = [CorpusShard(key=f"f{i:02d}", n=len(r),
                                  load=lambda r=r: Part(x[r], q[r], ids[r]))
                      for i, r in enumerate(files_rows)]
            res["cuts"][cut] = {"file_rows": [len(r) for r in files_rows]}
            for mode in MODES:
                t0 = time.perf_counter()
                sel = select_corpus(shards, cfg, CorpusBudget("fraction", ratio), mode=mode,
                                    block_rows=block_rows)
                wall = time.perf_counter() - t0
                glob = np.concatenate([files_rows[i][sel.selected[f"f{i:02d}"]]
                                       for i in range(len(files_rows))])
                f = score_selection(ground, glob, tm, lamb).f
                res["cuts"][cut][mode] = {
                    "f": f, "gap_closed": gap_closed(f, f_t, f_g), "rows": int(glob.size),
                    "unique_rows": int(np.unique(glob).size), "seconds": wall,
                    "route": sel.route, "rounds": len(sel.rounds)}
                print(f"{term:9s} {cut:18s} {mode:14s} gap closed {gap_closed(f, f_t, f_g):8.4f} "
                      f"rows {glob.size} in {wall:.1f}s ({sel.route})", flush=True)
        out["terms"][term] = res
    return out


def cuts_markdown(r: dict) -> str:
    what = (f"Corpus of {r['rows']:,} real documents ("
            + ", ".join(f"{k} {v:,}" for k, v in r["sources"].items())
            + f"; wordllama {r['dim']}-d, the default heuristic quality)"
            if r.get("corpus") == "real" else
            f"Corpus of {r['rows']:,} generated rows ({r['dim']}-d; DiSF on {r['disf_rows']:,})")
    lines = [f"{what}, "
             f"λ = {r['lamb']}, budget {r['select_ratio']:.0%}, {r['files']} files for the "
             "random and sorted cuts. Gap closed = (f − f(quality top-k)) / (f(greedy) − "
             "f(quality top-k)), every f on the whole corpus. Facility location's exchange: "
             f"greedy in k-means blocks of at most {r.get('block_rows', 8192):,} rows, one gain "
             "threshold.", "",
             "| term | cut | " + " | ".join(MODES) + " |",
             "|---|---|" + "---:|" * len(MODES)]
    for term, res in r["terms"].items():
        for cut in CUTS:
            c = res["cuts"][cut]
            cells = []
            for m in MODES:
                v = c[m]
                cells.append("n/a" if "skipped" in v else f"{v['gap_closed']:.3f}")
            lines.append(f"| {term} | {cut} | " + " | ".join(cells) + " |")
    lines += ["", "Seconds per selection (median over the three cuts; whole-corpus greedy for "
              "reference):", "", "| term | rows | greedy | " + " | ".join(MODES) + " |",
              "|---|---:|---:|" + "---:|" * len(MODES)]
    for term, res in r["terms"].items():
        cells = []
        for m in MODES:
            v = [res["cuts"][c][m]["seconds"] for c in CUTS if "seconds" in res["cuts"][c][m]]
            cells.append(f"{float(np.median(v)):.1f}" if v else "n/a")
        lines.append(f"| {term} | {res['n']:,} | {res['greedy_s']:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _recut_sorted(files: list, per: int, dim: int, workdir: str) -> list:
    """The same rows re-cut into files sorted by quality (the best rows in the first file)."""
    out_dir = os.path.join(workdir, "sorted_by_quality")
    os.makedirs(out_dir, exist_ok=True)
    out = [os.path.join(out_dir, f"shard_{i:03d}") for i in range(len(files))]
    if all(os.path.exists(b + ".q.npy") for b in out):
        return out
    q = np.concatenate([np.load(b + ".q.npy") for b in files])
    order = np.argsort(-q, kind="stable")
    xs = [np.memmap(b + ".x.f32", dtype=np.float32, mode="r", shape=(per, dim)) for b in files]
    for i, base in enumerate(out):
        rows = order[i * per:(i + 1) * per]
        x = np.empty((per, dim), dtype=np.float32)
        src, loc = rows // per, rows % per
        for f in range(len(files)):
            m = np.flatnonzero(src == f)
            srt = np.argsort(loc[m])
            x[m[srt]] = xs[f][loc[m][srt]]
        x.tofile(base + ".x.f32")
        np.save(base + ".q.npy", q[rows])
        np.save(base + ".ids.npy", rows)
    return out


def run_scale(rows: int, shards: int, dim: int, term: str, lamb: float, ratio: float,
              seed: int, workdir: str, candidates: int, max_rounds: int,
              cut: str = "random_blocks", mode: str = "exchange") -> dict:
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.corpus import CorpusBudget, CorpusShard, select_corpus
    from datamask_pipeline.engine.sample import make_table

    per = rows // shards
    os.makedirs(workdir, exist_ok=True)
    t0 = time.perf_counter()
    files = []
    for i in range(shards):
        base = os.path.join(workdir, f"shard_{i:03d}")
        if not os.path.exists(base + ".q.npy"):
            t = make_table(per, dim=dim, seed=seed, id_offset=i * per, row_seed=i)
            x = np.asarray(t.column("feature_arr").combine_chunks().flatten()
                           .to_numpy()).reshape(per, dim).astype(np.float32)
            x.tofile(base + ".x.f32")
            np.save(base + ".q.npy", t.column("quality_score").to_numpy())
            del t, x
        files.append(base)
    gen_s = time.perf_counter() - t0
    print(f"generated {shards} x {per:,} rows x {dim} in {gen_s:.0f}s", flush=True)
    if cut == "sorted_by_quality":
        files = _recut_sorted(files, per, dim, workdir)

    def load(base, i):
        x = np.fromfile(base + ".x.f32", dtype=np.float32).reshape(per, dim)
        ids = (np.load(base + ".ids.npy") if os.path.exists(base + ".ids.npy")
               else np.arange(i * per, (i + 1) * per))
        return Part(x, np.load(base + ".q.npy"), ids)

    marks = []

    def log(msg):
        marks.append((time.perf_counter(), _peak_rss(), msg))
        print(msg, flush=True)

    cs = [CorpusShard(key=f"shard_{i:03d}", n=per, load=lambda b=b, i=i: load(b, i))
          for i, b in enumerate(files)]
    cfg = LearnerConfig.profile("pipeline", algorithm=term, lamb=lamb)
    t0 = time.perf_counter()
    sel = select_corpus(cs, cfg, CorpusBudget("fraction", ratio), mode=mode,
                        gather_max_rows=0, candidates=candidates, max_rounds=max_rounds,
                        workdir=workdir, log=log)
    wall = time.perf_counter() - t0
    first_round = next((m for m in marks if "exchange round" in m[2]), None)
    rss_shards = max((m[1] for m in marks if first_round is None or m[0] < first_round[0]),
                     default=_peak_rss())
    rounds = sel.rounds
    return {
        "cut": cut, "mode": mode,
        "rows": per * shards, "shards": shards, "dim": dim, "term": term, "lamb": lamb,
        "select_ratio": ratio, "k": sel.k, "wall_s": wall, "generate_s": gen_s,
        "per_shard_phase_s": sel.timings.get("shards_s"),
        "rounds_phase_s": sel.timings.get("rounds_s"),
        "score_s": sel.timings.get("score_s"),
        "extra_s_per_shard": (sel.timings.get("rounds_s", 0.0)) / shards,
        "rounds": len(rounds), "converged": sel.converged,
        "swaps": int(sum(r["swaps"] for r in rounds)),
        "bytes_exchanged": int(sum(r["bytes_exchanged"] for r in rounds)),
        "peak_rss_per_shard_phase_bytes": int(rss_shards),
        "peak_rss_bytes": _peak_rss(),
        "f_per_shard_start": rounds[0]["f_before"] if rounds else None,
        "scores": sel.scores, "scored_by": sel.scored_by, "round_log": rounds,
        "route": sel.route, "cpu": cpu_model(),
    }


def scale_markdown(r: dict) -> str:
    g = 2 ** 30
    sc = r["scores"]
    return "\n".join([
        f"{r['rows']:,} rows in {r['shards']} shards (cut: {r.get('cut', 'random_blocks')}), "
        f"{r['dim']}-d, {r['term']}, λ = {r['lamb']}, "
        f"budget {r['select_ratio']:.0%} (k = {r['k']:,}); {r['cpu']}, one process, 1 torch thread.",
        "",
        "| what | value |", "|---|---:|",
        f"| wall time (selection + rounds + scoring) | {r['wall_s']:.0f} s |",
        f"| per-shard selections (the start; {r['route']}) | {r['per_shard_phase_s']:.0f} s |",
        f"| exchange rounds | {r['rounds_phase_s']:.0f} s in {r['rounds']} rounds "
        f"({'converged' if r['converged'] else 'round cap'}) |",
        f"| extra time per shard | {r['extra_s_per_shard']:.1f} s |",
        f"| swaps / bytes exchanged | {r['swaps']:,} / {r['bytes_exchanged'] / 2**20:.1f} MiB |",
        f"| peak RSS after the per-shard phase / at the end | "
        f"{r['peak_rss_per_shard_phase_bytes'] / g:.2f} / {r['peak_rss_bytes'] / g:.2f} GiB |",
        f"| whole-corpus f: exchange (corpus) | {sc['selection']['f']:.6f} |",
        f"| whole-corpus f: per-shard selection of these files (the start) | "
        f"{r['f_per_shard_start']:.6f} |",
        f"| whole-corpus f: quality top-k / random | {sc['quality_topk']['f']:.6f} / "
        f"{sc['random']['f']:.6f} |",
        "", "Reference: exact greedy is infeasible at this size; the per-shard selection of the "
        "same files, the paper's random blocks (the generated files are i.i.d. random blocks of "
        "one corpus; `--cut sorted_by_quality` re-cuts the same rows) and the corpus's quality "
        "top-k are the references, all scored exactly from the selections' sufficient statistics.",
    ])


def render_markdown(r: dict) -> str:
    """The report of a results file of either kind."""
    return cuts_markdown(r) if "terms" in r else scale_markdown(r)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.corpus", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    rr = sub.add_parser("render", help="rewrite REPORT_<tag>.md from results_<tag>.json")
    rr.add_argument("--tag", required=True)
    rr.add_argument("--out", default="bench/results")
    c = sub.add_parser("cuts")
    c.add_argument("--rows", type=int, default=20000)
    c.add_argument("--dim", type=int, default=384)
    c.add_argument("--disf-rows", type=int, default=5000)
    c.add_argument("--files", type=int, default=8)
    c.add_argument("--terms", default="Pair_simi,Facility,DiSF")
    c.add_argument("--real", action="store_true",
                   help="real documents (man pages in 4 languages, the Python manual and "
                        "docstrings; wordllama embeddings at --dim, heuristic quality) instead "
                        "of generated rows")
    c.add_argument("--block-rows", type=int, default=None,
                   help="facility location's exchange route: rows per block (default: the "
                        "engine's BLOCK_ROWS)")
    s = sub.add_parser("scale")
    s.add_argument("--rows", type=int, default=10_000_000)
    s.add_argument("--shards", type=int, default=10)
    s.add_argument("--dim", type=int, default=256)
    s.add_argument("--term", default="Pair_simi")
    s.add_argument("--workdir", default=None)
    s.add_argument("--candidates", type=int, default=4096)
    s.add_argument("--max-rounds", type=int, default=50)
    s.add_argument("--cut", default="random_blocks", choices=("random_blocks", "sorted_by_quality"))
    for q in (c, s):
        q.add_argument("--lamb", type=float, default=0.5)
        q.add_argument("--select-ratio", type=float, default=0.1)
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--threads", type=int, default=1)
        q.add_argument("--tag", default=None)
        q.add_argument("--out", default="bench/results")
    a = p.parse_args(argv)
    if a.what == "render":
        with open(os.path.join(a.out, f"results_{a.tag}.json")) as fh:
            r = json.load(fh)
        md = render_markdown(r)
        with open(os.path.join(a.out, f"REPORT_{a.tag}.md"), "w") as fh:
            fh.write(f"# {a.tag}\n\nCommand: `{r['command']}`\n\n{md}\n")
        print(md)
        return 0
    import torch

    torch.set_num_threads(a.threads)
    if a.what == "cuts":
        r = run_cuts(a.rows, a.dim, a.disf_rows, a.files, a.lamb, a.select_ratio,
                     a.terms.split(","), a.seed, a.block_rows, a.real)
        md = cuts_markdown(r)
    else:
        r = run_scale(a.rows, a.shards, a.dim, a.term, a.lamb, a.select_ratio, a.seed,
                      a.workdir or tempfile.mkdtemp(prefix="corpus-scale-"), a.candidates,
                      a.max_rounds, cut=a.cut)
        md = scale_markdown(r)
    import sys

    r["command"] = "python -m bench.corpus " + " ".join(sys.argv[1:] if argv is None else argv)
    print(md)
    write_report(a.out, a.tag, r, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
