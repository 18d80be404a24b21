"""``engine.storage`` against a real S3 endpoint: atomic publish (a failed write publishes
nothing and keeps the previous object), listings, hashes, removal, streaming row selection,
and the learner's checkpoint (kill and resume through S3)."""

import hashlib
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from datamask_pipeline.engine import storage
from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.data import DataContractError
from datamask_pipeline.engine.learner import learn, load_checkpoint, save_checkpoint
from datamask_pipeline.engine.sample import make_table

from .helpers import list_markers, list_objects, read_object

BIG = 12 * 2**20  # more than one multipart part: parts are already on the server when it fails


class Boom(RuntimeError):
    pass


def _pending_uploads(s3_env, bucket) -> list:
    """Multipart uploads still open in the bucket (an abandoned one would cost storage),
    asked with boto3 (installed with moto; pyarrow cannot list uploads)."""
    import boto3
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"])
    return client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def test_resolve_s3_uses_the_endpoint_from_the_environment(s3_env, bucket):
    fs, path = storage.resolve(f"s3://{bucket}/root/x.parquet")
    assert fs.type_name == "s3" and path == f"{bucket}/root/x.parquet"
    assert not storage.is_local(f"s3://{bucket}/root")
    assert storage.join(f"s3://{bucket}/root", "features", "a.parquet") == \
        f"s3://{bucket}/root/features/a.parquet"


def test_atomic_write_roundtrip_listing_hash_size_remove(s3fs, bucket):
    root = f"s3://{bucket}/root"
    table = make_table(200, dim=8, seed=1)
    storage.atomic_write_table(table, f"{root}/t/a.parquet", compression="zstd")
    storage.atomic_write_bytes(f"{root}/t/b.json", b'{"x": 1}')
    keys = set(list_objects(s3fs, bucket))
    assert keys == {"root/t/a.parquet", "root/t/b.json"}  # no temp object left behind
    data = read_object(s3fs, bucket, "root/t/a.parquet")
    assert pq.read_table(io.BytesIO(data)).equals(table)
    assert storage.exists(f"{root}/t/a.parquet") and not storage.exists(f"{root}/t/zzz")
    assert storage.size(f"{root}/t/a.parquet") == len(data)
    assert storage.sha256(f"{root}/t/a.parquet") == hashlib.sha256(data).hexdigest()
    assert storage.list_files(f"{root}/t") == [f"{root}/t/a.parquet"]
    assert storage.list_files(f"{root}/t", suffix=None) == [f"{root}/t/a.parquet", f"{root}/t/b.json"]

    # an in-flight temp object of another writer is not listed
    with s3fs.open_output_stream(f"{bucket}/root/t/.c.parquet.tmp-123") as fh:
        fh.write(b"partial")
    assert storage.list_files(f"{root}/t", suffix=None) == [f"{root}/t/a.parquet", f"{root}/t/b.json"]

    storage.remove(f"{root}/t/a.parquet")
    assert not storage.exists(f"{root}/t/a.parquet")
    storage.remove(f"{root}/t", recursive=True)
    assert list_objects(s3fs, bucket) == {}
    with pytest.raises(storage.StorageError):
        storage.list_files(f"{root}/missing")


def test_failed_write_to_a_new_key_publishes_nothing(s3_env, s3fs, bucket):
    uri = f"s3://{bucket}/root/out/new.bin"
    with pytest.raises(Boom):
        with storage.atomic_output(uri) as fh:
            fh.write(b"x" * BIG)  # parts of the temp object are uploaded
            raise Boom("the writer died half-way")
    assert list_objects(s3fs, bucket) == {}  # neither the target nor a temp object
    assert not storage.exists(uri)
    # all that may remain is pyarrow's zero-byte marker of the emptied prefix
    assert set(list_markers(s3fs, bucket)) <= {"root", "root/out"}
    assert _pending_uploads(s3_env, bucket) == []


def test_failed_write_keeps_the_previous_object(s3_env, s3fs, bucket):
    uri = f"s3://{bucket}/root/out/table.parquet"
    old = make_table(50, dim=256, seed=2)
    storage.atomic_write_table(old, uri)
    before = list_objects(s3fs, bucket)
    old_bytes = read_object(s3fs, bucket, "root/out/table.parquet")

    with pytest.raises(Boom):
        with storage.atomic_output(uri) as fh:
            writer = pq.ParquetWriter(fh, old.schema)
            try:  # the shape of the pipeline's writers: close in finally, then fail
                writer.write_table(make_table(12000, dim=256, seed=3))  # > one part
                raise Boom("the step failed half-way through the rows")
            finally:
                writer.close()
    after = list_objects(s3fs, bucket)
    assert set(after) == set(before)
    assert after["root/out/table.parquet"].mtime_ns == before["root/out/table.parquet"].mtime_ns
    assert read_object(s3fs, bucket, "root/out/table.parquet") == old_bytes
    assert _pending_uploads(s3_env, bucket) == []

    # a parquet writer that fails inside pyarrow publishes nothing either
    with pytest.raises((pa.ArrowException, ValueError)):
        storage.atomic_write_table(old, uri, compression="no-such-codec")
    assert read_object(s3fs, bucket, "root/out/table.parquet") == old_bytes
    assert set(list_objects(s3fs, bucket)) == set(before)


def test_write_selected_rows_in_s3_and_a_failed_selection_publishes_nothing(s3fs, bucket):
    raw_uri = f"s3://{bucket}/root/raw/shard.parquet"
    out_uri = f"s3://{bucket}/root/selected/shard.parquet"
    raw = make_table(500, dim=8, seed=4)
    with s3fs.open_output_stream(f"{bucket}/root/raw/shard.parquet") as fh:
        pq.write_table(raw, fh, row_group_size=64)
    ids = raw.column("chunk_id").to_numpy()[::7]
    info = storage.write_selected_rows(raw_uri, out_uri, ids, "chunk_id", batch_size=50)
    data = read_object(s3fs, bucket, "root/selected/shard.parquet")
    got = pq.read_table(io.BytesIO(data))
    assert got.equals(raw.take(pa.array(np.arange(0, 500, 7))))
    assert info == {"rows": len(ids), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    # ids that are not in the shard: DataContractError, the previous subset stays
    with pytest.raises(DataContractError, match="selected ids present"):
        storage.write_selected_rows(raw_uri, out_uri, [int(ids[0]), 10**9], "chunk_id")
    assert read_object(s3fs, bucket, "root/selected/shard.parquet") == data
    assert not [k for k in list_objects(s3fs, bucket) if ".tmp-" in k]


def test_checkpoint_in_s3_kill_and_resume_equals_uninterrupted(s3fs, bucket):
    ck = f"s3://{bucket}/root/checkpoints/shard.pt"
    state = {"step": 3, "logits": torch.arange(5.0), "history": [{"step": 1}]}
    save_checkpoint(ck, state)
    back = load_checkpoint(ck)
    assert back["step"] == 3 and back["logits"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    storage.remove(ck)
    assert load_checkpoint(ck) is None

    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 8)).astype(np.float32)
    q = rng.random(240)
    cfg = LearnerConfig(select_ratio=0.1, n_epochs=30, n_rollout=8, partial=0.25, seed=3)
    full = learn(x, q, cfg, device="cpu")
    part = learn(x, q, cfg, device="cpu", checkpoint_path=ck, checkpoint_every=10, max_steps=17)
    assert part.steps == 17 and storage.exists(ck)
    assert not [k for k in list_objects(s3fs, bucket) if ".tmp-" in k]
    resumed = learn(x, q, cfg, device="cpu", checkpoint_path=ck, checkpoint_every=10)
    assert resumed.resumed_from == 17
    np.testing.assert_array_equal(resumed.logits, full.logits)
    np.testing.assert_array_equal(resumed.selected, full.selected)


def test_a_failed_publish_is_a_storage_error_and_publishes_nothing(s3fs, bucket):
    # The server-side move (CopyObject + DeleteObject) is the publish step; when it fails
    # (here: the temp object is gone; on AWS also an object over CopyObject's 5 GiB) the
    # caller gets a StorageError naming the target, and the target does not appear.
    fs, path = storage.resolve(f"s3://{bucket}/root/out/x.parquet")
    with pytest.raises(storage.StorageError, match="could not be published"):
        storage.publish._publish_object(fs, f"{bucket}/root/out/.x.parquet.tmp-gone", path,
                                        f"s3://{bucket}/root/out/x.parquet")
    assert list_objects(s3fs, bucket) == {}
