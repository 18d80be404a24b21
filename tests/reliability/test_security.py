"""Issue 5, item 6: security.

* the web server binds to 127.0.0.1 unless told otherwise (every documented command; the
  live bind of ``dagster dev`` without ``-h`` in the slow variant);
* partition keys and paths cannot escape the data root (``..``, absolute paths, NUL,
  separators, symlinks), through ``DataRoot``, ``MaskLearner.checkpoint_path``,
  ``register_shards`` and the Dagster chain itself;
* SQL: values are parameters and identifiers quoted (an AST check of every ``execute`` in
  assets/validate.py and assets/report.py, and hostile column names / a data root path with
  quotes through the real checks and the catalog);
* a checkpoint carrying pickled code is refused without running it (engine CLI and mask step);
* a secret in the environment appears in no event, log, metadata or output file.
"""

import ast
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from dagster_duckdb import DuckDBResource

from assets.learn import MaskConfig
from assets.partitions import register_shards, scan_raw
from datamask_pipeline.engine.storage import StorageError
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.storage import DataRoot
from tests.pipeline.helpers import ALL_ASSETS, CHAIN, TINY

from .helpers import (
    BIN,
    CLI_TINY,
    REPO,
    SECRET_SENTINEL,
    dagster_env,
    error_text,
    good_table,
    retried_steps,
    run_cli_batch,
)

# ------------------------------------------------------------------ web server host
_HOST_FLAG = re.compile(r"(?:^|\s)(?:-h|--host|--dagit-host)[ =](\S+)")


def _ui_commands():
    """Every line of the docs, scripts and code that starts the web server."""
    files = [REPO / "README.md", *sorted((REPO / "scripts").glob("*.sh")),
             *sorted((REPO / "docs").rglob("*.md")), REPO / "datamask_pipeline" / "demo.py",
             REPO / "workspace.yaml"]
    out = []
    for f in files:
        for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if re.search(r"dagster(?:-webserver|\s+dev\b)|\bdg\s+dev\b", line):
                out.append((f"{f.relative_to(REPO)}:{i}", line))
    return out


def test_web_server_host_defaults_to_localhost():
    cmds = _ui_commands()
    assert any("README.md" in where for where, _ in cmds)
    for where, line in cmds:
        for host in _HOST_FLAG.findall(line):
            assert host in ("127.0.0.1", "localhost"), f"{where}: {line}"
    # commands without -h get the web server's default: dagster dev passes --host only when
    # given, and dagster-webserver's default is the loopback address
    from dagster._cli.dev import dev_command
    from dagster_webserver.cli import DEFAULT_WEBSERVER_HOST

    host_opt = [p for p in dev_command.params if "--host" in getattr(p, "opts", [])]
    assert len(host_opt) == 1
    assert host_opt[0].default is None or "UNSET" in str(host_opt[0].default)  # no default host
    assert DEFAULT_WEBSERVER_HOST == "127.0.0.1"


def _listening_addresses(port: int) -> set:
    out = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if int(p, 16) == port and state == "0A":  # LISTEN
                out.add(addr)
    return out


@pytest.mark.slow
def test_dagster_dev_without_host_listens_on_loopback_only(dagster_home, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dagster_env(dagster_home, tmp_path / "data")
    log = open(tmp_path / "dev.log", "w")
    proc = subprocess.Popen([str(BIN / "dagster"), "dev", "-w", "workspace.yaml", "-p", str(port)],
                            cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "dev.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                    break
            except OSError:
                time.sleep(0.5)
        addrs = _listening_addresses(port)
        assert addrs == {"0100007F"}, addrs  # 127.0.0.1 only, no 0.0.0.0 / ::
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


# ------------------------------------------------------------------ paths
HOSTILE_KEYS = ["..", "../x", "../../etc/passwd", "/etc/passwd", "a/b", ".hidden", "x\x00y",
                "", "a\\b", "c:evil", "s3://bucket/x", "k" * 200, "shard..1"]


@pytest.mark.parametrize("key", HOSTILE_KEYS, ids=[repr(k)[:20] for k in HOSTILE_KEYS])
def test_data_root_refuses_hostile_partition_keys(key, tmp_path):
    root = DataRoot(root=str(tmp_path / "data"))
    for method in (root.raw_shard, root.features, root.mask, root.selected, root.report_dir,
                   root.checkpoint):
        with pytest.raises((ValueError, StorageError)):
            method(key)
    learner = MaskLearner(checkpoint_dir=str(tmp_path / "ck"))
    with pytest.raises((ValueError, StorageError)):
        learner.checkpoint_path(key, "unused")


def test_symlinks_cannot_lead_outside_the_data_root(tmp_path, instance):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.parquet"
    pq.write_table(good_table(), victim)
    victim_bytes = victim.read_bytes()
    root = DataRoot(root=str(tmp_path / "data"))
    raw = Path(root.raw_root)
    raw.mkdir(parents=True)
    pq.write_table(good_table(), raw / "ok.parquet")
    # a raw file that is a symlink to a file outside the raw location
    os.symlink(victim, raw / "escape.parquet")
    scan = scan_raw(root.raw_root)
    assert sorted(scan.shards) == ["ok"]
    assert [(os.path.basename(u), "outside" in why) for u, why in scan.invalid] == [("escape.parquet", True)]
    out = register_shards(instance, root.raw_root)
    assert out["added"] == ["ok"] and len(out["invalid"]) == 1
    with pytest.raises(StorageError, match="resolves outside the root"):
        root.raw_shard("escape")
    # an output directory that is a symlink to a directory outside the data root
    os.makedirs(root.root, exist_ok=True)
    os.symlink(outside, os.path.join(root.root, "features"))
    with pytest.raises(StorageError, match="resolves outside the root"):
        root.features("ok")
    resources = {"data_root": root, "contract": DataContract(expected_dim=16),
                 "learner": MaskLearner(device="cpu", cpu_threads=1, shard_report=False),
                 "duckdb": DuckDBResource(database=":memory:"),
                 "catalog": DuckDBResource(database=root.catalog())}
    res = dg.materialize(ALL_ASSETS, partition_key="ok", instance=instance, resources=resources,
                         run_config=dg.RunConfig({"mask": MaskConfig(**TINY)}), selection=CHAIN,
                         raise_on_error=False)
    assert not res.success
    assert "resolves outside the root" in error_text(res)
    assert sorted(os.listdir(outside)) == ["victim.parquet"]  # nothing written outside
    assert victim.read_bytes() == victim_bytes


def test_hostile_dagster_partition_key_writes_nothing_outside(tmp_path, instance):
    """A dynamic partition key added behind the sensor's back (the API accepts any string):
    the chain fails on the key and nothing appears outside the data root."""
    base = tmp_path / "deep" / "er"
    root = DataRoot(root=str(base / "data"))
    os.makedirs(root.raw_root)
    key = "../../escape"
    instance.add_dynamic_partitions("shards", [key])
    resources = {"data_root": root, "contract": DataContract(expected_dim=16),
                 "learner": MaskLearner(device="cpu", cpu_threads=1, shard_report=False),
                 "duckdb": DuckDBResource(database=":memory:"),
                 "catalog": DuckDBResource(database=root.catalog())}
    res = dg.materialize(ALL_ASSETS, partition_key=key, instance=instance, resources=resources,
                         run_config=dg.RunConfig({"mask": MaskConfig(**TINY)}), selection=CHAIN,
                         raise_on_error=False)
    assert not res.success
    assert "partition key '../../escape'" in error_text(res)
    files = [os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert files == [], files


# ------------------------------------------------------------------ SQL
SQL_FILES = [REPO / "assets" / "validate.py", REPO / "assets" / "report.py"]
# names that hold quoted identifiers or SQL fragments built only from quoted identifiers,
# placeholders and constants (checked below where they are built)
SAFE_NAMES = {"T", "I", "Q", "E", "NUMBERED", "where", "nonfinite", "zero", "cols",
              "placeholders", "files", "conds", "groups"}
SAFE_CALLS = {"q", "sql_string"}


def _formatted_values(node):
    for v in ast.walk(node):
        if isinstance(v, ast.FormattedValue):
            yield v.value


def _safe(expr) -> bool:
    """A quoted identifier, a quoted literal, or a fragment name checked where it is built."""
    if isinstance(expr, ast.Name):
        return expr.id in SAFE_NAMES
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
        return expr.func.id in SAFE_CALLS
    # ``rule.sql``: a contract rule's DuckDB predicate, a constant of engine/contract.py whose
    # values are ``?`` parameters (test_contract_sql_binds_values below)
    if isinstance(expr, ast.Attribute) and expr.attr == "sql":
        return True
    # " OR ".join(conds): conditions built from quoted identifiers and "?" (checked below)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and \
            expr.func.attr == "join" and isinstance(expr.func.value, ast.Constant):
        return all(isinstance(a, ast.Name) and a.id in SAFE_NAMES for a in expr.args)
    return False


def test_contract_sql_binds_values():
    """Every contract rule's SQL predicate is code, not data: only the column placeholder
    ``{c}``, ``?`` parameters and SQL of its own; no digits but in ``?``-free constants such
    as ``0``, and nothing a shard could put there."""
    from datamask_pipeline.engine import contract

    for rule in contract.RULES:
        if rule.sql:
            assert "'" not in rule.sql and ";" not in rule.sql, (rule.name, rule.sql)
            assert len(rule.params) == rule.sql.count("?"), (rule.name, rule.sql, rule.params)


def test_every_sql_statement_quotes_identifiers_and_binds_values():
    """In the files that talk to DuckDB, an f-string that reaches ``execute`` may interpolate
    only quoted identifiers (``q(...)``), quoted file literals (``sql_string``) and
    fragments built from those (whose own f-strings are checked the same way); values go
    through ``?`` parameters. A value pasted into SQL makes this test fail."""
    checked = 0
    for path in SQL_FILES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "execute" and node.args):
                checked += 1
                for expr in _formatted_values(node.args[0]):
                    assert _safe(expr), f"{path.name}:{expr.lineno}: {{{ast.unparse(expr)}}} in SQL"
            # fragments: every assignment (or append) to a SAFE_NAMES name
            targets = []
            if isinstance(node, ast.Assign):
                targets = [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "append" and isinstance(node.func.value, ast.Name)):
                targets = [(node.func.value.id, a) for a in node.args]
            for name, value in targets:
                if name not in SAFE_NAMES:
                    continue
                for expr in _formatted_values(value):
                    ok = _safe(expr) or (name == "cols" and isinstance(expr, ast.Name) and expr.id == "t")
                    assert ok, f"{path.name}:{value.lineno}: {name} = ...{{{ast.unparse(expr)}}}"
    assert checked >= 15


HOSTILE_ID = 'x"; DROP TABLE features; --'
HOSTILE_Q = "q'); DROP TABLE shards; --"


def _hostile_table(dup=False):
    t = good_table()
    ids = t.column("chunk_id").to_numpy().copy()
    if dup:
        ids[21] = ids[20]
    return pa.table({HOSTILE_ID: pa.array(ids), HOSTILE_Q: t.column("quality_score"),
                     "feature_arr": t.column("feature_arr"), "text": t.column("text")})


def test_hostile_column_names_and_quoted_data_root(tmp_path, instance):
    """Raw columns named like SQL injections, a data root whose path holds both quote
    characters: the checks run, a real defect is reported naming the hostile column, the
    catalog is built and its view reads every selected row."""
    root = DataRoot(root=str(tmp_path / "it's a \"data\" root"))
    os.makedirs(root.raw_root)
    pq.write_table(_hostile_table(), root.raw_shard("ok"))
    pq.write_table(_hostile_table(dup=True), root.raw_shard("dup"))
    register_shards(instance, root.raw_root)
    resources = {"data_root": root,
                 "contract": DataContract(id_column=HOSTILE_ID, quality_columns=[HOSTILE_Q],
                                          expected_dim=16),
                 "learner": MaskLearner(device="cpu", cpu_threads=1, shard_report=False),
                 "duckdb": DuckDBResource(database=":memory:"),
                 "catalog": DuckDBResource(database=root.catalog())}

    def run(key, selection=CHAIN):
        return dg.materialize(ALL_ASSETS, partition_key=key, instance=instance, resources=resources,
                              run_config=dg.RunConfig({"mask": MaskConfig(**TINY)}),
                              selection=selection, raise_on_error=False)

    ok = run("ok")
    assert ok.success, error_text(ok)
    assert pq.read_table(root.selected("ok")).num_rows == 30
    bad = run("dup")
    assert not bad.success
    text = error_text(bad)
    assert f"column {HOSTILE_ID!r}: rule 'unique ids' broken by 1 row; ids: [20]" in text, text
    summary = dg.materialize(ALL_ASSETS, instance=instance, resources=resources,
                             selection=[dg.AssetKey("corpus_summary")], raise_on_error=False)
    assert summary.success, error_text(summary)
    con = duckdb.connect(root.catalog(), read_only=True)
    try:
        assert con.execute('SELECT count(*), count(DISTINCT "x""; DROP TABLE features; --") '
                           "FROM selected_rows").fetchall() == [(30, 30)]
        assert con.execute("SELECT partition_key, rows_selected FROM shards").fetchall() == [("ok", 30)]
    finally:
        con.close()


# ------------------------------------------------------------------ checkpoints
class _Payload:
    """Unpickling this runs ``os.mkdir(path)``: a visible side effect if code ever runs."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _evil_checkpoint(path, sentinel):
    torch.save({"format": 1, "logits": torch.zeros(400), "step": 5, "evil": _Payload(str(sentinel))}, path)


def test_checkpoint_with_pickled_code_is_refused_without_running_it(tmp_path, registered,
                                                                    run_chain, data_root):
    key = registered[0]
    assert run_chain(key, selection=dg.AssetSelection.assets("features")).success
    sentinel = tmp_path / "code_ran"
    ck = data_root.checkpoint(key)
    os.makedirs(os.path.dirname(ck), exist_ok=True)
    _evil_checkpoint(ck, sentinel)
    # the pickle really does run code when loaded the unsafe way
    torch.load(ck, weights_only=False)
    assert sentinel.is_dir()
    sentinel.rmdir()

    res = run_chain(key, selection=[dg.AssetKey("mask")], raise_on_error=False, solver="paper")
    assert not res.success
    text = error_text(res)
    assert ck in text and "weights-only" in text, text
    assert retried_steps(res) == []  # refusing again would not help: no RetryPolicy retries
    assert not sentinel.exists()
    assert not os.path.exists(data_root.mask(key))

    # the engine command line: exit code 2 with the reason, no code run, nothing written
    cli_ck = tmp_path / "cli" / "ck.pt"
    cli_ck.parent.mkdir()
    _evil_checkpoint(cli_ck, sentinel)
    out = tmp_path / "cli" / "out.parquet"
    r = run_cli_batch({"evil": ["--input", data_root.raw_shard(key), "--output", str(out),
                                "--checkpoint", str(cli_ck), "--device", "cpu", *CLI_TINY]},
                      str(tmp_path))["evil"]
    assert r["rc"] == 2, r["stderr"][-2000:]
    assert r["stderr"].startswith("train_mask: error: ") and str(cli_ck) in r["stderr"]
    assert "weights-only" in r["stderr"] and "Traceback" not in r["stderr"]
    assert not sentinel.exists() and not out.exists()


# ------------------------------------------------------------------ secrets
def test_no_secret_in_events_logs_metadata_or_outputs(monkeypatch, registered, run_chain,
                                                      instance, data_root, resources):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_SENTINEL)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-" + SECRET_SENTINEL)
    key = registered[0]
    assert run_chain(key).success
    # a failing run too (errors carry messages and stack traces)
    assert not run_chain(key, raise_on_error=False, partial=0.001, solver="paper").success
    summary = dg.materialize(ALL_ASSETS, instance=instance, resources=resources,
                             selection=[dg.AssetKey("corpus_summary")])
    assert summary.success
    from dagster._serdes import serialize_value

    texts = []
    for run in instance.get_runs():
        for entry in instance.all_logs(run.run_id):
            texts.append(serialize_value(entry))
        texts.append(serialize_value(run))
    assert len(texts) > 50
    blob = "\n".join(texts)
    assert "AWS_SECRET_ACCESS_KEY" not in blob and SECRET_SENTINEL not in blob
    # compute logs, the sqlite storage and every output file
    for base in (instance.root_directory, data_root.root):
        for d, _, files in os.walk(base):
            for f in files:
                with open(os.path.join(d, f), "rb") as fh:
                    assert SECRET_SENTINEL.encode() not in fh.read(), os.path.join(d, f)
