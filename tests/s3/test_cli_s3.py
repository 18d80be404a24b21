"""The engine CLI (``train_mask``) reading its input from and writing every output to S3, in
a subprocess that gets the endpoint and credentials through the environment only."""

import io
import json
import os
import subprocess
import sys

import pyarrow.compute as pc
import pyarrow.parquet as pq

from datamask_pipeline import settings
from datamask_pipeline.engine.sample import make_table

from .helpers import list_objects, read_object

ROWS, DIM = 300, 16


def _train_mask() -> list:
    """The installed console script next to this interpreter, else the module."""
    script = os.path.join(os.path.dirname(sys.executable), "train_mask")
    return [script] if os.access(script, os.X_OK) else [sys.executable, "-m", "datamask_pipeline.engine.cli"]


def test_train_mask_cli_s3_in_and_out(s3_env, s3fs, bucket, tmp_path):
    raw = make_table(ROWS, dim=DIM, seed=9)
    with s3fs.open_output_stream(f"{bucket}/in/shard.parquet") as fh:
        pq.write_table(raw, fh)
    base = f"s3://{bucket}"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, **s3_env, "TMPDIR": str(cwd), "PYTHONPATH": str(settings.repo_root())}
    cmd = _train_mask() + [
        "--input", f"{base}/in/shard.parquet", "--output", f"{base}/out/selected.parquet",
        "--masks-output", f"{base}/out/masks.parquet", "--summary-json", f"{base}/out/summary.json",
        "--checkpoint", f"{base}/ck/shard.pt", "--checkpoint-every", "5",
        "--device", "cpu", "--n_epochs", "20", "--n_rollout", "8", "--partial", "0.2",
        "--select_ratio", "0.1", "--no-progress",
    ]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["rows_written"] == summary["k"] == 30

    keys = set(list_objects(s3fs, bucket))
    assert {"out/selected.parquet", "out/masks.parquet", "out/summary.json"} <= keys
    assert "ck/shard.pt" in keys  # the learner's checkpoint went to S3 too (kept for a rerun)
    assert not [k for k in keys if ".tmp-" in k]
    assert json.loads(read_object(s3fs, bucket, "out/summary.json")) == summary
    masks = pq.read_table(io.BytesIO(read_object(s3fs, bucket, "out/masks.parquet")))
    sel_ids = masks.column("chunk_id").filter(masks.column("selected"))
    got = pq.read_table(io.BytesIO(read_object(s3fs, bucket, "out/selected.parquet")))
    assert got.equals(raw.filter(pc.is_in(raw.column("chunk_id"), value_set=sel_ids)))
    assert list(cwd.iterdir()) == []  # nothing written locally (temp folder = working dir)

    # a missing input is a clean error naming the URI, exit code 2
    bad = subprocess.run(_train_mask() + ["--input", f"{base}/in/missing.parquet", "--output",
                                          f"{base}/out/x.parquet", "--device", "cpu"],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "missing.parquet" in bad.stderr
    assert "out/x.parquet" not in set(list_objects(s3fs, bucket))
