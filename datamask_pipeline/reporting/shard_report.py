"""Per-shard selection report (issue 6, item 1): figures and pages from one shard's selection.

:func:`build_shard_report` turns one shard's selection into

* ``figures``: PNG bytes by name: ``curve`` (optimisation curve), ``quality`` (quality
  distribution), ``projection`` (2-D PCA), ``spectrum`` (correlation eigen-spectrum) and, when
  sources are given, ``sources`` (retention per source);
* ``html``: one self-contained page (inline CSS, figures as ``data:image/png;base64`` URIs, no
  external assets, no scripts), rendered from ``templates/shard_report.html.j2``;
* ``metrics``: a flat ``{name: float}`` dict for Dagster metadata (plots over partitions);
* ``markdown``: a table of the key numbers (``dg.MetadataValue.md``).

The numbers (spectra, flatness, PCA, retention, comparisons) come from :mod:`.numerics`; this
module draws and lays them out. All whole-shard objective numbers come from
:func:`engine.evaluate.evaluate_selection` (V = all n rows), so they agree with every other
place that scores a selection. The learner's history is batch-level (each step scores masks of
k' rows against its batch of m rows), so the curve labels it as such and draws the whole-shard
levels of the final subsets as horizontal lines and a star, never as if they were on the same
footing.
"""

from __future__ import annotations

import base64
import contextvars
import functools
import io
import json
import math
from dataclasses import dataclass, field

import numpy as np

from .numerics import (  # noqa: F401  (re-exported: the reporting package's public numerics)
    selection_label,
    MAX_SOURCES_SHOWN,
    OTHER_SOURCES,
    PROJECTION_MAX_POINTS,
    REF_ALIASES,
    SPECTRUM_MAX_ROWS,
    QualityHistograms,
    as_mask,
    as_numpy,
    correlation_spectrum,
    find_reference,
    fold_sources,
    objective_metrics,
    pca_2d,
    quality_histograms,
    scores_of,
    selection_quality,
    source_metrics,
    source_retention,
    spectral_flatness,
    subset_spectra,
)

__all__ = [
    "ShardReport",
    "build_shard_report",
    "write_shard_report",
    "correlation_spectrum",
    "spectral_flatness",
    "pca_2d",
    "source_retention",
    "fold_sources",
]

COLORS = {
    "datamask": "#1f5fbf",
    "datamask_light": "#8fb3e8",
    "topk": "#e67e00",
    "random": "#6b6b6b",
    "greedy": "#1e9e4a",
    "both": "#8e3fb5",
    "neither": "#c9c9c9",
    "shard": "#b0b0b0",
}
# The selection's label: set per report by build_shard_report (selection_label of its route).
_SELECTION_LABEL: contextvars.ContextVar[str] = contextvars.ContextVar("selection_label",
                                                                      default="selection")


class _Labels(dict):
    def __missing__(self, key):
        if key == "datamask":
            return _SELECTION_LABEL.get()
        raise KeyError(key)


LABELS = _Labels({
    "topk": "quality top-k",
    "random": "random",
    "greedy": "greedy",
})
MAX_SOURCES_IN_TABLE = 60  # rows of the HTML table (figure bars, markdown rows: MAX_SOURCES_SHOWN)
_DPI = 110
# set name -> the suffix of its spectrum_flatness_* metric
_FLATNESS_KEYS = {"datamask": "selected", "topk": "topk", "random": "random", "greedy": "greedy",
                  "shard": "shard"}


@dataclass
class ShardReport:
    """A rendered shard report: see the module doc string for the parts."""

    title: str
    html: str
    figures: dict = field(default_factory=dict)  # name -> PNG bytes
    metrics: dict = field(default_factory=dict)  # name -> float
    markdown: str = ""


# ================================================================== formatting
def _fmt(v, digits: int = 5) -> str:
    if v is None:
        return "–"
    try:
        fv = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(fv):
        return "–"
    if fv != 0 and (abs(fv) >= 1e5 or abs(fv) < 1e-3):
        return f"{fv:.{digits - 1}e}"
    return f"{fv:.{digits}g}"


def _pct(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


def _count(v) -> str:
    return f"{int(v):,}"


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


@functools.lru_cache(maxsize=None)
def _environment():
    """The jinja2 environment over this package's ``templates/``: the engine escapes every
    value of an HTML template; undefined names raise instead of rendering as blanks."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader(__package__, "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2"),
                                            default_for_string=True, default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(fmt=_fmt, pct=_pct, count=_count, data_uri=data_uri)
    return env


def render(template: str, **context) -> str:
    """Render ``templates/<template>`` with ``context`` (values are escaped by the engine)."""
    return _environment().get_template(template).render(**context)


# ================================================================== matplotlib
def _new_figure(w: float, h: float):
    """A figure on an Agg canvas; no pyplot, so no global backend state is touched."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def _png(fig, title: str | None = None) -> bytes:
    """The figure as PNG bytes, byte-identical for the same figure (no software or time
    stamp); ``title``: the figure's title, also written as the PNG's ``Title`` text."""
    buf = io.BytesIO()
    meta = {"Software": None}
    if title:
        meta["Title"] = title
    fig.savefig(buf, format="png", dpi=_DPI, metadata=meta)
    return buf.getvalue()


def _style(ax) -> None:
    ax.grid(True, alpha=0.3, linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=9)


def _source_label(ret: dict, i: int) -> str:
    name = ret["names"][i]
    if ret.get("n_folded") and i == len(ret["names"]) - 1:
        return f"other ({ret['n_folded']} sources)"
    return name


# ================================================================== figures
def _figure_curve(history, algorithm, lamb, levels: dict) -> bytes:
    """(a) learner curve per step (batch-level) + whole-shard levels of the final subsets."""
    from matplotlib.lines import Line2D

    fig = _new_figure(13.0, 4.0)
    axes = fig.subplots(1, 3)
    panels = [
        ("f", f"objective f  (λ={lamb:g})", ("mean_f", "best_f")),
        ("f_qua", "quality term f_qua", ("mean_f_qua",)),
        ("f_div", f"diversity term f_div ({algorithm})", ("mean_f_div",)),
    ]
    steps = np.array([h["step"] for h in history], dtype=np.float64) if history else np.array([])
    last = float(steps[-1]) if steps.size else 1.0
    ref_style = {
        "random": dict(color=COLORS["random"], ls=":", lw=1.6),
        "topk": dict(color=COLORS["topk"], ls="--", lw=1.6),
        "greedy": dict(color=COLORS["greedy"], ls="-.", lw=1.6),
    }
    for ax, (key, title, hkeys) in zip(axes, panels):
        if steps.size:
            ys = np.array([h[hkeys[0]] for h in history], dtype=np.float64)
            ax.plot(steps, ys, color=COLORS["datamask"], lw=1.6)
            if len(hkeys) > 1:
                yb = np.array([h[hkeys[1]] for h in history], dtype=np.float64)
                ax.plot(steps, yb, color=COLORS["datamask_light"], lw=1.1, ls="--")
        else:
            ax.text(0.5, 0.5, "no learner history", ha="center", va="center",
                    transform=ax.transAxes, color="#888888")
        for name, style in ref_style.items():
            if name in levels:
                ax.axhline(levels[name][key], **style)
        if "datamask" in levels:
            ax.plot([last], [levels["datamask"][key]], marker="*", ms=14, color=COLORS["datamask"],
                    mec="black", mew=0.6, ls="none", zorder=5)
        ax.set_title(title, fontsize=10.5)
        ax.set_xlabel("step", fontsize=9.5)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4), useMathText=True)
        _style(ax)
    handles = [
        Line2D([], [], color=COLORS["datamask"], lw=1.6, label="learner: mean over rollouts (batch-level)"),
        Line2D([], [], color=COLORS["datamask_light"], lw=1.1, ls="--", label="learner: best rollout (batch-level)"),
        Line2D([], [], color=COLORS["datamask"], marker="*", ms=12, mec="black", mew=0.6, ls="none",
               label=f"{LABELS['datamask']} final subset (whole shard)"),
    ]
    for name, style in ref_style.items():
        if name in levels:
            handles.append(Line2D([], [], label=f"{LABELS[name]} (whole shard)", **style))
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8.8, frameon=False)
    fig.suptitle("Optimisation curve — learner scores masks on its batch each step; "
                 "horizontal lines and ★ are whole-shard scores of final subsets",
                 fontsize=10.5)
    fig.subplots_adjust(left=0.055, right=0.985, top=0.85, bottom=0.25, wspace=0.28)
    return _png(fig)


def _figure_quality(hist: QualityHistograms) -> bytes:
    """(b) quality distribution: shard vs selected vs quality top-k (densities)."""
    fig = _new_figure(7.6, 4.3)
    ax = fig.subplots()
    e, dens, mean, cnt = hist.edges, hist.density, hist.mean, hist.count
    ax.stairs(dens["shard"], e, fill=True, color=COLORS["shard"], alpha=0.55,
              label=f"shard (n={cnt['shard']:,}, mean {mean['shard']:.4g})")
    ax.stairs(dens["topk"], e, lw=1.8, color=COLORS["topk"],
              label=f"quality top-k (mean {mean['topk']:.4g})")
    ax.stairs(dens["datamask"], e, lw=1.8, color=COLORS["datamask"],
              label=f"{LABELS['datamask']} (k={cnt['datamask']:,}, mean {mean['datamask']:.4g})")
    for name, c, ls in (("shard", COLORS["random"], ":"), ("topk", COLORS["topk"], "--"),
                        ("datamask", COLORS["datamask"], "--")):
        ax.axvline(mean[name], color=c, ls=ls, lw=1.2)
    ax.set_xlabel("quality score", fontsize=9.5)
    ax.set_ylabel("density (each set normalised)", fontsize=9.5)
    ax.set_title("Quality distribution (dashed/dotted lines: means)", fontsize=10.5)
    ax.legend(fontsize=8.5, frameon=False, loc="upper left")
    _style(ax)
    fig.tight_layout()
    return _png(fig)


def _figure_projection(coords, ratio, sel_s, topk_s, n_total: int) -> bytes:
    """(c) 2-D PCA coloured by membership."""
    fig = _new_figure(7.4, 6.4)
    ax = fig.subplots()
    both = sel_s & topk_s
    sel_only = sel_s & ~topk_s
    topk_only = topk_s & ~sel_s
    neither = ~(sel_s | topk_s)
    # Drawing order: "both" first among the coloured groups and with larger markers, so the
    # rows where the two selections differ (top-k only = near-duplicates DATAMASK dropped,
    # DATAMASK only = what it took instead) are drawn on top, while a shared near-duplicate
    # cluster (which projects to one spot) still shows as a purple ring around them.
    groups = [
        (neither, COLORS["neither"], 5, 0.5, "neither"),
        (both, COLORS["both"], 42, 0.65, "both"),
        (topk_only, COLORS["topk"], 13, 0.9, "quality top-k only"),
        (sel_only, COLORS["datamask"], 11, 0.9, f"{LABELS['datamask']} only"),
    ]
    for m, c, s, a, label in groups:
        ax.scatter(coords[m, 0], coords[m, 1], s=s, c=c, alpha=a, linewidths=0,
                   label=f"{label} ({int(m.sum()):,})", rasterized=True)
    ax.set_xlabel(f"PC 1 ({100 * ratio[0]:.1f}% of variance)", fontsize=9.5)
    ax.set_ylabel(f"PC 2 ({100 * ratio[1]:.1f}% of variance)", fontsize=9.5)
    shown = coords.shape[0]
    sub = f"{shown:,} of {n_total:,} rows" if shown < n_total else f"all {n_total:,} rows"
    ax.set_title(f"PCA of unit-normalised embeddings ({sub})", fontsize=10.5)
    leg = ax.legend(fontsize=8.5, frameon=True, framealpha=0.85, loc="best")
    for h in leg.legend_handles:
        h.set_sizes([36])
    leg.get_frame().set_linewidth(0)
    _style(ax)
    fig.tight_layout()
    return _png(fig)


def _figure_spectrum(spectra: dict, flat: dict, d: int) -> bytes:
    """(d) normalised eigen-spectra of the correlation matrix, log scale."""
    fig = _new_figure(10.0, 4.5)
    ax = fig.subplots()
    styles = {
        "shard": dict(color=COLORS["shard"], lw=1.3, ls="-"),
        "random": dict(color=COLORS["random"], lw=1.4, ls="--"),
        "greedy": dict(color=COLORS["greedy"], lw=1.4, ls="-."),
        "topk": dict(color=COLORS["topk"], lw=1.8, ls="-"),
        "datamask": dict(color=COLORS["datamask"], lw=1.8, ls="-"),
    }
    names = {"shard": "whole shard (all rows)", "random": "random subset (same k)",
             "greedy": "greedy", "topk": "quality top-k", "datamask": LABELS["datamask"]}
    floor = 1e-12
    for key in ("shard", "random", "greedy", "topk", "datamask"):
        if key not in spectra:
            continue
        ev = spectra[key]
        keep = ev > floor
        r = np.arange(1, ev.size + 1)
        ax.plot(r[keep], ev[keep], label=f"{names[key]} (flatness {flat[key]:.3f})", **styles[key])
    ax.axhline(1.0 / d, color="#444444", lw=0.9, ls=":", label=f"perfectly flat (1/d, d={d})")
    ax.set_yscale("log")
    ax.set_xlabel("eigenvalue rank", fontsize=9.5)
    ax.set_ylabel("eigenvalue / sum", fontsize=9.5)
    ax.set_title("Correlation eigen-spectrum (flatness = effective rank / d)", fontsize=10.5)
    ax.legend(fontsize=8.5, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _style(ax)
    fig.tight_layout()
    return _png(fig)


def _figure_sources(ret: dict, kept_fraction: float) -> bytes:
    """(e) per-source shares (shard, selected, top-k) and retention."""
    ret = fold_sources(ret, MAX_SOURCES_SHOWN)  # fold the tail into one bar
    names = [_source_label(ret, i) for i in range(len(ret["names"]))]
    s = len(names)
    fig = _new_figure(max(9.0, min(16.0, 3.0 + 0.75 * s * 2)), 4.6)
    ax1, ax2 = fig.subplots(1, 2)
    xs = np.arange(s)
    w = 0.27
    share = [(ret["share_shard"], COLORS["shard"], "shard"),
             (ret["share_selected"], COLORS["datamask"], LABELS["datamask"])]
    if ret["topk"] is not None:
        share.append((ret["share_topk"], COLORS["topk"], "quality top-k"))
    off = (np.arange(len(share)) - (len(share) - 1) / 2) * w
    for (vals, c, label), o in zip(share, off):
        ax1.bar(xs + o, vals, width=w, color=c, label=label)
    ax1.set_title("Share of each set by source", fontsize=10.5)
    ax1.set_ylabel("share", fontsize=9.5)
    ret_sets = [(ret["retention_selected"], COLORS["datamask"], LABELS["datamask"])]
    if ret["topk"] is not None:
        ret_sets.append((ret["retention_topk"], COLORS["topk"], "quality top-k"))
    off2 = (np.arange(len(ret_sets)) - (len(ret_sets) - 1) / 2) * w
    for (vals, c, label), o in zip(ret_sets, off2):
        bars = ax2.bar(xs + o, vals, width=w, color=c, label=label)
        if s <= 8:
            for b, v in zip(bars, vals):
                ax2.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{100 * v:.0f}%",
                         ha="center", va="bottom", fontsize=7.5)
    ax2.axhline(kept_fraction, color="#444444", ls=":", lw=1.1,
                label=f"overall ({100 * kept_fraction:.1f}%)")
    ax2.set_title("Retention: kept rows / source rows", fontsize=10.5)
    ax2.set_ylabel("retention", fontsize=9.5)
    from matplotlib.ticker import PercentFormatter

    tops = {ax1: max(float(np.max(v)) for v, _, _ in share),
            ax2: max([float(np.max(v)) for v, _, _ in ret_sets] + [kept_fraction])}
    for ax in (ax1, ax2):
        # headroom above the tallest bar for a one-row legend that never covers a bar
        ax.set_ylim(0, 1.32 * tops[ax] if tops[ax] > 0 else 1.0)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.legend(fontsize=8.2, frameon=False, loc="upper center", ncol=3,
                  bbox_to_anchor=(0.5, 1.0), handlelength=1.6, columnspacing=1.2)
    for ax in (ax1, ax2):
        ax.set_xticks(xs)
        ax.set_xticklabels([n if len(n) <= 18 else n[:17] + "…" for n in names],
                           rotation=30 if s > 4 else 0, ha="right" if s > 4 else "center",
                           fontsize=8.5)
        _style(ax)
        ax.grid(False, axis="x")
    fig.tight_layout()
    return _png(fig)


# ================================================================== report
FIGURE_TITLES = {"curve": "Optimisation curve", "quality": "Quality distribution",
                 "projection": "Embedding projection", "spectrum": "Eigen-spectrum flatness",
                 "sources": "Retention per source"}
FIGURE_CAPTIONS = {
    "curve": "Optimisation curve. Lines: the learner's per-step scores, averaged over its G "
             "rollouts (and the best rollout), each scored on that step's batch only "
             "(batch-level, V = batch). Horizontal lines and the star: the final subsets scored "
             "on the whole shard (V = all rows), so the curve's level is not directly comparable "
             "with them for terms that depend on the ground-set size (Facility, DiSF).",
    "quality": "Quality distribution of the shard, the selected subset and the quality top-k "
               "subset (each histogram normalised to unit area).",
    "projection": "2-D PCA of the unit-normalised embeddings, coloured by membership. Quality "
                  "top-k tends to crowd into a few regions; a joint selection spreads out. "
                  "A tight cluster of near-duplicates projects to a single spot, so many rows "
                  "can hide under one marker: the legend's counts are exact.",
    "spectrum": "Eigen-spectrum of each subset's correlation matrix (DiSF's view of "
                "dimensional collapse). Flatness = exp(spectral entropy)/d = effective rank/d: "
                "1 is perfectly flat, 1/d is collapsed onto one direction. A subset of k rows "
                "has rank at most k − 1, so compare the subsets with each other and with the "
                "random subset of the same size; the whole shard is drawn for orientation only.",
    "sources": "Per-source share of the shard, the selected subset and the quality top-k "
               "subset, and the fraction of each source's rows that was kept.",
}


def build_shard_report(*args, route: str | None = None, guard: str | None = None, **kwargs) -> ShardReport:
    """One shard's report (the parameters of :func:`_build_shard_report`). ``route`` (and
    ``guard``) name the selection in every label, figure and table of the page: the route that
    produced it (:func:`numerics.selection_label`), "DATAMASK" only where the learner ran;
    without a route it is called "selection"."""
    token = _SELECTION_LABEL.set(selection_label(route, guard))
    try:
        return _build_shard_report(*args, **kwargs)
    finally:
        _SELECTION_LABEL.reset(token)


def _build_shard_report(
    x,
    q,
    selected,
    history,
    *,
    ids=None,
    sources=None,
    lamb: float,
    algorithm: str,
    reference: dict,
    title: str,
    topk=None,
    device="cpu",
    extra: dict | None = None,
    random=None,
    greedy=None,
) -> ShardReport:
    """Build the report for one shard.

    ``x`` (n, d) embeddings and ``q`` (n,) quality (numpy or torch); ``selected``: the
    DATAMASK subset as a bool mask (n,) or indices; ``history``: the learner's history (list
    of dicts with step, mean_f, best_f, mean_f_qua, mean_f_div; may be empty); ``ids`` breaks
    quality ties for the top-k subset; ``sources`` (n,) optional source/domain labels.
    ``reference``: whole-shard evaluate_selection dicts for ``"random"`` and
    ``"quality_topk"`` (alias ``"topk"``), optionally ``"greedy"`` and ``"datamask"`` (else the
    selection is scored here). ``topk``: the quality top-k subset (mask or indices) if already
    computed, else it is recomputed with baselines.quality_topk. ``extra``: more
    ``{name: value}`` pairs shown in the page's header table (e.g. run time, config hash).
    ``random``: the random subset (mask or indices) whose spectrum is drawn as the equal-k
    reference, else ``baselines.random_selection(n, k, seed=0)``. ``greedy``: the greedy
    subset (mask or indices), when computed: its spectrum and flatness are shown too.

    Every value in ``metrics`` is a finite float (ratios to greedy are left out where they
    are undefined). Per-source metrics (``retention_selected[<source>]`` ...) have at most
    ``MAX_SOURCES_SHOWN`` entries: with more sources, all past the largest
    ``MAX_SOURCES_SHOWN - 1`` are folded into one ``(other)`` entry, so they always add up
    over the shard.
    """
    import torch

    from ..engine.config import canonical_algorithm

    algorithm = canonical_algorithm(algorithm)
    xt = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
    q_np = as_numpy(q, np.float64).ravel()
    if xt.ndim != 2 or xt.shape[0] != q_np.shape[0]:
        raise ValueError(f"x must be (n, d) and q (n,), got {tuple(xt.shape)} and {q_np.shape}")
    n, d = int(xt.shape[0]), int(xt.shape[1])
    sel = as_mask(selected, n)
    k = int(sel.sum())
    if k < 2:
        raise ValueError(f"a report needs a selection of at least 2 rows, got {k}")
    if topk is None:
        from ..engine.baselines import quality_topk

        topk = quality_topk(q_np, k, ids)
    topk_mask = as_mask(topk, n)

    # ---- whole-shard levels
    levels: dict = {}
    dm = find_reference(reference, "datamask")
    if dm is None:
        from ..engine.evaluate import evaluate_selection

        dm = evaluate_selection(xt, torch.as_tensor(q_np), np.flatnonzero(sel), lamb=lamb,
                                terms=(algorithm,), device=device)
    levels["datamask"] = scores_of(dm, algorithm)
    for name in ("topk", "random", "greedy"):
        ref = find_reference(reference, name)
        if ref is not None:
            levels[name] = scores_of(ref, algorithm)
    for req in ("topk", "random"):
        if req not in levels:
            raise KeyError(f"reference needs a {REF_ALIASES[req][0]!r} entry (evaluate_selection dict)")

    # ---- numbers
    if random is None:
        from ..engine.baselines import random_selection

        random = random_selection(n, k, seed=0)
    subsets = {"datamask": sel, "topk": topk_mask, "random": as_mask(random, n), "shard": None}
    if greedy is not None:
        subsets["greedy"] = as_mask(greedy, n)
    spectra = subset_spectra(xt, subsets, device=device)
    flat = {name: spectral_flatness(ev) for name, ev in spectra.items()}

    metrics: dict = {"n_rows": float(n), "dim": float(d), "k_selected": float(k),
                     "kept_fraction": k / n, "lamb": float(lamb)}
    metrics.update(objective_metrics(levels))
    metrics.update(selection_quality(q_np, sel, topk_mask))
    for name in spectra:
        metrics[f"spectrum_flatness_{_FLATNESS_KEYS[name]}"] = flat[name]
    if history:
        metrics["learner_steps"] = float(history[-1]["step"])
        if "elapsed_s" in history[-1]:
            metrics["learner_elapsed_s"] = float(history[-1]["elapsed_s"])
    ret = None
    if sources is not None:
        ret = source_retention(sources, sel, topk_mask)
        metrics.update(source_metrics(ret, MAX_SOURCES_SHOWN))

    # ---- figures
    rows, coords, ratio = pca_2d(xt, device=device)
    # a route that learns nothing has no curve: the figure is left out (three empty panels
    # said nothing) and the page says why in one line (NO_CURVE)
    figures = {} if not history else {
        "curve": _figure_curve(list(history), algorithm, lamb, levels)}
    figures |= {
        "quality": _figure_quality(quality_histograms(q_np, {"datamask": sel, "topk": topk_mask})),
        "projection": _figure_projection(coords, ratio, sel[rows], topk_mask[rows], n),
        "spectrum": _figure_spectrum(spectra, flat, d),
    }
    if ret is not None:
        figures["sources"] = _figure_sources(ret, k / n)

    markdown = _markdown(metrics, levels, algorithm, lamb, ret)
    page = _html_page(title, metrics, levels, algorithm, lamb, figures, ret, extra or {})
    return ShardReport(title=title, html=page, figures=figures, metrics=metrics, markdown=markdown)


# ================================================================== text
def _score_table(levels: dict, metrics: dict, algorithm: str, lamb: float):
    cols = [c for c in ("datamask", "topk", "random", "greedy") if c in levels]
    header = [""] + [LABELS[c] for c in cols]
    body = [
        [f"f (λ={lamb:g}, {algorithm})"] + [_fmt(levels[c]["f"]) for c in cols],
        ["f_qua (mean quality)"] + [_fmt(levels[c]["f_qua"]) for c in cols],
        [f"f_div ({algorithm})"] + [_fmt(levels[c]["f_div"]) for c in cols],
    ]
    flat_row = ["spectrum flatness"]
    for c in cols:
        key = f"spectrum_flatness_{_FLATNESS_KEYS[c]}"
        flat_row.append(_fmt(metrics[key], 4) if key in metrics else "–")
    body.append(flat_row)
    return header, body


def _summary_lines(metrics: dict) -> list[tuple[str, str]]:
    out = [
        ("rows kept", f"{int(metrics['k_selected']):,} of {int(metrics['n_rows']):,} "
                      f"({_pct(metrics['kept_fraction'])})"),
        ("f gain over quality top-k", _fmt(metrics["gain_f_over_topk"])),
        ("f gain over random", _fmt(metrics["gain_f_over_random"])),
        ("quality mean: shard / selected / top-k",
         f"{_fmt(metrics['quality_mean_shard'])} / {_fmt(metrics['quality_mean_selected'])} / "
         f"{_fmt(metrics['quality_mean_topk'])}"),
        ("overlap with quality top-k", _pct(metrics["overlap_with_topk"])),
    ]
    if "gap_closed_vs_greedy" in metrics:
        out.append(("f / f_greedy", _fmt(metrics["ratio_f_to_greedy"])))
        out.append(("gap closed (f − f_topk)/(f_greedy − f_topk)",
                    _fmt(metrics["gap_closed_vs_greedy"])))
    return out


def _source_rows(ret: dict) -> list[list[str]]:
    return [[_source_label(ret, i), f"{int(ret['rows'][i]):,}", f"{int(ret['selected'][i]):,}",
             _pct(ret["retention_selected"][i]),
             "–" if ret["retention_topk"] is None else _pct(ret["retention_topk"][i])]
            for i in range(len(ret["names"]))]


_SOURCE_HEADER = ["source", "rows", "kept", "retention", "top-k retention"]


def _markdown(metrics, levels, algorithm, lamb, ret) -> str:
    header, body = _score_table(levels, metrics, algorithm, lamb)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    lines += ["", "| summary | value |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in _summary_lines(metrics)]
    if ret is not None:
        lines += ["", "| " + " | ".join(_SOURCE_HEADER) + " |", "|---|---|---|---|---|"]
        for row in _source_rows(fold_sources(ret, MAX_SOURCES_SHOWN)):
            lines.append("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
    return "\n".join(lines) + "\n"


NO_CURVE = ("Optimisation curve: none — {label} took no learning steps (a route without the "
            "learner, λ = 1, or a result read from a finished checkpoint), so there is no "
            "per-step score to draw; the whole-shard scores above are the result.")


def _html_page(title, metrics, levels, algorithm, lamb, figures, ret, extra) -> str:
    header, body = _score_table(levels, metrics, algorithm, lamb)
    sections = []
    if "curve" not in figures:
        sections.append({"name": "curve", "png": None, "table": None,
                         "note": NO_CURVE.format(label=_SELECTION_LABEL.get())})
    for name, png in figures.items():
        table = None
        if name == "sources" and ret is not None:
            table = {"header": _SOURCE_HEADER,
                     "rows": _source_rows(fold_sources(ret, MAX_SOURCES_IN_TABLE))}
        sections.append({"name": name, "title": FIGURE_TITLES.get(name, name), "png": png,
                         "caption": FIGURE_CAPTIONS.get(name, ""), "table": table})
    return render(
        "shard_report.html.j2",
        title=title,
        algorithm=algorithm,
        lamb=lamb,
        metrics=metrics,
        score_header=header,
        score_rows=body,
        summary_rows=_summary_lines(metrics) + list(extra.items()),
        sections=sections,
        metrics_json=json.dumps(metrics, indent=1, default=float),
    )


# ================================================================== output
def write_shard_report(report: ShardReport, out_dir_uri) -> dict:
    """Write the report under ``out_dir_uri`` (path or URI): ``report_<figure>.png`` per
    figure, ``report_metrics.json`` (strict JSON, finite floats), ``report.md`` (the markdown
    tables) and, last, ``report.html``. Every file is published atomically (temp file beside
    it, then rename / object-store move), so a reader never sees a partial file, and the page
    appears only after everything else is in place. Figures of a previous report in the same
    directory that this report does not have (e.g. ``report_sources.png`` when the shard has no
    source column any more) are removed.

    Returns ``{"html": uri, "metrics": uri, "markdown": uri, <figure name>: uri, ...}``."""
    from ..engine import storage

    out = {}
    for name, png in report.figures.items():
        uri = storage.join(out_dir_uri, f"report_{name}.png")
        storage.atomic_write_bytes(uri, png)
        out[name] = uri
    for name in FIGURE_CAPTIONS:
        if name not in report.figures:
            storage.remove(storage.join(out_dir_uri, f"report_{name}.png"), missing_ok=True)
    uri = storage.join(out_dir_uri, "report_metrics.json")
    blob = json.dumps({k: float(v) for k, v in report.metrics.items()}, indent=1, sort_keys=True,
                      allow_nan=False)
    storage.atomic_write_bytes(uri, blob.encode("utf-8"))
    out["metrics"] = uri
    uri = storage.join(out_dir_uri, "report.md")
    storage.atomic_write_bytes(uri, (f"# {report.title}\n\n" + report.markdown).encode("utf-8"))
    out["markdown"] = uri
    uri = storage.join(out_dir_uri, "report.html")
    storage.atomic_write_bytes(uri, report.html.encode("utf-8"))
    out["html"] = uri
    return out
