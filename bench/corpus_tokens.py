"""Token budgets inside the objective, measured (issue 24 item 5).

``tokens``: one corpus with lengths rising with quality and one with lengths falling, on a
generated corpus and on real text (the Python reference manual's paragraphs shipped with
CPython, embedded with the shipped wordllama model, tokens = whitespace words; quality follows
the length's rank, 0.7 · rank + 0.3 · uniform noise). Files sorted by quality. For each term and
mode, the whole-corpus f (the selected set as it is, f_qua its mean quality) of:

* ``cost_aware``: ``select_corpus`` with ``select_tokens`` (gain per token inside the fit and
  the swap rounds);
* ``fit_after``: the old way: the row budget k = round(T / mean tokens · n) selected by the same
  mode, then :func:`fit_tokens` in quality order (what exchange and per_shard did before);
* ``quality_filled``: the rows in quality order taken while they fit (``fit_tokens`` from
  nothing)::

    python -m bench.corpus_tokens tokens --rows 5000 --dim 64 --share 0.1 --tag corpus_tokens
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from bench.common import write_report

TERMS = ("Pair_simi", "DiSF")
MODES = ("gather", "exchange")


def _generated(rows: int, dim: int, seed: int):
    from datamask_pipeline.engine.data import table_to_shard
    from datamask_pipeline.engine.sample import make_table

    sh = table_to_shard(make_table(rows, dim=dim, seed=seed), "corpus")
    q = np.asarray(sh.quality, dtype=np.float64)
    rng = np.random.default_rng(seed)
    r = np.argsort(np.argsort(q, kind="stable")) / (q.size - 1)
    noise = rng.uniform(0.5, 1.5, q.size)
    return {"x": sh.embeddings, "q": {"rising": q, "falling": q},
            "tokens": {"rising": (20 + 2000 * r * noise).astype(np.int64),
                       "falling": (20 + 2000 * (1 - r) * noise).astype(np.int64)}}


def _manual(dim: int, seed: int):
    from pydoc_data.topics import topics

    from datamask_pipeline.engine.corpus.tokens import count_tokens
    from datamask_pipeline.engine.embed import WordLlamaEmbedder

    paras, seen = [], set()
    for key in sorted(topics):
        for p in topics[key].split("\n\n"):
            p = " ".join(p.split())
            if len(p.split()) >= 5 and p not in seen:
                seen.add(p)
                paras.append(p)
    tok = count_tokens(paras, "whitespace")
    rng = np.random.default_rng(seed)
    n = tok.size
    r = np.argsort(np.argsort(tok + rng.uniform(0, 0.5, n))) / (n - 1)
    noise = rng.uniform(0, 0.3, n)
    return {"x": WordLlamaEmbedder(dim=dim).embed(paras),
            "q": {"rising": 0.7 * r + noise, "falling": 0.7 * (1 - r) + noise},
            "tokens": {"rising": tok, "falling": tok}}


def run_tokens(rows: int, dim: int, text_dim: int, share: float, files: int, lamb: float,
               seed: int) -> dict:
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.corpus import (CorpusBudget, CorpusShard, Part, fit_tokens,
                                                 select_corpus)
    from datamask_pipeline.engine.evaluate import make_ground_set
    from datamask_pipeline.engine.select import score_selection

    out = {"rows": rows, "dim": dim, "text_dim": text_dim, "share": share, "files": files,
           "lamb": lamb, "seed": seed, "cells": []}
    for corpus, data in (("generated", _generated(rows, dim, seed)),
                         ("python_manual", _manual(text_dim, seed))):
        x = data["x"]
        n = x.shape[0]
        ids = np.arange(n)
        for skew in ("rising", "falling"):
            q, tok = data["q"][skew], data["tokens"][skew]
            target = int(tok.sum() * share)
            cut = np.array_split(np.argsort(-q, kind="stable"), files)
            shards = [CorpusShard(key=f"f{i:02d}", n=len(r), tokens=tok[r],
                                  load=lambda r=r: Part(x[r], q[r], ids[r]))
                      for i, r in enumerate(cut)]
            filled = np.flatnonzero(fit_tokens(np.zeros(n, dtype=bool), q, tok, target))
            k_rows = CorpusBudget.of(select_tokens=target).rows(n, int(tok.sum()))
            for term in TERMS:
                cfg = LearnerConfig.profile("pipeline", algorithm=term, lamb=lamb)
                tm = cfg.diversity_term()
                ground = make_ground_set(x, q)

                def f_of(rows):
                    return score_selection(ground, np.sort(rows), tm, lamb).f

                for mode in MODES:
                    t0 = time.perf_counter()
                    res = select_corpus(shards, cfg, CorpusBudget.of(select_tokens=target),
                                        mode=mode)
                    secs = time.perf_counter() - t0
                    u = np.concatenate([cut[i][res.selected[f"f{i:02d}"]]
                                        for i in range(files)])
                    old = select_corpus(shards, cfg, CorpusBudget.of(select_rows=k_rows),
                                        mode=mode)
                    mask = np.zeros(n, dtype=bool)
                    mask[np.concatenate([cut[i][old.selected[f"f{i:02d}"]]
                                         for i in range(files)])] = True
                    fit = np.flatnonzero(fit_tokens(mask, q, tok, target))
                    cell = {"corpus": corpus, "n": n, "skew": skew, "term": term, "mode": mode,
                            "target": target, "f_cost_aware": f_of(u),
                            "f_fit_after": f_of(fit), "f_quality_filled": f_of(filled),
                            "k_cost_aware": int(u.size), "k_fit_after": int(fit.size),
                            "k_quality_filled": int(filled.size),
                            "tokens_cost_aware": int(tok[u].sum()),
                            "largest_document": int(tok.max()), "seconds": secs}
                    out["cells"].append(cell)
                    print(f"{corpus} {skew} {term} {mode}: cost-aware "
                          f"{cell['f_cost_aware']:.5f}, fit-after {cell['f_fit_after']:.5f}, "
                          f"quality filled {cell['f_quality_filled']:.5f} ({secs:.1f} s)",
                          flush=True)
    return out


def render(r: dict) -> str:
    lines = [f"Whole-corpus f (λ = {r['lamb']:g}; the selected set as it is, f_qua its mean "
             f"quality) under a token budget of {r['share']:.0%} of the corpus's tokens, "
             f"{r['files']} files sorted by quality. Generated corpus: {r['rows']:,} rows, "
             f"{r['dim']}-d, tokens 20 + 2000 · rank(q) · U(0.5, 1.5) (rising) or with "
             f"1 − rank (falling). Python manual: its paragraphs (CPython's pydoc_data), "
             f"wordllama {r['text_dim']}-d, tokens = words, quality 0.7 · rank(length) "
             f"(rising) or 0.7 · (1 − rank) (falling) + U(0, 0.3). **cost-aware**: "
             "`select_tokens` (gain per token in the fit and the swap rounds); **fit after**: "
             "the row budget selected by the same mode, then `fit_tokens` in quality order "
             "(the old path); **quality filled**: rows in quality order while they fit.", "",
             "| corpus | lengths | term | mode | cost-aware | fit after | quality filled | "
             "cost-aware − filled | rows (cost-aware / filled) | tokens / target | s |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in r["cells"]:
        lines.append(
            f"| {c['corpus']} | {c['skew']} | {c['term']} | {c['mode']} | "
            f"{c['f_cost_aware']:.5f} | {c['f_fit_after']:.5f} | {c['f_quality_filled']:.5f} | "
            f"{c['f_cost_aware'] - c['f_quality_filled']:+.5f} | {c['k_cost_aware']:,} / "
            f"{c['k_quality_filled']:,} | {c['tokens_cost_aware']:,} / {c['target']:,} | "
            f"{c['seconds']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.corpus_tokens",
                                description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokens")
    t.add_argument("--rows", type=int, default=5000)
    t.add_argument("--dim", type=int, default=64)
    t.add_argument("--text-dim", type=int, default=64)
    t.add_argument("--share", type=float, default=0.1)
    t.add_argument("--files", type=int, default=4)
    t.add_argument("--lamb", type=float, default=0.5)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", default="bench/results")
    t.add_argument("--tag", default=None)
    a = p.parse_args(argv)
    r = run_tokens(a.rows, a.dim, a.text_dim, a.share, a.files, a.lamb, a.seed)
    r["command"] = "python -m bench.corpus_tokens " + " ".join(argv if argv is not None
                                                              else sys.argv[1:])
    md = render(r)
    print(md)
    write_report(a.out, a.tag, r, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
