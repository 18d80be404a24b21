"""storage: URI access, safe paths, partition keys, atomic publish, streaming row selection."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch

from datamask_pipeline.engine import storage
from datamask_pipeline.engine.data import DataContractError
from datamask_pipeline.engine.sample import make_table
from datamask_pipeline.engine.storage import StorageError


def _leftovers(d) -> list:
    return sorted(n for n in os.listdir(d) if ".tmp-" in n)


# ------------------------------------------------------------------ basic access
def test_resolve_plain_relative_and_file_uri(tmp_path, monkeypatch):
    fs, p = storage.resolve(str(tmp_path / "a.parquet"))
    assert isinstance(fs, pafs.LocalFileSystem) and p == str(tmp_path / "a.parquet")
    monkeypatch.chdir(tmp_path)
    fs, p = storage.resolve("sub/b.bin")
    assert isinstance(fs, pafs.LocalFileSystem) and p == str(tmp_path / "sub" / "b.bin")
    fs, p = storage.resolve((tmp_path / "c.bin").as_uri())
    assert isinstance(fs, pafs.LocalFileSystem) and p == str(tmp_path / "c.bin")
    for bad in ("", None, "a\x00b"):
        with pytest.raises(StorageError):
            storage.resolve(bad)
    with pytest.raises(StorageError, match="nosuchscheme"):
        storage.resolve("nosuchscheme://x/y")


def test_join_local_and_uri():
    assert storage.join("/data/raw", "a", "b.parquet") == "/data/raw/a/b.parquet"
    assert storage.join("file:///data/raw/", "b.parquet") == "file:///data/raw/b.parquet"
    assert storage.join("s3://bucket/raw", "p", "x.parquet") == "s3://bucket/raw/p/x.parquet"


def test_exists_size_makedirs_remove(tmp_path):
    d = storage.join(str(tmp_path), "x", "y")
    assert not storage.exists(d)
    storage.makedirs(d)
    assert storage.exists(d) and os.path.isdir(d)
    f = storage.join(d, "f.bin")
    storage.atomic_write_bytes(f, b"12345")
    assert storage.exists(f) and storage.size(f) == 5
    with pytest.raises(StorageError, match="not a file"):
        storage.size(d)
    with pytest.raises(StorageError, match="is a directory"):
        storage.remove(d)
    storage.remove(f)
    assert not storage.exists(f)
    storage.remove(f)  # missing_ok
    with pytest.raises(StorageError, match="does not exist"):
        storage.remove(f, missing_ok=False)
    storage.remove(d, recursive=True)
    assert not os.path.exists(d)


def test_list_files_sorted_filtered_and_hides_temps(tmp_path):
    for name in ("b.parquet", "a.parquet", "c.txt", ".a.parquet.tmp-123", "z.parquet"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub.parquet").mkdir()  # a directory is not listed
    got = storage.list_files(str(tmp_path))
    assert got == [str(tmp_path / n) for n in ("a.parquet", "b.parquet", "z.parquet")]
    assert storage.list_files(str(tmp_path), suffix=None) == [
        str(tmp_path / n) for n in ("a.parquet", "b.parquet", "c.txt", "z.parquet")
    ]
    uri = tmp_path.as_uri()
    assert storage.list_files(uri, suffix=".txt") == [uri + "/c.txt"]
    with pytest.raises(StorageError, match="does not exist"):
        storage.list_files(str(tmp_path / "missing"))
    with pytest.raises(StorageError, match="not a directory"):
        storage.list_files(str(tmp_path / "c.txt"))


def test_sha256_streams_across_chunks(tmp_path):
    data = os.urandom(3 * (1 << 20) + 17)
    p = tmp_path / "big.bin"
    p.write_bytes(data)
    assert storage.sha256(str(p)) == hashlib.sha256(data).hexdigest()
    assert storage.sha256(p.as_uri()) == hashlib.sha256(data).hexdigest()
    with pytest.raises(StorageError):
        storage.sha256(str(tmp_path / "nope"))


# ------------------------------------------------------------------ safe paths
def test_safe_child_accepts_plain_children(tmp_path):
    root = str(tmp_path)
    assert storage.safe_child(root, "a.parquet") == os.path.join(root, "a.parquet")
    assert storage.safe_child(root, "p1/a.parquet") == os.path.join(root, "p1", "a.parquet")
    assert storage.safe_child(tmp_path.as_uri(), "x") == tmp_path.as_uri() + "/x"
    assert storage.safe_child("s3://bucket/root", "k/x.parquet") == "s3://bucket/root/k/x.parquet"


@pytest.mark.parametrize(
    "relative, fragment",
    [
        ("..", "'..'"),
        ("../x", "'..'"),
        ("a/../../x", "'..'"),
        ("a/./b", "'.'"),
        ("a//b", "''"),
        ("/etc/passwd", "absolute"),
        ("s3://other/x", "absolute"),
        ("C:evil", "absolute"),
        ("a\\..\\b", "backslash"),
        ("a\x00b", "NUL"),
        ("", "non-empty"),
    ],
)
def test_safe_child_refuses(tmp_path, relative, fragment):
    with pytest.raises(StorageError) as ei:
        storage.safe_child(str(tmp_path), relative)
    assert fragment in str(ei.value) and str(tmp_path) in str(ei.value)


def test_safe_child_single_component_when_asked(tmp_path):
    assert storage.safe_child(str(tmp_path), "a.parquet", allow_subdirs=False)
    with pytest.raises(StorageError, match="separator"):
        storage.safe_child(str(tmp_path), "a/b.parquet", allow_subdirs=False)
    with pytest.raises(StorageError, match="separator"):
        storage.safe_child("s3://bucket/root", "a/b", allow_subdirs=False)


def test_safe_child_symlinks(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "inner").mkdir()
    os.symlink(outside, root / "escape")
    os.symlink(root / "inner", root / "alias")
    os.symlink(outside / "f", root / "escape_file")
    with pytest.raises(StorageError, match="outside the root"):
        storage.safe_child(str(root), "escape/x.parquet")
    with pytest.raises(StorageError, match="outside the root"):
        storage.safe_child(str(root), "escape_file")
    assert storage.safe_child(str(root), "alias/x") == os.path.join(str(root), "alias", "x")
    # a root that is itself a symlink is fine: the check compares resolved paths
    os.symlink(root, tmp_path / "root_link")
    assert storage.safe_child(str(tmp_path / "root_link"), "inner/x")


@pytest.mark.parametrize("key", ["shard_000", "a", "A-b.c_9", "x" * 128, "2024-01-01"])
def test_validate_partition_key_ok(key):
    assert storage.validate_partition_key(key) == key


@pytest.mark.parametrize(
    "key, fragment",
    [
        ("", "empty"),
        ("x" * 129, "longer than 128"),
        ("a/b", "only letters"),
        ("a b", "only letters"),
        ("ä", "only letters"),
        ("a..b", "'..'"),
        ("..", "'..'"),
        (".hidden", "start with '.'"),
        (7, "string"),
    ],
)
def test_validate_partition_key_refuses(key, fragment):
    with pytest.raises(ValueError) as ei:
        storage.validate_partition_key(key)
    assert fragment in str(ei.value)
    assert repr(key)[:40] in str(ei.value) or key == ""


def test_partition_key_for():
    assert storage.partition_key_for("shard_000.parquet") == "shard_000"
    assert storage.partition_key_for("/data/raw/part-7.parquet") == "part-7"
    assert storage.partition_key_for("s3://b/raw/a.b.parquet") == "a.b"
    assert storage.partition_key_for("noext") == "noext"
    with pytest.raises(ValueError, match="only letters"):
        storage.partition_key_for("/raw/bad name.parquet")
    with pytest.raises(ValueError, match="start with '.'"):
        storage.partition_key_for("/raw/.hidden.parquet")


# ------------------------------------------------------------------ atomic publish
def test_atomic_write_bytes_replaces_and_leaves_no_temp(tmp_path):
    f = str(tmp_path / "sub" / "x.json")  # parent created
    storage.atomic_write_bytes(f, b"one")
    storage.atomic_write_bytes(f, b"two")
    assert open(f, "rb").read() == b"two"
    assert _leftovers(tmp_path / "sub") == []


def test_atomic_output_invisible_until_done_and_rolled_back_on_error(tmp_path):
    f = str(tmp_path / "ckpt.pt")
    with storage.atomic_output(f) as fh:
        fh.write(b"partial")
        assert not os.path.exists(f)
        temps = _leftovers(tmp_path)
        assert len(temps) == 1 and temps[0].startswith(".ckpt.pt.tmp-")
    assert open(f, "rb").read() == b"partial"

    with pytest.raises(RuntimeError, match="boom"):
        with storage.atomic_output(f) as fh:
            fh.write(b"garbage that must never be visible")
            raise RuntimeError("boom")
    assert open(f, "rb").read() == b"partial"  # previous version untouched
    assert _leftovers(tmp_path) == []

    g = str(tmp_path / "never.bin")
    with pytest.raises(KeyError):
        with storage.atomic_output(g) as fh:
            fh.write(b"x")
            raise KeyError("x")
    assert not os.path.exists(g) and _leftovers(tmp_path) == []


def test_atomic_output_with_torch_save(tmp_path):
    f = str(tmp_path / "state.pt")
    state = {"logits": torch.arange(10, dtype=torch.float32), "step": 7}
    with storage.atomic_output(f) as fh:
        torch.save(state, fh)
    back = torch.load(f, weights_only=True)
    assert back["step"] == 7 and torch.equal(back["logits"], state["logits"])


def test_atomic_write_table_roundtrip_with_kwargs(tmp_path):
    t = pa.table({"a": pa.array(np.arange(100)), "b": pa.array([str(i) for i in range(100)])})
    f = (tmp_path / "t.parquet").as_uri()
    storage.atomic_write_table(t, f, compression="zstd", row_group_size=30)
    p = str(tmp_path / "t.parquet")
    assert pq.read_table(p).equals(t)
    md = pq.ParquetFile(p).metadata
    assert md.num_row_groups == 4 and md.row_group(0).column(0).compression == "ZSTD"
    assert _leftovers(tmp_path) == []


def test_atomic_write_table_failure_keeps_old_file(tmp_path):
    f = str(tmp_path / "t.parquet")
    t = pa.table({"a": [1, 2, 3]})
    storage.atomic_write_table(t, f)
    with pytest.raises(Exception):
        storage.atomic_write_table(t, f, compression="no-such-codec")
    assert pq.read_table(f).equals(t) and _leftovers(tmp_path) == []


# ------------------------------------------------------------------ write_selected_rows
@pytest.fixture()
def raw(tmp_path):
    t = make_table(3000, dim=8, seed=3)
    p = str(tmp_path / "raw.parquet")
    pq.write_table(t, p, row_group_size=700)
    return p, t


def test_write_selected_rows_copies_every_column_unchanged(tmp_path, raw):
    p, t = raw
    rng = np.random.default_rng(0)
    sel = rng.choice(t.column("chunk_id").to_numpy(), 450, replace=False)
    out = str(tmp_path / "out" / "sel.parquet")
    res = storage.write_selected_rows(p, out, sel, "chunk_id", batch_size=256)
    got = pq.read_table(out)
    mask = np.isin(t.column("chunk_id").to_numpy(), sel)
    want = t.filter(pa.array(mask))
    assert got.schema.equals(pq.read_schema(p), check_metadata=True)
    assert got.equals(want)  # same rows, same order, text and source included
    assert res["rows"] == 450
    assert res["bytes"] == storage.size(out) == os.path.getsize(out)
    assert res["sha256"] == storage.sha256(out)
    # selected rows are gathered into row groups of ~batch_size, not one per input batch
    assert pq.ParquetFile(out).metadata.num_row_groups <= 3
    assert _leftovers(tmp_path / "out") == []


def test_write_selected_rows_accepts_lists_and_arrow_and_empty(tmp_path, raw):
    p, t = raw
    out = str(tmp_path / "a.parquet")
    res = storage.write_selected_rows(p, out, [5, 1, 2999], "chunk_id")
    assert pq.read_table(out).column("chunk_id").to_pylist() == [1, 5, 2999]
    res = storage.write_selected_rows(p, out, pa.array([7], pa.int32()), "chunk_id")
    assert res["rows"] == 1
    res = storage.write_selected_rows(p, out, np.array([], dtype=np.int64), "chunk_id")
    empty = pq.read_table(out)
    assert res["rows"] == 0 and empty.num_rows == 0 and empty.schema.equals(t.schema)


def test_write_selected_rows_string_ids(tmp_path):
    t = pa.table({"doc": ["d%03d" % i for i in range(50)], "text": ["t%d" % i for i in range(50)]})
    p = str(tmp_path / "raw.parquet")
    pq.write_table(t, p)
    out = str(tmp_path / "o.parquet")
    res = storage.write_selected_rows(p, out, np.array(["d010", "d002", "d049"]), "doc")
    assert res["rows"] == 3
    assert pq.read_table(out).to_pydict() == {"doc": ["d002", "d010", "d049"],
                                              "text": ["t2", "t10", "t49"]}


def test_write_selected_rows_missing_ids_publish_nothing(tmp_path, raw):
    p, _ = raw
    out = str(tmp_path / "o.parquet")
    storage.atomic_write_bytes(out, b"old")
    with pytest.raises(DataContractError) as ei:
        storage.write_selected_rows(p, out, [1, 2, 10_000, 10_001], "chunk_id")
    e = ei.value
    assert e.file == p and e.column == "chunk_id" and e.rule == "selected ids present in raw file"
    assert e.ids == [10_000, 10_001]
    assert "raw.parquet" in str(e) and "[10000, 10001]" in str(e)
    assert open(out, "rb").read() == b"old" and _leftovers(tmp_path) == []


def test_write_selected_rows_bad_inputs(tmp_path, raw):
    p, _ = raw
    out = str(tmp_path / "o.parquet")
    with pytest.raises(DataContractError, match="column 'nope'.*column present.*available"):
        storage.write_selected_rows(p, out, [1], "nope")
    with pytest.raises(DataContractError, match="selected ids match the id column type"):
        storage.write_selected_rows(p, out, ["a"], "chunk_id")
    with pytest.raises(DataContractError, match="selected ids unique") as ei:
        storage.write_selected_rows(p, out, [3, 3, 4], "chunk_id")
    assert ei.value.ids == [3]
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(DataContractError, match="junk.parquet: rule 'not a readable parquet file'"):
        storage.write_selected_rows(str(junk), out, [1], "chunk_id")
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.table({"chunk_id": [1, 2, 2, 3]}), dup)
    with pytest.raises(DataContractError, match="unique ids") as ei:
        storage.write_selected_rows(str(dup), out, [2, 3], "chunk_id")
    assert ei.value.ids == [2]
    assert not os.path.exists(out) and _leftovers(tmp_path) == []


_MEM_SCRIPT = r"""
import json, sys
import numpy as np, pyarrow as pa
from datamask_pipeline.engine import storage
raw, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = np.linspace(0, n - 1, 1000).astype(np.int64)
res = storage.write_selected_rows(raw, out, ids, "chunk_id", batch_size=4096)
print(json.dumps({"rows": res["rows"], "peak": pa.default_memory_pool().max_memory()}))
"""


def test_write_selected_rows_memory_is_flat_in_input_size(tmp_path):
    """Peak arrow allocation (fresh process, so the pool's high-water mark is this call's)
    must not grow with the input: 20k vs 200k rows, same number of selected ids."""
    peaks = {}
    for n in (20_000, 200_000):
        p = str(tmp_path / f"raw_{n}.parquet")
        pq.write_table(make_table(n, dim=8, seed=5), p, row_group_size=8192)
        r = subprocess.run(
            [sys.executable, "-c", _MEM_SCRIPT, p, str(tmp_path / f"o_{n}.parquet"), str(n)],
            capture_output=True, text=True, timeout=120,
        )
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout.strip().splitlines()[-1])
        assert info["rows"] == 1000
        peaks[n] = info["peak"]
    raw_bytes = os.path.getsize(tmp_path / "raw_200000.parquet")
    assert peaks[200_000] < 1.5 * peaks[20_000] + (1 << 20), peaks
    assert peaks[200_000] < raw_bytes / 2, (peaks, raw_bytes)
