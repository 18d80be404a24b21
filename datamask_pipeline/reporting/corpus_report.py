"""Corpus report (issue 6, item 2): one page over all shards, drawn and rendered from the
per-shard metrics (the aggregation itself is :mod:`.numerics`).

Input: the per-shard metric dicts of :func:`shard_report.build_shard_report` (its
``ShardReport.metrics``, or the ``report_metrics.json`` that :func:`write_shard_report` wrote),
keyed by shard / partition key. Output (:class:`CorpusReport`):

* ``rows``: one dict per shard (see :data:`ROW_FIELDS`), missing numbers as ``None``;
* ``totals``: corpus-level numbers (see :func:`corpus_totals`), all finite floats;
* ``figures``: ``{"overview": PNG bytes}``: kept fraction, mean quality before / after and the
  objective gain over quality top-k, per shard;
* ``html``: one self-contained page (inline CSS, the figure as a ``data:`` URI, no scripts; the
  only hyperlinks are the optional per-shard report links the caller passes), rendered from
  ``templates/corpus_report.html.j2``;
* ``metrics``: ``totals`` again, the flat ``{name: float}`` dict for Dagster metadata;
* ``markdown``: the per-shard table and a totals table (``dg.MetadataValue.md``).

Aggregation rules. Row counts add up. Mean quality before is weighted by shard rows, after by
kept rows (so it is the mean over the union of the selected subsets). Objective values are
per-shard means (f_qua is a mean over the subset, the diversity terms are normalised), so the
corpus numbers for them are plain means over shards plus min / max and a count of the shards
where the selection beats quality top-k; they are only comparable when every shard used the same
lambda and algorithm, which the page checks and flags.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .numerics import ROW_FIELDS, corpus_rows_from_metrics, corpus_totals
from .shard_report import COLORS, _fmt, _new_figure, _pct, _png, _style, render

__all__ = [
    "CorpusReport",
    "ROW_FIELDS",
    "corpus_rows_from_metrics",
    "corpus_totals",
    "build_corpus_report",
    "write_corpus_report",
]

MAX_MARKDOWN_ROWS = 200
FIGURE_CAPTIONS = {
    "overview": "Per shard: kept fraction (dotted: the corpus), mean quality of the shard, the "
                "selected subset and the quality top-k subset, and the whole-shard objective "
                "gain of the selection over quality top-k (each shard's route is in the table).",
}


@dataclass
class CorpusReport:
    title: str
    html: str
    rows: list = field(default_factory=list)
    totals: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    markdown: str = ""


# ----------------------------------------------------------------------- figure
def _figure(rows: list[dict], totals: dict) -> bytes:
    s = len(rows)
    width = float(min(18.0, max(11.0, 6.0 + 0.32 * s)))
    fig = _new_figure(width, 8.4)
    side = dict(fontsize=8.5, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True)
    xs = np.arange(s)
    labels = [r["shard"] for r in rows]

    def col(name):
        return np.array([np.nan if r[name] is None else r[name] for r in rows], dtype=np.float64)

    kept = col("kept_fraction")
    ax1.bar(xs, kept, color=COLORS["datamask"], width=0.7, label="shard")
    if s and np.isfinite(kept).any():
        if "kept_fraction" in totals:
            ax1.axhline(totals["kept_fraction"], color="#444444", ls=":", lw=1.1,
                        label=f"corpus ({100 * totals['kept_fraction']:.1f}%)")
        ax1.set_ylim(0, 1.2 * float(np.nanmax(kept)) if np.nanmax(kept) > 0 else 1.0)
        ax1.legend(**side)
    ax1.set_ylabel("kept fraction", fontsize=9.5)
    ax1.set_title("Kept fraction per shard", fontsize=10.5)

    w = 0.27
    for vals, off, c, label in ((col("quality_mean_before"), -w, COLORS["shard"], "shard (before)"),
                                (col("quality_mean_after"), 0.0, COLORS["datamask"], "selection (after)"),
                                (col("quality_mean_topk"), w, COLORS["topk"], "quality top-k")):
        ax2.bar(xs + off, vals, width=w, color=c, label=label)
    ax2.set_ylabel("mean quality", fontsize=9.5)
    ax2.set_title("Mean quality before and after selection", fontsize=10.5)
    ax2.legend(**side)

    gain = col("gain_f_over_topk")
    colors = [COLORS["datamask"] if g >= 0 else COLORS["topk"] for g in np.nan_to_num(gain)]
    ax3.bar(xs, gain, color=colors, width=0.7, label="selection − top-k")
    greedy_gain = col("f_greedy") - col("f_topk")
    if np.isfinite(greedy_gain).any():
        ax3.plot(xs, greedy_gain, ls="none", marker="_", ms=max(5.0, min(22.0, 260.0 / max(1, s))), mew=2.2, color=COLORS["greedy"],
                 label="greedy − top-k (reference)")
    ax3.axhline(0.0, color="#444444", lw=0.9)
    if np.nanmin(np.append(gain, 0.0)) < 0:  # explain the orange bars
        from matplotlib.patches import Patch

        handles, _ = ax3.get_legend_handles_labels()
        handles.append(Patch(color=COLORS["topk"], label="selection − top-k < 0 (top-k better)"))
        ax3.legend(handles=handles, **side)
    else:
        ax3.legend(**side)
    ax3.set_ylabel("f − f(quality top-k)", fontsize=9.5)
    ax3.set_title("Objective gain over quality top-k (whole shard; > 0: the selection better)",
                  fontsize=10.5)
    ax3.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4), useMathText=True)
    missing = ~np.isfinite(gain)
    for x in xs[missing]:
        ax3.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7, color="#888888")

    step = max(1, int(math.ceil(s / 40)))  # at most ~40 tick labels
    ax3.set_xticks(xs[::step])
    ax3.set_xticklabels([labels[i] if len(labels[i]) <= 16 else labels[i][:15] + "…"
                         for i in range(0, s, step)], rotation=40 if s > 6 else 0,
                        ha="right" if s > 6 else "center", fontsize=8.5)
    ax3.set_xlabel("shard", fontsize=9.5)
    for ax in (ax1, ax2, ax3):
        _style(ax)
        ax.grid(False, axis="x")
        if s:
            ax.set_xlim(-0.6, s - 0.4)
    if not s:
        ax1.text(0.5, 0.5, "no shards", ha="center", va="center", transform=ax1.transAxes)
    fig.tight_layout()
    return _png(fig)


# ----------------------------------------------------------------------- text
_COLUMNS = (
    ("shard", "shard"), ("route", "route"), ("rows", "n_rows"), ("kept", "k_selected"), ("kept %", "kept_fraction"),
    ("quality before", "quality_mean_before"), ("quality after", "quality_mean_after"),
    ("quality top-k", "quality_mean_topk"), ("f selection", "f_datamask"),
    ("f top-k", "f_topk"), ("f random", "f_random"), ("gain over top-k", "gain_f_over_topk"),
    ("gap closed vs greedy", "gap_closed_vs_greedy"),
)


def _cell(row: dict, fld: str) -> str:
    v = row.get(fld)
    if fld in ("shard", "route"):
        return "–" if v is None else str(v)
    if v is None:
        return "–"
    if fld in ("n_rows", "k_selected"):
        return f"{int(v):,}"
    if fld == "kept_fraction":
        return _pct(v)
    return _fmt(v)


def _columns(rows: list[dict]) -> list[tuple[str, str]]:
    cols = list(_COLUMNS)
    if not any(r.get("route") for r in rows):
        cols = [c for c in cols if c[1] != "route"]
    if not any(r.get("gap_closed_vs_greedy") is not None for r in rows):
        cols = [c for c in cols if c[1] != "gap_closed_vs_greedy"]
    return cols


def _totals_lines(t: dict) -> list[tuple[str, str]]:
    out = [("shards", f"{int(t['n_shards']):,}"),
           ("rows kept", f"{int(t['rows_kept']):,} of {int(t['rows_total']):,} "
                         f"({_pct(t.get('kept_fraction'))})")]
    if "quality_mean_before" in t or "quality_mean_after" in t:
        out.append(("mean quality before / after / top-k",
                    f"{_fmt(t.get('quality_mean_before'))} / {_fmt(t.get('quality_mean_after'))} / "
                    f"{_fmt(t.get('quality_mean_topk'))}"))
    if "gain_f_over_topk_mean" in t:
        out.append(("f gain over quality top-k: mean (min … max)",
                    f"{_fmt(t['gain_f_over_topk_mean'])} ({_fmt(t['gain_f_over_topk_min'])} … "
                    f"{_fmt(t['gain_f_over_topk_max'])})"))
        out.append(("shards where the selection beats quality top-k",
                    f"{int(t['shards_beating_topk'])} of {int(t['shards_with_gain'])}"))
    if "gain_f_over_random_mean" in t:
        out.append(("f gain over random: mean", _fmt(t["gain_f_over_random_mean"])))
    if "gap_closed_vs_greedy_mean" in t:
        out.append(("gap to greedy closed: mean", _fmt(t["gap_closed_vs_greedy_mean"])))
    if "spectrum_flatness_selected_mean" in t:
        out.append(("spectrum flatness: selection / top-k (mean)",
                    f"{_fmt(t['spectrum_flatness_selected_mean'], 4)} / "
                    f"{_fmt(t.get('spectrum_flatness_topk_mean'), 4)}"))
    return out


def _markdown(rows, totals, lamb_note) -> str:
    cols = _columns(rows)
    lines = ["| " + " | ".join(h for h, _ in cols) + " |",
             "|---|" + "---:|" * (len(cols) - 1)]
    for r in rows[:MAX_MARKDOWN_ROWS]:
        lines.append("| " + " | ".join(_cell(r, f).replace("|", "/") for _, f in cols) + " |")
    if len(rows) > MAX_MARKDOWN_ROWS:
        lines.append(f"| … {len(rows) - MAX_MARKDOWN_ROWS} more shards (see the HTML report) |"
                     + " |" * (len(cols) - 1))
    lines += ["", "| corpus | value |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in _totals_lines(totals)]
    if lamb_note:
        lines += ["", f"**Note:** {lamb_note}"]
    return "\n".join(lines) + "\n"


def _html_page(title, rows, totals, figures, links, extra, algorithm, lamb_note) -> str:
    cols = _columns(rows)
    shard_rows = [{"cells": [_cell(r, f) for _, f in cols],
                   "href": str(links[r["shard"]]) if links and r["shard"] in links else None}
                  for r in rows]
    return render(
        "corpus_report.html.j2",
        title=title,
        algorithm=algorithm,
        totals=totals,
        lamb_note=lamb_note,
        totals_rows=_totals_lines(totals) + list((extra or {}).items()),
        figures=[{"name": name, "png": png, "caption": FIGURE_CAPTIONS.get(name, "")}
                 for name, png in figures.items()],
        header=[h for h, _ in cols],
        shard_rows=shard_rows,
        totals_json=json.dumps(totals, indent=1, sort_keys=True),
    )


# ----------------------------------------------------------------------- API
def build_corpus_report(
    shard_metrics: Mapping[str, Mapping],
    *,
    title: str = "Corpus selection report",
    algorithm: str | None = None,
    links: Mapping[str, str] | None = None,
    extra: dict | None = None,
) -> CorpusReport:
    """Build the corpus page from ``{shard key: shard report metrics}`` (the dicts of
    ``ShardReport.metrics`` or the ``report_metrics.json`` files). ``algorithm`` is shown in
    the header; ``links`` maps shard keys to the URL / relative path of their shard report
    (rendered as the only hyperlinks of the page); ``extra`` adds rows to the totals table."""
    rows = corpus_rows_from_metrics(shard_metrics)
    totals = corpus_totals(rows)
    lambs = sorted({r["lamb"] for r in rows if r["lamb"] is not None})
    lamb_note = ""
    if len(lambs) > 1:
        lamb_note = (f"shards were selected with different λ ({', '.join(f'{v:g}' for v in lambs)}); "
                     "their objective values are not comparable, so the objective means mix scales.")
    figures = {"overview": _figure(rows, totals)}
    return CorpusReport(
        title=title,
        html=_html_page(title, rows, totals, figures, links, extra, algorithm, lamb_note),
        rows=rows,
        totals=totals,
        figures=figures,
        metrics=dict(totals),
        markdown=_markdown(rows, totals, lamb_note),
    )


def write_corpus_report(report: CorpusReport, out_dir_uri) -> dict:
    """Write ``corpus_<figure>.png``, ``corpus_metrics.json`` (strict JSON: totals and rows),
    ``corpus_report.md`` and, last, ``corpus_report.html`` under ``out_dir_uri``, each
    published atomically. Returns ``{"html", "metrics", "markdown", <figure name>: uri}``."""
    from ..engine import storage

    out = {}
    for name, png in report.figures.items():
        uri = storage.join(out_dir_uri, f"corpus_{name}.png")
        storage.atomic_write_bytes(uri, png)
        out[name] = uri
    uri = storage.join(out_dir_uri, "corpus_metrics.json")
    blob = json.dumps({"totals": report.totals, "shards": report.rows}, indent=1,
                      sort_keys=True, allow_nan=False)
    storage.atomic_write_bytes(uri, blob.encode("utf-8"))
    out["metrics"] = uri
    uri = storage.join(out_dir_uri, "corpus_report.md")
    storage.atomic_write_bytes(uri, (f"# {report.title}\n\n" + report.markdown).encode("utf-8"))
    out["markdown"] = uri
    uri = storage.join(out_dir_uri, "corpus_report.html")
    storage.atomic_write_bytes(uri, report.html.encode("utf-8"))
    out["html"] = uri
    return out
