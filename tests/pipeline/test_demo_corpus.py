"""The README's main job as a user runs it: ``python -m datamask_pipeline.demo`` pointed at a
data root that already holds parquet files selects for the corpus by default."""

import json
import os
import re
import subprocess
import sys

import pyarrow.parquet as pq

from datamask_pipeline.engine.sample import generate_corpus

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, env, timeout=300):
    return subprocess.run([sys.executable, "-m", "datamask_pipeline.demo", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_demo_selects_for_the_corpus_of_a_data_root_with_parquet_files(tmp_path):
    root = tmp_path / "corpus"
    generate_corpus(str(root), n_shards=3, rows_per_shard=300, dim=16, seed=5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATAMASK_")}
    env["DAGSTER_HOME"] = str(tmp_path / "home")
    r = _run(["--data-root", str(root), "--algorithm", "Pair_simi", "--select-rows", "91",
              "--lamb", "0.4"], env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "mode gather" in r.stdout and "of the 900 input rows; 91 rows selected" in r.stdout
    assert "deduplication: " in r.stdout and "rows dropped" in r.stdout
    assert r.stdout.startswith(f"data: the 3 parquet file(s) in {root} (--data-root {root})")
    assert "SAMPLE" not in r.stdout and "generated" not in r.stdout
    # the closing lines name every output where it is (issue 26, point 8)
    version = json.loads((root / "corpus" / "selection.json").read_text())["files"]["version"]
    sel_dir = root / "corpus" / "selection" / version
    assert sorted(os.listdir(root / "corpus" / "selection")) == [version]
    outputs = r.stdout[r.stdout.index("\nOutputs:\n"):].splitlines()[2:6]
    assert [ln.split()[0:2] for ln in outputs] == [
        ["selected", "rows"], ["corpus", "report"], ["lineage", f"{sel_dir}/<shard>.parquet"],
        ["duplicates", str(root / "corpus" / "duplicates.parquet")]], outputs
    assert f"selected rows  {root / 'selected'}/<shard>.parquet" in outputs[0]
    assert outputs[1].split()[2] == str(root / "corpus" / "report.html")
    for ln in outputs[1:]:
        path = ln.split()[2 if ln.split()[0] == "corpus" else 1].replace("<shard>", "shard_000")
        assert os.path.isfile(path), ln
    files = sorted(os.listdir(root / "selected"))
    assert files == [f"shard_00{i}.parquet" for i in range(3)]
    ids = [i for f in files for i in pq.read_table(root / "selected" / f).column("chunk_id").to_pylist()]
    assert len(ids) == 91 == len(set(ids))
    # the raw files were used as they are: nothing generated beside them
    assert sorted(p.name for p in root.glob("*.parquet")) == [f"shard_00{i}.parquet" for i in range(3)]
    assert not (root / "raw").exists()
    # the README's "Where the outputs are": each file the main job writes is where it says
    # (the per-shard chain's and corpus_summary's rows are that chain's, not the main job's)
    from tests.doc_pages import page

    section = page("README.md").split("## Where the outputs are", 1)[1].split("\n## ", 1)[0]
    rows = [ln.split(" | ")[0] for ln in section.splitlines() if ln.startswith("| `")
            and "per-shard chain" not in ln and "corpus_summary" not in ln]
    named = [p for cell in rows for p in re.findall(r"`([^`]+)`", cell)]
    assert {"selected/<shard>.parquet", "corpus/selection/<version>/<shard>.parquet",
            "corpus/selection.json", "corpus/report.html"} <= set(named)
    for p in named:
        assert (root / p.replace("<shard>", "shard_000").replace("<version>", version)).is_file(), p

    # the re-selection command of docs/corpus.md, on the same instance and data root
    readme = page("corpus.md")
    block = readme[readme.index("dagster asset materialize -m datamask_pipeline.definitions \\\n    --select corpus_selection"):]
    config = block[block.index("--config-json '") + len("--config-json '"):]
    config = config[:config.index("'")]
    env.update({"DATAMASK_DATA_ROOT": str(root), "DATAMASK_RAW_ROOT": str(root)})
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "dagster"), "asset",
                        "materialize", "-m", "datamask_pipeline.definitions", "--select",
                        "corpus_selection,corpus_subset", "--config-json", config],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ids = [i for f in sorted(os.listdir(root / "selected"))
           for i in pq.read_table(root / "selected" / f).column("chunk_id").to_pylist()]
    assert len(ids) == 50 == len(set(ids))


def test_demo_help_runs():
    r = subprocess.run([sys.executable, "-m", "datamask_pipeline.demo", "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--select-tokens" in r.stdout and "--mode" in r.stdout


def test_demo_on_bare_id_and_text_files_with_duplicates_across_files(tmp_path):
    """A corpus of only an id and a text column (no quality, no embeddings), with copies of
    some documents (a footer added) planted in other files: the main job's defaults compute
    quality and embeddings, drop the copies, and meet the budget exactly."""
    import numpy as np
    import pyarrow as pa

    from bench.dedup import FOOTER, _paragraphs

    root = tmp_path / "corpus"
    root.mkdir()
    paras = _paragraphs()[:400]
    rng = np.random.default_rng(0)
    planted = rng.choice(len(paras), 30, replace=False)
    texts = paras + [paras[i] + "\n" + FOOTER for i in planted]
    ids = np.arange(len(texts))
    file_of = np.r_[np.arange(len(paras)) % 3, (planted % 3 + 1) % 3]
    for f in range(3):
        m = file_of == f
        pq.write_table(pa.table({"id": pa.array(ids[m]), "text": pa.array(
            [t for t, k in zip(texts, m) if k])}), root / f"part_{f}.parquet")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATAMASK_")}
    env["DAGSTER_HOME"] = str(tmp_path / "home")
    r = _run(["--data-root", str(root), "--algorithm", "Pair_simi"], env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "id column: 'id'" in r.stdout
    got = [i for f in sorted(os.listdir(root / "selected"))
           for i in pq.read_table(root / "selected" / f).column("id").to_pylist()]
    assert len(got) == len(set(got)) == round(0.1 * len(texts))  # 10 % of the input rows
    chosen = set(got)
    both = [i for j, i in enumerate(planted) if i in chosen and len(paras) + j in chosen]
    assert both == []
    dups = pq.read_table(root / "corpus" / "duplicates.parquet")
    dropped = {int(i) for i in dups.column("id").to_pylist()}
    # one member of each planted pair is dropped (the one of lower computed quality), found by
    # the text whatever the embeddings
    found = [i for j, i in enumerate(planted) if i in dropped or len(paras) + j in dropped]
    assert len(found) >= 28
