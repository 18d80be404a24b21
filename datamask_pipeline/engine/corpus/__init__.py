"""The corpus stage: one budget and one objective over every shard (docs/method.md#corpus-level).

:func:`select_corpus` is the entry; :class:`CorpusBudget` the budget; the exchange rounds and
the sufficient statistics they share live in their own modules.
"""

from .budget import CorpusBudget, allocate, fit_tokens
from .select import GATHER_MAX_ROWS, MODES, CorpusSelection, CorpusShard, block_of, select_corpus

__all__ = ["CorpusBudget", "CorpusSelection", "CorpusShard", "GATHER_MAX_ROWS", "MODES",
           "allocate", "block_of", "fit_tokens", "select_corpus"]
