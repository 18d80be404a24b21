"""A realistic synthetic corpus in the shard format of :mod:`data` (vectorised, deterministic).

Structure, chosen so that the selection problem of docs/method.md#problem shows up:

* topic clusters around unit-norm centres that share a common direction (real sentence
  embeddings are anisotropic), with uneven sizes (log-normal weights);
* three tightness levels: *tight* clusters are near-duplicates (cosine ~0.99, the same text
  template: boilerplate), *medium* ones, and *diffuse* ones;
* quality correlated with the cluster: tight clusters score high, diffuse ones lower, so
  quality-only top-k concentrates on near-duplicates, which is what joint selection fixes;
* ~5% noise rows: random directions, low quality, random topic and source;
* per-row noise on quality, a text that mentions the row's topic, and a source domain; rows
  outside tight clusters add a sentence of their own (words drawn per row), so only the
  boilerplate of tight clusters is duplicate text.

Columns: ``chunk_id`` int64 (``id_offset + arange(n)``), ``quality_score`` float64 in [0, 1],
``feature_arr`` fixed_size_list<float32>[dim] (unit norm), ``text`` string, ``source`` string.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import storage

__all__ = ["TOPICS", "SOURCES", "make_table", "generate_corpus"]

SOURCES = ("web", "code", "wiki", "news", "forum")

# (topic, the source it usually comes from)
TOPICS = (
    ("python programming", "code"), ("rust compilers", "code"), ("database indexing", "code"),
    ("web frameworks", "code"), ("shell scripting", "code"), ("machine learning", "code"),
    ("linear algebra", "wiki"), ("number theory", "wiki"), ("organic chemistry", "wiki"),
    ("cell biology", "wiki"), ("plate tectonics", "wiki"), ("roman history", "wiki"),
    ("astronomy", "wiki"), ("classical music", "wiki"), ("world geography", "wiki"),
    ("quantum physics", "wiki"), ("medieval literature", "wiki"), ("philosophy of mind", "wiki"),
    ("election results", "news"), ("stock markets", "news"), ("climate policy", "news"),
    ("football transfers", "news"), ("space launches", "news"), ("public health", "news"),
    ("local weather", "news"), ("technology startups", "news"), ("film reviews", "news"),
    ("home cooking", "web"), ("gardening", "web"), ("travel tips", "web"),
    ("personal finance", "web"), ("fitness routines", "web"), ("car maintenance", "web"),
    ("pet care", "web"), ("interior design", "web"), ("online shopping deals", "web"),
    ("video games", "forum"), ("mechanical keyboards", "forum"), ("bird watching", "forum"),
    ("chess openings", "forum"), ("photography gear", "forum"), ("homebrewing", "forum"),
    ("board games", "forum"), ("cycling", "forum"), ("knitting patterns", "forum"),
    ("linux distributions", "forum"), ("language learning", "forum"), ("amateur radio", "forum"),
)

# words of the per-row sentence of rows outside tight clusters
_WORDS = tuple(sorted(set(
    " ".join(t for t, _ in TOPICS).split()
    + """a about after again all also always another because before best better between both
    built change clear common could daily data detail early easy every example fast few first
    found full good great group guide hard help here high idea important include interest
    keep large later learn least level little local long made main make many method might more
    most much must need never new next note often old only open order other part people place
    plan point problem public question quick real reason recent result right same second see
    short show simple since small some start step still study system take test than that their
    then there these thing think those three time today together tool under until useful value
    very view want water way well what when where which while whole work world would year
    young""".split())))

# text = PREFIX + topic + SUFFIX [+ " " + a sentence of the row's own words] + " (doc <id>)"
_TEMPLATES = (
    ("A short introduction to ", ": the basic ideas, a worked example and common mistakes."),
    ("Notes on ", " collected while reading several references over a weekend."),
    ("Why ", " matters, explained for a general audience in five paragraphs."),
    ("Ask the community: what is the best way to get started with ", "?"),
    ("Breaking: new developments in ", " surprised observers this week."),
    ("A detailed guide to ", ", with step-by-step instructions and pictures."),
    ("My experience with ", " after one year, what worked and what did not."),
    ("Frequently asked questions about ", " and their short answers."),
    ("The history of ", " from its origins to the present day."),
    ("Ten facts about ", " that most people get wrong."),
    ("Click here for cheap offers related to ", "!!! limited time, buy now"),
    ("Lecture summary: advanced topics in ", ", part three of the series."),
)

# Tightness levels: (share of clusters, noise std range, quality-mean range)
_KINDS = (
    ("tight", 0.30, (0.03, 0.08), (0.78, 0.92)),
    ("medium", 0.40, (0.35, 0.55), (0.45, 0.65)),
    ("diffuse", 0.30, (0.9, 1.3), (0.25, 0.50)),
)
_NOISE_FRACTION = 0.05
_NOISE_QUALITY = 0.18
_ROW_QUALITY_STD = 0.07
_SHARED_DIRECTION = 0.35
_SOURCE_FLIP = 0.12


def _default_clusters(n: int) -> int:
    return int(max(2, min(64, round(np.sqrt(max(n, 1)) / 2))))


def _unit(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def make_table(n: int, dim: int = 768, seed: int = 0, id_offset: int = 0,
               n_clusters: int | None = None, *, row_seed: int | None = None,
               return_labels: bool = False):
    """A synthetic shard of ``n`` rows (see the module docstring).

    The corpus structure (cluster centres, tightness, quality levels, topics) depends only on
    ``seed``, ``dim`` and ``n_clusters``; the rows depend also on ``row_seed``, so shards of
    one corpus share topics (``generate_corpus`` passes the shard index). With
    ``return_labels`` the cluster label of every row (-1 = noise row) comes back too."""
    n, dim = int(n), int(dim)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    K = _default_clusters(n) if n_clusters is None else int(n_clusters)
    if K < 1:
        raise ValueError(f"n_clusters must be >= 1, got {K}")

    # ---- corpus-level structure (seed only)
    crng = np.random.default_rng([int(seed), 0xC0FFEE, dim, K])
    shared = _unit(crng.standard_normal(dim))
    centers = _unit(_unit(crng.standard_normal((K, dim))) + _SHARED_DIRECTION * shared)
    shares = np.array([k[1] for k in _KINDS])
    kind = crng.choice(len(_KINDS), size=K, p=shares / shares.sum())
    lo_s = np.array([k[2][0] for k in _KINDS])[kind]
    hi_s = np.array([k[2][1] for k in _KINDS])[kind]
    sigma = crng.uniform(lo_s, hi_s)
    lo_q = np.array([k[3][0] for k in _KINDS])[kind]
    hi_q = np.array([k[3][1] for k in _KINDS])[kind]
    q_mean = crng.uniform(lo_q, hi_q)
    weights = crng.lognormal(0.0, 1.0, size=K)
    weights /= weights.sum()
    topic_of = crng.permutation(max(K, len(TOPICS)))[:K] % len(TOPICS)
    template_of = crng.integers(0, len(_TEMPLATES), size=K)

    # ---- rows (seed + row_seed)
    rkey = [int(seed), 0xDA7A] + ([] if row_seed is None else [int(row_seed) + 1])
    rng = np.random.default_rng(rkey)
    labels = rng.choice(K, size=n, p=weights).astype(np.int64)
    noise = rng.random(n) < _NOISE_FRACTION
    labels[noise] = -1
    lab = np.where(noise, 0, labels)

    x = rng.standard_normal((n, dim), dtype=np.float32)
    scale = np.where(noise, 0.0, sigma[lab] / np.sqrt(dim)).astype(np.float32)
    x *= scale[:, None]
    x += centers.astype(np.float32)[lab]  # noise rows are overwritten below
    n_noise = int(noise.sum())
    if n_noise:
        x[noise] = _unit(rng.standard_normal((n_noise, dim))).astype(np.float32)
    x = _unit(x).astype(np.float32, copy=False)

    q = np.where(noise, _NOISE_QUALITY, q_mean[lab]) + rng.normal(0.0, _ROW_QUALITY_STD, n)
    q = np.clip(q, 0.0, 1.0).astype(np.float64)

    topic = np.where(noise, rng.integers(0, len(TOPICS), n), topic_of[lab])
    tight = (kind[lab] == 0) & ~noise
    template = np.where(tight, template_of[lab], rng.integers(0, len(_TEMPLATES), n))
    topic_source = np.array([SOURCES.index(s) for _, s in TOPICS])[topic]
    flip = noise | (rng.random(n) < _SOURCE_FLIP)
    source = np.where(flip, rng.integers(0, len(SOURCES), n), topic_source)

    ids = np.arange(n, dtype=np.int64) + np.int64(id_offset)
    topic_names = pa.array([t for t, _ in TOPICS], pa.string())
    prefixes = pa.array([p for p, _ in _TEMPLATES], pa.string())
    suffixes = pa.array([s for _, s in _TEMPLATES], pa.string())
    id_arr = pa.array(ids, pa.int64())
    # a sentence of 12 words of the row's own (a generator of its own: the other columns keep
    # their values), empty for tight rows (boilerplate)
    wrng = np.random.default_rng(rkey + [0x7E47])
    words = pa.array(list(_WORDS), pa.string()).take(pa.array(wrng.integers(0, len(_WORDS), n * 12)))
    body = pc.binary_join(pa.FixedSizeListArray.from_arrays(words, 12).cast(pa.list_(pa.string())), " ")
    body = pc.if_else(pa.array(tight), pa.scalar("", pa.string()), pc.binary_join_element_wise(" ", body, ""))
    text = pc.binary_join_element_wise(
        prefixes.take(pa.array(template)), topic_names.take(pa.array(topic)),
        suffixes.take(pa.array(template)), body, " (doc ", pc.cast(id_arr, pa.string()), ")", "",
    )
    table = pa.table({
        "chunk_id": id_arr,
        "quality_score": pa.array(q, pa.float64()),
        "feature_arr": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float32()), dim),
        "text": text,
        "source": pa.array(list(SOURCES), pa.string()).take(pa.array(source)),
    })
    return (table, labels) if return_labels else table


def generate_corpus(out_dir_uri, n_shards: int = 4, rows_per_shard: int = 5000, dim: int = 768,
                    seed: int = 0) -> list[str]:
    """Write ``shard_000.parquet`` ... under ``out_dir_uri`` (each published atomically), ids
    distinct across shards; byte-identical for the same arguments. Returns the URIs."""
    if n_shards < 1 or rows_per_shard < 1:
        raise ValueError(f"need n_shards >= 1 and rows_per_shard >= 1, got {n_shards}, {rows_per_shard}")
    storage.makedirs(out_dir_uri)
    uris = []
    for i in range(int(n_shards)):
        table = make_table(rows_per_shard, dim=dim, seed=seed, id_offset=i * rows_per_shard,
                           row_seed=i)
        uri = storage.join(out_dir_uri, f"shard_{i:03d}.parquet")
        storage.atomic_write_table(table, uri, row_group_size=8192, compression="zstd")
        uris.append(uri)
    return uris
