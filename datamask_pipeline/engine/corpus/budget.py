"""The corpus budget: what the user asks for once, for the whole corpus.

A fraction of the rows, a number of rows, or a number of tokens. :meth:`CorpusBudget.rows`
turns it into k for a corpus of N rows; a token budget also keeps its target, which the
selection meets within one document (:func:`fit_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ConfigError

__all__ = ["CorpusBudget", "allocate", "fit_tokens"]

KINDS = ("fraction", "rows", "tokens")


@dataclass(frozen=True)
class CorpusBudget:
    """``kind`` is ``fraction`` (of the corpus's rows, in (0, 1)), ``rows`` or ``tokens``."""

    kind: str
    value: float

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"corpus budget: kind must be one of {KINDS}, got {self.kind!r}")
        v = self.value
        if self.kind == "fraction" and not 0.0 < v < 1.0:
            raise ConfigError(f"corpus budget: select_ratio={v} must lie in (0, 1)")
        if self.kind in ("rows", "tokens") and (v != int(v) or v < 1):
            raise ConfigError(f"corpus budget: select_{self.kind}={v} must be a whole number >= 1")

    @classmethod
    def of(cls, select_ratio: float | None = None, select_rows: int | None = None,
           select_tokens: int | None = None) -> "CorpusBudget":
        """The one budget that is set; ``select_rows``/``select_tokens`` win over the ratio
        (which always has a default)."""
        given = [(k, v) for k, v in (("rows", select_rows), ("tokens", select_tokens))
                 if v is not None]
        if len(given) > 1:
            raise ConfigError("corpus budget: set select_rows or select_tokens, not both")
        if given:
            return cls(given[0][0], float(given[0][1]))
        if select_ratio is None:
            raise ConfigError("corpus budget: set select_ratio, select_rows or select_tokens")
        return cls("fraction", float(select_ratio))

    @property
    def label(self) -> str:
        if self.kind == "fraction":
            return f"{self.value:g} of the rows"
        return f"{int(self.value):,} {self.kind}"

    def rows(self, n: int, tokens_total: int | None = None) -> int:
        """k for a corpus of n rows (for tokens: the row count whose mean-token estimate meets
        the target; :func:`fit_tokens` then makes it exact). Raises ConfigError when the
        budget is impossible, before any work."""
        if n < 2:
            raise ConfigError(f"corpus budget: the corpus has {n} row(s); at least 2 are needed")
        if self.kind == "fraction":
            k = max(1, int(round(self.value * n)))
        elif self.kind == "rows":
            k = int(self.value)
        else:
            if tokens_total is None:
                raise ConfigError("corpus budget: select_tokens needs token counts: a token "
                                  "column (token_column) or a text column with a tokenizer")
            if self.value >= tokens_total:
                raise ConfigError(f"corpus budget: select_tokens={int(self.value):,} is not below "
                                  f"the corpus's {tokens_total:,} tokens: nothing to choose")
            k = max(1, int(round(self.value / tokens_total * n)))
        if k >= n:
            raise ConfigError(f"corpus budget: {self.label} asks for {k:,} of the corpus's {n:,} "
                              f"rows: nothing to choose (the budget must be below the corpus)")
        return k


def allocate(sizes, k: int) -> np.ndarray:
    """Split k over parts of the given sizes in proportion (largest remainder), so the parts
    add up to exactly k and none exceeds its size."""
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    if not 0 <= k <= total:
        raise ValueError(f"cannot allocate {k} rows over {total}")
    exact = sizes * (k / total)
    out = np.floor(exact).astype(np.int64)
    rest = k - int(out.sum())
    order = np.lexsort((np.arange(len(sizes)), -(exact - out)))
    for i in order:
        if rest == 0:
            break
        if out[i] < sizes[i]:
            out[i] += 1
            rest -= 1
    return out


def fit_tokens(selected: np.ndarray, priority: np.ndarray, tokens: np.ndarray,
               target: int) -> np.ndarray:
    """Adjust a selection (bool, (N,)) to a token target: drop the selected rows of lowest
    ``priority`` while the total exceeds the target, then add unselected rows in order of
    ``priority`` while each still fits. The result holds at most ``target`` tokens and no
    remaining row in priority order fits: within one document of the target."""
    sel = selected.copy()
    tokens = np.asarray(tokens, dtype=np.int64)
    total = int(tokens[sel].sum())
    if total > target:
        members = np.flatnonzero(sel)
        drop_order = members[np.argsort(priority[members], kind="stable")]
        cum = total - np.cumsum(tokens[drop_order])
        n_drop = int(np.searchsorted(-cum, -target, side="left")) + 1  # first where cum <= target
        sel[drop_order[:n_drop]] = False
        total = int(tokens[sel].sum())
    rest = np.flatnonzero(~sel)
    order = rest[np.argsort(-priority[rest], kind="stable")]
    cum = total + np.cumsum(tokens[order])
    j = int(np.searchsorted(cum, target, side="right"))  # the prefix that fits as a whole
    sel[order[:j]] = True
    total = int(cum[j - 1]) if j else total
    tail = order[j:]
    if tail.size:  # then any later row that still fits, until none can
        floor = np.minimum.accumulate(tokens[tail][::-1])[::-1]
        for i, t in enumerate(tokens[tail]):
            if target - total < floor[i]:
                break
            if total + t <= target:
                sel[tail[i]] = True
                total += int(t)
    return sel
