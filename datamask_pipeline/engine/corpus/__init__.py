"""The corpus stage: one budget and one objective over every shard (docs/method.md#corpus-level).

:func:`select_corpus` is the entry; :class:`CorpusBudget` the budget; deduplication, the
exchange rounds and the sufficient statistics they share live in their own modules, and so do
the stage's files on the data root (``shards``, ``duplicates``, ``outputs``). Names are
imported on first use, so that loading the Dagster definitions does not import torch.
"""

import importlib

_WHERE = {
    "CorpusBudget": ".budget", "allocate": ".budget", "fit_tokens": ".budget",
    "CorpusSelection": ".select", "CorpusShard": ".select", "GATHER_MAX_ROWS": ".select",
    "MODES": ".select", "block_of": ".parts", "select_corpus": ".select", "Part": ".parts",
}

__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
