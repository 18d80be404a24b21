"""Issue 26, points 1, 3, 6 and 8 (the demo's part): the path a user names is used or
refused, never turned into sample data; flags are checked before any work; errors before a
run are one line with the fix; conflicting flags are an error, not ignored.

Every refusal here is asserted to be one line on stderr, exit code 2, and to have written
nothing: not the data root, not ``$DAGSTER_HOME``.
"""

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask_pipeline.demo import InputError, _parser, resolve_input
from datamask_pipeline.engine.sample import generate_corpus

REPO = Path(__file__).resolve().parents[2]
PROG = "python -m datamask_pipeline.demo"


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATAMASK_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1", **extra)
    return env


def _demo(args, env, timeout=300):
    return subprocess.run([sys.executable, "-m", "datamask_pipeline.demo", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def _tree(path: Path) -> list:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else None


def _refused(r, tmp_path, *parts) -> str:
    """The one line of a refusal; nothing written to $DAGSTER_HOME."""
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"{PROG}: error: ")
    for part in parts:
        assert part in lines[0], (part, lines[0])
    assert "generated" not in r.stdout and "Selected" not in r.stdout
    assert not (tmp_path / "home").exists()
    return lines[0]


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A user's data root holding three parquet shards itself."""
    root = tmp_path / "corpus"
    generate_corpus(str(root), n_shards=3, rows_per_shard=200, dim=16, seed=5)
    return root


# ------------------------------------------------------------------ point 1: the named path
def _csv_folder(tmp_path):
    d = tmp_path / "csvs"
    d.mkdir()
    (d / "a.csv").write_text("id,text\n1,hello\n")
    (d / "b.csv").write_text("id,text\n2,world\n")
    return d


def _empty_folder(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    return d


def _a_file(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    return f


@pytest.mark.parametrize("make, found", [
    (lambda t: t / "my_corpus", "no such folder"),
    (_csv_folder, "it holds 2 file(s) (.csv) and no *.parquet"),
    (_empty_folder, "it is empty"),
    (_a_file, "a file, not a folder"),
])
def test_a_named_data_root_without_parquet_is_refused_and_nothing_is_written(tmp_path, make,
                                                                            found):
    root = make(tmp_path)
    before = _tree(root)
    r = _demo(["--data-root", str(root), "--algorithm", "Pair_simi", "--select-ratio", "0.1"],
              _env(tmp_path))
    _refused(r, tmp_path, f"--data-root {root}: {found}", "expected a folder with "
             "raw/*.parquet or *.parquet files", "omit --data-root to generate sample data")
    assert _tree(root) == before  # nothing generated into it (and a missing root not created)


def test_a_data_root_named_in_the_environment_is_refused_too(tmp_path):
    root = tmp_path / "nowhere"
    r = _demo([], _env(tmp_path, DATAMASK_DATA_ROOT=str(root)))
    _refused(r, tmp_path, f"DATAMASK_DATA_ROOT={root}: no such folder",
             "unset DATAMASK_DATA_ROOT to generate sample data")
    assert not root.exists()


def test_files_without_an_id_column_are_refused_before_any_run(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    pq.write_table(pa.table({"doc": [1, 2], "text": ["a b", "c d"]}), root / "part_0.parquet")
    r = _demo(["--data-root", str(root)], _env(tmp_path))
    _refused(r, tmp_path, "part_0.parquet: column 'chunk_id': rule 'column present' broken; "
             "no id column: expected 'chunk_id' or 'id' (its columns: doc, text); --id-column "
             "NAME names it")
    assert _tree(root) == ["part_0.parquet"]


def _args(*argv):
    return _parser().parse_args(list(argv))


def test_sample_data_only_without_a_data_root_or_when_asked(tmp_path, corpus):
    default = tmp_path / "repo_data"
    # no data root named: the sample, generated into <default>/raw
    got = resolve_input(_args(), environ={}, default_root=str(default))
    assert got["generate"] and got["raw"] == str(default / "raw") and got["named"] is None
    # an earlier run's sample is used again, as it is
    generate_corpus(str(default / "raw"), n_shards=4, rows_per_shard=20, dim=8, seed=0)
    again = resolve_input(_args(), environ={}, default_root=str(default))
    assert not again["generate"] and len(again["files"]) == 4
    # ... so sample flags that would be ignored are an error naming them
    with pytest.raises(InputError, match=r"^--shards 2 --rows 2000: .*raw already holds 4 "
                                         r"parquet shard\(s\) from an earlier run"):
        resolve_input(_args("--shards", "2", "--rows", "2000"), environ={},
                      default_root=str(default))
    # a named data root with parquet files: used, never generated into
    own = resolve_input(_args("--data-root", str(corpus)), environ={})
    assert not own["generate"] and own["raw"] == str(corpus) and len(own["files"]) == 3
    assert own["named"] == f"--data-root {corpus}"
    with pytest.raises(InputError, match=r"^--shards, --rows: only for a generated sample"):
        resolve_input(_args("--data-root", str(corpus), "--shards", "2", "--rows", "50"),
                      environ={})
    # --generate-sample: into a named folder that holds no shards yet, never over files
    fresh = resolve_input(_args("--data-root", str(tmp_path / "new"), "--generate-sample"),
                          environ={})
    assert fresh["generate"] and fresh["raw"] == str(tmp_path / "new" / "raw")
    with pytest.raises(InputError, match=r"^--generate-sample: .* already holds 4 file\(s\)"):
        resolve_input(_args("--generate-sample"), environ={}, default_root=str(default))


def test_ignored_sample_flags_are_an_error_on_the_command_line(tmp_path, corpus):
    before = _tree(corpus)
    r = _demo(["--data-root", str(corpus), "--shards", "2", "--rows", "2000"], _env(tmp_path))
    _refused(r, tmp_path, "--shards, --rows: only for a generated sample",
             f"--data-root {corpus} holds your 3 parquet file(s)")
    assert _tree(corpus) == before


# ------------------------------------------------------- point 6: flag values before any work
@pytest.mark.parametrize("flags, line", [
    (["--select-ratio", "1.5"], "--select-ratio 1.5: select_ratio must be in (0, 1), got 1.5"),
    (["--select_ratio", "0"], "--select-ratio 0.0: select_ratio must be in (0, 1), got 0.0"),
    (["--algorithm", "Pair_sim"], "--algorithm Pair_sim: unknown algorithm 'Pair_sim': choose "
                                  "one of DiSF, Facility, Pair_simi; did you mean 'Pair_simi'?"),
    (["--lamb", "2"], "--lamb 2.0: lamb (lambda) must be in [0, 1], got 2.0"),
    (["--select-rows", "0"], "argument --select-rows: 0 is out of range (expected an integer "
                             ">= 1)"),
    (["--mode", "gathr"], "argument --mode: invalid choice: 'gathr' (choose from 'auto', "
                          "'gather', 'exchange', 'per_shard', 'random_blocks')"),
    (["--dedup-threshold", "1.5"], "argument --dedup-threshold: 1.5 is out of range (expected "
                                   "a number in (0, 1])"),
    (["--device", "tpu"], "--device tpu: unknown device 'tpu': use auto, cpu or cuda:N"),
    # conflicting flags (point 8): an error, never silently ignored
    (["--per-shard-chain", "--select-rows", "30", "--no-dedup"],
     "--select-rows, --no-dedup: a corpus selection flag, and --per-shard-chain selects each "
     "shard alone"),
    (["--token-column", "n_tokens"], "--token-column n_tokens: only used with --select-tokens"),
    (["--no-dedup", "--dedup-threshold", "0.9"], "--dedup-threshold 0.9 with --no-dedup"),
])
def test_bad_flag_values_are_one_line_before_any_work(tmp_path, corpus, flags, line):
    """On a valid data root: the run would start at once, so an error after the work started
    would leave the features or $DAGSTER_HOME behind."""
    before = _tree(corpus)
    r = _demo(["--data-root", str(corpus), *flags], _env(tmp_path))
    _refused(r, tmp_path, line)
    assert _tree(corpus) == before


# ------------------------------------------------------- point 3: one line, with the fix
def test_a_dagster_home_that_is_a_file_is_one_line(tmp_path, corpus):
    home = tmp_path / "home_file"
    home.write_text("")
    env = _env(tmp_path)
    env["DAGSTER_HOME"] = str(home)
    r = _demo(["--data-root", str(corpus)], env)
    _refused(r, tmp_path, f"DAGSTER_HOME={home}: a file, not a folder; export "
             "DAGSTER_HOME=<a writable folder>, or unset it")
    assert "Traceback" not in r.stderr


def test_no_shard_to_register_is_one_line(tmp_path):
    root = tmp_path / "bad_names"
    root.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "text": ["a b", "c d"]}), root / "my shard.parquet")
    r = _demo(["--data-root", str(root)], _env(tmp_path))
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{PROG}: error: {root}: none of its 1 parquet file(s) has a name "
                           "that can be a shard key")
    assert "rename them" in last
