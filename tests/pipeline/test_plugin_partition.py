"""The example plug-in term (tests/plugin_term) through one pipeline partition."""

import sys

import pyarrow.parquet as pq
import pytest

from datamask_pipeline.engine import terms
from tests.plugin_term.install import install_plugin


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    site = install_plugin(tmp_path / "site")
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    assert "Dispersion" in terms.load_plugins(reload=True)
    yield
    terms.unregister("Dispersion")


def test_plugin_term_selects_one_partition(plugin, registered, run_chain, data_root):
    key = registered[0]
    result = run_chain(key, algorithm="Dispersion", solver="auto")
    assert result.success
    mat = {e.asset_key.to_user_string(): e.materialization
           for e in result.get_asset_materialization_events()}
    md = mat["mask"].metadata
    assert md["algorithm"].value == "Dispersion" and md["route"].value == "paper"
    assert md["f_datamask"].value >= md["f_quality_topk"].value
    sel = pq.read_table(data_root.selected(key))
    assert sel.num_rows == md["k_selected"].value == 40
