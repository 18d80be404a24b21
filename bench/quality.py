"""What separates good text from bad: the default quality scorer's signals, measured (issue 21
item 1), and its throughput in documents per second per core.

    .venv/bin/python -m bench.quality                  # results/results_quality.json, REPORT_quality.md
    .venv/bin/python -m bench.quality --quick --out DIR   # a small sample (tests/bench/test_quality_bench_smoke.py)

**Good text** is real and offline: the Python reference manual that CPython ships
(``pydoc_data.topics``, cut into documents of a few paragraphs), docstrings of the Python
standard library, and man pages under ``/usr/share/man`` rendered by ``man`` (``col -b``), when
the machine has them. **Bad text** is made from other good documents, one kind at a time:

- ``boilerplate``: navigation, cookie, share and copyright lines around one real sentence;
- ``repeated_lines``: a few lines of a document repeated until it is as long as the original;
- ``shuffled_words``: the words of a document in random order (same words, no syntax);
- ``keyword_list``: the document's words as a comma- or line-separated keyword list;
- ``truncated``: the first 3 to 12 words of a document, cut mid-sentence;
- ``symbol_soup``: characters drawn from punctuation, digits, letters and ``#``;
- ``mixed``: the real document with a third of its lines replaced by boilerplate lines (mild
  damage: does the score still rank the clean page above it?).

The separation measure is the AUC (the probability that a random good document scores above a
random bad one; 0.5 = no separation, ties count half), per signal (on its pass degree) and per
combination, over all bad kinds and per kind. The combination is chosen on the *tuning* sources
(docstrings + the reference manual) and reported on the *held-out* man pages, which played no
part in the choice. Throughput: ``engine.quality.HeuristicScorer.score`` on the sample at one
thread, documents per second per core.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .common import cpu_model, loadavg, median

REPO = Path(__file__).resolve().parent.parent
BAD_KINDS = ("boilerplate", "repeated_lines", "shuffled_words", "keyword_list", "truncated",
             "symbol_soup", "mixed")
BOILERPLATE = (
    "Home | About | Contact | Blog", "Skip to main content", "Log in", "Sign up", "Menu",
    "Share on Facebook", "Share on Twitter", "Pin it", "Email this page",
    "We use cookies to improve your experience. Accept all cookies",
    "Copyright © 2024 All rights reserved.", "Privacy Policy | Terms of Use | Sitemap",
    "Next »", "« Previous", "Read more", "Click here to subscribe", "Posted by admin",
    "Tags: news, tips, howto", "Related posts", "Leave a comment", "0 comments",
    "Search ...", "Categories", "Archives", "Follow us", "Back to top", "Powered by WordPress",
)


# ------------------------------------------------------------------ good text
def reference_docs(max_chars: int = 3000) -> list[str]:
    """The Python reference manual (``pydoc_data.topics``), cut at paragraph boundaries into
    documents of at most ``max_chars`` characters (and at least 200)."""
    import pydoc_data.topics as topics

    out = []
    for key in sorted(topics.topics):
        paras = [p.strip("\n") for p in re.split(r"\n\s*\n", topics.topics[key]) if p.strip()]
        cur = ""
        for p in paras:
            if cur and len(cur) + len(p) > max_chars:
                out.append(cur)
                cur = ""
            cur = f"{cur}\n\n{p}" if cur else p
        if cur:
            out.append(cur)
    return [d for d in out if len(d) >= 200]


STDLIB = ("argparse", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib",
          "csv", "datetime", "decimal", "difflib", "email", "fractions", "functools", "gzip",
          "heapq", "html", "http.client", "inspect", "ipaddress", "itertools", "json",
          "logging", "mailbox", "os", "pathlib", "pickle", "pprint", "random", "re", "shlex",
          "shutil", "smtplib", "socket", "sqlite3", "statistics", "string", "subprocess",
          "tarfile", "tempfile", "textwrap", "threading", "typing", "unittest", "urllib.parse",
          "uuid", "warnings", "zipfile")


def docstring_docs(min_chars: int = 300) -> list[str]:
    """Docstrings of the modules in :data:`STDLIB`, their classes and functions (at least
    ``min_chars`` characters, each once)."""
    import importlib
    import inspect

    seen, out = set(), []
    for name in STDLIB:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        objs = [mod] + [v for _, v in sorted(vars(mod).items())
                        if (inspect.isclass(v) or inspect.isfunction(v))
                        and getattr(v, "__module__", None) == mod.__name__]
        for cls in [o for o in objs if inspect.isclass(o)]:
            objs += [v for _, v in sorted(vars(cls).items()) if inspect.isfunction(v)]
        for o in objs:
            doc = inspect.getdoc(o)
            if doc and len(doc) >= min_chars and doc not in seen:
                seen.add(doc)
                out.append(doc)
    return out


def man_docs(n: int, seed: int = 0, max_chars: int = 20000) -> list[str]:
    """``n`` man pages (sections 1, 5, 8, English) rendered by ``man -l`` and ``col -b``;
    empty when the machine has no man pages or no ``man``."""
    root = Path("/usr/share/man")
    if not shutil.which("man") or not root.is_dir():
        return []
    files = sorted(p for s in ("man1", "man5", "man8") for p in (root / s).glob("*")
                   if p.is_file())
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.permutation(len(files)):
        if len(out) >= n:
            break
        try:
            r = subprocess.run(f"man -l -P cat {shlex.quote(str(files[i]))} 2>/dev/null | col -bx",
                               shell=True, capture_output=True, timeout=20,
                               env={**os.environ, "MANWIDTH": "100000", "LANG": "C.UTF-8"})
        except subprocess.TimeoutExpired:
            continue
        text = r.stdout.decode("utf-8", "replace")
        # the header and footer lines, and the indentation, are typesetting, not text
        lines = [ln.strip() for ln in text.splitlines()[1:-1]]
        text = "\n".join(lines).strip()
        if len(text) >= 300:
            out.append(text[:max_chars])
    return out


# ------------------------------------------------------------------ bad text
def make_bad(doc: str, kind: str, rng) -> str:
    words = doc.split()
    lines = [ln for ln in doc.splitlines() if ln.strip()]
    if kind == "boilerplate":
        sentences = re.split(r"(?<=[.!?])\s+", " ".join(words))
        body = sentences[int(rng.integers(len(sentences)))]
        nav = list(rng.choice(BOILERPLATE, size=int(rng.integers(8, 20))))
        at = int(rng.integers(len(nav) + 1))
        return "\n".join(nav[:at] + [body] + nav[at:])
    if kind == "repeated_lines":
        keep = lines[:int(rng.integers(1, 4))]
        out = []
        while sum(len(x) for x in out) < len(doc):
            out.append(keep[int(rng.integers(len(keep)))])
        return "\n".join(out)
    if kind == "shuffled_words":
        return " ".join(rng.permutation(words))
    if kind == "keyword_list":
        kw = [w.strip(".,;:()[]\"'").lower() for w in words]
        kw = [w for w in kw if len(w) > 3]
        kw = list(dict.fromkeys(kw))[:int(rng.integers(15, 80))] or ["keyword"]
        return (", " if rng.random() < 0.5 else "\n").join(kw)
    if kind == "truncated":
        return " ".join(words[:int(rng.integers(3, 13))])
    if kind == "symbol_soup":
        alphabet = list("#@$%^&*()[]{}<>|/\\~=+-_!?.,;:0123456789abcdefxyz")
        m = int(rng.integers(50, 600))
        chars = rng.choice(alphabet, size=m)
        chars[rng.random(m) < 0.15] = " "
        return "".join(chars)
    if kind == "mixed":  # the real document with a third of its lines replaced by boilerplate
        out = list(lines)
        for i in rng.permutation(len(out))[:max(1, len(out) // 3)]:
            out[i] = BOILERPLATE[int(rng.integers(len(BOILERPLATE)))]
        return "\n".join(out)
    raise ValueError(kind)


def build_sample(quick: bool, seed: int = 0) -> dict:
    """{source: {"good": [...], "bad": [...], "bad_kind": [...]}}: each source's good
    documents, and as many bad ones made from a shuffled copy of them, the kinds in turn."""
    rng = np.random.default_rng(seed)
    n_man = 40 if quick else 400
    sources = {"docstrings": docstring_docs(), "reference": reference_docs(),
               "man_pages": man_docs(n_man, seed)}
    if quick:
        sources = {k: v[:60] for k, v in sources.items()}
    out = {}
    for name, good in sources.items():
        if not good:
            continue
        donors = [good[i] for i in rng.permutation(len(good))]
        kinds = [BAD_KINDS[i % len(BAD_KINDS)] for i in range(len(good))]
        bad = [make_bad(d, k, rng) for d, k in zip(donors, kinds)]
        out[name] = {"good": good, "bad": bad, "bad_kind": kinds}
    return out


# ------------------------------------------------------------------ measures
def _auc(good, bad) -> float:
    """P(a good score > a bad score), ties counting half: the Mann-Whitney U statistic over
    n_good * n_bad, from average ranks (numpy only)."""
    good, bad = np.asarray(good, float), np.asarray(bad, float)
    x = np.concatenate([good, bad])
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    # average rank of each run of equal values
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], len(xs)]
    avg = (starts + ends + 1) / 2.0  # 1-based ranks starts+1 .. ends, averaged
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(avg, ends - starts)
    u = ranks[:len(good)].sum() - len(good) * (len(good) + 1) / 2
    return float(u / (len(good) * len(bad)))


TUNING = ("docstrings", "reference")
HELD_OUT = ("man_pages",)


def _kind_auc(deg, names, how) -> float:
    """Mean over the bad kinds of the combination's AUC, over the given sources' degrees."""
    from datamask_pipeline.engine import quality as Q

    out = []
    for g, b, kinds in deg:
        G, Bd = Q.combine(g, how, names), Q.combine(b, how, names)
        out.append(np.mean([_auc(G, Bd[kinds == k]) for k in BAD_KINDS if (kinds == k).any()]))
    return float(np.mean(out)) if out else float("nan")


def choose(deg: dict) -> dict:
    """For each combination: backward elimination of signals on the tuning sources (drop the
    signal whose removal raises the mean per-kind AUC most, while it does not fall), and the
    kept set's AUC on the tuning and held-out sources."""
    from datamask_pipeline.engine import quality as Q

    tune = [deg[k] for k in TUNING if k in deg]
    held = [deg[k] for k in HELD_OUT if k in deg]
    out = {}
    for how in Q.COMBINATIONS:
        names = [s.name for s in Q.SIGNALS]
        start = cur = _kind_auc(tune, names, how)
        dropped = []
        while len(names) > 1:
            best = max(((_kind_auc(tune, [x for x in names if x != n], how), n) for n in names))
            if best[0] < cur - 1e-4:
                break
            cur = best[0]
            names.remove(best[1])
            dropped.append(best[1])
        out[how] = {"all_signals_tuning": start, "kept": names, "dropped": dropped,
                    "tuning": cur, "held_out": _kind_auc(held, names, how),
                    "all_signals_held_out": _kind_auc(held, [s.name for s in Q.SIGNALS], how)}
    return out


def measure(sample: dict) -> dict:
    """Per source: each signal's AUC (all bad kinds, and per kind) and each combination's (of
    the default signals); and the choice of signals per combination (:func:`choose`)."""
    from datamask_pipeline.engine import quality as Q

    out, deg = {}, {}
    for name, s in sample.items():
        dg = Q.degrees(Q.signals(s["good"]))
        db = Q.degrees(Q.signals(s["bad"]))
        kinds = np.asarray(s["bad_kind"])
        deg[name] = (dg, db, kinds)
        rows = {}
        combos = {c: (Q.combine(dg, c), Q.combine(db, c)) for c in Q.COMBINATIONS}
        for label, (g, b) in [*[(sig, (dg[sig], db[sig])) for sig in dg],
                              *[(f"combination:{c}", v) for c, v in combos.items()]]:
            rows[label] = {"all": _auc(g, b), **{k: _auc(g, b[kinds == k]) for k in BAD_KINDS}}
        out[name] = {"good": len(s["good"]), "bad": len(s["bad"]), "auc": rows,
                     "default_score_good": _quantiles(Q.combine(dg)),
                     "default_score_bad": _quantiles(Q.combine(db))}
    return {"sources": out, "choice": choose(deg),
            "default": {"combination": Q.COMBINATION, "signals": list(Q.DEFAULT_SIGNALS)}}


def _quantiles(x) -> dict:
    q = np.quantile(np.asarray(x, float), [0.1, 0.5, 0.9])
    return {"p10": round(float(q[0]), 4), "median": round(float(q[1]), 4),
            "p90": round(float(q[2]), 4)}


def throughput(texts: list, reps: int) -> dict:
    """HeuristicScorer.score on ``texts`` in chunks of 8,192, one thread (this process is
    started with one thread for BLAS and Arrow): median of ``reps`` rounds."""
    import pyarrow as pa

    from datamask_pipeline.engine import quality as Q

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    scorer = Q.HeuristicScorer()
    arr = pa.array(texts, pa.large_string())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for s in range(0, len(arr), Q.DEFAULT_CHUNK_ROWS):
            scorer.score(arr.slice(s, Q.DEFAULT_CHUNK_ROWS))
        times.append(time.perf_counter() - t0)
    chars = int(sum(len(t) for t in texts))
    med = median(times)
    return {"docs": len(texts), "chars": chars, "reps": reps, "seconds": times,
            "median_s": med, "docs_per_s_per_core": len(texts) / med,
            "mb_per_s_per_core": chars / med / 1e6}


# ------------------------------------------------------------------ report
def report(res: dict) -> str:
    from datamask_pipeline.engine import quality as Q

    lines = ["# The default quality scorer: what separates good text from bad", "",
             f"Command: `{res['command']}`  ", f"Date: {res['date']}, {res['cpu']}, load "
             f"{res['loadavg']}", "",
             "AUC = P(a real document scores above a damaged one); 0.5 = no separation. Good "
             "text: docstrings of the Python standard library and the Python reference manual "
             "(`pydoc_data.topics`) are the *tuning* sources on which the combination was "
             "chosen; man pages rendered by `man` are *held out*. Bad text: "
             + ", ".join(f"`{k}`" for k in BAD_KINDS) + " made from other documents of the "
             "same source (see `bench/quality.py`).", ""]
    for name, m in res["sources"].items():
        role = "held out" if name == "man_pages" else "tuning"
        lines += [f"## {name} ({role}): {m['good']} good, {m['bad']} bad documents", "",
                  "Combinations are of the default signals.", "",
                  "| signal / combination | all bad | " + " | ".join(BAD_KINDS) + " |",
                  "|---|---|" + "---|" * len(BAD_KINDS)]
        for label, row in m["auc"].items():
            mark = " **(default)**" if label == f"combination:{Q.COMBINATION}" else ""
            mark += "" if label.startswith("combination:") or label in Q.DEFAULT_SIGNALS else \
                " (not in the default)"
            lines.append(f"| `{label}`{mark} | {row['all']:.3f} | "
                         + " | ".join(f"{row[k]:.3f}" for k in BAD_KINDS) + " |")
        g, b = m["default_score_good"], m["default_score_bad"]
        lines += ["", f"Default score, good: p10 {g['p10']}, median {g['median']}, p90 "
                      f"{g['p90']}; bad: p10 {b['p10']}, median {b['median']}, p90 {b['p90']}.",
                  ""]
    lines += ["## Choosing the signals and the combination", "",
              "Backward elimination on the tuning sources: starting from every signal, drop the "
              "one whose removal raises the mean over bad kinds of the AUC most, while it does "
              "not fall. The default is the best tuning result "
              f"(`{res['default']['combination']}` of "
              + ", ".join(f"`{x}`" for x in res["default"]["signals"]) + ").", "",
              "| combination | AUC, all signals (tuning) | kept | AUC kept (tuning) | "
              "AUC all signals (held out) | AUC kept (held out) |", "|---|---|---|---|---|---|"]
    for how, c in res["choice"].items():
        lines.append(f"| `{how}` | {c['all_signals_tuning']:.4f} | {', '.join(c['kept'])} | "
                     f"{c['tuning']:.4f} | {c['all_signals_held_out']:.4f} | "
                     f"{c['held_out']:.4f} |")
    lines.append("")
    t = res["throughput"]
    lines += ["## Throughput", "",
              f"`HeuristicScorer.score` at one thread on the {t['docs']:,} good documents "
              f"({t['chars'] / t['docs']:,.0f} characters each on average), median of "
              f"{t['reps']}: **{t['docs_per_s_per_core']:,.0f} documents/s per core** "
              f"({t['mb_per_s_per_core']:.2f} MB of text/s), i.e. "
              f"{1e9 / t['docs_per_s_per_core'] / 3600:,.0f} core-hours per 10⁹ such "
              f"documents. No GPU path: the scorer is string arithmetic.", ""]
    return "\n".join(lines)


MAIN_JOB_ALGORITHMS = ("Pair_simi", "DiSF", "Facility")


def run_main_job(n_good: int, files: int, seed: int, workdir: str,
                 algorithms=MAIN_JOB_ALGORITHMS) -> dict:
    """The README's main job on files of only ``id`` and ``text``: ``n_good`` held-out man
    pages and as many damaged documents made from other man pages (the bad kinds in turn),
    spread at random over ``files`` files. The measure is independent of the scorer: whether a
    selected document is a real page. Per diversity term: the share of real pages in the
    selection against random (the corpus's share) and the measure's top-k (1 while the budget
    is at most the real pages), and the gap closed between them."""
    from bench.common import main_job_on_texts

    rng = np.random.default_rng(seed)
    good = man_docs(n_good, seed)
    if not good:
        raise RuntimeError("no man pages on this machine (man, /usr/share/man)")
    donors = [good[i] for i in rng.permutation(len(good))]
    kinds = [BAD_KINDS[i % len(BAD_KINDS)] for i in range(len(good))]
    texts = good + [make_bad(d, k, rng) for d, k in zip(donors, kinds)]
    real = np.array([True] * len(good) + [False] * len(good))
    n = real.size
    ids = np.array([f"doc{i:06d}" for i in range(n)])
    file_of = rng.integers(0, files, size=n)
    k = int(round(0.1 * n))
    share_random = float(real.mean())
    share_top = float(min(1.0, real.sum() / k))
    out = {"good": len(good), "bad": len(good), "rows": n, "files": files, "budget_rows": k,
           "share_random": share_random, "share_topk": share_top, "cpu": cpu_model(),
           "algorithms": {}}
    out["by_combination"] = selection_by_combination(texts, real, k, algorithms)
    for algorithm in algorithms:
        rows, secs = main_job_on_texts(os.path.join(workdir, algorithm), ids, texts, file_of,
                                       ["--algorithm", algorithm])
        share = float(real[rows].mean())
        bad_kinds = {}
        for i in rows[~real[rows]]:
            kind = kinds[i - len(good)]
            bad_kinds[kind] = bad_kinds.get(kind, 0) + 1
        out["algorithms"][algorithm] = {
            "command": f"python -m datamask_pipeline.demo --data-root D --algorithm {algorithm}",
            "seconds": secs, "selected": int(rows.size), "share_real": share,
            "gap_closed": (share - share_random) / (share_top - share_random),
            "bad_selected_by_kind": bad_kinds}
        print(f"{algorithm}: {rows.size} selected, {share:.3f} real (random {share_random:.3f}), "
              f"gap closed {out['algorithms'][algorithm]['gap_closed']:.3f}, {secs:.0f}s",
              flush=True)
    return out


def selection_by_combination(texts: list, real: np.ndarray, k: int, algorithms) -> dict:
    """Why the combination matters beyond its AUC: the selection weighs the score's size
    (λ · mean quality against the diversity gain), so a damaged text that scores 0.6 instead of
    0.3 is cheap for a diversity term that likes it. Per combination of the default signals and
    per term: the share of real pages in the whole corpus's selection of k rows (the engine's
    select_shard, the pipeline profile at λ = 0.5: what ``gather`` runs, without deduplication)."""
    from types import SimpleNamespace

    from datamask_pipeline.engine import quality as Q
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.embed import load_embedder
    from datamask_pipeline.engine.select import select_shard

    x = load_embedder().embed(texts).astype(np.float32)
    deg = Q.degrees(Q.signals(texts))
    ids = np.array([f"doc{i:06d}" for i in range(len(texts))])
    out = {}
    for how in Q.COMBINATIONS:
        q = Q.combine(deg, how).astype(np.float32)
        shard = SimpleNamespace(embeddings=x, quality=q, ids=ids, n=len(texts))
        row = {"score_real_median": float(np.median(q[real])),
               "score_damaged_median": float(np.median(q[~real]))}
        for algorithm in algorithms:
            cfg = LearnerConfig.profile("pipeline", algorithm=algorithm, lamb=0.5,
                                        select_ratio=k / len(texts))
            sel = np.asarray(select_shard(shard, cfg, references=False).selected)
            idx = np.flatnonzero(sel) if sel.dtype == bool else sel
            row[algorithm] = float(real[idx].mean())
        out[how] = row
        print(f"combination {how}: " + ", ".join(f"{a} {row[a]:.3f}" for a in algorithms),
              flush=True)
    return out


def main_job_markdown(r: dict) -> str:
    lines = [f"{r['good']:,} man pages (held out from the scorer's tuning) and {r['bad']:,} "
             f"damaged documents made from other man pages, in {r['files']} files of only `id` "
             "and `text`, through the README's main job (quality scored from the text by the "
             f"default scorer, deduplicated, budget 10 %: {r['budget_rows']} rows). The measure "
             "is independent of the scorer: whether a selected document is a real page. Random "
             f"selects {r['share_random']:.0%} real pages, the measure's top-k "
             f"{r['share_topk']:.0%}.", "",
             "| run | selected | real pages | gap closed (random → top-k) | damaged kinds selected | seconds |",
             "|---|---:|---:|---:|---|---:|"]
    for a, v in r["algorithms"].items():
        kinds = ", ".join(f"{k} {c}" for k, c in sorted(v["bad_selected_by_kind"].items())) or "none"
        lines.append(f"| `{v['command']}` | {v['selected']} | {v['share_real']:.1%} | "
                     f"{v['gap_closed']:.3f} | {kinds} | {v['seconds']:.0f} |")
    from datamask_pipeline.engine import quality as Q

    algos = list(r["algorithms"])
    lines += ["", "Real pages in the selection by the heuristic's combination (the same corpus "
              "and budget, selected whole by the engine at λ = 0.5, no deduplication; median "
              "score of real and damaged documents):", "",
              "| combination | score real / damaged | " + " | ".join(algos) + " |",
              "|---|---|" + "---:|" * len(algos)]
    for how, row in r["by_combination"].items():
        mark = " **(default)**" if how == Q.COMBINATION else ""
        lines.append(f"| {how}{mark} | {row['score_real_median']:.3f} / "
                     f"{row['score_damaged_median']:.3f} | "
                     + " | ".join(f"{row[a]:.1%}" for a in algos) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--main-job", type=int, default=None, metavar="N",
                   help="instead: the README's main job on N man pages and N damaged documents "
                   "in id+text files, per diversity term (results_quality_main_job.json)")
    p.add_argument("--workdir", default="/tmp/quality_main_job")
    args = p.parse_args(argv)
    if args.main_job:
        from .common import write_report

        r = run_main_job(args.main_job, 8, 0, args.workdir)
        r["command"] = "python -m bench.quality --main-job " + str(args.main_job)
        md = main_job_markdown(r)
        print(md)
        write_report(args.out, "quality_main_job", r, md)
        return 0
    reps = args.reps or (1 if args.quick else 3)
    cmd = "python -m bench.quality" + (" --quick" if args.quick else "")
    sample = build_sample(args.quick)
    res = {"command": cmd, "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "cpu": cpu_model(), "loadavg": loadavg(), "python": platform.python_version(),
           **measure(sample)}
    everything = [t for s in sample.values() for t in s["good"]]
    res["throughput"] = throughput(everything, reps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results_quality.json").write_text(json.dumps(res, indent=1))
    (out / "REPORT_quality.md").write_text(report(res))
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
