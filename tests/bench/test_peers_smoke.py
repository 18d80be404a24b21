"""CI smoke run of bench/peers.py at n = 300: it runs and writes valid JSON and a report. The
outside peers come from the ``bench`` extra, which CI does not install: their rows are left
out and listed under ``skipped``. No timing is asserted."""

import json
import math
import sys

import pytest

from bench import peers
from bench.peers import main


def _finite(obj):
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    if isinstance(obj, float):
        return math.isfinite(obj)
    return True


def _read(out):
    res = json.loads((out / "results_peers.json").read_text())
    assert _finite(res)
    assert (out / "REPORT_peers.md").read_text().startswith("# Outside peers")
    return res


def test_quick_run_writes_json_and_report(tmp_path):
    assert main(["--quick", "--out", str(tmp_path), "--threads", "1"]) == 0
    res = _read(tmp_path)
    assert res["command"].startswith(".venv/bin/python -m bench.peers --quick")
    assert [s["n"] for s in res["facility"]] == [300, 600]
    small, large = res["facility"]
    assert "ours: exact greedy (dense)" in small["rows"] and "ours: auto (dense)" in small["rows"]
    # the large size runs sparse modes only
    assert not any("dense" in name for name in large["rows"])
    for sec in res["facility"]:
        assert set(sec["references"]) == {"quality top-k", "random"}
        for name, r in sec["rows"].items():
            assert all(run["k"] == sec["k"] for run in r["runs"])
            assert 0 < r["f"] <= 1 and r["time_s"] >= 0
    if res["engine_sparse"]:
        assert any("sparse" in name and name.startswith("ours") for name in large["rows"])
    for peer in ("apricot", "submodlib"):
        present = any(name.startswith(peer) for name in small["rows"])
        assert present == (peer in res["peers"]), peer
        if peer not in res["peers"]:
            assert "does not import" in res["skipped"][peer]
    assert sorted(s["term"] for s in res["joint"]) == ["DiSF", "Facility", "Pair_simi"]
    for sec in res["joint"]:
        rows = sec["rows"]
        assert rows["greedy (exact)"]["frac_of_greedy"] == 1.0
        assert {"auto", "sgreedy+polish", "stochastic greedy (ε=0.01)"} <= set(rows)


def test_missing_peers_are_skipped_cleanly(tmp_path, monkeypatch):
    # a None entry in sys.modules makes `import apricot` raise ImportError, as when the
    # bench extra is not installed
    monkeypatch.setitem(sys.modules, "apricot", None)
    monkeypatch.setitem(sys.modules, "submodlib", None)
    assert main(["--quick", "--out", str(tmp_path), "--sections", "facility",
                 "--n-large", "0"]) == 0
    res = _read(tmp_path)
    assert res["peers"] == {}
    assert set(res["skipped"]) == {"apricot", "submodlib"}
    assert all(name.startswith("ours") for name in res["facility"][0]["rows"])
    assert res["joint"] == []


def test_dense_rows_are_refused_with_the_memory_they_need(monkeypatch):
    """Where the n x n similarity does not fit, the dense rows are listed as not run, with
    the bytes they need and the bytes available."""
    import numpy as np

    monkeypatch.setattr(peers, "available_bytes", lambda: 2**16)
    x = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
    q = np.linspace(0, 1, 300)

    class Opts:
        select_ratio, steps, seed, neighbors = 0.1, 10, 0, 16

    fns, not_run = peers.facility_contenders(x, q, np.arange(300), False, Opts, {}, False)
    assert not any("dense" in name for name in fns)
    why = not_run["ours: exact greedy / auto (dense)"]
    assert "0.0 GiB available" in why and "float32" in why


@pytest.mark.skipif(not peers.peer_versions(("apricot",))[0],
                    reason=str(peers.peer_versions(("apricot",))[1].get("apricot")))
def test_apricot_sparse_matrix_is_the_transposed_neighbour_lists():
    """apricot reads row j as the points j covers: the csr holds, in row j, each row i that
    lists j among its K neighbours, with their clipped cosine."""
    import numpy as np

    x = np.random.default_rng(1).standard_normal((200, 8)).astype(np.float32)
    C, method = peers.neighbour_csr(x, 10, knn="exact")
    assert method == "exact"
    S = peers.clipped_cosine(x)
    assert C.shape == (200, 200) and C.nnz == 200 * 10
    cols = C.tocsc()
    for i in (0, 57, 199):  # column i: row i's neighbours, its 10 most similar rows
        j = cols.indices[cols.indptr[i]:cols.indptr[i + 1]]
        assert np.allclose(np.sort(S[i, j]), np.sort(S[i])[-10:], atol=1e-5)
