"""The corpus selection's page: whole-corpus scores, each shard's and each source's share of
the selection next to its share of the corpus (one bar chart each), and the exchange rounds.
Built from ``corpus/selection.json`` and per-source counts; Dagster-free. The corpus assets'
markdown tables (scores, shares, sources, the dedup per shard) are rendered here too."""

from __future__ import annotations

from .shard_report import COLORS, _new_figure, _png, _style, render

__all__ = ["render_page", "shares_figure", "headline", "excerpt", "scores_md", "shares_md",
           "sources_md", "dedup_md"]


def _share(p: float) -> str:
    """A share as a percentage to 3 significant digits: 10%, 12.3%, 0.5%."""
    return f"{100 * p:.3g}%"


def headline(summary: dict, budget: str | None = None) -> str:
    """What the selection is, in the units a reader checks: the rows selected as a share of
    the corpus's input rows (the rows left after deduplication in brackets) and the budget in
    the rows it was taken of, e.g. "300 rows selected = 10% of 3,000 input rows (2,621 after
    dedup) · budget 10% of the input rows". A fraction budget is read from the counts (k =
    fraction x input rows, the default, or x the rows after dedup); ``budget``: the label of
    any other budget (rows, tokens)."""
    k = int(summary.get("selected_rows", summary["k"]))
    n = int(summary["n"])
    n_in = int(summary.get("n_input") or n)
    text = f"{k:,} rows selected = {_share(k / max(1, n_in))} of {n_in:,} input rows"
    if n != n_in:
        text += f" ({n:,} after dedup)"
    b = summary.get("budget") or {}
    if b.get("kind") == "fraction":
        v = float(b["value"])
        of = "the input rows"
        if n != n_in and int(summary["k"]) != max(1, round(v * n_in)) and (
                int(summary["k"]) == max(1, round(v * n))):
            of = "the rows after dedup"
        text += f" · budget {_share(v)} of {of}"
    elif budget:
        text += f" · budget {budget}"
    return text


def shares_figure(names: list, rows: list, selected: list, title: str) -> bytes:
    """Bars of each part's share of the corpus and of the selection."""
    import numpy as np

    total_r, total_s = max(1, sum(rows)), max(1, sum(selected))
    fig = _new_figure(max(5.0, 0.5 * len(names) + 2), 3.2)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(names))
    ax.bar(x - 0.2, [r / total_r for r in rows], width=0.4, color=COLORS["shard"],
           label="share of the corpus")
    ax.bar(x + 0.2, [s / total_s for s in selected], width=0.4, color=COLORS["datamask"],
           label="share of the selection")
    ax.set_xticks(x, names, rotation=45 if len(names) > 6 else 0, ha="right" if len(names) > 6 else "center")
    ax.set_ylabel("share")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    _style(ax)
    fig.tight_layout()
    return _png(fig)


def _share_rows(names, rows, selected):
    total = max(1, sum(selected))
    return [[n, f"{r:,}", f"{s:,}", f"{s / max(1, r):.1%}", f"{s / total:.1%}"]
            for n, r, s in zip(names, rows, selected)]


EXCERPT_CHARS = 400


def excerpt(text: str | None, chars: int = EXCERPT_CHARS) -> str:
    """The first ``chars`` characters of a text (line breaks kept), "…" where cut."""
    if text is None:
        return "(no text)"
    return text if len(text) <= chars else text[:chars].rstrip() + " …"


def _measure(v) -> str:
    return "n/a" if v is None or v != v else f"{v:.3f}"


def render_page(summary: dict, budget: str, sources: dict | None = None,
                duplicate_pairs: list | None = None) -> str:
    """The page's HTML. ``sources``: {source: (rows in the corpus, rows selected)}.
    ``duplicate_pairs``: a sample of the dedup's dropped rows, each a dict of kind,
    containment, cosine, the dropped row's and its duplicate's label (shard, row, id) and
    text, shown side by side so a reader can judge them."""
    keys = sorted(summary["sizes"])
    rows = [summary["sizes"][k] for k in keys]
    sel = [summary["counts"].get(k, 0) for k in keys]
    figures = [{"name": "shards", "png": shares_figure(keys, rows, sel, "each shard's share"),
                "caption": "Each shard's share of the corpus (grey) and of the selection (blue)."}]
    source_rows = None
    if sources:
        names = sorted(sources, key=lambda s: -sources[s][1])
        figures.append({"name": "sources", "png": shares_figure(
            names, [sources[s][0] for s in names], [sources[s][1] for s in names],
            "each source's share"),
            "caption": "Each source's share of the corpus (grey) and of the selection (blue)."})
        source_rows = _share_rows(names, [sources[s][0] for s in names],
                                  [sources[s][1] for s in names])
    label = {"selection": f"corpus {summary['mode']} ({summary['route']})"}
    score_rows = [[label.get(n, n), f"{v['f']:.6f}", f"{v['f_qua']:.6f}", f"{v['f_div']:.6f}"]
                  for n, v in (summary.get("scores") or {}).items()]
    rounds = [[r["round"], f"{r['swaps']:,}", f"{r['f']:.8f}", f"{r['seconds']:.1f}",
               f"{r['bytes_exchanged']:,}"] for r in summary.get("rounds") or []]
    dd = summary.get("dedup") or {}
    if dd.get("enabled"):
        rows_in = max(1, int(dd.get("rows") or 0))
        dedup = [["rows before", f"{dd.get('rows', 0):,}"],
                 ["dropped", f"{dd.get('dropped', 0):,} ({(dd.get('dropped') or 0) / rows_in:.1%})"],
                 ["exact text", f"{dd.get('exact_dropped') or 0:,}"],
                 ["fuzzy text (containment ≥ " + f"{dd.get('containment')})", f"{dd.get('fuzzy_dropped') or 0:,}"],
                 ["near (cosine ≥ " + f"{dd.get('threshold')})", f"{dd.get('near_dropped') or 0:,}"]]
    elif dd:
        dedup = [["deduplication", "off"]]
    else:
        dedup = None
    pairs = [{"kind": d["kind"], "containment": _measure(d.get("containment")),
              "cosine": _measure(d.get("cosine")), "dropped": d["dropped"],
              "kept": d["kept"], "dropped_text": excerpt(d.get("dropped_text")),
              "kept_text": excerpt(d.get("kept_text"))} for d in duplicate_pairs or []]
    return render("corpus_selection.html.j2", title="Corpus selection", summary=summary, dedup=dedup,
                  duplicate_pairs=pairs,
                  budget=budget, headline=headline(summary, budget), excluded=sorted((summary.get("excluded") or {}).items()),
                  score_rows=score_rows, figures=figures,
                  shard_rows=_share_rows(keys, rows, sel), source_rows=source_rows,
                  rounds=rounds)


# ------------------------------------------------------------------ markdown tables
def scores_md(result) -> str:
    """The whole-corpus f of the selection and its references (a ``CorpusSelection``)."""
    if not result.scores:
        return "(not computed: " + "; ".join(result.notes) + ")"
    lines = [f"| selection | f (λ={result.lamb:g}, {result.term}) | f_qua | f_div |",
             "|---|---:|---:|---:|"]
    label = {"selection": f"corpus {result.mode} ({result.route})"}
    for name, sc in result.scores.items():
        lines.append(f"| {label.get(name, name)} | {sc['f']:.6g} | {sc['f_qua']:.6g} | "
                     f"{sc['f_div']:.6g} |")
    return "\n".join(lines)


def shares_md(counts: dict, sizes: dict, excluded: dict) -> str:
    """Each shard's rows, rows selected, kept share and share of the selection; the shards
    left out with why."""
    total = max(1, sum(counts.values()))
    lines = ["| shard | rows | selected | kept | share of the selection |", "|---|---:|---:|---:|---:|"]
    for key in sorted(sizes):
        c = counts.get(key, 0)
        lines.append(f"| {key} | {sizes[key]:,} | {c:,} | {c / max(1, sizes[key]):.1%} | "
                     f"{c / total:.1%} |")
    for key, why in sorted(excluded.items()):
        lines.append(f"| {key} | excluded | - | - | {why} |")
    return "\n".join(lines)


def sources_md(sources: dict, column: str = "source") -> str:
    """``sources`` ({source: (rows in the corpus, rows selected)}) as a table, the most
    selected first."""
    total = max(1, sum(s for _, s in sources.values()))
    lines = [f"| {column} | rows | selected | kept | share of the selection |",
             "|---|---:|---:|---:|---:|"]
    for name, (r, c) in sorted(sources.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {name} | {r:,} | {c:,} | {c / max(1, r):.1%} | {c / total:.1%} |")
    return "\n".join(lines)


def dedup_md(sizes: dict, duplicates) -> str:
    """Each shard's rows dropped by the dedup, by reason (``sizes``: {shard: rows}, in table
    order; ``duplicates``: the table of ``corpus/duplicates.parquet``)."""
    per_shard = {}
    for key, reason in zip(duplicates.column("partition_key").to_pylist(),
                           duplicates.column("reason").to_pylist()):
        per_shard.setdefault(key, {"exact": 0, "fuzzy": 0, "near": 0})[reason] += 1
    md = ["| shard | rows | exact | fuzzy | near | dropped |", "|---|---:|---:|---:|---:|---:|"]
    for key, n in sizes.items():
        e = per_shard.get(key, {"exact": 0, "fuzzy": 0, "near": 0})
        md.append(f"| {key} | {n:,} | {e['exact']:,} | {e['fuzzy']:,} | {e['near']:,} | "
                  f"{sum(e.values()) / max(1, n):.1%} |")
    return "\n".join(md)
