"""Corpus dedup at scale (issue 24, item 3): one ~3 MB document among ordinary rows goes
through :func:`dedup.deduplicate` with bounded memory; a cluster of thousands of near-identical
rows compared in capped pieces keeps what it keeps whole; the k-means sample rule.

The memory test runs the dedup in a child process under an address-space limit, so code that
asks for a rows x longest-text array fails there with a MemoryError instead of filling the
machine; the child reads its own peak resident memory (``getrusage(RUSAGE_SELF).ru_maxrss``: the
real process, not Python's allocator, and no other child of the test process counts). Measured
on the code before this test (d5a19bf): the exact step grouped keys on ``keys.astype(str)`` and
asked numpy for 21 GiB (2,003 rows x a 2.8 M-character key x 4 bytes: MemoryError); with exact
off, its MinHash of the big document's ~370k 3-grams at once grew the process by ~630 MiB, over
GROWTH_BOUND. This code: peak ~340-410 MiB, the dedup's traced peak ~82 MiB."""

import json
import os
import re
import resource
import string
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from datamask_pipeline.engine.corpus.dedup import (_best_above, _cluster_best, deduplicate,
                                                   kmeans_sample)
from tests.engine.text_corpus import python_sentences

ROWS, DIM, BIG_BYTES = 2000, 32, 3_000_000
# the child's whole peak: the interpreter with numpy, pyarrow, faiss and datasketch (~150 MB),
# the corpus (~7 MB of text as Python strings, twice: the texts and their keys; the big
# document's key as a str of up to 4 bytes a character) and the dedup's growth below. 1 GiB is
# three times what this code needs and far under the old exact step's 21 GiB.
PEAK_BOUND = 2 << 30  # the interpreter and its libraries included; GROWTH_BOUND is the dedup's own
# the dedup's own growth (peak minus the resident memory before it, with the corpus built and
# the dedup's libraries imported): the big document's key (a few copies, ~40 MB), the 3-gram
# sets of the big document and of its copy (a containment check holds both: ~2 x 50 MB) and
# MinHash pieces (MINHASH_PIECE x 126 x 8 bytes = 16 MB each).
GROWTH_BOUND = 320 << 20
ADDRESS_LIMIT = 6 << 30  # a fail-safe for the machine: a text-width array stops here

CHILD = textwrap.dedent("""
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    from tests.engine.test_dedup_scale import big_corpus_result
    out = big_corpus_result()
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps(out))
""")


def big_document(n_bytes: int = BIG_BYTES) -> str:
    """A ~``n_bytes`` real-text document: CPython's reference manual (``pydoc_data``), its
    topics again and again, each paragraph's copy marked with its number after every 2nd word
    so that lines differ and most word 3-grams are distinct (~370k of them, about as many as a
    3 MB text of its own would have)."""
    from pydoc_data.topics import topics

    paras = [p for key in sorted(topics) for p in topics[key].split("\n\n") if p.strip()]
    out, size, i = [], 0, 0
    while size < n_bytes:
        p = re.sub(r"((?:\S+ ){2})", rf"\1p{i} ", paras[i % len(paras)])
        out.append(p)
        size += len(p) + 2
        i += 1
    return "\n\n".join(out)


def ordinary_texts(n: int) -> list:
    """``n`` distinct real texts: the manual's sentences, then its paragraphs."""
    from pydoc_data.topics import topics

    out = python_sentences(n)
    seen = set(out)
    for key in sorted(topics):
        for p in topics[key].split("\n\n"):
            if len(out) == n:
                return out
            if len(p.strip()) >= 80 and p.strip() not in seen:
                seen.add(p.strip())
                out.append(p.strip())
    return out


def big_corpus():
    """(x, q, ids, texts, planted): ROWS sentences and paragraphs of the manual, the big
    document, a copy of it in upper case (ASCII letters) with its spaces doubled (an exact
    duplicate), and a copy of a sentence (exact); embeddings random (no near duplicates),
    quality random."""
    rng = np.random.default_rng(3)
    sent = ordinary_texts(ROWS)
    assert len(sent) == ROWS
    big = big_document()
    shout = str.maketrans(string.ascii_lowercase, string.ascii_uppercase)  # lower() undoes it
    texts = sent + [big, big.translate(shout).replace(" ", "  "), sent[7]]
    n = len(texts)
    q = rng.uniform(0, 1, n)
    q[ROWS], q[7] = 2.0, 1.5  # the originals rank above every row equal to them
    q[ROWS + 1], q[ROWS + 2] = -1.0, -1.0
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    return x, q, np.arange(n), texts, {"big": (ROWS + 1, ROWS), "sentence": (ROWS + 2, 7)}


def big_corpus_result() -> dict:
    """The dedup of :func:`big_corpus` (run in the child): what was dropped, as what."""
    import pyarrow as pa

    import datasketch  # noqa: F401  (imported by the dedup: not part of its growth)
    import faiss  # noqa: F401
    import pyarrow.compute  # noqa: F401

    x, q, ids, texts, planted = big_corpus()
    n = len(texts)
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    import tracemalloc

    arr = pa.array(texts, pa.large_string())
    tracemalloc.start()  # numpy's and Python's allocations: the dedup's own, whatever the machine
    res = deduplicate(x, q, ids, np.zeros(n, dtype=np.int64), np.arange(n), arr,
                      rows_per_cluster=200)
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"dropped": {str(d["row"]): [d["dup_of_row"], d["reason"]] for d in res.dropped},
            "planted": planted, "rows": n, "big_len": len(texts[ROWS]), "rss_before": before,
            "traced_peak": traced_peak,
            "stats": {k: v for k, v in res.stats.items() if isinstance(v, (int, float, str))}}


def _child_env() -> dict:
    """The child's environment: the machine's basics only, not what earlier tests of this
    session left in ``os.environ`` (the measured peak must not depend on the test order)."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    return {**env, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def _run_child(limit: int = ADDRESS_LIMIT):
    """(the child's result or None, its stderr, its peak resident bytes or None): the big corpus
    deduplicated in a fresh interpreter whose address space is capped at ``limit``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-c", CHILD.format(limit=limit)], cwd=root,
                       capture_output=True, text=True, timeout=300,
                       env=_child_env())
    out = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
    return out, p.stderr, (out or {}).get("peak_rss")


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB and RLIMIT_AS: Linux")
def test_a_3mb_document_goes_through_the_dedup_with_bounded_memory():
    out, err, peak = _run_child()
    assert out is not None, (f"the dedup of one 3 MB document among {ROWS} rows failed:\n"
                             f"{err[-3000:]}")
    # the dedup's own allocations at their peak (tracemalloc: numpy and Python), not RSS
    # differences, which move with what else the machine holds (1 GiB in a loaded full suite)
    growth = out["traced_peak"]
    print(f"\npeak RSS of the child: {peak / 2**20:.0f} MiB, {growth / 2**20:.0f} MiB of it in "
          f"the dedup; {out['stats']}")
    assert out["big_len"] >= BIG_BYTES and out["rows"] == ROWS + 3
    # the long document's copy and the sentence's copy are exact duplicates of their originals
    for copy, orig in out["planted"].values():
        assert out["dropped"][str(copy)] == [orig, "exact"]
    assert peak < PEAK_BOUND, f"peak RSS {peak / 2**20:.0f} MiB >= {PEAK_BOUND / 2**20:.0f} MiB"
    assert growth < GROWTH_BOUND, f"the dedup grew by {growth / 2**20:.0f} MiB"


def _near_identical(m: int, dim: int = 24, seed: int = 1):
    """``m`` unit rows around 3 directions: two large groups of near-identical rows (cosine
    > 0.999 inside each) and a spread-out rest."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((2, dim))
    x = np.vstack([centres[rng.integers(0, 2, m - m // 4)]
                   + 0.01 * rng.standard_normal((m - m // 4, dim)),
                   rng.standard_normal((m // 4, dim))]).astype(np.float32)
    x = x[rng.permutation(m)]
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_capped_cluster_finds_the_near_identical_rows_of_the_whole_one():
    xm = _near_identical(2500)
    best, arg = _best_above(xm)
    cb, ca = _cluster_best(xm, cap=400)
    assert np.array_equal(_cluster_best(xm, cap=2500)[1], arg)  # under the cap: the same
    # every row's partner is ranked above it, and its cosine is the one stated
    rows = np.arange(1, xm.shape[0])
    assert (ca[rows] < rows).all()
    np.testing.assert_allclose(cb[rows], np.sum(xm[rows] * xm[ca[rows]], axis=1), atol=1e-5)
    # a row is a duplicate at 0.98 capped exactly when it is one whole (near-identical rows are
    # always near an anchor), and the capped cosine is never above the whole one
    assert np.array_equal(cb >= 0.98, best >= 0.98)
    assert (cb <= best + 1e-6).all()
    assert (best >= 0.98).sum() > 1500


def test_dedup_of_one_huge_cluster_keeps_what_the_uncapped_dedup_keeps():
    n = 3000
    x = _near_identical(n, seed=4)
    q = np.random.default_rng(2).uniform(0, 1, n)
    kw = dict(exact=False, fuzzy=False, rows_per_cluster=n, threshold=0.98)
    whole = deduplicate(x, q, np.arange(n), np.zeros(n, int), np.arange(n), **kw,
                        max_cluster_rows=n)
    capped = deduplicate(x, q, np.arange(n), np.zeros(n, int), np.arange(n), **kw,
                         max_cluster_rows=500)
    assert capped.stats["largest_cluster"] == n and capped.stats["clusters_capped"] == 1
    assert whole.stats["clusters_capped"] == 0
    assert np.array_equal(capped.keep[0], whole.keep[0])


def test_kmeans_sample_is_all_rows_up_to_the_limit_then_a_seeded_uniform_sample():
    assert kmeans_sample(10, 10, 0) is None
    s = kmeans_sample(1000, 100, 0)
    assert s.size == 100 and np.all(np.diff(s) > 0) and s[-1] < 1000
    assert np.array_equal(s, kmeans_sample(1000, 100, 0))
    assert not np.array_equal(s, kmeans_sample(1000, 100, 1))
    # the local engine trains on the sample: stated in its stats
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 8)).astype(np.float32)
    res = deduplicate(x, rng.uniform(0, 1, 600), np.arange(600), np.zeros(600, int),
                      np.arange(600), rows_per_cluster=100, kmeans_sample_rows=250)
    assert res.stats["clusters"] == 6 and res.stats["kmeans_sample"] == 250
    with pytest.raises(ValueError, match="max_cluster_rows"):
        deduplicate(x, np.ones(600), np.arange(600), np.zeros(600, int), np.arange(600),
                    max_cluster_rows=0)


def test_exact_dedup_groups_on_the_digest_and_tells_colliding_keys_apart(monkeypatch):
    """Equal keys (up to case, spaces and boilerplate) are grouped by their digest, the
    best-ranked stays; were every digest equal (a collision), distinct texts still stay apart."""
    import pyarrow as pa

    from datamask_pipeline.engine.corpus import dedup

    texts = ["Alpha beta gamma.", "ALPHA  beta gamma.", "delta epsilon", "Delta Epsilon ",
             "zeta", None, "", "alpha beta gamma."]
    n = len(texts)
    q = np.array([0.1, 0.9, 0.5, 0.4, 0.3, 0.2, 0.2, 0.8])

    def run():
        res = deduplicate(np.ones((n, 4), np.float32), q, np.arange(n), np.zeros(n, int),
                          np.arange(n), pa.array(texts), fuzzy=False, near=False,
                          boilerplate_min_docs=None)
        return {d["row"]: d["dup_of_row"] for d in res.dropped}

    want = {0: 1, 7: 1, 3: 2}  # each to its key's best-ranked row; null and empty texts stay
    assert run() == want
    monkeypatch.setattr(dedup, "key_digests",
                        lambda keys: np.zeros(len(keys), dtype=np.dtype((np.void, 16))))
    assert run() == want
