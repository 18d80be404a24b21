"""Embedding throughput of the default model (issue 13 item 5): documents/s and tokens/s.

    .venv/bin/python -m bench.embed                 # 10^4 documents, 3 rounds: results/results_embed.json, REPORT_embed.md
    .venv/bin/python -m bench.embed --quick --out DIR   # 200 documents, 1 round (tests/bench/test_embed_bench_smoke.py)

The sample is built from the real sentences of ``tests/engine/text_corpus.py`` (cooking,
astronomy, and the Python reference manual that CPython ships): each document takes one topic
and k sentences of it, k log-uniform on [1, ``--max-sentences``], so lengths run from one
sentence to documents longer than the model's 512-token limit. Variants, each in its own
process at one thread, rounds interleaved:

- ``embed_shard``: ``engine.embed.embed_shard`` on the parquet, as the pipeline calls it (chunks
  written under a fresh checkpoint folder, the text rules checked);
- ``embedder``: ``WordLlamaEmbedder.embed`` on the list, in chunks of the shard's chunk size;
- ``reference``: wordllama's own loop, ``WordLlama.load(...).embed(texts)`` as its README shows
  it, loaded offline the way ``engine.embed`` loads it;
- ``tokenize``: the tokenizer step of ``embedder`` alone (what a GPU would not take over).

Peak memory is VmHWM of the variant's process (reset by exec, unlike ``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import cpu_model, loadavg, median, peak_rss_bytes

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("embed_shard", "embedder", "reference", "tokenize")
DESCRIBE = {
    "embed_shard": "engine.embed.embed_shard(parquet, checkpoint dir, 'text', id_column="
                   "'chunk_id'): read, text rules, hash, embed, write .npz chunks",
    "embedder": "WordLlamaEmbedder().embed(texts[i:i + chunk_rows]) over the list",
    "reference": "WordLlama.load(config='l2_supercat', cache_dir=<package>, "
                 "disable_download=True).embed(texts)",
    "tokenize": "the embedder's tokenizer step alone (cut, encode_batch in batches of 64)",
}
# One thread everywhere: numpy's BLAS and the Rust tokenizer's rayon pool.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# ------------------------------------------------------------------ the sample
def make_docs(n: int, max_sentences: int = 32, seed: int = 0) -> list[str]:
    """``n`` documents: a topic each (cooking, astronomy, Python, in turn), then k of its
    sentences drawn with replacement and joined by spaces, k log-uniform on
    [1, ``max_sentences``]."""
    import numpy as np

    sys.path.insert(0, str(REPO / "tests" / "engine"))
    try:
        from text_corpus import ASTRONOMY, COOKING, _sentences, python_sentences
    finally:
        sys.path.pop(0)
    topics = [_sentences(COOKING), _sentences(ASTRONOMY), python_sentences(100_000)]
    rng = np.random.default_rng(seed)
    ks = np.floor(np.exp(rng.uniform(0, np.log(max_sentences + 1), n))).astype(int).clip(1)
    docs = []
    for i, k in enumerate(ks):
        pool = topics[i % 3]
        docs.append(" ".join(pool[j] for j in rng.integers(0, len(pool), k)))
    return docs


def token_counts(docs: list[str]):
    """Tokens per document with the model's own tokenizer (no special tokens, no truncation)."""
    import numpy as np

    from datamask_pipeline.engine.embed import WordLlamaEmbedder

    tok = WordLlamaEmbedder()._tok
    return np.array([len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False)])


def write_sample(work: Path, docs: list[str]) -> dict:
    import pyarrow as pa

    from datamask_pipeline.engine import storage

    work.mkdir(parents=True, exist_ok=True)
    path = work / "text_only.parquet"
    table = pa.table({"chunk_id": pa.array(range(len(docs)), pa.int64()), "text": docs})
    # as engine.sample.generate_corpus writes raw shards
    storage.atomic_write_table(table, str(path), row_group_size=8192, compression="zstd")
    return {"raw": str(path), "work": str(work)}


# ------------------------------------------------------------------ one variant (child side)


def _threads() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("Threads:"))


def _child(variant: str, paths: dict) -> dict:
    """Load the model (timed apart), run the variant once, save its unit vectors."""
    import numpy as np
    import pyarrow.parquet as pq

    from datamask_pipeline.engine import embed

    texts = pq.read_table(paths["raw"], columns=["text"]).column("text").to_pylist()
    t0 = time.perf_counter()
    if variant == "reference":
        from wordllama import WordLlama

        pkg = Path(embed._import_wordllama().__file__).parent
        model = WordLlama.load(config="l2_supercat", cache_dir=pkg, disable_download=True)
    else:
        model = embed.WordLlamaEmbedder()
    load_s = time.perf_counter() - t0
    rss_loaded = peak_rss_bytes()
    extra = {}
    c0, t0 = time.process_time(), time.perf_counter()
    if variant == "embed_shard":
        ckpt = Path(paths["work"]) / "checkpoint"
        shutil.rmtree(ckpt, ignore_errors=True)
        res = embed.embed_shard(paths["raw"], str(ckpt), "text", model, id_column="chunk_id")
        wall = time.perf_counter() - t0
        extra = {"chunks_computed": res.computed, "chunks_reused": res.reused,
                 "tokens_reported": res.tokens, "truncated_rows": res.truncated_rows}
        vectors = res.load()
    elif variant == "embedder":
        step = embed.DEFAULT_CHUNK_ROWS
        vectors = np.concatenate([model.embed(texts[s:s + step])
                                  for s in range(0, len(texts), step)])
        wall = time.perf_counter() - t0
    elif variant == "reference":
        vectors = model.embed(texts)  # (n, 256) float32, not normalised
        wall = time.perf_counter() - t0
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    elif variant == "tokenize":
        cut = model.max_tokens * model._max_token_chars  # as WordLlamaEmbedder.encode cuts
        n = 0
        for s in range(0, len(texts), model.batch_size):
            encs = model._tok.encode_batch([t[:cut] for t in texts[s:s + model.batch_size]],
                                           add_special_tokens=False)
            n += sum(min(len(e.ids), model.max_tokens) for e in encs)
        wall = time.perf_counter() - t0
        extra = {"tokens_kept": n}
        vectors = None
    else:
        raise ValueError(f"unknown variant {variant!r}; known: {VARIANTS}")
    cpu = time.process_time() - c0
    if vectors is not None:
        np.save(Path(paths["work"]) / f"vectors_{variant}.npy", vectors.astype(np.float32))
    return {"variant": variant, "docs": len(texts), "wall_s": wall, "cpu_s": cpu,
            "load_s": load_s, "rss_after_load_bytes": rss_loaded,
            "peak_rss_bytes": peak_rss_bytes(), "threads": _threads(), **extra}


# ------------------------------------------------------------------ the driver (parent side)


def _run_variant(variant: str, paths: dict) -> dict:
    env = {**os.environ, **ONE_THREAD, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "bench.embed", "--child", variant,
                           "--paths", json.dumps(paths)], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"variant {variant} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])




def summarize(runs: dict, doc_tokens: int, embedded_tokens: dict) -> dict:
    """Per variant: median [min, max] wall, documents/s, tokens/s, peak RSS, and the CPU cost
    of 10^9 documents at that rate (one thread)."""
    out = {}
    for v, recs in runs.items():
        walls = [r["wall_s"] for r in recs]
        med, docs = median(walls), recs[0]["docs"]
        out[v] = {
            "what": DESCRIBE[v], "reps": len(recs), "wall_s": walls, "median_s": med,
            "min_s": min(walls), "max_s": max(walls),
            "docs_per_s": docs / med, "docs_per_s_min": docs / max(walls),
            "docs_per_s_max": docs / min(walls),
            "tokens_per_s": doc_tokens / med,
            "embedded_tokens_per_s": embedded_tokens[v] / med,
            "cpu_over_wall": median([r["cpu_s"] / r["wall_s"] for r in recs]),
            "load_s": median([r["load_s"] for r in recs]),
            "peak_rss_mib": max(r["peak_rss_bytes"] for r in recs) / 2**20,
            "rss_after_load_mib": max(r["rss_after_load_bytes"] for r in recs) / 2**20,
            "threads": max(r["threads"] for r in recs),
            "core_hours_per_1e9_docs": 1e9 / (docs / med) / 3600,
        }
    return out


def agreement(work: Path, tokens, max_tokens: int) -> dict:
    """Largest |difference| between the variants' unit vectors: embed_shard vs embedder on
    every document, embedder vs reference on the documents within the model's token limit
    (the reference embeds every token; ours truncates at ``max_tokens``)."""
    import numpy as np

    v = {name: np.load(work / f"vectors_{name}.npy") for name in ("embed_shard", "embedder",
                                                                    "reference")}
    short = tokens <= max_tokens
    return {"shard_vs_embedder_max_abs": float(np.abs(v["embed_shard"] - v["embedder"]).max()),
            "embedder_vs_reference_max_abs_within_limit": float(
                np.abs(v["embedder"][short] - v["reference"][short]).max()),
            "docs_within_limit": int(short.sum())}


def run(docs_n: int, reps: int, max_sentences: int, out: Path, work: Path, command: str,
        warmup: int = 1, log=print) -> dict:
    import numpy as np

    from datamask_pipeline.engine.embed import WORDLLAMA_MAX_TOKENS

    t_start = time.perf_counter()
    docs = make_docs(docs_n, max_sentences)
    tokens = token_counts(docs)
    paths = write_sample(work, docs)
    log(f"{docs_n:,} documents, {int(tokens.sum()):,} tokens, in {paths['raw']}")
    kept = int(np.minimum(tokens, WORDLLAMA_MAX_TOKENS).sum())
    embedded = {"embed_shard": kept, "embedder": kept, "tokenize": kept,
                "reference": int(tokens.sum())}
    runs = {v: [] for v in VARIANTS}
    load_rounds, machine = [], {"cpu_count": os.cpu_count(), "cpu_model": cpu_model(),
                                "python": platform.python_version(), "loadavg_start": loadavg()}
    for rnd in range(1 - warmup, reps + 1):  # rounds < 1: untimed warm-up
        shift = rnd % len(VARIANTS)
        for v in VARIANTS[shift:] + VARIANTS[:shift]:
            rec = _run_variant(v, paths)
            if rnd >= 1:
                runs[v].append(rec)
            log(f"round {rnd}{' (warm-up)' if rnd < 1 else ''} {v}: {rec['wall_s']:.3f} s, "
                f"peak RSS {rec['peak_rss_bytes'] / 2**20:.0f} MiB")
        if rnd >= 1:
            load_rounds.append(loadavg())
    machine["loadavg_end"] = loadavg()
    import pyarrow
    import tokenizers
    import wordllama

    from datamask_pipeline.engine.embed import load_embedder

    model = load_embedder()
    machine.update(numpy=np.__version__, pyarrow=pyarrow.__version__,
                   tokenizers=tokenizers.__version__, wordllama=wordllama.__version__)
    q = np.percentile(tokens, [0, 10, 50, 90, 99, 100]).tolist()
    sample = {
        "docs": docs_n, "max_sentences": max_sentences, "seed": 0,
        "how": "documents from tests/engine/text_corpus.py: topic i % 3 (cooking, astronomy, "
               "Python manual), k sentences of it drawn with replacement and joined by spaces, "
               f"k = floor(exp(U(0, ln({max_sentences + 1})))) (log-uniform on [1, "
               f"{max_sentences}])",
        "tokens": int(tokens.sum()), "tokens_embedded_by_ours": kept,
        "tokens_per_doc": {"mean": float(tokens.mean()),
                           **{f"p{p}": v for p, v in zip((0, 10, 50, 90, 99, 100), q)}},
        "docs_over_limit": int((tokens > WORDLLAMA_MAX_TOKENS).sum()),
        "chars": sum(len(d) for d in docs), "parquet_bytes": os.path.getsize(paths["raw"]),
    }
    variants = summarize(runs, int(tokens.sum()), embedded)
    res = {"schema_version": 1, "command": command,
           "started": _dt.datetime.now().isoformat(timespec="seconds"), "machine": machine,
           "threads": 1, "thread_env": ONE_THREAD, "reps": reps, "warmup_rounds": warmup,
           "model": {"name": model.name, "version": model.version, "dim": model.dim,
                     "max_tokens": model.max_tokens, "pooling": model.pooling},
           "sample": sample, "loadavg_rounds": load_rounds, "runs": runs, "variants": variants,
           "agreement": agreement(work, tokens, WORDLLAMA_MAX_TOKENS),
           "headline": "embed_shard",
           "gpu": {"measured": False, "why": "no accelerator was lent to the session that ran "
                                             "this bench"}}
    t = variants["tokenize"]["median_s"]
    res["gpu"]["tokenize_share_of_embedder"] = t / variants["embedder"]["median_s"]
    res["gpu"]["tokenize_share_of_embed_shard"] = t / variants["embed_shard"]["median_s"]
    res["total_s"] = time.perf_counter() - t_start
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results_embed.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(res, indent=1, allow_nan=False))
    tmp.replace(path)
    (out / "REPORT_embed.md").write_text(render(res))
    log(f"wrote {path} and {out / 'REPORT_embed.md'}")
    return res


# ------------------------------------------------------------------ report
def render(res: dict) -> str:
    m, s, v, g = res["machine"], res["sample"], res["variants"], res["gpu"]
    tq = s["tokens_per_doc"]
    lines = [
        "# Embedding throughput (default model, CPU, one thread)", "",
        f"Command: `{res['command']}` ({res['started']}, {res['total_s']:.0f} s in all).", "",
        f"Machine: {m['cpu_model']}, {m['cpu_count']} cores, shared with other jobs: load "
        f"average {m['loadavg_start']} at the start, {m['loadavg_end']} at the end (per round: "
        f"{res['loadavg_rounds']}). Python {m['python']}, numpy {m['numpy']}, pyarrow "
        f"{m['pyarrow']}, tokenizers {m['tokenizers']}, wordllama {m['wordllama']}. Every "
        f"variant runs in its own process with {', '.join(f'{k}={x}' for k, x in res['thread_env'].items())}; "
        f"{res['reps']} timed rounds after {res['warmup_rounds']} untimed warm-up, the order "
        "rotated each round. Times exclude imports and the model load (shown apart).", "",
        f"Model: `{res['model']['name']}` {res['model']['version']}, {res['model']['dim']}-d, "
        f"pooling `{res['model']['pooling']}` at {res['model']['max_tokens']} tokens.", "",
        f"Sample: {s['docs']:,} documents, {s['tokens']:,} tokens (the model's tokenizer, no "
        f"special tokens), {s['chars']:,} characters, parquet {s['parquet_bytes'] / 2**20:.1f} "
        f"MiB. {s['how']}. Tokens per document: mean {tq['mean']:.0f}, p10 {tq['p10']:.0f}, "
        f"median {tq['p50']:.0f}, p90 {tq['p90']:.0f}, p99 {tq['p99']:.0f}, max {tq['p100']:.0f}; "
        f"{s['docs_over_limit']:,} documents exceed {res['model']['max_tokens']} tokens, so ours "
        f"embeds {s['tokens_embedded_by_ours']:,} tokens and the reference all of them.", "",
        "| variant | what | median s [min–max] | documents/s [min–max] | tokens/s (document "
        "tokens) | embedded tokens/s | CPU/wall | model load s | peak RSS MiB (after load) "
        "| core-hours per 10⁹ documents |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in v.items():
        lines.append(
            f"| `{name}` | {r['what']} | {r['median_s']:.3f} [{r['min_s']:.3f}–{r['max_s']:.3f}] "
            f"| {r['docs_per_s']:,.0f} [{r['docs_per_s_min']:,.0f}–{r['docs_per_s_max']:,.0f}] "
            f"| {r['tokens_per_s']:,.0f} | {r['embedded_tokens_per_s']:,.0f} "
            f"| {r['cpu_over_wall']:.2f} | {r['load_s']:.2f} | {r['peak_rss_mib']:.0f} "
            f"({r['rss_after_load_mib']:.0f}) | {r['core_hours_per_1e9_docs']:,.0f} |")
    a, h = res["agreement"], v[res["headline"]]
    ref, emb = v["reference"], v["embedder"]
    lines += [
        "", "`tokenize` is part of `embedder`, not an alternative to it: it is listed to split the "
        "time. Core-hours per 10⁹ documents = 10⁹ / documents/s / 3600 at one thread, for "
        "documents distributed like this sample; scale by tokens for other corpora.", "",
        "## Reading", "",
        f"- The pipeline's path (`embed_shard`) embeds {h['docs_per_s']:,.0f} documents/s on one "
        f"thread: **{h['core_hours_per_1e9_docs']:,.0f} core-hours per 10⁹ documents** of this "
        f"length mix. Its time over `embedder`'s: {h['median_s'] / emb['median_s']:.2f} (it also "
        "reads the parquet, checks the text rules, hashes the text and writes the chunks).",
        f"- Against wordllama's reference loop: `embedder` / `reference` documents/s = "
        f"{emb['docs_per_s'] / ref['docs_per_s']:.2f}. They do not do the same work on long "
        f"documents: the reference embeds every token, padded to the longest document of each "
        f"batch of 64, ours the first {res['model']['max_tokens']} (the text is cut before "
        "tokenizing). On the documents within the limit the vectors agree: largest |difference| "
        f"{a['embedder_vs_reference_max_abs_within_limit']:.1e} over {a['docs_within_limit']:,} "
        f"documents; `embed_shard` vs `embedder`: {a['shard_vs_embedder_max_abs']:.1e}.",
        f"- CPU/wall {h['cpu_over_wall']:.2f} for `embed_shard`: under 1, the process waited "
        "for a core on this shared machine (see the load average), so the rates are lower "
        "bounds for an unshared core.",
        f"- Memory: peak RSS {h['peak_rss_mib']:.0f} MiB for `embed_shard`, "
        f"{ref['peak_rss_mib']:.0f} MiB for the reference (whose padded (64, longest, 256) "
        "float32 batch grows with the longest document).",
        "",
        "## GPU", "",
        f"Not measured: {g['why']}. WordLlama is a static embedding: a document's vector is the "
        "mean of rows of a 32k × 256 table picked by its token ids. There is no matrix multiply "
        "for a GPU to accelerate; on a GPU the lookup and mean would be one memory-bound gather "
        "(an `embedding_bag`), while the tokenizer (Rust, on the CPU) and reading the text stay "
        f"where they are. Measured here, tokenizing is {g['tokenize_share_of_embedder']:.0%} of "
        f"`embedder`'s time and {g['tokenize_share_of_embed_shard']:.0%} of `embed_shard`'s, so "
        "moving the rest to a GPU could at most speed this path up "
        f"{1 / g['tokenize_share_of_embed_shard']:.2f}× on one CPU thread (Amdahl, with the GPU "
        "part taken as free and the host-to-device copy of the ids ignored). The way to go faster "
        "is more CPU threads or processes (the tokenizer's batch encoding is multi-threaded; "
        "shards are independent). A GPU matters for the transformer models "
        "(`SentenceTransformerEmbedder`), which this bench does not measure.",
    ]
    return "\n".join(lines) + "\n"




def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.embed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=10_000)
    p.add_argument("--max-sentences", type=int, default=32,
                   help="longest document, in sentences (log-uniform from 1)")
    p.add_argument("--reps", type=int, default=3, help="timed interleaved rounds (>= 1)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    p.add_argument("--quick", action="store_true", help="200 documents, 1 round, no warm-up (CI)")
    p.add_argument("--out", default=None, help="default bench/results (bench/results/tmp/embed "
                                               "with --quick)")
    p.add_argument("--work", default=None, help="scratch folder (default "
                                                "bench/results/tmp/embed_work)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--paths", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, json.loads(args.paths))))
        return 0
    if args.quick:
        args.docs, args.reps, args.warmup = 200, 1, 0
    if args.reps < 1 or args.docs < 1 or args.max_sentences < 1:
        p.error("--reps, --docs and --max-sentences must be >= 1")
    tmp = REPO / "bench" / "results" / "tmp"
    out = Path(args.out) if args.out else (tmp / "embed" if args.quick else
                                           REPO / "bench" / "results")
    work = Path(args.work) if args.work else tmp / "embed_work"
    cmd = " ".join([".venv/bin/python -m bench.embed"]
                   + [shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])])
    t0 = time.perf_counter()
    run(args.docs, args.reps, args.max_sentences, out, work, cmd, warmup=args.warmup,
        log=lambda msg: print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
