"""``solver="auto"``: the fastest measured route to the best whole-shard f, per device, term,
λ and n, read from ``solver_table.json``, which ``python -m bench.solvers --write-table``
writes from its measurements (the file names, per device, the command and the results it came
from).

The table is keyed by device type (``cpu``, ``cuda``): a run of the bench on a machine adds or
replaces the rules of *its* device and leaves the others as they were (:func:`merge`). Each row
may carry the λ it was measured at; when a term has rows for several λ, the rows of the
nearest measured λ are used. A device the bench has not run on uses the CPU rules, and the
route's ``why`` says so.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("solver_table.json")
# Used for terms and devices the bench has not measured; it never ends below quality top-k
# (the polish starts there and only accepts improving swaps).
FALLBACK = "topk+polish"
# The rules every device falls back to.
BASE_DEVICE = "cpu"


@lru_cache(maxsize=1)
def load() -> dict:
    with open(TABLE_PATH, encoding="utf-8") as fh:
        return json.load(fh)


def _rows_for_lamb(rows: list, lamb: float | None) -> tuple[list, str]:
    """The rows of the λ nearest ``lamb`` (rows without a λ hold for every λ) and a note
    when the λ used is not the one asked for."""
    tagged = sorted({r["lamb"] for r in rows if r.get("lamb") is not None})
    if not tagged:
        return rows, ""
    if lamb is None:
        use = tagged[0] if len(tagged) == 1 else min(tagged, key=lambda v: abs(v - 0.5))
    else:
        use = min(tagged, key=lambda v: (abs(v - lamb), v))
    mine = [r for r in rows if r.get("lamb") == use]
    note = "" if lamb is None or abs(use - lamb) < 1e-12 else f"; measured at λ={use:g}, not at λ={lamb:g}"
    return mine, note


def choose(term_spec: dict, n: int, device_type: str = "cpu", lamb: float | None = None,
           table: dict | None = None) -> tuple[str, str]:
    """(solver, why) for a shard of n rows on ``device_type`` at λ = ``lamb``.
    ``term_spec``: {term name: weight}. ``table``: the parsed table (default: the committed one)."""
    table = load() if table is None else table
    rules = table.get("rules", {})
    names = list(term_spec)
    if len(names) != 1:
        return FALLBACK, f"auto: a mixture of terms was not measured by the bench: {FALLBACK}"
    term = names[0]
    measured = rules.get(device_type, {})
    note = ""
    if term not in measured and device_type != BASE_DEVICE:
        measured = rules.get(BASE_DEVICE, {})
        note = (f" (not measured on {device_type}: the {BASE_DEVICE.upper()} table is used until "
                f"`python -m bench.solvers --device {device_type} --write-table` runs there)")
    if term not in measured:
        return FALLBACK, f"auto: term {term!r} was not measured by the bench: {FALLBACK}"
    rows, lamb_note = _rows_for_lamb(measured[term], lamb)
    rows = sorted(rows, key=lambda r: r["max_n"])
    row = next((r for r in rows if n <= r["max_n"]), rows[-1])
    return row["solver"], (f"auto: {row['solver']} for {term} at n={n} ({row['why']}{lamb_note})"
                           f"{note}")


def merge(table: dict, device_type: str, rules: dict, source: dict) -> dict:
    """``table`` with ``rules`` ({term: [rows]}) measured on ``device_type`` merged in: for each
    term measured, the rows of the λ values measured replace the old rows of those λ values;
    other λ values, other terms and other devices are kept. ``source`` (command, results,
    created, machine) is recorded under ``sources[device_type]``. Returns a new dict."""
    out = copy.deepcopy(table) if table else {}
    out.setdefault("note", "written by bench/solvers.py --write-table (merged per device); "
                           "edit by re-running the bench")
    dev = out.setdefault("rules", {}).setdefault(device_type, {})
    for term, new_rows in rules.items():
        lambs = {r.get("lamb") for r in new_rows}
        kept = [r for r in dev.get(term, []) if r.get("lamb") not in lambs]
        dev[term] = sorted(kept + list(new_rows),
                           key=lambda r: (r.get("lamb") is None, r.get("lamb") or 0.0, r["max_n"]))
    out.setdefault("sources", {})[device_type] = source
    return out


# ------------------------------------------------------------------ docs
# The sizes the README's route table shows (the bench's sizes and the 10^6 run's).
