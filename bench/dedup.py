"""Deduplication across the corpus, measured (``engine/corpus/dedup.py``).

``planted``: real text (CPython's reference manual, ``pydoc_data.topics``, cut into
paragraphs) embedded with the default model, with near-duplicates planted in other files than
their originals (the same text with a footer line added, embedded again): recall (planted
pairs whose copy is dropped as a duplicate of its original) and precision (dropped rows that
are a planted copy, or, for the others, whose duplicate is equal up to case and spaces, a
footer or a cosine >= the threshold: checked independently) per kind::

    python -m bench.dedup planted --pairs 500 --tag dedup_planted

``labelled``: precision and recall per kind on a labelled set (planted copies of four kinds,
template pages that must all stay), our dedup under several settings and datatrove's MinHash::

    python -m bench.dedup labelled --per-kind 100 --per-template 75 --tag dedup_labelled

``centering``: the labelled set cut into more and smaller files, and its copies in a file of
another source, with the semantic stage on what the corpus stage reads (each language's mean
over the whole corpus taken out: the default), on each file read by its own language means
and on the model's vectors::

    python -m bench.dedup centering --files 2,4,8,16,32,64 --tag dedup_centering

``planted`` and ``labelled`` (and ``centering``) embed and read as the pipeline does: each file
through the features step (``assets.ingest.write_features``: the default model and quality
scorer; the features keep the model's vectors and record each language's sums), read back by
the corpus stage's reader (``engine.corpus.shards.open_shards``: each vector less its
language's mean over the whole corpus), :func:`product_features`.

``main_job``: the README's main job (``python -m datamask_pipeline.demo --data-root D
--algorithm Pair_simi``, a subprocess) on the same kind of corpus written as files of only id
and text, by default, with ``--no-dedup`` and file by file (``--per-shard-chain``): rows
selected against the budget, planted pairs with both members selected, selected pairs at
cosine >= 0.95::

    python -m bench.dedup main_job --pairs 500 --tag dedup_main_job

``scale``: time and peak memory of each kind at N rows of the generated sample::

    python -m bench.dedup scale --rows 1000000 --dim 256 --tag dedup_scale

``long_document``: one ~3 MB document among N real ones (man pages' text, cut into documents
of ~0.6-3 kB; the long one made of other man pages) as files of only id and text, through the
README's main job (``python -m datamask_pipeline.demo --data-root D``) under
``/usr/bin/time -v``: the job's peak resident memory and wall time, what the dedup and the
selection did with the long document::

    python -m bench.dedup long_document --rows 20000 --long-mb 3 --tag long_document
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import cpu_model, main_job_on_texts, write_report

FOOTER = "Shared from our weekly newsletter: subscribe for more articles like this one."


def _paragraphs(min_chars: int = 80) -> list:
    from pydoc_data.topics import topics

    out = []
    for doc in topics.values():
        for p in doc.split("\n\n"):
            p = " ".join(p.split())
            if len(p) >= min_chars:
                out.append(p)
    return sorted(set(out))  # the reference manual repeats some paragraphs verbatim


def product_features(texts: list, file_of, workdir: str, geometry: str | None = None) -> dict:
    """The vectors the corpus stage's dedup reads for ``texts``, as the pipeline ingests and
    reads them: each file (``file_of``) a raw shard of only ``id`` and ``text`` under the data
    root ``workdir``, through ``assets.ingest.write_features`` with the default embedder and
    quality scorer (which detects each row's language) and the contract's
    ``embedding_language_geometry`` (``geometry``; None: the default, ``center``: the features
    keep the model's vectors and record each language's sums in their footer), then read back
    by the corpus stage's own reader (``engine.corpus.shards.open_shards``: each shard's loader
    centers by the corpus's language means, the sum of the footers). Returns ``vectors`` (what
    the dedup reads: (n, d) float32 in the order of ``texts``), ``per_file`` (each file read
    by its own means, as a shard's steps read it: ``read_shard`` without corpus sums),
    ``model`` (the model's vectors, as the features store them), ``languages`` (each row's
    detected language), ``centered`` (whether every footer records language sums) and
    ``seconds`` (embedding and scoring)."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from assets.ingest import write_features
    from datamask_pipeline.engine.contract import EMBEDDING
    from datamask_pipeline.engine.corpus.shards import features_loader, open_shards
    from datamask_pipeline.engine.data import Columns
    from datamask_pipeline.engine.embed import load_embedder, read_language_sums
    from datamask_pipeline.engine.quality import load_scorer
    from datamask_pipeline.engine.storage import DataLayout

    shutil.rmtree(workdir, ignore_errors=True)
    layout = DataLayout(workdir)
    os.makedirs(layout.raw_root)
    os.makedirs(os.path.dirname(layout.features("part_0")))
    n, file_of = len(texts), np.asarray(file_of)
    embedder, scorer = load_embedder(), load_scorer()
    keys = {int(f): f"part_{f}" for f in np.unique(file_of)}
    languages = np.empty(n, dtype=object)
    model = None
    t0 = time.perf_counter()
    for f, key in keys.items():
        m = np.flatnonzero(file_of == f)
        pq.write_table(pa.table({"id": [f"doc{i:06d}" for i in m],
                                 "text": [texts[i] for i in m]}), layout.raw_shard(key))
        write_features(layout.raw_shard(key), layout.features(key), Columns(id="id"),
                       embedder=embedder, scorer=scorer,
                       checkpoint_dir=os.path.join(workdir, f"emb_{f}"),
                       quality_checkpoint_dir=os.path.join(workdir, f"q_{f}"),
                       language_geometry=geometry)
        t = pq.read_table(layout.features(key), columns=["id", EMBEDDING, "language"])
        if t.num_rows != m.size:
            raise RuntimeError(f"file {f}: {t.num_rows} features rows for {m.size} texts")
        at = np.array([int(s[3:]) for s in t.column("id").to_pylist()])
        v = np.asarray(t.column(EMBEDDING).combine_chunks().flatten(),
                       dtype=np.float32).reshape(t.num_rows, -1)
        if model is None:
            model = np.zeros((n, v.shape[1]), np.float32)
        model[at] = v
        languages[at] = t.column("language").to_pylist()
    seconds = time.perf_counter() - t0

    def place(shards) -> np.ndarray:
        out = np.full(model.shape, np.nan, np.float32)
        for s in shards:
            out[[int(str(i)[3:]) for i in s.ids]] = s.embeddings
        if np.isnan(out).any():
            raise RuntimeError("a row the features hold was not read back")
        return out

    # the corpus stage's reader (assets.corpus.corpus_shards -> open_shards): the dedup's input
    opened = open_shards(layout, list(keys.values()))
    vectors = place(opened[k].load() for k in keys.values())
    per_file = place(features_loader(layout.features(k))() for k in keys.values())
    centered = all(read_language_sums(layout.features(k)) is not None for k in keys.values())
    return {"vectors": vectors, "per_file": per_file, "model": model, "languages": languages,
            "centered": centered, "seconds": seconds}


def _planted_texts(rng, pairs: int, footers: str = "same") -> tuple:
    """(paragraphs, the planted ones' indices, paragraphs + their planted copies)."""
    base = _paragraphs()
    src = rng.choice(len(base), size=pairs, replace=False)
    if footers == "same":
        texts = base + [base[i] + "\n" + FOOTER for i in src]
    else:  # every copy its own footer line: no line is common to many texts
        words = sorted({w for p in base[:200] for w in p.lower().split() if w.isalpha()})
        texts = base + [base[i] + "\n" + " ".join(rng.choice(words, 12)) for i in src]
    return base, src, texts


def run_planted(pairs: int, files: int, threshold: float, containment: float, seed: int,
                footers: str = "same", workdir: str = "/tmp/dedup_planted") -> dict:
    """Recall and precision on planted copies (the module docstring), on the vectors the
    corpus stage reads from the features of each file (:func:`product_features`)."""
    from datamask_pipeline.engine.corpus.dedup import deduplicate

    rng = np.random.default_rng(seed)
    base, src, texts = _planted_texts(rng, pairs, footers)
    n0, n = len(base), len(base) + pairs
    q = rng.random(n)
    q[n0:] = q[src] - 1e-3  # the copy is a little worse: the original is the one to keep
    file_of = rng.integers(0, files, size=n)
    file_of[n0:] = (file_of[src] + 1 + rng.integers(0, files - 1, size=pairs)) % files
    feats = product_features(texts, file_of, os.path.join(workdir, "features"))
    x, embed_s = feats["vectors"], feats["seconds"]
    order = np.lexsort((np.arange(n), file_of))
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n)
    row_of = np.empty(n, dtype=np.int64)
    for f in range(files):
        m = order[file_of[order] == f]
        row_of[m] = np.arange(m.size)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos_planted = (xn[n0:] * xn[src]).sum(1)
    out = {"rows": n, "pairs": pairs, "files": files, "threshold": threshold, "footers": footers,
           "containment": containment, "embed_s": embed_s,
           "geometry": "center" if feats["centered"] else "off",
           "centered_by": "corpus" if feats["centered"] else None,
           "planted_cosine": {"min": float(cos_planted.min()),
                              "median": float(np.median(cos_planted)),
                              "share_ge_threshold": float((cos_planted >= threshold).mean())},
           "modes": {}}
    where = {(int(file_of[i]), int(row_of[i])): i for i in range(n)}
    for name, kw in (("exact+fuzzy+near (default)", {}), ("near only", {"exact": False, "fuzzy": False}),
                     ("exact+fuzzy only", {"near": False})):
        t0 = time.perf_counter()
        res = deduplicate(x[order], q[order], np.arange(n)[order], file_of[order], row_of[order],
                          np.asarray(texts, dtype=object)[order], threshold=threshold,
                          containment=containment, **kw)
        secs = time.perf_counter() - t0
        dropped = {where[(d["shard"], d["row"])]: where[(d["dup_of_shard"], d["dup_of_row"])]
                   for d in res.dropped}
        found = sum(1 for j, i in enumerate(src) if dropped.get(n0 + j) is not None
                    and _same_group(dropped, n0 + j, int(i)))
        other = [i for i in dropped if i < n0]
        ok_other = sum(1 for i in other if _justified(texts, xn, i, dropped[i], threshold))
        both_kept = sum(1 for j, i in enumerate(src) if n0 + j not in dropped and int(i) not in dropped)
        out["modes"][name] = {
            "seconds": secs, "dropped": len(dropped), "planted_found": found,
            "recall": found / pairs, "planted_pairs_both_kept": both_kept,
            "other_dropped": len(other), "other_justified": ok_other,
            "precision": (found + ok_other) / max(1, len(dropped)), "stats": res.stats}
        print(f"{name:28s} recall {found / pairs:.3f}, both kept {both_kept}, dropped {len(dropped)} "
              f"({len(other)} not planted, {ok_other} of them justified) in {secs:.1f}s", flush=True)
    return out


MAIN_JOB_VARIANTS = (("main job (default)", []), ("main job --no-dedup", ["--no-dedup"]),
                     ("per file (--per-shard-chain)", ["--per-shard-chain"]))


def run_main_job(pairs: int, files: int, seed: int, workdir: str, algorithm: str = "Pair_simi",
                 near_cosine: float = 0.95, variants=MAIN_JOB_VARIANTS) -> dict:
    """The README's main job on files of only ``id`` and ``text`` (real paragraphs with planted
    copies in other files): ``python -m datamask_pipeline.demo --data-root D --algorithm A``
    as a subprocess, per variant on its own data root and Dagster instance; then, from the
    files it wrote under ``selected/`` (``selected_per_shard/`` for the per-file chain): rows
    selected against the budget (10 % of the input rows), planted pairs with both members
    selected, and pairs of selected rows at cosine >= ``near_cosine`` (the default model's
    embeddings, computed here)."""
    import os

    from datamask_pipeline.engine.embed import load_embedder

    rng = np.random.default_rng(seed)
    base, src, texts = _planted_texts(rng, pairs)
    n0, n = len(base), len(base) + pairs
    file_of = rng.integers(0, files, size=n)
    file_of[n0:] = (file_of[src] + 1 + rng.integers(0, files - 1, size=pairs)) % files
    ids = np.array([f"doc{i:06d}" for i in range(n)])
    xn = load_embedder().embed(texts)
    xn = xn / np.linalg.norm(xn, axis=1, keepdims=True)
    out = {"rows": n, "paragraphs": n0, "pairs": pairs, "files": files, "algorithm": algorithm,
           "near_cosine": near_cosine, "budget_rows": int(round(0.1 * n)),
           "cpu": cpu_model(), "variants": {}}
    for name, extra in variants:
        root = os.path.join(workdir, name.split(" (")[0].replace(" ", "_").replace("-", ""))
        rows, secs = main_job_on_texts(root, ids, texts, file_of, ["--algorithm", algorithm, *extra])
        chosen = set(rows.tolist())
        both = sum(1 for j, i in enumerate(src) if n0 + j in chosen and int(i) in chosen)
        c = xn[rows] @ xn[rows].T
        near = int((np.triu(c, 1) >= near_cosine).sum())
        out["variants"][name] = {
            "command": "python -m datamask_pipeline.demo --data-root D --algorithm "
                       + " ".join([algorithm, *extra]),
            "seconds": secs, "selected": int(rows.size), "distinct": len(chosen),
            "planted_pairs_both_selected": both, "near_pairs": near}
        print(f"{name:32s} {rows.size} selected ({len(chosen)} distinct; budget "
              f"{out['budget_rows']}), planted pairs both selected {both}, pairs at cosine >= "
              f"{near_cosine} {near}, {secs:.0f}s", flush=True)
    return out


def main_job_markdown(r: dict) -> str:
    lines = [f"{r['paragraphs']:,} paragraphs of CPython's reference manual and {r['pairs']} "
             f"planted copies (a paragraph with a footer line added, in another file than the "
             f"original): {r['rows']:,} rows in {r['files']} files of only `id` and `text`, "
             "through the README's main job with "
             f"`--algorithm {r['algorithm']}` (quality scored from the text, embeddings computed, "
             f"the budget 10 % of the input rows: {r['budget_rows']}). Near pairs: pairs of "
             f"selected rows at cosine >= {r['near_cosine']} (the default model's embeddings).",
             "", "| run | selected | planted pairs both selected | near pairs | seconds |",
             "|---|---:|---:|---:|---:|"]
    for name, v in r["variants"].items():
        lines.append(f"| {name}: `{v['command']}` | {v['selected']:,} | "
                     f"{v['planted_pairs_both_selected']} | {v['near_pairs']} | {v['seconds']:.0f} |")
    return "\n".join(lines)


def _same_group(dropped: dict, a: int, b: int) -> bool:
    """a is dropped as a duplicate of b, directly or through a chain of duplicates."""
    seen = set()
    while a in dropped and a not in seen:
        seen.add(a)
        a = dropped[a]
        if a == b:
            return True
    return False


def _justified(texts, xn, a: int, b: int, threshold: float) -> bool:
    from datamask_pipeline.engine.corpus.dedup import _shingles, normalised_text_keys

    ka, kb = normalised_text_keys([texts[a], texts[b]])
    if ka == kb or float(xn[a] @ xn[b]) >= threshold - 1e-6:
        return True
    sa, sb = _shingles(ka), _shingles(kb)
    return bool(sa and sb and len(sa & sb) / min(len(sa), len(sb)) >= 0.8)


def run_scale(rows: int, dim: int, seed: int) -> dict:
    from datamask_pipeline.engine.corpus.dedup import deduplicate
    from datamask_pipeline.engine.sample import make_table

    t0 = time.perf_counter()
    t = make_table(rows, dim=dim, seed=seed)
    x = np.asarray(t.column("feature_arr").combine_chunks().flatten().to_numpy()).reshape(rows, dim)
    q = t.column("quality_score").to_numpy()
    texts = t.column("text").combine_chunks()
    gen_s = time.perf_counter() - t0
    out = {"rows": rows, "dim": dim, "generate_s": gen_s, "cpu": cpu_model(), "kinds": {}}
    for name, kw in (("exact", {"fuzzy": False, "near": False}),
                     ("fuzzy", {"exact": False, "near": False}),
                     ("near", {"exact": False, "fuzzy": False})):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        res = deduplicate(x, q, np.arange(rows), np.zeros(rows, dtype=np.int64),
                          np.arange(rows), texts, **kw)
        secs = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["kinds"][name] = {"seconds": secs, "dropped": len(res.dropped),
                              "peak_rss_bytes": peak * 1024, "peak_rss_before_bytes": before * 1024,
                              "clusters": res.stats.get("clusters")}
        print(f"{name}: {secs:.1f}s, {len(res.dropped):,} dropped, peak RSS {peak / 2**20:.2f} GiB",
              flush=True)
    return out


_ROFF_TEXT = {"SH", "SS", "B", "I", "BI", "BR", "IR", "RB", "RI", "IB", "SM", "TP", "IP"}
_ROFF_BREAK = {"SH", "SS", "PP", "LP", "P", "TP", "IP", "sp", "HP"}


def _roff_paragraphs(src: str) -> list:
    """The paragraphs of one man page's roff source as plain text: requests dropped (the text
    arguments of font and heading macros kept), escapes removed, paragraph macros as breaks."""
    paras, cur = [], []
    for line in src.splitlines():
        if line.startswith((".", "'")):
            name, _, rest = line[1:].strip().partition(" ")
            if name in _ROFF_BREAK and cur:
                paras.append(" ".join(cur))
                cur = []
            if name not in _ROFF_TEXT or not rest.strip():
                continue
            line = rest.replace('"', "")
        line = re.sub(r"\\f(\[[^\]]*\]|\(..|.)|\\s[-+]?\d+|\\[&c%]", "", line)
        line = re.sub(r"\\\(..|\\\*\(..|\\\*.", " ", line).replace("\\-", "-")
        line = re.sub(r"\\.", "", line).strip()
        if line:
            cur.append(line)
    if cur:
        paras.append(" ".join(cur))
    return [p for p in paras if len(p) >= 40]


def man_documents(n: int, long_bytes: int, seed: int = 0, min_chars: int = 600,
                  max_chars: int = 3000):
    """(``n`` documents, one of ~``long_bytes``): the English man pages under /usr/share/man in
    a seeded random order, each page's paragraphs grouped into documents of ``min_chars`` to
    ``max_chars``; the long document joins the pages after those (its text is in no other
    document). Raises when the machine has too few man pages."""
    files = sorted(p for p in Path("/usr/share/man").glob("man[1-8]/*.gz") if p.is_file())
    files = [files[i] for i in np.random.default_rng(seed).permutation(len(files))]
    docs, long_parts, size = [], [], 0
    for f in files:
        try:
            paras = _roff_paragraphs(gzip.open(f, "rt", errors="replace").read())
        except (OSError, EOFError):
            continue
        if len(docs) < n:
            cur = []
            for p in paras:
                cur.append(p)
                if sum(map(len, cur)) >= min_chars:
                    docs.append("\n".join(cur)[:max_chars])
                    cur = []
            docs = docs[:n]
        elif size < long_bytes:
            long_parts += paras
            size += sum(len(p) + 1 for p in paras)
        else:
            break
    if len(docs) < n or size < long_bytes:
        raise RuntimeError(f"{len(files)} man pages give {len(docs)} documents of {n} and "
                           f"{size:,} bytes of the long one's {long_bytes:,}")
    return docs, "\n".join(long_parts)[:long_bytes]


def run_long_document(rows: int, long_mb: float, files: int, seed: int, workdir: str) -> dict:
    """The main job on ``rows`` man-page documents and one of ``long_mb`` MB (8 id+text files)
    under ``/usr/bin/time -v``: its peak RSS, wall time, rows selected, the long document's
    fate (dropped by the dedup? selected?)."""
    import json
    import shutil
    import subprocess

    import pyarrow as pa
    import pyarrow.parquet as pq

    docs, long_doc = man_documents(rows, int(long_mb * 1e6), seed)
    texts = docs + [long_doc]
    ids = np.array([f"doc{i:06d}" for i in range(len(texts))])
    file_of = np.random.default_rng(seed).integers(0, files, len(texts))
    raw = os.path.join(workdir, "raw")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(raw)
    for f in range(files):
        m = np.flatnonzero(file_of == f)
        pq.write_table(pa.table({"id": ids[m], "text": [texts[i] for i in m]}),
                       os.path.join(raw, f"part_{f}.parquet"))
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "datamask_pipeline.demo",
           "--data-root", workdir]
    env = {**os.environ, "DAGSTER_HOME": os.path.join(workdir, ".dagster_home")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    sel = set()
    for fn in sorted(os.listdir(os.path.join(workdir, "selected"))):
        sel.update(pq.read_table(os.path.join(workdir, "selected", fn), columns=["id"])
                   .column("id").to_pylist())
    dup = pq.read_table(os.path.join(workdir, "corpus", "duplicates.parquet")).to_pylist()
    dedup = json.load(open(os.path.join(workdir, "corpus", "dedup.json")))
    long_id = str(ids[-1])
    return {"rows": len(texts), "files": files, "long_bytes": len(long_doc.encode()),
            "text_bytes": int(sum(len(t.encode()) for t in texts)),
            "max_rss_bytes": rss * 1024, "wall_s": secs, "selected": len(sel),
            "long_selected": long_id in sel,
            "long_dropped": [d for d in dup if d.get("id") == long_id],
            "dropped": len(dup), "dedup_stats": {k: v for k, v in dedup.items()
                                                 if isinstance(v, (int, float, str))},
            "cpu": cpu_model(), "job_command": " ".join(cmd[2:4] + cmd[4:]).replace(
                sys.executable, "python")}


def long_document_markdown(r: dict) -> str:
    st = r["dedup_stats"]
    return "\n".join([
        f"{r['rows'] - 1:,} documents of man-page text (~0.6-3 kB each) and one of "
        f"{r['long_bytes'] / 1e6:.1f} MB (other man pages), {r['text_bytes'] / 1e6:.0f} MB of "
        f"text in {r['files']} files of only `id` and `text`, through the README's main job "
        f"(`{r['job_command']}`, defaults: quality from the text, embeddings computed, "
        f"deduplicated, budget 10 %) on {r['cpu']}.", "",
        "| peak RSS (`/usr/bin/time -v`) | wall | selected | long document | dropped by dedup "
        "(exact / fuzzy / near) | largest cluster |", "|---:|---:|---:|---|---:|---:|",
        f"| {r['max_rss_bytes'] / 2**30:.2f} GiB | {r['wall_s']:.0f} s | {r['selected']:,} | "
        f"{'selected' if r['long_selected'] else 'dropped (duplicate)' if r['long_dropped'] else 'not selected'} | "
        f"{r['dropped']:,} ({st.get('exact_dropped', 0):,} / {st.get('fuzzy_dropped', 0):,} / "
        f"{st.get('near_dropped', 0):,}) | {st.get('largest_cluster', 'n/a')} |"])


def planted_markdown(r: dict) -> str:
    pc = r["planted_cosine"]
    foot = ("the same footer line" if r.get("footers", "same") == "same"
            else "a footer line of its own (12 random words)")
    lines = [f"{r['rows'] - r['pairs']:,} paragraphs of CPython's reference manual and "
             f"{r['pairs']} planted copies ({r['rows']:,} rows; a copy is a paragraph again with "
             f"{foot}, in another of {r['files']} files), embedded with the "
             + ("default model and centered by each language's mean over the whole corpus, as "
                "the corpus stage reads the features (the default): "
                if r.get("centered_by") == "corpus" else
                "default model and centered by language in each file (the features step's "
                "default): " if r.get("geometry") == "center" else "default model: ")
             + f"the planted copies' cosine to their originals is {pc['min']:.3f} at "
             f"least, {pc['median']:.3f} in the median; {pc['share_ge_threshold']:.0%} reach the "
             f"near-duplicate threshold {r['threshold']}.", "",
             "| kinds | recall (planted) | planted pairs both kept | dropped | not planted (justified) | precision | seconds |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, m in r["modes"].items():
        lines.append(f"| {name} | {m['recall']:.3f} | {m['planted_pairs_both_kept']} | {m['dropped']:,} | "
                     f"{m['other_dropped']:,} ({m['other_justified']:,}) | {m['precision']:.3f} | "
                     f"{m['seconds']:.1f} |")
    return "\n".join(lines)


def scale_markdown(r: dict) -> str:
    g = 2 ** 30
    lines = [f"{r['rows']:,} generated rows, {r['dim']}-d, one process, {r['cpu']}. Peak RSS is "
             "the process's, the generated corpus in memory included (each kind stayed under it).",
             "", "| kind | seconds | rows dropped | peak RSS |", "|---|---:|---:|---:|"]
    for name, k in r["kinds"].items():
        lines.append(f"| {name} | {k['seconds']:.0f} | {k['dropped']:,} | {k['peak_rss_bytes'] / g:.2f} GiB |")
    return "\n".join(lines)


# ------------------------------------------------------------------ the labelled set
# template pages: real pages share long boilerplate (a site's navigation and license, a man
# page's section skeleton) around their own content. Pages built on one template with
# different content are near-misses: a dedup must keep every one of them
WEB_HEAD = ["Python 3.13 documentation", "Home | Library Reference | Language Reference | "
            "Tutorial | FAQ | Glossary | Search", "Previous topic | Next topic | This page | "
            "Report a bug | Show source", "Navigation: index, modules, next, previous"]
WEB_FOOT = ["© Copyright 2001-2024, Python Software Foundation.",
            "This page is licensed under the Python Software Foundation License Version 2.",
            "Examples, recipes, and other code in the documentation are additionally licensed "
            "under the Zero Clause BSD License.",
            "See History and License for more information.",
            "The Python Software Foundation is a non-profit corporation. Please donate.",
            "Found a bug? Created using Sphinx 8.1.3."]
MAN_COPYRIGHT = ("Copyright © 2024 Free Software Foundation, Inc. License GPLv3+: GNU GPL "
                 "version 3 or later <https://gnu.org/licenses/gpl.html>. This is free "
                 "software: you are free to change and redistribute it. There is NO WARRANTY, "
                 "to the extent permitted by law.")
MAN_SEE_ALSO = ("Full documentation <https://www.gnu.org/software/coreutils/> or available "
                "locally via: info '(coreutils) invocation'. The full documentation is "
                "maintained as a Texinfo manual; if the info and program are properly "
                "installed at your site, the command info coreutils should give you access to "
                "the complete manual.")
TEMPLATES = ("web", "man", "web_dated", "stub")


def _template_page(kind: str, content: str, i: int, rng) -> str:
    """One page of template ``kind`` around its own ``content``: ``web`` (navigation and a
    license block), ``man`` (a man page's sections and its copyright and see-also
    paragraphs), ``web_dated`` (``web`` with a header line of its own: title and date, so no
    line of it is common), ``stub`` (``web`` around one short line of its own)."""
    words = content.split()
    if kind == "man":
        name = f"cmd{i}"
        return "\n".join(["NAME", f"{name} - {' '.join(words[:6])}", "SYNOPSIS",
                          f"{name} [OPTION]... [FILE]...", "DESCRIPTION", content, "AUTHOR",
                          "Written by the project's contributors.", "REPORTING BUGS",
                          "GNU coreutils online help: <https://www.gnu.org/software/coreutils/>",
                          "COPYRIGHT", MAN_COPYRIGHT, "SEE ALSO", MAN_SEE_ALSO])
    head = list(WEB_HEAD)
    if kind == "web_dated":
        head[0] = (f"{' '.join(words[:4])} | Python 3.13 documentation, updated "
                   f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}")
    if kind == "stub":
        content = " ".join(words[:8])
    return "\n".join(head + [content] + WEB_FOOT)


def _swap(text: str, rng, share: float) -> str:
    """``text`` with ``share`` of its words swapped with their right neighbour (at least one
    swap): the same words, reordered, so its word 3-grams break while a bag-of-words
    embedding does not move."""
    w = text.split()
    for j in rng.choice(len(w) - 1, size=max(1, int(round(share * len(w)))), replace=False):
        w[j], w[j + 1] = w[j + 1], w[j]
    return " ".join(w)


def _distinct_paragraphs(paras: list, at: float = 0.5) -> list:
    """``paras`` less every paragraph whose word 3-grams are contained in an earlier kept
    one's at >= ``at`` (or the other way round), checked pair by pair over the paragraphs
    that share a 3-gram: the manual's own near-duplicates (``Changed in version ...``
    paragraphs) would otherwise count as wrong drops."""
    from datamask_pipeline.engine.corpus.dedup import _shingles, normalised_text_keys

    sh = [_shingles(k) for k in normalised_text_keys(paras)]
    index, kept = {}, []
    for i, s in enumerate(sh):
        if not s:
            continue
        cand = {j for g in s for j in index.get(g, ())}
        if any(len(s & sh[j]) / min(len(s), len(sh[j])) >= at for j in cand):
            continue
        kept.append(i)
        for g in s:
            index.setdefault(g, []).append(i)
    return [paras[i] for i in kept]


def _edit(text: str, rng, share: float, vocab: list) -> str:
    """``text`` with ``share`` of its words replaced by other words of the manual (at least
    one), at random places."""
    w = text.split()
    k = max(1, int(round(share * len(w))))
    for j in rng.choice(len(w), size=min(k, len(w)), replace=False):
        w[j] = vocab[rng.integers(len(vocab))]
    return " ".join(w)


PLANTED_KINDS = ("exact", "footer", "fuzzy", "near")


def labelled_set(per_kind: int, per_template: int, seed: int) -> dict:
    """Real paragraphs (CPython's reference manual) with planted copies of each kind and
    template pages. ``texts``; ``group``: each row's label (``base``, ``original``,
    ``copy:<kind>``, ``template:<kind>``); ``pairs``: (copy row, original row, kind).
    Copies: exact (other case and spaces), footer (the same footer line added to every
    copy), fuzzy (3 % of the words replaced, at least one), near (12 % of the words swapped
    with their neighbour: the same words reordered, which 3-gram containment at 0.8 misses).
    Template pages: each paragraph used once, in no other row. The paragraphs are the
    manual's distinct ones (:func:`_distinct_paragraphs`)."""
    rng = np.random.default_rng(seed)
    paras = _distinct_paragraphs(_paragraphs())
    vocab = sorted({w for p in paras for w in p.split() if w.isalpha()})
    order = rng.permutation(len(paras))
    n_orig, n_tmpl = per_kind * len(PLANTED_KINDS), per_template * len(TEMPLATES)
    # the planted originals are long enough for 3-grams at 5 % edits; template content any
    long_ = [i for i in order if len(paras[i].split()) >= 25]
    orig = long_[:n_orig]
    rest = [i for i in order if i not in set(orig)]
    tmpl_src, base_src = rest[:n_tmpl], rest[n_tmpl:]
    texts, group = [], []
    for i in base_src:
        texts.append(paras[i])
        group.append("base")
    pos_orig = {}
    for i in orig:
        pos_orig[i] = len(texts)
        texts.append(paras[i])
        group.append("original")
    for t, kind in enumerate(TEMPLATES):
        for j, i in enumerate(tmpl_src[t * per_template:(t + 1) * per_template]):
            texts.append(_template_page(kind, paras[i], t * per_template + j, rng))
            group.append(f"template:{kind}")
    pairs = []
    for k, kind in enumerate(PLANTED_KINDS):
        for i in orig[k * per_kind:(k + 1) * per_kind]:
            p = paras[i]
            if kind == "exact":
                c = "  " + p.upper().replace(" ", "  ") + " "
            elif kind == "footer":
                c = p + "\n" + FOOTER
            elif kind == "fuzzy":
                c = _edit(p, rng, 0.03, vocab)
            else:
                c = _swap(p, rng, 0.12)
            pairs.append((len(texts), pos_orig[i], kind))
            texts.append(c)
            group.append(f"copy:{kind}")
    return {"texts": texts, "group": group, "pairs": pairs}


def _score(dropped: set, pairs: list, group: list) -> dict:
    """Recall per planted kind (pairs with exactly one member dropped), precision (dropped
    rows that are a member of a planted pair whose other member stays) and the drops of rows
    of no planted pair, per group: the same rule for every dedup, whichever member it keeps."""
    member = {}
    for c, o, kind in pairs:
        member[c], member[o] = (o, kind), (c, kind)
    rec = {}
    for kind in PLANTED_KINDS:
        ps = [(c, o) for c, o, k in pairs if k == kind]
        rec[kind] = sum((c in dropped) != (o in dropped) for c, o in ps) / max(1, len(ps))
    allp = len(pairs)
    found = sum((c in dropped) != (o in dropped) for c, o, _ in pairs)
    right = sum(1 for r in dropped if r in member and member[r][0] not in dropped)
    wrong = {}
    for r in dropped:
        if r not in member or member[r][0] in dropped:
            g = group[r].split(":")[0] + (":" + group[r].split(":")[1] if ":" in group[r] else "")
            wrong[g] = wrong.get(g, 0) + 1
    return {"recall": rec, "recall_all": found / max(1, allp),
            "precision": right / max(1, len(dropped)), "dropped": len(dropped),
            "wrong_drops": wrong,
            "template_pages_dropped": sum(v for g, v in wrong.items() if g.startswith("template"))}


def run_datatrove(texts: list, workdir: str) -> tuple:
    """datatrove's MinHash deduplication (its defaults: 5-gram shingles, 14 buckets of 8
    hashes) on ``texts``: signature, buckets, clusters and filter steps run in this process.
    Returns (the dropped rows, seconds)."""
    import shutil

    from datatrove.data import Document
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets,
                                                  MinhashDedupCluster, MinhashDedupFilter,
                                                  MinhashDedupSignature)

    def drain(r):
        if r is not None:
            for _ in r:
                pass

    shutil.rmtree(workdir, ignore_errors=True)
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    cfg = MinhashConfig()
    t0 = time.perf_counter()
    drain(MinhashDedupSignature(f"{workdir}/sig", config=cfg).run(iter(docs), 0, 1))
    for b in range(cfg.num_buckets):
        drain(MinhashDedupBuckets(f"{workdir}/sig", f"{workdir}/buckets", config=cfg)
              .run(None, b, cfg.num_buckets))
    drain(MinhashDedupCluster(f"{workdir}/buckets", f"{workdir}/clusters", config=cfg)
          .run(None, 0, 1))
    kept = {int(d.id) for d in MinhashDedupFilter(f"{workdir}/clusters").run(iter(docs), 0, 1)}
    secs = time.perf_counter() - t0
    return set(range(len(texts))) - kept, secs


LABELLED_SETTINGS = (
    # (name, deduplicate keyword arguments)
    ("ours (defaults)", {}),
    ("ours, no text guard on the semantic stage", {"near_containment": 0.0}),
    ("ours, no text guard, threshold 0.98 (the old defaults)", {"near_containment": 0.0,
                                                                 "threshold": 0.98}),
    ("ours, fuzzy stage only on texts of >= 8 3-grams", {"fuzzy_min_shingles": 8}),
    ("ours, common lines kept (no boilerplate rule)", {"boilerplate_min_docs": None}),
    ("ours, exact+fuzzy only", {"near": False}),
    # each file read by its own language means (what a shard's steps read; what the dedup
    # read before the corpus stage centered by the corpus's means)
    ("ours (defaults), each file's own language means", {"vectors": "per_file"}),
    # the vectors before any centering (embedding_language_geometry off)
    ("ours (defaults), the model's vectors (geometry off)", {"vectors": "model"}),
    ("ours, no text guard, the model's vectors (geometry off)", {"vectors": "model",
                                                                  "near_containment": 0.0}),
)


def _labelled_layout(per_kind: int, per_template: int, files: int, seed: int) -> dict:
    """:func:`labelled_set` laid out as the labelled measures read it: qualities drawn at
    random with each copy a little worse than its original (``q``), each row's file
    (``file_of``: a copy in another file than its original) and row in it (``row_of``)."""
    ls = labelled_set(per_kind, per_template, seed)
    n, pairs = len(ls["texts"]), ls["pairs"]
    rng = np.random.default_rng(seed)
    q = rng.random(n)
    for c, o, _ in pairs:
        q[c] = q[o] - 1e-3
    file_of = rng.integers(0, files, size=n)
    for c, o, _ in pairs:  # in another file than the original
        file_of[c] = (file_of[o] + 1 + rng.integers(0, files - 1)) % files
    row_of = np.zeros(n, dtype=np.int64)
    for f in range(files):
        m = np.flatnonzero(file_of == f)
        row_of[m] = np.arange(m.size)
    return {**ls, "n": n, "q": q, "file_of": file_of, "row_of": row_of,
            "where": {(int(file_of[i]), int(row_of[i])): i for i in range(n)}}


def _labelled_cosines(v: np.ndarray, group: list, pairs: list) -> tuple:
    """(each planted kind's cosine of the copies to their originals: min and median; each
    template's pages' highest cosine to another page of it: median and shares >= 0.98,
    0.99)."""
    xn = v / np.linalg.norm(v, axis=1, keepdims=True)
    tmpl = [i for i, g in enumerate(group) if g.startswith("template")]
    tcos = {}
    for kind in TEMPLATES:
        m = [i for i in tmpl if group[i] == f"template:{kind}"]
        c = xn[m] @ xn[m].T
        np.fill_diagonal(c, -1)
        tcos[kind] = {"median_max_cosine": float(np.median(c.max(1))),
                      "share_ge_0.98": float((c.max(1) >= 0.98).mean()),
                      "share_ge_0.99": float((c.max(1) >= 0.99).mean())}
    pc_ = {k: [float(xn[c] @ xn[o]) for c, o, kk in pairs if kk == k] for k in PLANTED_KINDS}
    return {k: {"min": min(v), "median": float(np.median(v))} for k, v in pc_.items()}, tcos


def run_labelled(per_kind: int, per_template: int, files: int, seed: int, workdir: str,
                 thresholds=(0.95, 0.98, 0.99), guards=(0.0, 0.2, 0.3, 0.5)) -> dict:
    """Precision and recall per kind on :func:`labelled_set`, for our dedup (the vectors the
    corpus stage reads from the features step's files: the default model's, each less its
    language's mean over the whole corpus, :func:`product_features`; qualities drawn at random
    with each copy a little worse than its original) under the settings of
    ``LABELLED_SETTINGS`` and a sweep of the semantic threshold x text guard, and for
    datatrove's MinHash; throughput of each."""
    from datamask_pipeline.engine.corpus.dedup import deduplicate

    lay = _labelled_layout(per_kind, per_template, files, seed)
    texts, group, pairs, n = lay["texts"], lay["group"], lay["pairs"], lay["n"]
    q, file_of, row_of, where = lay["q"], lay["file_of"], lay["row_of"], lay["where"]
    # the dedup's input: each file embedded as ingestion does, read back by the corpus stage's
    # reader (centered by the corpus's language means)
    feats = product_features(texts, file_of, os.path.join(workdir, "features"))
    x, x_model = feats["vectors"], feats["model"]

    def cosines(v):
        return _labelled_cosines(v, group, pairs)

    pcos, tcos = cosines(x)
    pcos_model, tcos_model = cosines(x_model)
    langs = feats["languages"].tolist()
    out = {"rows": n, "per_kind": per_kind, "per_template": per_template, "files": files,
           "groups": {g: group.count(g) for g in sorted(set(group))},
           "embed_s": feats["seconds"], "geometry": "center" if feats["centered"] else "off",
           "centered_by": "corpus" if feats["centered"] else None,
           "languages": {k: langs.count(k) for k in sorted(
               set(langs), key=lambda k: (-langs.count(k), str(k)))},
           "planted_cosine": pcos, "template_cosine": tcos,
           "planted_cosine_model": pcos_model, "template_cosine_model": tcos_model,
           "cpu": cpu_model(), "runs": {}, "sweep": []}
    arr = np.asarray(texts, dtype=object)

    def ours(vectors=x, **kw):
        t0 = time.perf_counter()
        res = deduplicate(vectors, q, np.arange(n), file_of, row_of, arr, **kw)
        secs = time.perf_counter() - t0
        dropped = {where[(d["shard"], d["row"])] for d in res.dropped}
        return res, dropped, secs

    ours(near=False)  # warm-up: the first call loads faiss and datasketch
    for name, kw in LABELLED_SETTINGS:
        if kw.get("vectors") in ("model", "per_file"):
            kw = {**kw, "vectors": x_model if kw["vectors"] == "model" else feats["per_file"]}
        res, dropped, secs = ours(**kw)
        sc = _score(dropped, pairs, group)
        sc.update(seconds=secs, rows_per_s=n / secs, stats={k: v for k, v in res.stats.items()
                                                           if not isinstance(v, dict)})
        by_kind = {}
        for d in res.dropped:
            by_kind[d["kind"]] = by_kind.get(d["kind"], 0) + 1
        sc["dropped_by_kind"] = by_kind
        out["runs"][name] = sc
        print(f"{name:48s} recall {sc['recall_all']:.3f} {sc['recall']} precision "
              f"{sc['precision']:.3f} template pages dropped {sc['template_pages_dropped']} "
              f"wrong {sc['wrong_drops']} {secs:.1f}s", flush=True)
    for t in thresholds:
        for g in guards:
            _, dropped, secs = ours(threshold=t, near_containment=g)
            sc = _score(dropped, pairs, group)
            out["sweep"].append({"threshold": t, "near_containment": g, **sc})
            print(f"threshold {t} guard {g}: recall {sc['recall_all']:.3f} near "
                  f"{sc['recall']['near']:.3f} precision {sc['precision']:.3f} template "
                  f"{sc['template_pages_dropped']}", flush=True)
    dropped, secs = run_datatrove(texts, os.path.join(workdir, "datatrove"))
    sc = _score(dropped, pairs, group)
    sc.update(seconds=secs, rows_per_s=n / secs)
    out["runs"]["datatrove MinHash (defaults)"] = sc
    print(f"datatrove: recall {sc['recall_all']:.3f} {sc['recall']} precision "
          f"{sc['precision']:.3f} wrong {sc['wrong_drops']} {secs:.1f}s", flush=True)
    return out


# the vectors the dedup could compare: what the corpus stage's reader gives (the product's
# default), each file read by its own language means (what a shard's steps read, and what the
# features carried before they kept the model's vectors), the model's vectors (geometry off)
CENTERING_GEOMETRIES = ("corpus-wide language means (the corpus stage's reader: the default)",
                        "per file (each file's own language means)",
                        "off (the model's vectors)")


def run_centering(per_kind: int, per_template: int, files_list, seed: int, workdir: str,
                  mixes=(0, 800), thresholds=(0.95, 0.9, 0.8)) -> dict:
    """The labelled set (:func:`_labelled_layout`) cut into each number of files of
    ``files_list``, through the features step and read back as the corpus stage reads it
    (:func:`product_features`): our dedup under its defaults on each geometry of
    ``CENTERING_GEOMETRIES``: the vectors the corpus stage's reader gives (each language's mean
    over the whole corpus taken out: the product's default), each file read by its own
    language means (what a shard's steps read) and the model's vectors
    (``embedding_language_geometry`` off). Per number of files and geometry: the planted
    copies' cosine to their originals, recall per kind, precision and the template pages
    dropped; ``cut``: the largest difference of the default's vectors from the first layout's
    (the same rows cut otherwise). Then ``sources``: the planted copies in one file and their
    originals in another, the copies' file with each number of ``mixes`` documents of
    man-page text beside them (:func:`man_documents`): what centering does to a copy whose
    file is of another source (recall only: the man pages' own duplicates are not labelled).
    ``thresholds``: the defaults on the default's vectors with each lower semantic threshold,
    in every layout."""
    from datamask_pipeline.engine.corpus.dedup import deduplicate

    out = {"per_kind": per_kind, "per_template": per_template, "cpu": cpu_model(), "runs": [],
           "sources": [], "thresholds": [], "cut": []}
    first = None
    for files in files_list:
        lay = _labelled_layout(per_kind, per_template, files, seed)
        texts, group, pairs, n = lay["texts"], lay["group"], lay["pairs"], lay["n"]
        feats = product_features(texts, lay["file_of"], os.path.join(workdir, f"f{files}"))
        if first is None:
            first = (files, feats["vectors"])
        out["cut"].append({"files": files, "vs_files": first[0], "max_abs_diff": float(
            np.abs(feats["vectors"] - first[1]).max())})
        arr = np.asarray(texts, dtype=object)
        for geometry, x in zip(CENTERING_GEOMETRIES, (feats["vectors"], feats["per_file"],
                                                      feats["model"])):
            res = deduplicate(x, lay["q"], np.arange(n), lay["file_of"], lay["row_of"], arr)
            dropped = {lay["where"][(d["shard"], d["row"])] for d in res.dropped}
            sc = _score(dropped, pairs, group)
            pcos, tcos = _labelled_cosines(x, group, pairs)
            out["runs"].append({"files": files, "rows": n, "rows_per_file": n / files,
                                "geometry": geometry, "centered": feats["centered"],
                                "planted_cosine": pcos, "template_cosine": tcos, **sc})
            print(f"{files:3d} files ({n / files:5.0f} rows a file) {geometry:32s} near cosine "
                  f"min {pcos['near']['min']:.3f} median {pcos['near']['median']:.3f}: recall "
                  f"{sc['recall_all']:.3f} {sc['recall']} precision {sc['precision']:.3f} "
                  f"template pages dropped {sc['template_pages_dropped']}", flush=True)
        for t in thresholds:  # a lower threshold on the default's vectors, the guard as it is
            res = deduplicate(feats["vectors"], lay["q"], np.arange(n), lay["file_of"],
                              lay["row_of"], arr, threshold=t)
            sc = _score({lay["where"][(d["shard"], d["row"])] for d in res.dropped}, pairs,
                        group)
            out["thresholds"].append({"layout": f"{files} files", "threshold": t,
                                      "recall_near": sc["recall"]["near"],
                                      "recall_all": sc["recall_all"],
                                      "precision": sc["precision"],
                                      "template_pages_dropped": sc["template_pages_dropped"]})
    # the copies in a file of another source: file 0 the originals and the manual's other
    # paragraphs, file 1 the copies and ``mix`` documents of man-page text
    lay = _labelled_layout(per_kind, per_template, 8, seed)
    texts, group, pairs = lay["texts"], lay["group"], lay["pairs"]
    keep = [i for i, g in enumerate(group) if g == "base" or g == "original"]
    copies = [c for c, _, _ in pairs]
    for mix in mixes:
        docs, _ = man_documents(mix, 0, seed) if mix else ([], None)
        rows = keep + copies
        pos = {r_: j for j, r_ in enumerate(rows)}
        t = [texts[i] for i in rows] + list(docs)
        g = [group[i] for i in rows] + ["man"] * len(docs)
        file_of = np.array([0] * len(keep) + [1] * (len(copies) + len(docs)))
        sp = [(pos[c], pos[o], k) for c, o, k in pairs]
        n = len(t)
        rng = np.random.default_rng(seed)
        q = rng.random(n)
        for c, o, _ in sp:
            q[c] = q[o] - 1e-3
        row_of = np.concatenate([np.arange(len(keep)), np.arange(n - len(keep))])
        feats = product_features(t, file_of, os.path.join(workdir, f"mix{mix}"))
        arr = np.asarray(t, dtype=object)
        for geometry, x in zip(CENTERING_GEOMETRIES, (feats["vectors"], feats["per_file"],
                                                      feats["model"])):
            res = deduplicate(x, q, np.arange(n), file_of, row_of, arr)
            dropped = {(len(keep) if d["shard"] else 0) + d["row"] for d in res.dropped}
            sc = _score(dropped, sp, g)
            xn = x / np.linalg.norm(x, axis=1, keepdims=True)
            cn = [float(xn[c] @ xn[o]) for c, o, k in sp if k == "near"]
            out["sources"].append({"man_documents": mix, "rows": n,
                                   "rows_in_copies_file": n - len(keep), "geometry": geometry,
                                   "near_cosine": {"min": min(cn), "median": float(np.median(cn))},
                                   "recall": sc["recall"], "recall_all": sc["recall_all"]})
            print(f"copies' file with {mix} man-page documents, {geometry:32s} near cosine min "
                  f"{min(cn):.3f} median {np.median(cn):.3f}: recall {sc['recall_all']:.3f} "
                  f"{sc['recall']}", flush=True)
        for t in thresholds:
            res = deduplicate(feats["vectors"], q, np.arange(n), file_of, row_of, arr, threshold=t)
            sc = _score({(len(keep) if d["shard"] else 0) + d["row"] for d in res.dropped}, sp, g)
            out["thresholds"].append({"layout": f"copies' file with {mix} man-page documents",
                                      "threshold": t, "recall_near": sc["recall"]["near"],
                                      "recall_all": sc["recall_all"]})
    return out


def centering_markdown(r: dict) -> str:
    default = CENTERING_GEOMETRIES[0]
    lines = [f"The labelled set ({r['runs'][0]['rows']:,} rows: {r['per_kind']} planted copies "
             f"per kind, {r['per_template']} template pages per template; as in the labelled "
             "measure, each copy in another file than its original) cut into more and smaller "
             "files, each file through the features step (quality scorer and language detection, "
             "the default model; the features keep the model's vectors and record each "
             "language's sums in their footer), then our dedup under its defaults on three "
             "geometries: the vectors the corpus stage's reader gives (`open_shards`: each "
             "vector less its language's mean over the whole corpus, from the sum of the "
             "footers; what the dedup reads, the default), each file read by its own language "
             "means (what a shard's steps read; what the dedup read before the corpus stage "
             "centered by the corpus's means) and the model's vectors "
             "(`embedding_language_geometry: off`). Near copies: the same words reordered (the "
             "model's cosine 1.000); only the semantic stage finds them.", "",
             "| files | rows a file | geometry | near copies' cosine min / median | recall near "
             "| recall all | precision | template pages dropped |",
             "|---:|---:|---|---|---:|---:|---:|---:|"]
    for s in r["runs"]:
        c = s["planted_cosine"]["near"]
        lines.append(f"| {s['files']} | {s['rows_per_file']:.0f} | {s['geometry']} | "
                     f"{c['min']:.3f} / {c['median']:.3f} | {s['recall']['near']:.3f} | "
                     f"{s['recall_all']:.3f} | {s['precision']:.3f} | "
                     f"{s['template_pages_dropped']} |")
    if r.get("cut"):
        lines += ["", f"The default's vectors do not depend on the cut: largest difference from "
                  f"the {r['cut'][0]['vs_files']} files' vectors, per layout: " + ", ".join(
                      f"{c['files']} files {c['max_abs_diff']:.1e}" for c in r["cut"]) + "."]
    lines += ["", "Files that differ in what they hold: the planted copies all in one file (a "
              "quarter of them upper-cased, a quarter with the common footer), their originals "
              "in another with the manual's other paragraphs, and beside the copies 0 or more "
              "documents of man-page text (another source); our dedup under its defaults:", "",
              "| man-page documents in the copies' file | geometry | near copies' cosine min / "
              "median | recall exact | footer | fuzzy | near | all |",
              "|---:|---|---|---:|---:|---:|---:|---:|"]
    for s in r["sources"]:
        c, rc = s["near_cosine"], s["recall"]
        lines.append(f"| {s['man_documents']} | {s['geometry']} | {c['min']:.3f} / "
                     f"{c['median']:.3f} | {rc['exact']:.3f} | {rc['footer']:.3f} | "
                     f"{rc['fuzzy']:.3f} | {rc['near']:.3f} | {s['recall_all']:.3f} |")
    if r.get("thresholds"):
        name = default.split(" (")[0]
        lines += ["", f"A lower semantic threshold on the default's vectors ({name}; "
                  "the text guard and every other setting the defaults; precision and template "
                  "pages only where the set has them):", "",
                  "| layout | threshold | recall near | recall all | precision | template pages "
                  "dropped |", "|---|---:|---:|---:|---:|---:|"]
        for s in r["thresholds"]:
            p = f"{s['precision']:.3f}" if "precision" in s else "-"
            tp = s.get("template_pages_dropped", "-")
            lines.append(f"| {s['layout']} | {s['threshold']} | {s['recall_near']:.3f} | "
                         f"{s['recall_all']:.3f} | {p} | {tp} |")
    return "\n".join(lines)


def run_throughput(rows: int, seed: int, workdir: str) -> dict:
    """Throughput on ``rows`` real documents (man pages' text, :func:`man_documents`), no
    labels: our dedup (every stage; the default model's embeddings computed first, timed
    apart) and datatrove's MinHash, one process each, on the same texts."""
    from datamask_pipeline.engine.corpus.dedup import deduplicate
    from datamask_pipeline.engine.embed import load_embedder

    docs, _ = man_documents(rows, 0, seed)
    n = len(docs)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    x = load_embedder().embed(docs)
    embed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = deduplicate(x, rng.random(n), np.arange(n), np.zeros(n, dtype=np.int64), np.arange(n),
                      np.asarray(docs, dtype=object))
    ours_s = time.perf_counter() - t0
    dropped, dt_s = run_datatrove(docs, os.path.join(workdir, "datatrove_throughput"))
    out = {"rows": n, "text_bytes": int(sum(len(d.encode()) for d in docs)), "cpu": cpu_model(),
           "embed_s": embed_s, "ours_s": ours_s, "ours_dropped": len(res.dropped),
           "ours_by_kind": {k: sum(d["kind"] == k for d in res.dropped)
                            for k in ("exact", "fuzzy", "semantic")},
           "datatrove_s": dt_s, "datatrove_dropped": len(dropped)}
    print(out, flush=True)
    return out


def throughput_markdown(r: dict) -> str:
    return "\n".join([
        f"{r['rows']:,} documents of man-page text ({r['text_bytes'] / 1e6:.1f} MB), one process "
        f"each, {r['cpu']}.", "",
        "| dedup | seconds | rows/s | dropped |", "|---|---:|---:|---:|",
        f"| ours (every stage, defaults; embeddings given) | {r['ours_s']:.1f} | "
        f"{r['rows'] / r['ours_s']:,.0f} | {r['ours_dropped']:,} {r['ours_by_kind']} |",
        f"| ours + the default model's embeddings | {r['ours_s'] + r['embed_s']:.1f} | "
        f"{r['rows'] / (r['ours_s'] + r['embed_s']):,.0f} | |",
        f"| datatrove MinHash (defaults: 5-grams, 14 x 8 hashes) | {r['datatrove_s']:.1f} | "
        f"{r['rows'] / r['datatrove_s']:,.0f} | {r['datatrove_dropped']:,} |"])


def _labelled_embeddings(r: dict) -> str:
    if r.get("geometry") is None:  # a run from before the features step's centering
        return (f"Embeddings: the default model (embedding took {r['embed_s']:.1f} s, not in "
                "the dedup's seconds).")
    langs = ", ".join(f"{k or 'none'} {v:,}" for k, v in r["languages"].items())
    if r["geometry"] != "center":
        how = "the model's vectors (`embedding_language_geometry: off`)"
    elif r.get("centered_by") == "corpus":
        how = ("read as the corpus stage reads them (`engine.corpus.shards.open_shards`): each "
               "vector less its language's mean over the whole corpus, from the language sums "
               "the features' footers record (the default `embedding_language_geometry: "
               "center`)")
    else:  # a run from before the corpus stage centered by the corpus's means
        how = ("each vector less the mean of its language's rows in its file (the default "
               "`embedding_language_geometry: center`)")
    return (f"Embeddings: the features step's, file by file (`assets.ingest.write_features`: "
            f"the default model, the quality scorer's language per row: {langs}; {how}; "
            f"{r['embed_s']:.1f} s, not in the dedup's seconds).")


def _labelled_model_cosines(r: dict) -> str:
    pm = r.get("planted_cosine_model")
    if pm is None:
        return ""
    return (" The model's vectors before centering: " + ", ".join(
        f"{k} min {v['min']:.3f} / median {v['median']:.3f}" for k, v in pm.items())
        + "; template pages " + ", ".join(
            f"{k} median {v['median_max_cosine']:.3f} ({v['share_ge_0.98']:.0%} >= 0.98)"
            for k, v in r["template_cosine_model"].items()) + ".")


def labelled_markdown(r: dict) -> str:
    g = r["groups"]
    lines = [
        f"{r['rows']:,} rows (one process, {r['cpu']}): {g.get('base', 0):,} paragraphs of "
        f"CPython's reference manual (its distinct ones: none is contained in another at "
        f"0.5), {g.get('original', 0)} originals with a planted copy each "
        f"({r['per_kind']} per kind, in another of {r['files']} files): exact (other case and "
        "spaces), footer (one footer line added, the same in every copy), fuzzy (3 % of the "
        "words replaced, at least one), near (12 % of the words swapped with their neighbour: "
        "the same words reordered); and "
        f"{sum(v for k, v in g.items() if k.startswith('template'))} template pages, "
        f"{r['per_template']} per template, each around a paragraph in no other row "
        "(near-misses: none may be dropped): web (navigation and a 6-line license block), man "
        "(a man page's sections, copyright and see-also paragraphs), web_dated (web with a "
        "header line of its own, so no line of the template is common), stub (web around one "
        "8-word line). " + _labelled_embeddings(r), "",
        "Cosine of the planted copies to their originals: " + ", ".join(
            f"{k} min {v['min']:.3f} / median {v['median']:.3f}"
            for k, v in r["planted_cosine"].items()) + ". Template pages' highest cosine to "
        "another page of their template: " + ", ".join(
            f"{k} median {v['median_max_cosine']:.3f} ({v['share_ge_0.98']:.0%} >= 0.98)"
            for k, v in r["template_cosine"].items()) + "." + _labelled_model_cosines(r), "",
        "Recall: planted pairs with exactly one member dropped. Precision: dropped rows that are "
        "a member of a planted pair whose other member stays. Wrong drops: the other dropped "
        "rows, by group. The same rule for every dedup.", "",
        "| dedup | recall exact | footer | fuzzy | near | all | precision | template pages "
        "dropped | other wrong drops | rows/s |", "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for name, s in r["runs"].items():
        other = {k: v for k, v in s["wrong_drops"].items() if not k.startswith("template")}
        rc = s["recall"]
        lines.append(f"| {name} | {rc['exact']:.3f} | {rc['footer']:.3f} | {rc['fuzzy']:.3f} | "
                     f"{rc['near']:.3f} | {s['recall_all']:.3f} | {s['precision']:.3f} | "
                     f"{s['template_pages_dropped']} | {other or '-'} | {s['rows_per_s']:,.0f} |")
    lines += ["", "The semantic stage's threshold x text guard (our dedup, other settings the "
              "defaults):", "", "| cosine threshold | text guard (containment) | recall near | "
              "recall all | precision | template pages dropped |", "|---:|---:|---:|---:|---:|---:|"]
    for s in r["sweep"]:
        lines.append(f"| {s['threshold']} | {s['near_containment']} | {s['recall']['near']:.3f} | "
                     f"{s['recall_all']:.3f} | {s['precision']:.3f} | "
                     f"{s['template_pages_dropped']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dedup", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("planted")
    a.add_argument("--pairs", type=int, default=500)
    a.add_argument("--files", type=int, default=8)
    a.add_argument("--threshold", type=float, default=0.99)  # dedup.DEFAULT_THRESHOLD
    a.add_argument("--containment", type=float, default=0.8)
    a.add_argument("--footers", default="same", choices=("same", "distinct"))
    a.add_argument("--workdir", default="/tmp/dedup_planted")
    c = sub.add_parser("main_job")
    c.add_argument("--pairs", type=int, default=500)
    c.add_argument("--files", type=int, default=8)
    c.add_argument("--algorithm", default="Pair_simi")
    c.add_argument("--workdir", default="/tmp/dedup_main_job")
    b = sub.add_parser("scale")
    b.add_argument("--rows", type=int, default=1_000_000)
    b.add_argument("--dim", type=int, default=256)
    e = sub.add_parser("labelled")
    e.add_argument("--per-kind", type=int, default=100)
    e.add_argument("--per-template", type=int, default=50)
    e.add_argument("--files", type=int, default=8)
    e.add_argument("--workdir", default="/tmp/dedup_labelled")
    g = sub.add_parser("centering")
    g.add_argument("--per-kind", type=int, default=100)
    g.add_argument("--per-template", type=int, default=75)
    g.add_argument("--files", default="2,8,32,64")
    g.add_argument("--man-documents", default="0,800")
    g.add_argument("--workdir", default="/tmp/dedup_centering")
    f = sub.add_parser("throughput")
    f.add_argument("--rows", type=int, default=10_000)
    f.add_argument("--workdir", default="/tmp/dedup_throughput")
    d = sub.add_parser("long_document")
    d.add_argument("--rows", type=int, default=20_000)
    d.add_argument("--long-mb", type=float, default=3.0)
    d.add_argument("--files", type=int, default=8)
    d.add_argument("--workdir", default="/tmp/dedup_long_document")
    for s in (a, b, c, d, e, f, g):
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("--tag", default=None)
        s.add_argument("--out", default="bench/results")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if args.what == "planted":
        r = run_planted(args.pairs, args.files, args.threshold, args.containment, args.seed,
                        args.footers, args.workdir)
        md = planted_markdown(r)
    elif args.what == "main_job":
        r = run_main_job(args.pairs, args.files, args.seed, args.workdir, args.algorithm)
        md = main_job_markdown(r)
    elif args.what == "labelled":
        r = run_labelled(args.per_kind, args.per_template, args.files, args.seed, args.workdir)
        md = labelled_markdown(r)
    elif args.what == "centering":
        r = run_centering(args.per_kind, args.per_template,
                          [int(v) for v in args.files.split(",")], args.seed, args.workdir,
                          [int(v) for v in args.man_documents.split(",")])
        md = centering_markdown(r)
    elif args.what == "throughput":
        r = run_throughput(args.rows, args.seed, args.workdir)
        md = throughput_markdown(r)
    elif args.what == "long_document":
        r = run_long_document(args.rows, args.long_mb, args.files, args.seed, args.workdir)
        md = long_document_markdown(r)
    else:
        r = run_scale(args.rows, args.dim, args.seed)
        md = scale_markdown(r)
    r["command"] = "python -m bench.dedup " + " ".join(sys.argv[1:] if argv is None else argv)
    print(md)
    write_report(args.out, args.tag, r, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
