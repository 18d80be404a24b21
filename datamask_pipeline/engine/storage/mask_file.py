"""The mask file (``masks/<key>.parquet``): per-sample ``id``, ``logit``, ``rank``, ``selected``,
and the selection's record (solver, route, whole-shard scores, history, config) as JSON in the
parquet schema's key-value metadata under ``datamask.selection``. Readers of the mask (the shard
report, the corpus catalog) take the numbers from the file, so they agree with its rows.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from .publish import atomic_write_table
from .uris import resolve

METADATA_KEY = b"datamask.selection"
FORMAT_VERSION = 1
# select_shard's score names -> the names the pipeline publishes (metadata keys, catalog columns)
SCORE_NAMES = {"selection": "datamask", "quality_topk": "quality_topk", "random": "random",
               "learner_readout": "learner_readout"}


# Per-step history fields that measure the run rather than the result (not persisted).
RUN_FACTS = ("elapsed_s",)
# Polish fields that measure the run (its wall time and its (elapsed, f, swaps) trace).
POLISH_RUN_FACTS = ("elapsed_s", "history")


class MaskFileError(ValueError):
    """A mask file without a readable selection record."""


@dataclass(frozen=True)
class SelectionRecord:
    """What a mask step decided, beside the per-sample columns. ``scores``: whole-shard
    ``{"f", "f_qua", "f_div"}`` per published name (``datamask``, ``quality_topk``, ``random``
    and, when the learner ran, ``learner_readout``); ``history``: the learner's per-step
    records; ``config``: the engine's ``LearnerConfig.to_dict()``."""

    n: int
    k: int
    term: str
    lamb: float
    solver: str
    route: str
    device: str
    steps: int
    config_hash: str
    config: dict
    scores: dict
    history: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    guard: str = ""
    resumed_from: int = 0
    polish: dict | None = None

    @classmethod
    def from_selection(cls, sel, cfg) -> "SelectionRecord":
        """From the engine's ``Selection`` and the ``LearnerConfig`` that produced it."""
        return cls(
            n=int(sel.selected.size), k=int(sel.k), term=cfg.term_label, lamb=float(cfg.lamb),
            solver=cfg.solver, route=sel.route, device=str(sel.device), steps=int(sel.steps),
            config_hash=sel.config_hash, config=cfg.to_dict(),
            scores={SCORE_NAMES[name]: sc.as_dict() for name, sc in sel.scores.items()},
            history=list(sel.history), timings=dict(sel.timings), guard=sel.guard or "",
            resumed_from=int(sel.resumed_from or 0), polish=sel.polish,
        )

    @property
    def single_term(self) -> str | None:
        """The diversity term's name when the objective has exactly one (weight 1), else None."""
        return None if self.config.get("terms") else self.config.get("algorithm")

    def f(self, name: str) -> float:
        return float(self.scores[name]["f"])

    def to_json(self) -> bytes:
        """The persisted record: what was decided, not how it ran. Wall times (``timings``,
        each history entry's and the polish's ``elapsed_s``, the polish trace) and the step a
        retry resumed from stay out of the file, so equal inputs
        and config give byte-equal mask files (the data version is their hash); they are in the
        mask materialization's metadata."""
        d = asdict(self)
        d["timings"], d["resumed_from"] = {}, 0
        d["history"] = [{k: v for k, v in h.items() if k not in RUN_FACTS} for h in d["history"]]
        if d["polish"]:
            d["polish"] = {k: v for k, v in d["polish"].items() if k not in POLISH_RUN_FACTS}
        return json.dumps({"format": FORMAT_VERSION, **d}, sort_keys=True,
                          default=_plain).encode("utf-8")

    @classmethod
    def from_json(cls, blob: bytes, where: str = "") -> "SelectionRecord":
        try:
            d = json.loads(blob)
            version = d.pop("format")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MaskFileError(f"{where}: the {METADATA_KEY.decode()} record is not a JSON "
                                f"object with a 'format' field: {exc}") from exc
        if version != FORMAT_VERSION:
            raise MaskFileError(f"{where}: {METADATA_KEY.decode()} record format {version!r}, "
                                f"this code reads {FORMAT_VERSION}: re-materialize mask")
        try:
            return cls(**d)
        except TypeError as exc:
            raise MaskFileError(f"{where}: {METADATA_KEY.decode()} record: {exc}") from exc


def _plain(o):
    """numpy scalars (the engine's numbers) as Python numbers."""
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def mask_table(ids, logits, rank, selected, record: SelectionRecord, id_column: str = "id") -> pa.Table:
    """The mask table, with ``record`` in its schema metadata."""
    table = pa.table({
        id_column: pa.array(ids),
        "logit": pa.array(logits, pa.float32()),
        "rank": pa.array(rank, pa.int64()),
        "selected": pa.array(selected, pa.bool_()),
    })
    return table.replace_schema_metadata({METADATA_KEY: record.to_json()})


def write_mask(uri, table: pa.Table) -> None:
    """Publish the mask table atomically (temp file, then rename / object-store move)."""
    if not table.schema.metadata or METADATA_KEY not in table.schema.metadata:
        raise MaskFileError(f"{uri}: refusing to write a mask without its "
                            f"{METADATA_KEY.decode()} record")
    atomic_write_table(table, uri, compression="zstd")


def read_record(uri) -> SelectionRecord:
    """The selection record of the mask file at ``uri`` (reads the parquet footer only)."""
    fs, path = resolve(uri)
    with fs.open_input_file(path) as fh:
        meta = pq.read_schema(fh).metadata or {}
    if METADATA_KEY not in meta:
        raise MaskFileError(f"{uri}: no {METADATA_KEY.decode()!r} key in the parquet schema "
                            "metadata (a mask file carries its selection record; this one was "
                            "written by an older mask step): re-materialize mask")
    return SelectionRecord.from_json(meta[METADATA_KEY], str(uri))


def read_mask(uri, columns=None) -> tuple[pa.Table, SelectionRecord]:
    """The mask table (``columns``, default all) and its selection record."""
    fs, path = resolve(uri)
    with fs.open_input_file(path) as fh:
        table = pq.read_table(fh, columns=columns)
    blob = (table.schema.metadata or {}).get(METADATA_KEY)
    if blob is None:
        return table, read_record(uri)  # raises the missing-record error
    return table, SelectionRecord.from_json(blob, str(uri))
