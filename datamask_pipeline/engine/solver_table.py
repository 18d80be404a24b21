"""``solver="auto"``: the fastest measured route to the best whole-shard f, per term, n and
device, read from ``solver_table.json``, which ``python -m bench.solvers`` writes from its
measurements (the file names the command and the results it came from).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("solver_table.json")
# Used for terms and devices the bench has not measured; it never ends below quality top-k
# (the polish starts there and only accepts improving swaps).
FALLBACK = "topk+polish"


@lru_cache(maxsize=1)
def load() -> dict:
    with open(TABLE_PATH, encoding="utf-8") as fh:
        return json.load(fh)


def choose(term_spec: dict, n: int, device_type: str = "cpu") -> tuple[str, str]:
    """(solver, why) for a shard of n rows. ``term_spec``: {term name: weight}."""
    table = load()
    rules = table.get("rules", {})
    measured = rules.get(device_type)
    note = ""
    if measured is None:
        measured = rules.get("cpu", {})
        note = f" (not measured on {device_type}: the CPU measurements are used)"
    names = list(term_spec)
    if len(names) != 1 or names[0] not in measured:
        what = "a mixture of terms" if len(names) != 1 else f"term {names[0]!r}"
        return FALLBACK, f"auto: {what} was not measured by the bench: {FALLBACK}"
    for row in measured[names[0]]:
        if n <= row["max_n"]:
            return row["solver"], (f"auto: {row['solver']} for {names[0]} at n={n} "
                                   f"({row['why']}){note}")
    last = measured[names[0]][-1]
    return last["solver"], f"auto: {last['solver']} for {names[0]} at n={n} ({last['why']}){note}"
