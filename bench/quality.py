"""What separates good text from bad, in every language: the default quality scorer measured
per language and per kind of damage (issue 25 items 1-3, 6), and its throughput in documents per
second per core, side by side with an earlier revision's.

    .venv/bin/python -m bench.quality --baseline HEAD   # results/results_quality.json, REPORT_quality.md
    .venv/bin/python -m bench.quality --quick --out DIR   # a small sample (tests/bench/test_quality_bench_smoke.py)
    .venv/bin/python -m bench.quality --main-job 100    # the main job on 100 real pages per language + damaged copies
    .venv/bin/python -m bench.quality --languages       # the language detectors compared (needs them installed)

**Good text** is real and offline: man pages under ``/usr/share/man`` (English) and
``/usr/share/man/<lang>`` (:data:`LANGUAGES`) rendered by ``man`` (``col -b``), when the machine
has them, and two English sources, docstrings of the Python standard library and the Python
reference manual (``pydoc_data.topics``, cut into documents of a few paragraphs). A page's
language is its directory's (some translated pages are partly English: the scorer detects each
document's language itself). **Bad text** is made from other good documents of the same source,
one kind at a time:

- ``boilerplate``: navigation, cookie, share and copyright lines around one real sentence;
- ``repeated_lines``: a few lines of a document repeated until it is as long as the original;
- ``shuffled_words``: the words of a document in random order (same words, no syntax);
- ``keyword_list``: the document's words as a comma- or line-separated keyword list;
- ``truncated``: the first 3 to 12 words of a document, cut mid-sentence;
- ``symbol_soup``: characters drawn from punctuation, digits, letters and ``#``;
- ``mixed``: the real document with a third of its lines replaced by boilerplate lines (mild
  damage: does the score still rank the clean page above it?).

The separation measure is the AUC (the probability that a random good document scores above a
random bad one; 0.5 = no separation, ties count half), per signal (on its degree, over the
documents it applies to) and per combination, over all bad kinds and per kind. Ties: the share
of real documents scoring exactly 1.0 and the share of distinct scores. Throughput:
``engine.quality.HeuristicScorer.score`` on the sample at one thread, documents per second per
core, and with ``--baseline REV`` the same texts scored by that revision's scorer (its
``datamask_pipeline`` from ``git archive``, in a subprocess) in the same run.
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


def man_docs(n: int, seed: int = 0, max_chars: int = 20000, lang: str = "en") -> list[str]:
    """``n`` man pages (sections 1, 5, 8) in ``lang`` (``en``: ``/usr/share/man/man*``, else
    ``/usr/share/man/<lang>/man*``) rendered by ``man -l`` and ``col -b``; empty when the
    machine has no such man pages or no ``man``."""
    root = Path("/usr/share/man") if lang == "en" else Path("/usr/share/man") / lang
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


# man page directories measured (``en``: /usr/share/man itself), and the ISO 639-1 code the
# detector should give for each
LANGUAGES = ("en", "de", "fr", "es", "it", "nl", "pl", "ru", "sv", "pt_BR", "ja", "zh_CN")
ISO = {"pt_BR": "pt", "zh_CN": "zh"}
# the done-when bar's languages (issue 25): real pages in at least four languages
MAIN_LANGUAGES = ("en", "de", "fr", "es")


def build_sample(quick: bool, seed: int = 0, n_man: int | None = None,
                 languages=LANGUAGES) -> dict:
    """{source: {"good": [...], "bad": [...], "bad_kind": [...], "language": code}}: each
    source's good documents (``man_<lang>`` per language, and the two English Python sources),
    and as many bad ones made from a shuffled copy of them, the kinds in turn."""
    rng = np.random.default_rng(seed)
    n_man = n_man or (25 if quick else 200)
    sources = {f"man_{lang}": (man_docs(n_man, seed, lang=lang), ISO.get(lang, lang))
               for lang in languages}
    sources["docstrings"] = (docstring_docs(), "en")
    sources["reference"] = (reference_docs(), "en")
    if quick:
        sources = {k: (v[:25], lang) for k, (v, lang) in sources.items()}
    out = {}
    for name, (good, lang) in sources.items():
        if len(good) < 2:
            continue
        donors = [good[i] for i in rng.permutation(len(good))]
        kinds = [BAD_KINDS[i % len(BAD_KINDS)] for i in range(len(good))]
        bad = [make_bad(d, k, rng) for d, k in zip(donors, kinds)]
        out[name] = {"good": good, "bad": bad, "bad_kind": kinds, "language": lang}
    return out


# ------------------------------------------------------------------ measures
def _auc(good, bad) -> float:
    """P(a good score > a bad score), ties counting half: the Mann-Whitney U statistic over
    n_good * n_bad, from average ranks (numpy only)."""
    good, bad = np.asarray(good, float), np.asarray(bad, float)
    if not len(good) or not len(bad):
        return float("nan")
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


def _scored(texts: list) -> tuple:
    """(degrees, languages, {combination: scores}) of ``texts`` by the engine's scorer."""
    from datamask_pipeline.engine import quality as Q

    langs = Q.detect_languages(texts)
    deg = Q.degrees(Q.signals(texts, langs), langs)
    return deg, langs, {c: Q.combine(deg, c) for c in Q.COMBINATIONS}


def measure(sample: dict) -> dict:
    """Per source: each signal's AUC (on its degree, over the documents it applies to; all bad
    kinds, and per kind) and each combination's; the default score's quantiles, ties and the
    languages the detector found."""
    from datamask_pipeline.engine import quality as Q

    out = {}
    for name, s in sample.items():
        dg, lg, cg = _scored(s["good"])
        db, lb, cb = _scored(s["bad"])
        kinds = np.asarray(s["bad_kind"])
        rows = {}
        for sig in dg:
            g, b = dg[sig], db[sig]
            if np.isnan(g).all() or np.isnan(b).all():
                continue
            rows[sig] = {"all": _auc(g[~np.isnan(g)], b[~np.isnan(b)]),
                         **{k: _auc(g[~np.isnan(g)], b[(kinds == k) & ~np.isnan(b)])
                            for k in BAD_KINDS},
                         "applies_good": float(np.mean(~np.isnan(g)))}
        for c in Q.COMBINATIONS:
            g, b = cg[c], cb[c]
            rows[f"combination:{c}"] = {"all": _auc(g, b),
                                        **{k: _auc(g, b[kinds == k]) for k in BAD_KINDS}}
        g = cg[Q.COMBINATION]
        detected = dict(zip(*np.unique(lg.astype(str), return_counts=True)))
        out[name] = {"good": len(s["good"]), "bad": len(s["bad"]), "language": s["language"],
                     "auc": rows,
                     "default_score_good": _quantiles(g),
                     "default_score_bad": _quantiles(cb[Q.COMBINATION]),
                     "good_at_1": float(np.mean(g == 1.0)),
                     "good_distinct": float(len(np.unique(g)) / len(g)),
                     "detected_good": {k: int(v) for k, v in sorted(
                         detected.items(), key=lambda kv: -kv[1])},
                     "detected_as_language": float(np.mean(lg == s["language"]))}
    return {"sources": out,
            "default": {"combination": Q.COMBINATION, "signals": list(Q.DEFAULT_SIGNALS)}}


def _quantiles(x) -> dict:
    q = np.quantile(np.asarray(x, float), [0.1, 0.5, 0.9])
    return {"p10": round(float(q[0]), 4), "median": round(float(q[1]), 4),
            "p90": round(float(q[2]), 4)}


_TIMER = r"""
import json, sys, time
import pyarrow as pa
pa.set_cpu_count(1)
pa.set_io_thread_count(1)
import torch
torch.set_num_threads(1)
from datamask_pipeline.engine import quality as Q
texts = json.load(open(sys.argv[1]))
reps = int(sys.argv[2])
scorer = Q.HeuristicScorer()
arr = pa.array(texts, pa.large_string())
scorer.score(arr.slice(0, 64))  # models loaded before the clock starts
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    for s in range(0, len(arr), Q.DEFAULT_CHUNK_ROWS):
        scorer.score(arr.slice(s, Q.DEFAULT_CHUNK_ROWS))
    times.append(time.perf_counter() - t0)
print(json.dumps({"file": Q.__file__, "seconds": times}))
"""


def throughput(texts: list, reps: int, source: str | None = None) -> dict:
    """HeuristicScorer.score on ``texts`` in chunks of 8,192, one thread (pyarrow and torch),
    in a fresh subprocess importing ``datamask_pipeline`` from ``source`` (default this tree):
    median of ``reps`` rounds."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "texts.json")
        Path(path).write_text(json.dumps(texts))
        env = {**os.environ, "PYTHONPATH": source or str(REPO), "OMP_NUM_THREADS": "1"}
        r = subprocess.run([sys.executable, "-c", _TIMER, path, str(reps)], env=env,
                           capture_output=True, text=True, cwd=tmp)
        if r.returncode:
            raise RuntimeError(f"the throughput run failed: {r.stderr[-2000:]}")
        got = json.loads(r.stdout.strip().splitlines()[-1])
    times = got["seconds"]
    chars = int(sum(len(t) for t in texts))
    med = median(times)
    return {"docs": len(texts), "chars": chars, "reps": reps, "seconds": times,
            "median_s": med, "docs_per_s_per_core": len(texts) / med,
            "mb_per_s_per_core": chars / med / 1e6}


def baseline_throughput(rev: str, texts: list, reps: int) -> dict:
    """:func:`throughput` of revision ``rev``'s scorer (``git archive rev datamask_pipeline``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        arch = subprocess.run(["git", "archive", rev, "datamask_pipeline"], cwd=REPO,
                              capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=arch, check=True)
        sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.strip()
        return {"rev": rev, "commit": sha, **throughput(texts, reps, tmp)}


# ------------------------------------------------------------------ the language detectors
def compare_detectors(n: int = 40, seed: int = 1, chars: int = 2000) -> dict:
    """Accuracy (the page's directory as truth) and documents/s of the offline language
    detectors on ``n`` man pages per language (those that are installed)."""
    items = [(ISO.get(lang, lang), d[:chars]) for lang in LANGUAGES
             for d in man_docs(n, seed, lang=lang)]
    out = {"pages": len(items), "chars": chars, "detectors": {}}

    def run(name, f):
        t0 = time.perf_counter()
        pred = f([t for _, t in items])
        dt = time.perf_counter() - t0
        ok = np.array([p == g for (g, _), p in zip(items, pred)])
        out["detectors"][name] = {"accuracy": float(ok.mean()), "docs_per_s": len(items) / dt}

    from datamask_pipeline.engine import quality_signals as S

    S.detect_languages(["warm up"])
    run("py3langid, batched (engine.quality_signals)", lambda ts: list(S.detect_languages(ts)))
    try:
        import py3langid

        run("py3langid 0.4 classify, text by text",
            lambda ts: [py3langid.classify(t)[0] for t in ts])
    except ImportError:
        pass
    try:
        import langdetect

        langdetect.DetectorFactory.seed = 0

        def ld(t):
            try:
                return langdetect.detect(t).split("-")[0]
            except Exception:  # langdetect raises on text without features
                return "und"

        run("langdetect 1.0.9", lambda ts: [ld(t) for t in ts])
    except ImportError:
        pass
    try:
        from lingua import LanguageDetectorBuilder

        det = LanguageDetectorBuilder.from_all_languages().build()

        def li(t):
            r = det.detect_language_of(t)
            return r.iso_code_639_1.name.lower() if r else "und"

        run("lingua-language-detector", lambda ts: [li(t) for t in ts])
    except ImportError:
        pass
    return out


# ------------------------------------------------------------------ report
def report(res: dict) -> str:
    from datamask_pipeline.engine import quality as Q

    lines = ["# The default quality scorer, per language: what separates good text from bad", "",
             f"Command: `{res['command']}`  ", f"Date: {res['date']}, {res['cpu']}, load "
             f"{res['loadavg']}", "",
             "AUC = P(a real document scores above a damaged one); 0.5 = no separation. Good "
             "text: man pages rendered by `man`, per language directory (`man_<lang>`), and two "
             "English Python sources (standard-library docstrings, the reference manual). Bad "
             "text: " + ", ".join(f"`{k}`" for k in BAD_KINDS) + " made from other documents of "
             "the same source (see `bench/quality.py`). Default: the "
             f"`{res['default']['combination']}` of the signals that apply to each document.",
             "", "## The default score per source", "",
             "| source | language | real / damaged | AUC | " + " | ".join(BAD_KINDS)
             + " | median real / damaged | real at exactly 1.0 | distinct real scores | "
             "detected as the language |",
             "|---|---|---|---:|" + "---:|" * len(BAD_KINDS) + "---|---:|---:|---:|"]
    for name, m in res["sources"].items():
        row = m["auc"][f"combination:{Q.COMBINATION}"]
        lines.append(f"| {name} | {m['language']} | {m['good']} / {m['bad']} | "
                     f"{row['all']:.3f} | " + " | ".join(f"{row[k]:.3f}" for k in BAD_KINDS)
                     + f" | {m['default_score_good']['median']:.3f} / "
                     f"{m['default_score_bad']['median']:.3f} | {m['good_at_1']:.1%} | "
                     f"{m['good_distinct']:.1%} | {m['detected_as_language']:.0%} |")
    lines += ["", "## Combinations (AUC over all damage kinds)", "",
              "| source | " + " | ".join(Q.COMBINATIONS) + " |",
              "|---|" + "---:|" * len(Q.COMBINATIONS)]
    for name, m in res["sources"].items():
        lines.append(f"| {name} | " + " | ".join(
            f"{m['auc'][f'combination:{c}']['all']:.3f}" for c in Q.COMBINATIONS) + " |")
    lines += ["", "## Each signal's AUC on its own (over the documents it applies to)", "",
              "| signal | " + " | ".join(res["sources"]) + " |",
              "|---|" + "---:|" * len(res["sources"])]
    for sig in Q.DEFAULT_SIGNALS:
        cells = [f"{m['auc'][sig]['all']:.2f}" if sig in m["auc"] else "off"
                 for m in res["sources"].values()]
        lines.append(f"| `{sig}` | " + " | ".join(cells) + " |")
    t = res["throughput"]
    lines += ["", "## Throughput", "",
              f"`HeuristicScorer.score` at one thread on the {t['docs']:,} good documents "
              f"({t['chars'] / t['docs']:,.0f} characters each on average), median of "
              f"{t['reps']}: **{t['docs_per_s_per_core']:,.0f} documents/s per core** "
              f"({t['mb_per_s_per_core']:.2f} MB of text/s), i.e. "
              f"{1e9 / t['docs_per_s_per_core'] / 3600:,.0f} core-hours per 10⁹ such "
              f"documents. No GPU path: the scorer is string arithmetic."]
    if res.get("baseline"):
        b = res["baseline"]
        lines += ["", f"The same texts, same run, scored by revision `{b['rev']}` "
                      f"({b['commit']}, the English-only scorer): "
                      f"{b['docs_per_s_per_core']:,.0f} documents/s per core."]
    lines.append("")
    return "\n".join(lines)


def docs_markdown(res: dict) -> str:
    """The measured lines docs/quality.md shows (tests/engine/test_docs.py keeps them equal to
    the committed results_quality.json)."""
    from datamask_pipeline.engine import quality as Q

    lines = ["| source | language | real / damaged | AUC | AUC, mildly damaged (`mixed`) | "
             "median real / damaged | real at exactly 1.0 |", "|---|---|---|---:|---:|---|---:|"]
    for name, m in res["sources"].items():
        row = m["auc"][f"combination:{Q.COMBINATION}"]
        lines.append(f"| {name} | {m['language']} | {m['good']} / {m['bad']} | "
                     f"{row['all']:.3f} | {row['mixed']:.3f} | "
                     f"{m['default_score_good']['median']:.3f} / "
                     f"{m['default_score_bad']['median']:.3f} | {m['good_at_1']:.1%} |")
    t = res["throughput"]
    line = (f"Throughput at one thread on the {t['docs']:,} real documents "
            f"({t['chars'] / t['docs']:,.0f} characters each on average): "
            f"**{t['docs_per_s_per_core']:,.0f} documents/s per core**")
    if res.get("baseline"):
        b = res["baseline"]
        line += (f"; the English-only scorer (`{b['commit']}`) on the same texts in the same "
                 f"run: {b['docs_per_s_per_core']:,.0f}")
    return "\n".join(lines + ["", line + "."])


MAIN_JOB_ALGORITHMS = ("Pair_simi", "DiSF", "Facility")


def language_corpus(n_per_lang: int, seed: int, languages=MAIN_LANGUAGES) -> dict:
    """Real man pages, ``n_per_lang`` per language, and as many damaged copies of other pages
    of the same language (the kinds in turn): texts, real (bool), language, kind."""
    rng = np.random.default_rng(seed)
    texts, real, lang, kind = [], [], [], []
    for lg in languages:
        good = man_docs(n_per_lang, seed, lang=lg)
        if not good:
            raise RuntimeError(f"no man pages in {lg} on this machine (man, /usr/share/man)")
        donors = [good[i] for i in rng.permutation(len(good))]
        kinds = [BAD_KINDS[i % len(BAD_KINDS)] for i in range(len(good))]
        texts += good + [make_bad(d, k, rng) for d, k in zip(donors, kinds)]
        real += [True] * len(good) + [False] * len(good)
        lang += [lg] * (2 * len(good))
        kind += ["real"] * len(good) + kinds
    return {"texts": texts, "real": np.array(real), "language": np.array(lang),
            "kind": np.array(kind)}


def _selection_measure(rows: np.ndarray, c: dict) -> dict:
    """What a selection (row positions) holds: damaged share and kinds, and per language its
    real pages against their fair share (the language's share of the real pages, times the
    rows selected)."""
    real, lang = c["real"], c["language"]
    k = len(rows)
    per = {}
    for lg in dict.fromkeys(lang.tolist()):
        fair = k * (real & (lang == lg)).sum() / real.sum()
        got = int((real[rows] & (lang[rows] == lg)).sum())
        per[lg] = {"real_selected": got, "fair_share": float(fair),
                   "of_fair_share": float(got / fair) if fair else float("nan")}
    bad = {}
    for i in rows[~real[rows]]:
        bad[str(c["kind"][i])] = bad.get(str(c["kind"][i]), 0) + 1
    return {"selected": int(k), "damaged_share": float((~real[rows]).mean()) if k else 0.0,
            "damaged_by_kind": bad, "languages": per}


def run_main_job(n_per_lang: int, files: int, seed: int, workdir: str,
                 algorithms=MAIN_JOB_ALGORITHMS, languages=MAIN_LANGUAGES) -> dict:
    """The README's main job on files of only ``id`` and ``text``: ``n_per_lang`` real man pages
    per language and as many damaged copies (the bad kinds in turn), spread at random over
    ``files`` files, budget 10%. The measure is independent of the scorer: whether a selected
    document is a real page, and of which language. Per diversity term: the damaged share of the
    selection and each language's real pages against their fair share; and the quality the
    main job computed (the features' ``quality`` column): its AUC per language."""
    import pyarrow.parquet as pq

    from bench.common import main_job_on_texts

    c = language_corpus(n_per_lang, seed, languages)
    rng = np.random.default_rng(seed)
    texts, real = c["texts"], c["real"]
    n = real.size
    ids = np.array([f"doc{i:06d}" for i in range(n)])
    file_of = rng.integers(0, files, size=n)
    k = int(round(0.1 * n))
    out = {"languages": list(languages), "per_language": n_per_lang, "rows": n,
           "real": int(real.sum()), "files": files, "budget_rows": k, "cpu": cpu_model(),
           "algorithms": {}}
    out["by_combination"] = selection_by_combination(c, k, algorithms)
    # the same whole-corpus selection with a perfect score: what no combination beats
    out["by_combination_oracle"] = out["by_combination"].pop("oracle")
    for algorithm in algorithms:
        root = os.path.join(workdir, algorithm)
        rows, secs = main_job_on_texts(root, ids, texts, file_of, ["--algorithm", algorithm])
        m = _selection_measure(rows, c)
        out["algorithms"][algorithm] = {
            "command": f"python -m datamask_pipeline.demo --data-root D --algorithm {algorithm}",
            "seconds": secs, **m}
        print(f"{algorithm}: {rows.size} selected, damaged {m['damaged_share']:.3f}, "
              + ", ".join(f"{lg} {v['of_fair_share']:.2f}" for lg, v in m["languages"].items())
              + f", {secs:.0f}s", flush=True)
    # what a perfect score would do for each term: the job's own deduplicated rows and vectors
    # selected again in-process, with the quality it computed (the job's selection, as a check)
    # and with an oracle's (1 for a real page, 0 for a damaged one)
    for algorithm in algorithms:
        out["algorithms"][algorithm]["reselected"] = reselect(os.path.join(workdir, algorithm),
                                                              algorithm, c, ids)
    # the quality the main job computed, read back from its features: AUC per language
    feats = sorted(Path(workdir, algorithms[0], "features").glob("*.parquet"))
    pos = {d: i for i, d in enumerate(ids.tolist())}
    q = np.full(n, np.nan)
    for f in feats:
        t = pq.read_table(f, columns=["id", "quality"])
        q[[pos[d] for d in t.column("id").to_pylist()]] = t.column("quality").to_numpy()
    out["computed_quality_auc"] = {
        lg: _auc(q[real & (c["language"] == lg)], q[~real & (c["language"] == lg)])
        for lg in languages}
    out["computed_quality_rows"] = int(np.isfinite(q).sum())
    return out


def reselect(root: str, algorithm: str, c: dict, ids) -> dict:
    """The main job under ``root`` selected again in-process (engine ``select_shard``, the
    pipeline profile, the job's λ and k) on its own features less the rows its deduplication
    dropped, read as the corpus stage reads them (``read_shard`` centered by the corpus's
    language sums: the vectors the job selected on), once with the quality the job computed
    (``same_as_job``: the job's selection reproduced) and once with an oracle's quality: 1 for
    a real page, 0 for a damaged one, the score that separates them perfectly. What the term
    selects under the oracle is damage that no better heuristic score removes (a damaged pick
    costs it the most quality a score in [0, 1] can charge); only the selection (λ, pruning,
    the term) can."""
    import pyarrow.parquet as pq
    from types import SimpleNamespace

    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.data import Columns, read_shard
    from datamask_pipeline.engine.embed import LanguageSums, read_language_sums
    from datamask_pipeline.engine.select import select_shard

    info = json.loads(Path(root, "corpus", "selection.json").read_text())
    pos = {d: i for i, d in enumerate(np.asarray(ids).tolist())}
    dup_file = Path(root, "corpus", "duplicates.parquet")
    dup = set(pq.read_table(dup_file, columns=["id"]).column("id").to_pylist()
              if dup_file.exists() else [])
    files = [str(f) for f in sorted(Path(root, "features").glob("*.parquet"))]
    # the vectors as the corpus stage reads them: centered by the corpus's language means
    sums = LanguageSums.total(read_language_sums(f) for f in files)
    rows, q, x = [], [], []
    for f in files:
        shard = read_shard(f, Columns(id="id", quality=("quality",), embedding="embedding"),
                           language_sums=sums)
        keep = np.array([d not in dup for d in np.asarray(shard.ids).tolist()], bool)
        rows += [pos[d] for d in np.asarray(shard.ids)[keep].tolist()]
        q.append(np.asarray(shard.quality, np.float64)[keep])
        x.append(np.asarray(shard.embeddings, np.float32)[keep])
    rows, q, x = np.asarray(rows, np.int64), np.concatenate(q), np.concatenate(x)
    job = {pos[d] for f in sorted(Path(root, "selected").glob("*.parquet"))
           for d in pq.read_table(f, columns=["id"]).column("id").to_pylist()}
    cfg = LearnerConfig.profile("pipeline", algorithm=algorithm, lamb=float(info["lamb"]),
                                select_ratio=int(info["k"]) / len(rows))
    out = {"rows": int(len(rows)), "k": int(info["k"]), "lamb": float(info["lamb"])}
    for name, quality in (("computed", q), ("oracle", c["real"][rows].astype(np.float64))):
        shard = SimpleNamespace(embeddings=x, quality=quality.astype(np.float32),
                                ids=np.asarray(ids)[rows], n=len(rows))
        sel = np.asarray(select_shard(shard, cfg, references=False).selected)
        got = rows[np.flatnonzero(sel) if sel.dtype == bool else sel]
        out[name] = _selection_measure(got, c)
        if name == "computed":
            out["same_as_job"] = set(got.tolist()) == job
    print(f"{algorithm} reselected: same as the job {out['same_as_job']}, with an oracle score "
          f"damaged {out['oracle']['damaged_share']:.3f}", flush=True)
    return out


def selection_by_combination(c: dict, k: int, algorithms) -> dict:
    """Why the combination matters beyond its AUC: the selection weighs the score's size
    (λ · mean quality against the diversity gain), so a damaged text that scores 0.6 instead of
    0.3 is cheap for a diversity term that likes it. Per combination and per term: what the
    whole corpus's selection of k rows holds (the engine's select_shard, the pipeline profile
    at λ = 0.5: what ``gather`` runs, without deduplication), on the vectors the features
    carry by default: centered by the detected language over the whole corpus; and the same
    for an oracle's score (key ``oracle``: 1 for a real page, 0 for a damaged one)."""
    from types import SimpleNamespace

    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.embed import language_centering, load_embedder
    from datamask_pipeline.engine.select import select_shard

    texts, real, lang = c["texts"], c["real"], c["language"]
    x = load_embedder().embed(texts).astype(np.float32)
    _, detected, scores = _scored(texts)
    # the geometry the features carry by default (contract embedding_language_geometry center)
    x = language_centering([x], detected).apply(x, 0)
    ids = np.array([f"doc{i:06d}" for i in range(len(texts))])
    scores = {**scores, "oracle": real.astype(np.float64)}
    out = {}
    for how, q in scores.items():
        q = q.astype(np.float32)
        shard = SimpleNamespace(embeddings=x, quality=q, ids=ids, n=len(texts))
        row = {"score_real_median": {lg: float(np.median(q[real & (lang == lg)]))
                                     for lg in dict.fromkeys(lang.tolist())},
               "score_damaged_median": float(np.median(q[~real])),
               "auc": {lg: _auc(q[real & (lang == lg)], q[~real & (lang == lg)])
                       for lg in dict.fromkeys(lang.tolist())}}
        for algorithm in algorithms:
            cfg = LearnerConfig.profile("pipeline", algorithm=algorithm, lamb=0.5,
                                        select_ratio=k / len(texts))
            sel = np.asarray(select_shard(shard, cfg, references=False).selected)
            idx = np.flatnonzero(sel) if sel.dtype == bool else sel
            row[algorithm] = _selection_measure(idx, c)
        out[how] = row
        print(f"combination {how}: " + ", ".join(
            f"{a} damaged {row[a]['damaged_share']:.3f}" for a in algorithms), flush=True)
    return out


def _fair(m: dict) -> str:
    return ", ".join(f"{lg} {v['real_selected']} ({v['of_fair_share']:.2f})"
                     for lg, v in m["languages"].items())


def main_job_markdown(r: dict) -> str:
    from datamask_pipeline.engine import quality as Q

    langs = ", ".join(r["languages"])
    lines = [f"{r['per_language']:,} man pages per language ({langs}: {r['real']:,} real "
             f"pages) and as many damaged copies of other pages of the same language, in "
             f"{r['files']} files of only `id` and `text`, through the README's main job "
             "(language and quality computed from the text by the default scorer, "
             f"deduplicated, budget 10 %: {r['budget_rows']} rows). The measure is independent "
             "of the scorer: whether a selected document is a real page, and of which language. "
             "A language's fair share is its share of the real pages times the rows selected; "
             "in brackets, the real pages selected over that share.", "",
             "The quality the main job computed (the features' `quality` column, "
             f"{r['computed_quality_rows']:,} rows), real against damaged pages: AUC "
             + ", ".join(f"{lg} **{a:.3f}**" for lg, a in r["computed_quality_auc"].items())
             + ".", "",
             "| run | selected | damaged selected | damaged kinds | real pages per language "
             "(of fair share) | seconds |",
             "|---|---:|---:|---|---|---:|"]
    for a, v in r["algorithms"].items():
        kinds = ", ".join(f"{k} {c}" for k, c in sorted(v["damaged_by_kind"].items())) or "none"
        lines.append(f"| `{v['command']}` | {v['selected']} | {v['damaged_share']:.1%} | "
                     f"{kinds} | {_fair(v)} | {v['seconds']:.0f} |")
    algos = [a for a in r["algorithms"]]
    if all("reselected" in v for v in r["algorithms"].values()):
        lines += ["", "What a perfect score would do: each job's deduplicated rows and vectors "
                  "selected again in-process (the pipeline profile, the job's λ and k), with the "
                  "quality the job computed (does it reproduce the job's selection?) and with an "
                  "oracle's, 1 for a real page and 0 for a damaged one: the damaged pages a term "
                  "still takes then are its own choice, which no better score removes:", "",
                  "| term | rows after deduplication | job's selection reproduced | oracle score: "
                  "damaged selected | damaged kinds | real pages per language (of fair share) |",
                  "|---|---:|---|---:|---|---|"]
        for a, v in r["algorithms"].items():
            o = v["reselected"]
            kinds = ", ".join(f"{k} {c}" for k, c in
                              sorted(o["oracle"]["damaged_by_kind"].items())) or "none"
            lines.append(f"| {a} | {o['rows']} | {'yes' if o['same_as_job'] else 'no'} | "
                         f"{o['oracle']['damaged_share']:.1%} | {kinds} | {_fair(o['oracle'])} |")
    lines += ["", "By the heuristic's combination (the same corpus and budget, selected whole by "
              "the engine at λ = 0.5, no deduplication): the AUC per language, and per term the "
              "damaged share of the selection and the lowest language's real pages over its "
              "fair share:", "",
              "| combination | AUC per language | " + " | ".join(algos) + " |",
              "|---|---|" + "---|" * len(algos)]
    rows = dict(r["by_combination"])
    if "by_combination_oracle" in r:
        rows["oracle"] = r["by_combination_oracle"]
    for how, row in rows.items():
        mark = (" **(default)**" if how == Q.COMBINATION else
                " (not a combination: 1 for a real page, 0 for a damaged one)"
                if how == "oracle" else "")
        auc = ", ".join(f"{lg} {v:.3f}" for lg, v in row["auc"].items())
        cells = [f"{row[a]['damaged_share']:.1%} damaged, lowest "
                 f"{min(v['of_fair_share'] for v in row[a]['languages'].values()):.2f}"
                 for a in algos]
        lines.append(f"| {how}{mark} | {auc} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--per-language", type=int, default=None, metavar="N",
                   help="man pages per language (default 200; --quick 25)")
    p.add_argument("--baseline", default=None, metavar="REV",
                   help="also time REV's scorer on the same texts (git archive), same run")
    p.add_argument("--main-job", type=int, default=None, metavar="N",
                   help="instead: the README's main job on N real man pages per language "
                   "(en, de, fr, es) and as many damaged copies, in id+text files "
                   "(results_quality_main_job.json)")
    p.add_argument("--languages", action="store_true",
                   help="instead: compare the offline language detectors "
                   "(results_quality_languages.json)")
    p.add_argument("--workdir", default="/tmp/quality_main_job")
    args = p.parse_args(argv)
    from .common import write_report

    if args.main_job:
        r = run_main_job(args.main_job, 8, 0, args.workdir)
        r["command"] = "python -m bench.quality --main-job " + str(args.main_job)
        md = main_job_markdown(r)
        print(md)
        write_report(args.out, "quality_main_job", r, md)
        return 0
    if args.languages:
        r = compare_detectors()
        r["command"] = "python -m bench.quality --languages"
        md = "\n".join([f"{r['pages']} man pages ({', '.join(LANGUAGES)}; first {r['chars']} "
                        "characters; truth: the page's directory, though some translated pages "
                        "are partly English):", "", "| detector | accuracy | documents/s |",
                        "|---|---:|---:|"] + [f"| {k} | {v['accuracy']:.3f} | "
                                             f"{v['docs_per_s']:,.0f} |"
                                             for k, v in r["detectors"].items()])
        print(md)
        write_report(args.out, "quality_languages", r, md)
        return 0
    reps = args.reps or (1 if args.quick else 3)
    cmd = "python -m bench.quality" + (" --quick" if args.quick else "") + (
        f" --per-language {args.per_language}" if args.per_language else "") + (
        f" --baseline {args.baseline}" if args.baseline else "")
    sample = build_sample(args.quick, n_man=args.per_language)
    res = {"command": cmd, "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "cpu": cpu_model(), "loadavg": loadavg(), "python": platform.python_version(),
           **measure(sample)}
    everything = [t for s in sample.values() for t in s["good"]]
    res["throughput"] = throughput(everything, reps)
    if args.baseline:
        res["baseline"] = baseline_throughput(args.baseline, everything, reps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results_quality.json").write_text(json.dumps(res, indent=1))
    (out / "REPORT_quality.md").write_text(report(res))
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
