"""Issue 26, points 5 and 6: one vocabulary across the command lines (``train_mask`` /
``datamask`` and ``python -m datamask_pipeline.demo``), and flag values checked before any work.

* both spellings of every flag (``--select-ratio`` and ``--select_ratio``) in both CLIs;
* the id column found by one rule (``engine.id_column``): ``train_mask`` on an id+text file
  needs no ``--id-column``, like the demo;
* each CLI's help and errors name the command that was invoked;
* a bad value is one line naming the flag, the value and what is allowed, with a suggestion
  for a misspelt algorithm, and comes before the input is read.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask_pipeline.engine.cli import build_parser
from datamask_pipeline.engine.cli_flags import invoked_prog
from datamask_pipeline.engine.id_column import IdColumnError, detect_id_column

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(cmd, env=None, timeout=120):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "COLUMNS": "100", **(env or {})})


def _demo_parser():
    from datamask_pipeline.demo import _parser

    return _parser()


def _long_flags(parser: argparse.ArgumentParser) -> list:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


@pytest.mark.parametrize("make", [build_parser, _demo_parser], ids=["train_mask", "demo"])
def test_every_flag_takes_both_spellings(make):
    parser = make()
    text = " ".join(parser.format_help().split())  # registers the spellings, as parsing does
    flags = _long_flags(parser)
    for flag in flags:
        for alt in (flag.replace("_", "-"), flag.replace("-", "_").replace("__", "--", 1)):
            assert alt in flags, (flag, alt)
    # one spelling each in the help, and a line saying both are accepted
    assert "hyphens or underscores alike" in text
    assert "--select_ratio SELECT_RATIO, --select-ratio" not in text


def test_both_spellings_parse_to_the_same_value():
    for flags in (["--select-ratio", "0.3", "--n-epochs", "7", "--id_column", "id"],
                  ["--select_ratio", "0.3", "--n_epochs", "7", "--id-column", "id"]):
        args = build_parser().parse_args(["--input", "a", "--output", "b", *flags])
        assert (args.select_ratio, args.n_epochs, args.id_column) == (0.3, 7, "id")
    for flags in (["--select-ratio", "0.3", "--no-dedup"], ["--select_ratio", "0.3", "--no_dedup"]):
        args = _demo_parser().parse_args(flags)
        assert args.select_ratio == 0.3 and args.no_dedup


def test_the_command_is_named_as_invoked():
    assert invoked_prog("datamask_pipeline.engine.cli", "/x/.venv/bin/datamask") == "datamask"
    assert invoked_prog("datamask_pipeline.engine.cli", "/x/bin/train_mask") == "train_mask"
    assert invoked_prog("m.cli", "/repo/m/cli.py") == "python -m m.cli"
    assert invoked_prog("m.cli", "-c") == "python -m m.cli"


@pytest.mark.parametrize("name", ["datamask", "train_mask"])
def test_console_scripts_help_names_itself(name):
    script = BIN / name
    if not script.exists():
        pytest.skip(f"{script} is not installed")
    r = _run([str(script), "--help"])
    assert r.returncode == 0 and r.stdout.startswith(f"usage: {name} "), r.stdout[:200]


def test_jobs_module_has_a_real_help():
    r = _run([sys.executable, "-m", "datamask_pipeline.jobs", "--help"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage: python -m datamask_pipeline.jobs")
    for word in ("pipeline", "upstream", "cpu-demo", "datamask_upstream_job", "--config-json"):
        assert word in r.stdout, word
    assert len(r.stdout.splitlines()) > 5
    ok = _run([sys.executable, "-m", "datamask_pipeline.jobs", "upstream"])
    assert json.loads(ok.stdout)["ops"]["mask"]["config"]["solver"] == "paper"


# ------------------------------------------------------------------ the id column, one rule
def test_id_column_rule():
    assert detect_id_column(["chunk_id", "id", "text"]) == ("chunk_id", None)
    col, note = detect_id_column(["id", "text"])
    assert col == "id" and "'id'" in note and "--id-column" in note
    assert detect_id_column(["doc", "text"], "doc") == ("doc", None)
    # the data contract's error, worded as read_shard and the pipeline's ingestion word it
    with pytest.raises(IdColumnError, match=r"^f.parquet: column 'chunk_id': rule 'column "
                                            r"present' broken; no id column: expected 'chunk_id' "
                                            r"or 'id' \(its columns: doc, text\); --id-column "
                                            r"NAME names it$"):
        detect_id_column(["doc", "text"], where="f.parquet")
    with pytest.raises(IdColumnError, match="column 'uid': rule 'column present' broken; "
                                            "--id-column uid names no column of it"):
        detect_id_column(["id", "text"], "uid")


def _id_text_file(path, n=60):
    from tests.engine.test_quality import good_docs

    pq.write_table(pa.table({"id": pa.array(range(n)), "text": pa.array(good_docs(n))}), path)
    return path


def test_train_mask_finds_the_id_column_of_an_id_and_text_file(tmp_path):
    """The README's command on a file of only id and text, with the demo's spelling of the
    ratio: no --id-column needed, and it says which column it took."""
    src = _id_text_file(tmp_path / "id_and_text.parquet")
    out = tmp_path / "out.parquet"
    r = _run([sys.executable, "-m", "datamask_pipeline.engine.cli", "--input", str(src),
              "--output", str(out), "--select-ratio", "0.1", "--profile", "pipeline",
              "--no-progress", "--device", "cpu"], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "id column: 'id'" in r.stderr
    got = pq.read_table(out)
    assert got.num_rows == 6 and got.schema.names == ["id", "text"]
    assert json.loads(r.stdout)["k"] == 6


def test_train_mask_without_an_id_column_is_one_line(tmp_path):
    src = tmp_path / "doc_text.parquet"
    pq.write_table(pa.table({"doc": [1, 2, 3], "text": ["a b c", "d e f", "g h i"]}), src)
    r = _run([sys.executable, "-m", "datamask_pipeline.engine.cli", "--input", str(src),
              "--output", str(tmp_path / "o.parquet")])
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"python -m datamask_pipeline.engine.cli: error: {src}: column 'chunk_id': rule 'column "
        "present' broken; no id column: expected 'chunk_id' or 'id' (its columns: doc, text); "
        "--id-column NAME names it"]


# ------------------------------------------------------------------ values before any work
@pytest.mark.parametrize("flags, line", [
    (["--select-ratio", "1.5"], "--select_ratio 1.5: select_ratio must be in (0, 1), got 1.5"),
    (["--algorithm", "Pair_sim"], "--algorithm Pair_sim: unknown algorithm 'Pair_sim': choose "
                                  "one of DiSF, Facility, Pair_simi; did you mean 'Pair_simi'?"),
    (["--threads", "-1"], "argument --threads: -1 is out of range (expected an integer >= 0)"),
    (["--embed_max_tokens", "0"], "argument --embed-max-tokens: 0 is out of range (expected an "
                                  "integer >= 1)"),
    (["--quality-min", "1", "--quality-max", "0"], "--quality-min 1 is above --quality-max 0"),
])
def test_train_mask_bad_values_are_one_line_before_reading(tmp_path, flags, line):
    """The input does not exist: an error about it would mean the values were checked after
    the work started."""
    r = _run([sys.executable, "-m", "datamask_pipeline.engine.cli", "--input",
              str(tmp_path / "missing.parquet"), "--output", str(tmp_path / "o.parquet"), *flags])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and line in lines[0], r.stderr
    assert lines[0].startswith("python -m datamask_pipeline.engine.cli: error: ")
    assert "missing.parquet" not in lines[0]
