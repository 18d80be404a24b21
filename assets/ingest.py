"""Ingestion: raw shard -> canonical features parquet (``id``, ``quality``, ``embedding``).

The raw file is read with pyarrow, one batch at a time, and only its id, quality and embedding
columns; text and every other column stay in the raw file (the selected subset copies them
from there). Only the structure is enforced here (the columns exist and have usable types,
``engine.data``'s schema rules); the value rules (unique ids, finite values, one dimension ...)
are the blocking checks of :mod:`assets.validate`, which read the features file this step wrote.
"""


import errno
import functools
import hashlib
import re
from datetime import timedelta

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datamask_pipeline.engine import contract as C
from datamask_pipeline.engine import embed as E
from datamask_pipeline.engine import storage
from datamask_pipeline.engine.config import ConfigError
from datamask_pipeline.engine.data import (
    META_QUARANTINED,
    META_RAW_ROWS,
    RAW_ROW,
    RULE_ID_INT64,
    RULE_READABLE,
    Columns,
    DataContractError,
    check_schema,
    text_rejects,
)
from resources.contract import DataContract
from resources.storage import DataRoot

from .partitions import scan_raw, shards

GROUP = "datamask"
# Who answers for these assets in the UI, and the pipeline step each one is (a tag to filter by).
OWNERS = ["team:data-selection"]
# Retries: transient I/O only. No asset carries a ``dg.RetryPolicy``: Dagster retries ANY
# exception under one, an interrupt (Ctrl-C, a run termination) and an allocation error
# included. Each asset body is wrapped in ``retry_transient_io`` instead, which asks Dagster for
# a retry (``dg.RetryRequested``) only when the error is a transient I/O one (``is_transient``);
# everything else fails the step at once. The instance's run retries never re-run a failed step
# (dagster.yaml: retry_on_asset_or_op_failure: false), so a step runs at most 3 attempts.
TRANSIENT_MAX_RETRIES = 2
TRANSIENT_DELAY_S = 5
# errno values of a failure that may pass by itself: network, timeouts, a busy or stale handle
TRANSIENT_ERRNOS = frozenset(getattr(errno, name) for name in (
    "EAGAIN", "EBUSY", "EINTR", "ETIMEDOUT", "ECONNRESET", "ECONNREFUSED", "ECONNABORTED",
    "EPIPE", "ENETDOWN", "ENETUNREACH", "ENETRESET", "EHOSTDOWN", "EHOSTUNREACH", "ESTALE",
    "EIO", "ENOTCONN", "EREMOTEIO") if hasattr(errno, name))
# pyarrow's S3 file system raises a plain OSError naming the AWS SDK's error type; these are
# the types the SDK itself deems retryable (network, throttling, the service's own failures)
_TRANSIENT_S3 = re.compile(
    r"AWS Error (NETWORK_CONNECTION|SLOW_DOWN|THROTTLING|SERVICE_UNAVAILABLE|REQUEST_TIMEOUT"
    r"|INTERNAL_FAILURE)\b|HTTP status (429|5\d\d)\b|curlCode: (7|28|52|55|56)\b")


def _chain(exc: BaseException):
    """``exc`` and the exceptions it was raised from (``__cause__``, else ``__context__``; a
    ``dg.Failure`` raised ``from None`` is followed to its ``__context__`` too: the steps report
    an error as one readable Failure without the chained trace, and it is still that error)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        follow = not exc.__suppress_context__ or isinstance(exc, dg.Failure)
        exc = exc.__cause__ if exc.__cause__ is not None else (
            exc.__context__ if follow else None)


def _wraps_io(e: BaseException) -> bool:
    """A report of another error, judged by that error: a ``dg.Failure`` (the steps' readable
    failures), and a raw file reported unreadable (``DataContractError`` of rule ``readable``)
    because reading it failed."""
    if isinstance(e, dg.Failure):
        return True
    return isinstance(e, DataContractError) and e.rule == RULE_READABLE and (
        e.__cause__ is not None or e.__context__ is not None)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a transient I/O error, worth retrying a few seconds later.

    Never: an interrupt (``KeyboardInterrupt``, ``DagsterExecutionInterruptedError``: not
    ``Exception``s), an allocation error (``MemoryError``, numpy's ``_ArrayMemoryError``), bad
    input or config (``ValueError``, ``DataContractError``, ``ConfigError``, a ``dg.Failure``
    of its own), or an error of the path itself (``FileNotFoundError``, ``PermissionError``,
    ``IsADirectoryError`` ...: the next attempt meets the same path).
    Transient: ``ConnectionError`` and ``TimeoutError`` (socket timeouts included), an
    ``OSError`` whose errno is in ``TRANSIENT_ERRNOS``, and pyarrow's S3 errors of a network,
    throttling or service failure. A wrapping error (``storage.StorageError ... from exc``, a
    step's ``dg.Failure`` reporting it, a raw file reported unreadable because the read failed)
    is judged by what it wraps: a non-transient error anywhere in the chain wins."""
    if not isinstance(exc, Exception):
        return False
    found = False
    for e in _chain(exc):
        if _wraps_io(e):
            continue
        if isinstance(e, (MemoryError, ValueError)) or not isinstance(e, Exception):
            return False
        if isinstance(e, (ConnectionError, TimeoutError)):
            found = True
        elif isinstance(e, OSError):
            if e.errno is not None:
                if e.errno in TRANSIENT_ERRNOS:
                    found = True
                else:
                    return False  # ENOENT, EACCES, EISDIR, ENOSPC ...: not by itself
            elif _TRANSIENT_S3.search(str(e)):
                found = True
    return found


def retry_transient_io(fn=None, *, max_retries: int = TRANSIENT_MAX_RETRIES,
                       seconds_to_wait: float = TRANSIENT_DELAY_S):
    """Decorator of an asset's body (below ``@dg.asset``): a transient I/O error
    (:func:`is_transient`) becomes ``dg.RetryRequested(max_retries, seconds_to_wait)`` raised
    from it, so Dagster retries the step in the run (``STEP_UP_FOR_RETRY``, then "Exceeded
    max_retries" when none is left); any other error, and every interrupt, passes through and
    fails the step after one attempt. The signature is kept (``functools.wraps``), so Dagster
    still sees the body's context, config and resource parameters."""

    def wrap(body):
        @functools.wraps(body)
        def run(*args, **kwargs):
            try:
                return body(*args, **kwargs)
            except Exception as exc:
                if is_transient(exc):
                    raise dg.RetryRequested(max_retries=max_retries,
                                            seconds_to_wait=seconds_to_wait) from exc
                raise

        run.transient_retry = (max_retries, seconds_to_wait)
        return run

    return wrap(fn) if fn is not None else wrap


# The catalog and the selected rows should follow the daily refresh (DATAMASK_SCHEDULE_CRON's
# default): warn after a day without a fresh materialization, fail after two.
FRESHNESS = dg.FreshnessPolicy.time_window(fail_window=timedelta(days=2), warn_window=timedelta(days=1))


def stage(name: str) -> dict:
    """The tags of an asset of pipeline step ``name`` (ingest, validate, learn, select, report)."""
    return {"datamask/stage": name}


# features-2: the model's vectors and each language's sums in the footer (features-1 wrote the
# vectors centered by the shard's language means)
CODE_VERSION = "features-2"
BATCH_ROWS = 65536
# Row groups of the features file. Readers (the DuckDB checks) hold about one row group per
# thread: 8192 rows of 768-d float32 embeddings are 25 MB, 65536 rows were 200 MB.
ROW_GROUP_ROWS = 8192

ID, QUALITY, EMBEDDING = "id", "quality", "embedding"
LANGUAGE = E.LANGUAGE_COLUMN
EMBEDDING_TYPE = pa.list_(pa.float32())

@dg.observable_source_asset(
    name="raw_shard",
    partitions_def=shards,
    group_name=GROUP,
    tags={**stage("ingest"), "dagster/kind/parquet": ""},
    description="A raw parquet shard under the raw location (one file per partition): an id "
    "column, numeric quality column(s), an embedding column (list of floats) and any other "
    "columns (text, source ...). Written by you, not by Dagster. Observable: its data version "
    "per shard is the file's size and modification time from one listing of the raw location "
    "(no per-file stat); a new version makes the shard's chain update (datamask_pipeline/"
    "automation.py).",
)
def raw_shard(context, data_root: DataRoot) -> dg.DataVersionsByPartition:
    """Data versions of every registered shard, from one listing (``scan_raw``)."""
    registered = set(context.instance.get_dynamic_partitions(shards.name))
    scan = scan_raw(data_root.raw_root)
    return dg.DataVersionsByPartition(
        {key: scan.signature(key) for key in scan.files if key in registered})


def features_schema(id_type: pa.DataType, raw_row: bool = False,
                    language: bool = False) -> pa.Schema:
    """The canonical features schema; ``raw_row``: with the raw row number of each row (only
    when rows were quarantined, so that the features are not the raw file row for row);
    ``language``: with each row's language (when the heuristic scored the quality from the
    text, ``engine.quality``)."""
    fields = [(ID, id_type), (QUALITY, pa.float64()), (EMBEDDING, EMBEDDING_TYPE)]
    return pa.schema(fields + ([(LANGUAGE, pa.string())] if language else [])
                     + ([(RAW_ROW, pa.int64())] if raw_row else []))


def _canonical_id_type(t: pa.DataType) -> pa.DataType:
    return pa.int64() if pa.types.is_integer(t) else pa.string()


def canonical_batch(batch: pa.RecordBatch, columns: Columns, path: str, id_type,
                    embeddings=None, quality=None) -> pa.RecordBatch:
    """Map one raw batch to the canonical schema. Nulls, NaN and Inf pass through unchanged
    (the validation checks report them); float64 embeddings become float32 (values beyond
    float32's range become Inf, which the checks catch). ``embeddings``: the batch's computed
    vectors, (rows, d) float32, for a text-only shard. ``quality``: the batch's scores computed
    from the text, (rows,) float64, for a shard without quality columns."""
    raw_id = batch.column(columns.id)
    try:
        ids = pc.cast(raw_id, id_type)
    except pa.ArrowInvalid as exc:
        too_big = pc.greater(raw_id, pa.scalar(2**63 - 1, raw_id.type)) if pa.types.is_unsigned_integer(raw_id.type) else None
        bad = raw_id.filter(too_big).to_pylist()[:10] if too_big is not None else []
        raise DataContractError(path, RULE_ID_INT64, column=columns.id, ids=bad, detail=str(exc)) from exc
    q = None if quality is None else pa.array(np.asarray(quality, np.float64), pa.float64())
    for name, w in zip(columns.quality if quality is None else (), columns.weights):
        col = pc.cast(batch.column(name), pa.float64(), safe=False)
        term = col if w == 1.0 else pc.multiply(col, pa.scalar(float(w)))
        q = term if q is None else pc.add(q, term)
    if embeddings is None:
        emb = pc.cast(batch.column(columns.embedding), EMBEDDING_TYPE, safe=False)
    else:
        m, d = embeddings.shape
        emb = pa.ListArray.from_arrays(pa.array(np.arange(0, (m + 1) * d, d, dtype=np.int32)),
                                       pa.array(embeddings.reshape(-1)))
    return pa.RecordBatch.from_arrays([ids, q, emb], schema=features_schema(id_type))


def write_features(raw_uri: str, out_uri: str, columns: Columns, *, embedder=None,
                   checkpoint_dir=None, expected_dim=None, progress=None, scorer=None,
                   quality_checkpoint_dir=None, quality_progress=None,
                   quarantine_share=None, language_geometry=None) -> dict:
    """Stream ``raw_uri``'s id/quality/embedding columns into the canonical ``out_uri``
    (published atomically). Returns rows, bytes, sha256, embedding dimension counts and
    ``embedding`` (the ``engine.embed.EmbedResult`` of a text-only shard, else None).

    A text-only shard (``Columns.source``) is embedded first by ``embedder`` (an Embedder or a
    function returning one: the model loads only then), in chunks under ``checkpoint_dir``
    (resumable); its vectors must have ``expected_dim`` when that is set. A shard without its
    quality column(s) but with the text column (``Columns.quality_source``) is scored first by
    ``scorer`` (an ``engine.quality.Scorer`` or a function returning one), in chunks under
    ``quality_checkpoint_dir`` (resumable); ``quality`` in the result is its
    ``engine.quality.QualityResult``, else None.

    ``quarantine_share`` (a share of the rows, or None): when the text is read (embedded or
    scored), the rows that break a row rule of the text (``contract.QUARANTINE_RULES``: null,
    not UTF-8, blank) are quarantined up to that share of the shard: left out of the features,
    which then carry each row's raw row number (``raw_row``) and the counts in their footer;
    ``rejects`` in the result is the ``engine.data.TextRejects`` (None when the text is not
    read). Past the share, or with None, such a row rejects the shard (DataContractError).

    ``language_geometry`` (``engine.embed.LANGUAGE_GEOMETRIES``; None: the default, ``center``):
    the vectors written are the model's either way. When the shard is embedded here and its
    languages are known (the heuristic scorer's), ``center`` records each language's vector sum
    and rows over the shard in the footer (``engine.embed.LanguageSums``), by which the readers
    center the vectors: a shard's steps by the shard's means, the corpus stage by the
    corpus's; ``language_sums`` in the result is those sums and ``centering`` the shard's own
    ``LanguageCentering``, else None. ``off``: the footer says so, and every reader keeps the
    model's vectors."""
    geometry = language_geometry or E.DEFAULT_LANGUAGE_GEOMETRY
    if geometry not in E.LANGUAGE_GEOMETRIES:
        raise ConfigError(f"embedding_language_geometry must be one of "
                          f"{E.LANGUAGE_GEOMETRIES}, got {geometry!r}")
    fs, path = storage.resolve(raw_uri)
    try:
        src = fs.open_input_file(path)
        pf = pq.ParquetFile(src, buffer_size=1 << 20, pre_buffer=False)
    except FileNotFoundError as exc:
        raise storage.StorageError(f"{raw_uri}: raw shard does not exist") from exc
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise DataContractError(raw_uri, RULE_READABLE, detail=str(exc)) from exc
    try:
        source = check_schema(pf.schema_arrow, str(raw_uri), columns)
        reads_text = C.TEXT in (source, columns.quality_source(pf.schema_arrow.names))
        rejects = None
        if reads_text and quarantine_share is not None:
            rejects = text_rejects(raw_uri, columns, quarantine_share)
        skip = rejects if rejects is not None and rejects.count else None
        scored = None
        if columns.quality_source(pf.schema_arrow.names) == C.TEXT:
            if quality_checkpoint_dir is None:
                raise ValueError("a shard without quality needs a quality_checkpoint_dir")
            from datamask_pipeline.engine.data import score_text

            scored = score_text(raw_uri, columns, scorer, quality_checkpoint_dir,
                                quality_progress, skip=skip)
        embedded = None
        if source == C.TEXT:
            embedded = _embed(raw_uri, columns, embedder, checkpoint_dir, expected_dim, progress,
                              skip)
            reader = embedded.reader()
        id_type = _canonical_id_type(pf.schema_arrow.field(columns.id).type)
        langs = None if scored is None else scored.languages
        sums = centering = None
        footer = {}
        if embedded is not None and langs is not None:
            footer[E.META_GEOMETRY] = geometry.encode()
            if geometry == "center":
                sums = E.LanguageSums.of(embedded.arrays(), langs)
                centering = sums.centering(langs)
                footer.update(sums.footer())
        schema = features_schema(id_type, raw_row=skip is not None, language=langs is not None)
        if skip is not None:
            footer.update({META_QUARANTINED: str(skip.count).encode(),
                           META_RAW_ROWS: str(skip.n).encode()})
        if footer:
            schema = schema.with_metadata(footer)
        rows = raw = 0
        dims: dict = {}
        with storage.atomic_output(out_uri) as fh:
            writer = pq.ParquetWriter(fh, schema, compression="zstd")
            try:
                names = pf.schema_arrow.names
                wanted = [c for c in columns.needed() if c in names and (
                    embedded is None or c != columns.embedding)]
                it = pf.iter_batches(batch_size=BATCH_ROWS, columns=wanted, use_threads=False)
                while True:
                    try:
                        batch = next(it)
                    except StopIteration:
                        break
                    except (OSError, pa.ArrowException) as exc:
                        raise DataContractError(raw_uri, RULE_READABLE, detail=str(exc)) from exc
                    keep = None if skip is None else skip.kept(raw, batch.num_rows)
                    at = np.arange(raw, raw + batch.num_rows, dtype=np.int64)
                    raw += batch.num_rows
                    if keep is not None:  # quarantined rows leave the features
                        batch, at = batch.filter(pa.array(keep)), at[keep]
                    vectors = None if embedded is None else reader.take(batch.num_rows)
                    out = canonical_batch(
                        batch, columns, str(raw_uri), id_type, vectors,
                        None if scored is None else scored.scores[rows:rows + batch.num_rows])
                    extra = [] if langs is None else [
                        pa.array(langs[rows:rows + batch.num_rows], pa.string())]
                    if skip is not None:
                        extra.append(pa.array(at, pa.int64()))
                    if extra:
                        out = pa.RecordBatch.from_arrays([*out.columns, *extra], schema=schema)
                    writer.write_batch(out, row_group_size=ROW_GROUP_ROWS)
                    rows += out.num_rows
                    vc = pc.value_counts(pc.list_value_length(out.column(EMBEDDING)))
                    for v, c in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()):
                        dims[v] = dims.get(v, 0) + c
            finally:
                writer.close()
    finally:
        src.close()
    return {"rows": rows, "bytes": storage.size(out_uri), "sha256": storage.sha256(out_uri),
            "dims": dims, "id_type": str(id_type), "embedding": embedded, "quality": scored,
            "rejects": rejects, "language_sums": sums, "centering": centering}


def ingestion_failure(key: str, raw_uri: str, exc: Exception) -> dg.Failure:
    """The ``features`` step's failure for bad input: a ``Failure`` (no retries: the same
    file fails the same way) whose description names the partition, the file, the column
    and the rule broken."""
    md = {"raw_uri": dg.MetadataValue.path(str(raw_uri)), "error": type(exc).__name__}
    if isinstance(exc, DataContractError):
        md["rule"] = exc.rule
        if exc.column is not None:
            md["column"] = exc.column
    return dg.Failure(description=f"partition {key!r}: ingestion failed: {exc}", metadata=md,
                      allow_retries=False)


def raw_rows(raw_uri: str) -> int | None:
    """The raw shard's row count from its parquet footer; None when it cannot be read (the
    ingestion then reports why)."""
    try:
        fs, path = storage.resolve(raw_uri)
        with fs.open_input_file(path) as fh:
            return pq.ParquetFile(fh).metadata.num_rows
    except Exception:  # noqa: BLE001 - any reason is reported by write_features
        return None


def _embed(raw_uri, columns: Columns, embedder, checkpoint_dir, expected_dim, progress,
           skip=None):
    """The text-only shard's embeddings (``engine.embed.embed_shard``)."""
    from datamask_pipeline.engine import embed

    embedder = embed.load_embedder() if embedder is None else (
        embedder() if callable(embedder) else embedder)
    if expected_dim is not None and int(expected_dim) != embedder.dim:
        raise DataContractError(raw_uri, C.rule_expected_dim(int(expected_dim)),
                                column=columns.text, detail=f"the embedding model "
                                f"{embedder.name} gives {embedder.dim}-d vectors")
    if checkpoint_dir is None:
        raise ValueError("a text-only shard needs a checkpoint_dir for its embedding chunks")
    return embed.embed_shard(raw_uri, checkpoint_dir, columns.text, embedder,
                             id_column=columns.id, progress=progress, skip=skip)


def _publish_rejects(context, key: str, uri: str, rejects) -> dict:
    """Write the quarantined rows to ``uri`` (atomically), or remove a previous run's file
    when none was quarantined; returns the asset's quarantine metadata."""
    if rejects is None or not rejects.count:
        storage.remove(uri)
        return {} if rejects is None else {"rows_quarantined": 0}
    with storage.atomic_output(uri) as fh:
        pq.write_table(rejects.table(), fh, compression="zstd")
    per_rule = rejects.by_rule()
    context.log.warning(
        f"partition {key}: {rejects.count} of {rejects.n} rows quarantined (row rules of the "
        f"text column {rejects.column!r}: {per_rule}; at most {rejects.share:.2%} of the shard) "
        f"-> {uri}; the other rows proceed")
    return {"rows_quarantined": rejects.count,
            "rows_quarantined_by_rule": dg.MetadataValue.json(per_rule),
            "quarantine_share": rejects.share,
            "rejects_uri": dg.MetadataValue.path(str(uri))}


def _embed_log(context, key: str, every_s: float = 10.0):
    """Embedding progress in the run log: at most one line per ``every_s`` seconds, and the
    last chunk."""
    last = [float("-inf")]

    def log(p) -> None:
        if p.chunks_done == p.chunks or p.seconds - last[0] >= every_s:
            last[0] = p.seconds
            context.log.info(f"partition {key}: embedded {p.rows_done}/{p.rows} rows (chunk "
                             f"{p.chunks_done}/{p.chunks}, {p.reused} reused from the "
                             f"checkpoint), {p.seconds:.1f} s")

    return log


@dg.asset(
    key="features",
    partitions_def=shards,
    deps=[raw_shard],
    group_name=GROUP,
    kinds={"parquet", "pyarrow"},
    owners=OWNERS,
    tags=stage("ingest"),
    code_version=CODE_VERSION,
)
@retry_transient_io
def features(context: dg.AssetExecutionContext, data_root: DataRoot,
             contract: DataContract) -> dg.MaterializeResult:
    """Canonical features of one shard: ``id`` (int64 or string), ``quality`` (float64, the
    weighted sum of the raw quality columns) and ``embedding`` (list<float32>), row for row as
    in the raw file. Text and other raw columns are not copied. Data version: the SHA-256 of
    the written parquet.

    A text-only shard (the text column, no embedding column) is embedded here, on CPU, by the
    contract's embedding model, in chunks under ``checkpoints/<key>.embeddings/`` (a retried or
    re-run step reuses the chunks already written; removed once the features are published).
    The embedding model's name and version are in the metadata and change the data version."""
    key = context.partition_key
    raw_uri = data_root.raw_shard(key)
    out_uri = data_root.features(key)
    columns = contract.columns()
    # an impossible mask config fails the run here, its first step, before anything is written
    from .mask_config import check_run_mask_config

    run_config = context.run.run_config
    if (((run_config or {}).get("ops") or {}).get("mask") or {}).get("config") is not None:
        rows = raw_rows(raw_uri)
        # fewer than 2 rows is the data's fault, not the config's: the checks (no row) and
        # the mask step (one row) say so
        check_run_mask_config(run_config, key, rows=rows if rows is not None and rows >= 2 else None)
    embed_dir = storage.safe_child(data_root.root, f"checkpoints/{key}.embeddings")
    quality_dir = storage.safe_child(data_root.root, f"checkpoints/{key}.quality")
    try:
        info = write_features(raw_uri, out_uri, columns, embedder=contract.embedder,
                              checkpoint_dir=embed_dir, expected_dim=contract.expected_dim,
                              progress=_embed_log(context, key), scorer=contract.scorer,
                              quality_checkpoint_dir=quality_dir,
                              quarantine_share=contract.quarantine_share,
                              language_geometry=contract.embedding_language_geometry)
    except (DataContractError, storage.StorageError, ConfigError) as exc:
        # One readable failure: the description is the whole reason (file, column, rule), so
        # the engine's exception is not chained (it would print the same line and a second
        # stack trace); the rule and column are metadata too.
        raise ingestion_failure(key, raw_uri, exc) from None
    context.log.info(f"partition {key}: {info['rows']} rows, {info['bytes']} bytes -> {out_uri}")
    quarantine = _publish_rejects(context, key, data_root.rejects(key), info["rejects"])
    embedded = info["embedding"]
    if embedded is not None:
        from datamask_pipeline.engine.embed import remove_checkpoint

        remove_checkpoint(embed_dir)
    scored = info["quality"]
    version = info["sha256"]
    if scored is not None:
        storage.remove(quality_dir, recursive=True)
        context.log.info(f"partition {key}: quality scored from {columns.text!r} by "
                         f"{scored.scorer} ({scored.scorer_version}), {scored.computed} chunks "
                         f"computed, {scored.reused} reused")
        # the scorer is part of the data version (not only of the bytes it produced)
        version = hashlib.sha256(f"{info['sha256']}:{scored.scorer_key}:"
                                 f"{scored.scorer_version}".encode()).hexdigest()
    dims = {str(k): v for k, v in sorted(info["dims"].items(), key=lambda kv: (kv[0] is None, kv[0] or 0))}
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": info["rows"],
            "dagster/column_schema": dg.TableSchema(columns=[
                dg.TableColumn(ID, info["id_type"], description=f"raw column {columns.id!r}"),
                dg.TableColumn(QUALITY, "double", description=(
                    " + ".join(f"{w:g}*{c}" for c, w in zip(columns.quality, columns.weights))
                    if scored is None else f"computed from raw column {columns.text!r} by "
                    f"{scored.scorer}")),
                dg.TableColumn(EMBEDDING, "list<float>", description=(
                    f"raw column {columns.embedding!r}" if embedded is None else
                    f"computed from raw column {columns.text!r} by {embedded.model}")),
            ]),
            **({} if embedded is None else embedded.metadata()),
            **({} if info["centering"] is None else {
                k: dg.MetadataValue.json(v) if isinstance(v, dict) else v
                for k, v in info["centering"].metadata().items()}),
            **({} if scored is None else scored.metadata()),
            "bytes": info["bytes"],
            "sha256": info["sha256"],
            "embedding_dims": dg.MetadataValue.json(dims),
            "raw_uri": dg.MetadataValue.path(str(raw_uri)),
            "features_uri": dg.MetadataValue.path(str(out_uri)),
            **quarantine,
        },
        data_version=dg.DataVersion(version),
    )
