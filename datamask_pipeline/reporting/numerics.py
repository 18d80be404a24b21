"""The numbers behind the selection reports: PCA projection, correlation eigen-spectrum and its
flatness, quality histograms, per-source retention, objective comparisons and corpus totals.
numpy / torch only -- no plotting, no HTML: shard_report and corpus_report draw and render them.

Definitions:

* **spectrum**: eigenvalues of the d x d correlation matrix C = Z^T Z / (k - 1) of a subset,
  Z = the subset's embeddings z-scored per dimension (unbiased variance, 1e-8 floor: the same
  standardisation as the DiSF term), sorted descending and divided by their sum.
* **spectral flatness**: exp(H(p)) / d, with p the normalised eigenvalues and H the Shannon
  entropy (natural log) -- the *effective rank* of C divided by d. It is 1 for a perfectly flat
  (whitened) spectrum and 1/d when all variance lies in one direction (dimensional collapse).
  A subset of k rows has rank <= k - 1, so compare flatness at equal k (selected vs top-k).
* **projection**: PCA of the unit-normalised embeddings (what the cosine terms see) fitted on
  a deterministic uniform subsample of at most 5,000 rows; eigen-decomposition of their
  covariance in float64, signs fixed so the largest loading of each axis is positive.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping

import numpy as np

__all__ = [
    "PROJECTION_MAX_POINTS",
    "SPECTRUM_MAX_ROWS",
    "MAX_SOURCES_SHOWN",
    "OTHER_SOURCES",
    "REF_ALIASES",
    "ROW_FIELDS",
    "Projection",
    "QualityHistograms",
    "as_numpy",
    "as_mask",
    "scores_of",
    "find_reference",
    "correlation_spectrum",
    "spectral_flatness",
    "subset_spectra",
    "pca_projection",
    "pca_2d",
    "quality_histograms",
    "selection_quality",
    "objective_metrics",
    "source_retention",
    "fold_sources",
    "metric_key",
    "source_metrics",
    "finite_or_none",
    "corpus_rows_from_metrics",
    "corpus_totals",
]

PROJECTION_MAX_POINTS = 5000
SPECTRUM_MAX_ROWS = 20000
MAX_SOURCES_SHOWN = 15  # sources kept apart before the tail is folded into OTHER_SOURCES
OTHER_SOURCES = "(other)"
# reference set name -> keys accepted for it in a ``reference`` dict, canonical key first
REF_ALIASES = {
    "topk": ("quality_topk", "topk", "top_k", "quality", "quality-topk"),
    "random": ("random",),
    "greedy": ("greedy",),
    "datamask": ("datamask", "selected"),
}


# ================================================================== inputs
def as_numpy(a, dtype=None) -> np.ndarray:
    """``a`` (numpy, torch tensor, pyarrow / pandas column, list) as a numpy array."""
    try:
        import torch

        if torch.is_tensor(a):
            a = a.detach().cpu().numpy()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    if hasattr(a, "to_numpy") and not isinstance(a, np.ndarray):  # pyarrow / pandas
        try:
            a = a.to_numpy(zero_copy_only=False)
        except TypeError:
            a = a.to_numpy()
    out = np.asarray(a)
    return out.astype(dtype, copy=False) if dtype is not None else out


def as_mask(selection, n: int) -> np.ndarray:
    """A selection given as a bool mask (n,) or as indices -> bool mask (n,)."""
    s = as_numpy(selection)
    if s.dtype == bool:
        if s.shape != (n,):
            raise ValueError(f"selection mask has shape {s.shape}, expected ({n},)")
        return s.copy()
    idx = s.astype(np.int64).ravel()
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"selection indices out of range [0, {n})")
    if np.unique(idx).size != idx.size:
        raise ValueError("selection indices contain duplicates")
    m = np.zeros(n, dtype=bool)
    m[idx] = True
    return m


def _term_value(entry, key: str, algorithm: str) -> float:
    """``entry[key]`` as a float; evaluate_selection nests per-term values in dicts."""
    v = entry[key]
    if isinstance(v, dict):
        if algorithm in v:
            v = v[algorithm]
        else:
            low = {str(kk).lower(): vv for kk, vv in v.items()}
            if algorithm.lower() in low:
                v = low[algorithm.lower()]
            elif len(v) == 1:
                v = next(iter(v.values()))
            else:
                raise KeyError(f"{key} has no value for term {algorithm!r}: {sorted(v)}")
    return float(v)


def scores_of(entry, algorithm: str) -> dict:
    """{"f", "f_qua", "f_div"} floats from an evaluate_selection dict (or a flat dict)."""
    return {kk: _term_value(entry, kk, algorithm) for kk in ("f", "f_qua", "f_div")}


def find_reference(reference: Mapping, name: str):
    """The entry of ``reference`` for the set ``name`` under any of its REF_ALIASES, or None."""
    for key in REF_ALIASES[name]:
        if key in reference and reference[key] is not None:
            return reference[key]
    return None


# ================================================================== spectrum
def correlation_spectrum(x, max_rows: int = SPECTRUM_MAX_ROWS, seed: int = 0, device="cpu") -> np.ndarray:
    """Normalised eigenvalues (descending, sum 1, length d) of the correlation matrix of the
    rows ``x`` (k, d); see the module doc string. At most ``max_rows`` rows are used (a
    deterministic uniform subsample when there are more)."""
    import torch

    xt = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
    if xt.ndim != 2:
        raise ValueError(f"x must be (k, d), got {tuple(xt.shape)}")
    k, d = xt.shape
    if k < 2:
        raise ValueError("a spectrum needs at least 2 rows")
    if max_rows and k > max_rows:
        rng = np.random.default_rng(seed)
        rows = torch.as_tensor(np.sort(rng.choice(k, size=max_rows, replace=False)))
        xt = xt.index_select(0, rows.to(xt.device))
        k = max_rows
    xt = xt.to(device=device, dtype=torch.float64)
    xc = xt - xt.mean(dim=0, keepdim=True)
    std = (xc.pow(2).sum(dim=0) / (k - 1)).sqrt().clamp(min=1e-8)
    z = xc / std
    if k <= d:  # Gram: same non-zero eigenvalues, cheaper
        ev = torch.linalg.eigvalsh(z @ z.T / (k - 1))
        ev = torch.cat([ev.new_zeros(d - k), ev])  # ascending, like eigvalsh's output
    else:
        ev = torch.linalg.eigvalsh(z.T @ z / (k - 1))
    ev = ev.clamp(min=0).flip(0).cpu().numpy()
    tot = ev.sum()
    if tot <= 0:
        out = np.zeros(d)
        out[0] = 1.0
        return out
    return ev / tot


def spectral_flatness(eigs) -> float:
    """exp(spectral entropy) / d = effective rank / d, in [1/d, 1] (1 = flat, 1/d = collapsed).

    ``eigs``: eigenvalues (any scale) of a d x d matrix, zeros included."""
    p = np.asarray(eigs, dtype=np.float64).ravel()
    d = p.size
    if d == 0:
        raise ValueError("no eigenvalues")
    p = np.clip(p, 0, None)
    tot = p.sum()
    if tot <= 0:
        return 1.0 / d
    p = p / tot
    nz = p[p > 0]
    h = float(-(nz * np.log(nz)).sum())
    return float(math.exp(h) / d)


def subset_spectra(x, subsets: Mapping[str, object], device="cpu") -> dict:
    """``{name: correlation_spectrum(rows of x in the subset)}``; a subset is a bool mask (n,)
    or indices, or None for all rows."""
    import torch

    xt = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
    n = int(xt.shape[0])
    out = {}
    for name, subset in subsets.items():
        rows = xt if subset is None else xt[torch.as_tensor(as_mask(subset, n), device=xt.device)]
        out[name] = correlation_spectrum(rows, device=device)
    return out


# ================================================================== projection
@dataclass(frozen=True)
class Projection:
    """A PCA projection of (a subsample of) the unit-normalised rows of x.

    ``rows``: indices (sorted) of the subsample in x; ``coords`` (m, c): the centred rows on
    the axes; ``explained_ratio`` (c,): each axis's share of the total variance;
    ``components`` (d, c): the unit axes, largest variance first; ``mean`` (d,): the centre."""

    rows: np.ndarray
    coords: np.ndarray
    explained_ratio: np.ndarray
    components: np.ndarray
    mean: np.ndarray


def pca_projection(x, n_components: int = 2, max_points: int = PROJECTION_MAX_POINTS,
                   seed: int = 0, device="cpu") -> Projection:
    """PCA of the unit-normalised rows of ``x`` (n, d) on a deterministic subsample of at
    most ``max_points`` rows. When the data has fewer than ``n_components`` directions
    (d or the row count is smaller), the missing axes are zeros."""
    import torch

    if n_components < 1:
        raise ValueError(f"n_components must be >= 1, got {n_components}")
    xt = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
    if xt.ndim != 2 or xt.shape[0] < 1:
        raise ValueError(f"x must be (n, d) with n >= 1, got {tuple(xt.shape)}")
    n, d = xt.shape
    if n > max_points:
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(n, size=max_points, replace=False))
        xs = xt.index_select(0, torch.as_tensor(rows).to(xt.device))
    else:
        rows = np.arange(n)
        xs = xt
    xs = torch.nn.functional.normalize(xs.to(device=device, dtype=torch.float64), dim=1)
    mean = xs.mean(dim=0, keepdim=True)
    xc = xs - mean
    m = xc.shape[0]
    c = min(n_components, d, m)
    if d <= m:
        evals, evecs = torch.linalg.eigh(xc.T @ xc / max(1, m - 1))
        comps = evecs[:, d - c:].flip(1)  # (d, c), largest first
    else:  # fewer rows than dimensions: the m x m Gram matrix has the same non-zero spectrum
        evals, u = torch.linalg.eigh(xc @ xc.T / max(1, m - 1))
        comps = xc.T @ u[:, m - c:].flip(1)
        comps = comps / comps.norm(dim=0, keepdim=True).clamp(min=1e-12)
    top = evals[evals.numel() - c:].flip(0)
    # deterministic orientation: the largest |loading| of each axis is positive
    pivot = comps.abs().argmax(dim=0)
    signs = torch.sign(comps[pivot, torch.arange(comps.shape[1])])
    signs[signs == 0] = 1
    comps = comps * signs
    coords = (xc @ comps).cpu().numpy()
    total = float(evals.clamp(min=0).sum())
    ratio = (top.clamp(min=0) / total).cpu().numpy() if total > 0 else np.zeros(c)
    comps = comps.cpu().numpy()
    if c < n_components:
        pad = n_components - c
        coords = np.concatenate([coords, np.zeros((coords.shape[0], pad))], axis=1)
        ratio = np.concatenate([ratio, np.zeros(pad)])
        comps = np.concatenate([comps, np.zeros((d, pad))], axis=1)
    return Projection(rows=rows, coords=coords, explained_ratio=ratio, components=comps,
                      mean=mean[0].cpu().numpy())


def pca_2d(x, max_points: int = PROJECTION_MAX_POINTS, seed: int = 0, device="cpu"):
    """2-D PCA of the unit-normalised rows of ``x`` on a deterministic subsample.

    Returns ``(rows, coords (m, 2), explained_variance_ratio (2,))`` where ``rows`` are the
    indices (sorted) of the subsample in ``x``; see :func:`pca_projection`."""
    p = pca_projection(x, 2, max_points=max_points, seed=seed, device=device)
    return p.rows, p.coords, p.explained_ratio


# ================================================================== quality
@dataclass(frozen=True)
class QualityHistograms:
    """Quality histograms of several sets on shared bins.

    ``edges`` (n_bins + 1,); per set name: ``density`` (n_bins,) normalised to unit area over
    the bins (all zeros for a set without finite values), ``mean`` (nan when empty) and
    ``count`` (rows in the set)."""

    edges: np.ndarray
    density: dict
    mean: dict
    count: dict


def quality_histograms(q, subsets: Mapping[str, object], n_bins: int = 60) -> QualityHistograms:
    """Histograms of the quality ``q`` (n,) of the whole shard (set ``"shard"``) and of each
    subset (bool mask (n,) or indices) over ``n_bins`` equal bins spanning the finite range
    of ``q``."""
    q = as_numpy(q, np.float64).ravel()
    if "shard" in subsets:
        raise ValueError('"shard" is the whole-shard histogram; name the subset differently')
    sets = {"shard": q}
    sets.update({name: q[as_mask(s, q.size)] for name, s in subsets.items()})
    finite = q[np.isfinite(q)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if hi <= lo:
        hi = lo + 1.0
    edges = np.linspace(lo, hi, n_bins + 1)
    widths = np.diff(edges)
    density, mean, count = {}, {}, {}
    for name, v in sets.items():
        counts = np.histogram(v[np.isfinite(v)], bins=edges)[0]
        tot = counts.sum()
        density[name] = counts / (tot * widths) if tot else np.zeros(n_bins)
        mean[name] = float(v.mean()) if v.size else math.nan
        count[name] = int(v.size)
    return QualityHistograms(edges=edges, density=density, mean=mean, count=count)


def selection_quality(q, selected: np.ndarray, topk: np.ndarray) -> dict:
    """Mean quality of the shard, the selected and the top-k subset (bool masks), and the
    fraction of the selected rows that top-k also holds."""
    q = as_numpy(q, np.float64).ravel()
    k = int(selected.sum())
    return {
        "quality_mean_shard": float(q.mean()),
        "quality_mean_selected": float(q[selected].mean()),
        "quality_mean_topk": float(q[topk].mean()),
        "overlap_with_topk": float((selected & topk).sum()) / k if k else 0.0,
    }


# ================================================================== objective
def objective_metrics(levels: Mapping[str, Mapping[str, float]]) -> dict:
    """Flat comparison of whole-shard scores ``{set: {"f", "f_qua", "f_div"}}`` (sets
    ``datamask``, ``topk``, ``random`` required, ``greedy`` optional):
    ``<term>_<set>`` for every set, the gains of DATAMASK over top-k and random, and, with
    greedy, ``ratio_f_to_greedy`` = f / f_greedy and ``gap_closed_vs_greedy`` = (f - f_topk) /
    (f_greedy - f_topk), each only where its denominator is non-zero, so every value is finite
    for finite inputs."""
    for req in ("datamask", "topk", "random"):
        if req not in levels:
            raise KeyError(f"objective_metrics needs whole-shard scores for {req!r}")
    out = {}
    for name, lv in levels.items():
        for key, v in lv.items():
            out[f"{key}_{name}"] = float(v)
    dm, tk = levels["datamask"], levels["topk"]
    out["gain_f_over_topk"] = dm["f"] - tk["f"]
    out["gain_f_over_random"] = dm["f"] - levels["random"]["f"]
    out["delta_f_qua_vs_topk"] = dm["f_qua"] - tk["f_qua"]
    out["delta_f_div_vs_topk"] = dm["f_div"] - tk["f_div"]
    if "greedy" in levels:
        fg, ft, fm = levels["greedy"]["f"], tk["f"], dm["f"]
        if fg != 0:
            out["ratio_f_to_greedy"] = fm / fg
        if abs(fg - ft) > 1e-12 * max(1.0, abs(fg), abs(ft)):
            out["gap_closed_vs_greedy"] = (fm - ft) / (fg - ft)
    return out


# ================================================================== sources
def source_retention(sources, selected_mask: np.ndarray, topk_mask: np.ndarray | None = None) -> dict:
    """Per source: rows in the shard, rows kept, shares and retention (kept / rows).

    Returns ``{"names": [...], "rows": int array, "selected": int array, "topk": int array or
    None, "share_shard", "share_selected", "share_topk", "retention_selected",
    "retention_topk"}`` (float arrays), sources sorted by shard rows, descending (ties by
    name). Shares of each set sum to 1; sum(rows * retention) equals the set's size."""
    src = as_numpy(sources)
    if src.dtype.kind not in "US":
        src = np.array(["<null>" if s is None else str(s) for s in src.tolist()], dtype=object)
    src = src.astype(str)
    n = src.shape[0]
    if selected_mask.shape != (n,):
        raise ValueError(f"sources has {n} rows, selection {selected_mask.shape[0]}")
    names, inv = np.unique(src, return_inverse=True)
    inv = inv.ravel()
    order = np.lexsort((names, -np.bincount(inv, minlength=names.size)))

    def per_source(mask):
        counts = np.bincount(inv, weights=mask.astype(np.float64), minlength=names.size)
        return counts[order].astype(np.int64)

    rows = np.bincount(inv, minlength=names.size)[order]
    sel = per_source(selected_mask)
    tk = None if topk_mask is None else per_source(topk_mask)
    return _with_shares([str(s) for s in names[order]], rows, sel, tk)


def _with_shares(names, rows, sel, tk) -> dict:
    return {
        "names": names,
        "rows": rows,
        "selected": sel,
        "share_shard": rows / max(1, rows.sum()),
        "share_selected": sel / max(1, sel.sum()),
        "retention_selected": sel / np.maximum(rows, 1),
        "topk": tk,
        "share_topk": None if tk is None else tk / max(1, tk.sum()),
        "retention_topk": None if tk is None else tk / np.maximum(rows, 1),
    }


def fold_sources(ret: dict, max_shown: int = MAX_SOURCES_SHOWN) -> dict:
    """``ret`` (from :func:`source_retention`) with every source past the ``max_shown - 1``
    largest folded into one entry named ``OTHER_SOURCES``; unchanged when there are at most
    ``max_shown`` sources. Counts, shares and retentions are recomputed for the folded entry,
    so totals are preserved. ``n_folded`` says how many sources the entry holds (0: none)."""
    names = list(ret["names"])
    if len(names) <= max_shown:
        return dict(ret, n_folded=0)
    cut = max(1, max_shown - 1)

    def fold(a):
        return None if a is None else np.concatenate([a[:cut], [a[cut:].sum()]]).astype(np.int64)

    out = _with_shares(names[:cut] + [OTHER_SOURCES], fold(ret["rows"]), fold(ret["selected"]),
                       fold(ret["topk"]))
    out["n_folded"] = len(names) - cut
    return out


def metric_key(text) -> str:
    """``text`` with every run of characters outside [A-Za-z0-9_.-] replaced by ``_``."""
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("_")
    return s or "_"


def source_metrics(ret: dict, max_shown: int = MAX_SOURCES_SHOWN) -> dict:
    """Flat per-source metrics from :func:`source_retention`'s ``ret``: ``n_sources`` and,
    for at most ``max_shown`` entries (the tail folded, see :func:`fold_sources`),
    ``retention_selected[<key>]``, ``retention_topk[<key>]`` (when ret has top-k),
    ``share_shard[<key>]`` and ``share_selected[<key>]``. Keys are :func:`metric_key` of the
    source names; names that sanitise alike get ``~2``, ``~3`` ... so none overwrites another."""
    out = {"n_sources": float(len(ret["names"]))}
    folded = fold_sources(ret, max_shown)
    used: set = set()
    for i, s in enumerate(folded["names"]):
        key = metric_key(s)
        base, j = key, 2
        while key in used:
            key, j = f"{base}~{j}", j + 1
        used.add(key)
        out[f"retention_selected[{key}]"] = float(folded["retention_selected"][i])
        if folded["retention_topk"] is not None:
            out[f"retention_topk[{key}]"] = float(folded["retention_topk"][i])
        out[f"share_shard[{key}]"] = float(folded["share_shard"][i])
        out[f"share_selected[{key}]"] = float(folded["share_selected"][i])
    return out


# ================================================================== labels
def selection_label(route: str | None = None, guard: str | None = None) -> str:
    """How a user sees the selection named: by the route that produced it. "DATAMASK" only
    when the policy-gradient learner ran (routes ``paper``, ``paper+polish``); a guard that
    returned a reference selection instead says so."""
    if not route:
        return "selection"
    name = f"DATAMASK ({route})" if route in ("paper", "paper+polish") else route
    if guard:
        returned = guard.split(" scored", 1)[0].replace("quality_topk", "quality top-k") \
                        .replace("learner_readout", "learner read-out")
        name += f" → {returned} (guard)"
    return name


# ================================================================== corpus
# corpus row field -> shard report metric key
ROW_FIELDS = {
    "n_rows": "n_rows",
    "k_selected": "k_selected",
    "kept_fraction": "kept_fraction",
    "quality_mean_before": "quality_mean_shard",
    "quality_mean_after": "quality_mean_selected",
    "quality_mean_topk": "quality_mean_topk",
    "f_datamask": "f_datamask",
    "f_topk": "f_topk",
    "f_random": "f_random",
    "f_greedy": "f_greedy",
    "gain_f_over_topk": "gain_f_over_topk",
    "gain_f_over_random": "gain_f_over_random",
    "gap_closed_vs_greedy": "gap_closed_vs_greedy",
    "spectrum_flatness_selected": "spectrum_flatness_selected",
    "spectrum_flatness_topk": "spectrum_flatness_topk",
    "lamb": "lamb",
}


def finite_or_none(v):
    """A finite float, or None for a missing / non-numeric / non-finite value."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def corpus_rows_from_metrics(shard_metrics: Mapping[str, Mapping]) -> list[dict]:
    """One row per shard, sorted by shard key: ``{"shard": key, <ROW_FIELDS>: float | None}``.

    Counts (``n_rows``, ``k_selected``) become ints. ``kept_fraction`` and the gains are
    derived from their parts when the metrics lack them but have the parts."""
    rows = []
    for key in sorted(shard_metrics, key=str):
        m = shard_metrics[key] or {}
        row = {"shard": str(key), "route": str(m["route"]) if m.get("route") else None}
        for fld, src in ROW_FIELDS.items():
            row[fld] = finite_or_none(m.get(src))
        for cnt in ("n_rows", "k_selected"):
            if row[cnt] is not None:
                row[cnt] = int(round(row[cnt]))
        if row["kept_fraction"] is None and row["n_rows"] and row["k_selected"] is not None:
            row["kept_fraction"] = row["k_selected"] / row["n_rows"]
        for gain, ref in (("gain_f_over_topk", "f_topk"), ("gain_f_over_random", "f_random")):
            if row[gain] is None and row["f_datamask"] is not None and row[ref] is not None:
                row[gain] = row["f_datamask"] - row[ref]
        rows.append(row)
    return rows


def corpus_totals(rows: list[dict]) -> dict:
    """Corpus-level numbers from :func:`corpus_rows_from_metrics` rows (finite floats only;
    an aggregate none of the shards has the inputs for is left out).

    Row counts add up. Mean quality before is weighted by shard rows, after (and top-k) by
    kept rows, over the shards that have both counts. Objective values are per-shard means,
    so their aggregates are plain means over shards (with min / max for the gains) and a
    count of the shards where the selection beats quality top-k."""
    t: dict = {"n_shards": float(len(rows))}
    counted = [r for r in rows if r["n_rows"] is not None and r["k_selected"] is not None]
    n_tot = sum(r["n_rows"] for r in counted)
    k_tot = sum(r["k_selected"] for r in counted)
    t["n_shards_counted"] = float(len(counted))
    t["rows_total"] = float(n_tot)
    t["rows_kept"] = float(k_tot)
    if n_tot:
        t["kept_fraction"] = k_tot / n_tot

    def weighted(field_, weight):
        rs = [r for r in counted if r[field_] is not None and r[weight]]
        w = sum(r[weight] for r in rs)
        return sum(r[field_] * r[weight] for r in rs) / w if w else None

    for name, fld, wt in (("quality_mean_before", "quality_mean_before", "n_rows"),
                          ("quality_mean_after", "quality_mean_after", "k_selected"),
                          ("quality_mean_topk", "quality_mean_topk", "k_selected")):
        v = weighted(fld, wt)
        if v is not None:
            t[name] = v
    for fld in ("f_datamask", "f_topk", "f_random", "f_greedy", "gain_f_over_topk",
                "gain_f_over_random", "gap_closed_vs_greedy", "spectrum_flatness_selected",
                "spectrum_flatness_topk"):
        vals = np.array([r[fld] for r in rows if r[fld] is not None], dtype=np.float64)
        if vals.size:
            t[f"{fld}_mean"] = float(vals.mean())
            if fld.startswith("gain") or fld.startswith("gap"):
                t[f"{fld}_min"] = float(vals.min())
                t[f"{fld}_max"] = float(vals.max())
    gains = [r["gain_f_over_topk"] for r in rows if r["gain_f_over_topk"] is not None]
    if gains:
        t["shards_beating_topk"] = float(sum(g > 0 for g in gains))
        t["shards_with_gain"] = float(len(gains))
    lambs = sorted({r["lamb"] for r in rows if r["lamb"] is not None})
    if len(lambs) == 1:
        t["lamb"] = lambs[0]
    t["lamb_values"] = float(len(lambs))
    return t
