"""Selection reports: what a data engineer looks at before trusting a selection.

Dagster-free: the pipeline's assets call these functions and attach the results (files and
metadata) to their materialisations. matplotlib is imported lazily inside the plotting
functions (Agg canvas, no pyplot), so importing this package costs no plotting time.

* :func:`build_shard_report` / :func:`write_shard_report`: one shard's report (optimisation
  curve, quality distribution, PCA projection, eigen-spectrum flatness, per-source retention),
  as a self-contained HTML page plus PNGs, flat float metrics and a markdown table.
* :func:`build_corpus_report` / :func:`write_corpus_report`: one page over all shards (kept
  fraction, quality before/after, objective gain over quality top-k, totals) from the
  per-shard metric dicts.
* :func:`sweep_lambda` / :func:`plot_frontier`: the lambda trade-off view (also
  ``python -m datamask_pipeline.reporting.tradeoff``).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ShardReport": "shard_report",
    "build_shard_report": "shard_report",
    "write_shard_report": "shard_report",
    "spectral_flatness": "shard_report",
    "correlation_spectrum": "shard_report",
    "pca_2d": "shard_report",
    "source_retention": "shard_report",
    "fold_sources": "shard_report",
    "CorpusReport": "corpus_report",
    "build_corpus_report": "corpus_report",
    "write_corpus_report": "corpus_report",
    "corpus_rows_from_metrics": "corpus_report",
    "corpus_totals": "corpus_report",
    "sweep_lambda": "tradeoff",
    "plot_frontier": "tradeoff",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)
