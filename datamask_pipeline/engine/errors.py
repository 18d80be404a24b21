"""The error a shard raises when it breaks the data contract (file, column, rule, ids).
Dependency-free so that every engine module (``data``, ``storage``) can raise it without
importing the others.
"""

from __future__ import annotations

__all__ = ["DataContractError", "MAX_IDS"]

MAX_IDS = 10


class DataContractError(ValueError):
    """A shard that breaks the data contract.

    Attributes: ``file``, ``column`` (None for file-level problems), ``rule``, ``ids`` (up to
    10 offending ids; empty when the ids themselves are null, see ``rows``), ``rows`` (up to
    10 offending row numbers), ``count`` (how many rows/ids break the rule), ``detail``."""

    def __init__(self, file, rule: str, column: str | None = None, ids=None, count=None,
                 unit: str = "rows", detail: str | None = None, rows=None):
        self.file = str(file)
        self.column = column
        self.rule = rule
        self.ids = list(ids or [])[:MAX_IDS]
        self.rows = list(rows or [])[:MAX_IDS]
        self.count = count
        self.detail = detail
        msg = f"{self.file}: "
        if column is not None:
            msg += f"column {column!r}: "
        msg += f"rule {rule!r} broken"
        if count is not None:
            if count == 1 and unit.endswith("s"):
                unit = unit[:-1]
            msg += f" by {count} {unit}"
        if self.ids:
            msg += f"; ids: {self.ids}"
        if self.rows:
            msg += f"; row numbers: {self.rows}"
        if detail:
            msg += f"; {detail}"
        super().__init__(msg)
