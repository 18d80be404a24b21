"""The diversity-term registry: names and aliases, errors, mixtures, plug-ins registered at
runtime or shipped as entry points, and which optional moves a term has."""

import importlib
import sys
import textwrap

import numpy as np
import pytest
import torch

from datamask_pipeline.engine import terms
from datamask_pipeline.engine.baselines import greedy
from datamask_pipeline.engine.evaluate import ALL_TERMS, evaluate_selection
from datamask_pipeline.engine.objectives import Batch, score
from datamask_pipeline.engine.polish import polish

from .test_objectives import BRUTE, _data


class NegMeanNorm(terms.DiversityTerm):
    """A plug-in with only the batched objective: minus the norm of the selection's mean."""

    name = "NegMeanNorm"
    aliases = ("neg_mean_norm",)

    def batched(self, batch, idx, chunk=None):
        return -batch.x[idx].mean(dim=1).norm(dim=1)


@pytest.fixture
def plugin():
    term = terms.register(NegMeanNorm)
    yield term
    terms.unregister("NegMeanNorm")


# ------------------------------------------------------------------ registry
def test_builtin_names_and_aliases():
    assert terms.BUILTIN_NAMES == ALL_TERMS == ("DiSF", "Facility", "Pair_simi")
    assert terms.names()[:3] == ("DiSF", "Facility", "Pair_simi")
    for spelling, name in [("disf", "DiSF"), ("DISF", "DiSF"), ("facility", "Facility"),
                           ("Facility_Location", "Facility"), ("pair_simi", "Pair_simi"),
                           ("pairwise", "Pair_simi"), (" pair ", "Pair_simi")]:
        assert terms.get(spelling).name == name
    assert terms.get(terms.get("DiSF")) is terms.get("disf")
    assert terms.get("Facility").min_k == 1 and terms.get("DiSF").min_k == 2


def test_unknown_name_lists_the_registered_terms():
    with pytest.raises(terms.TermError, match=r"unknown diversity term 'kmeans': choose one of "
                                              r"DiSF, Facility, Pair_simi"):
        terms.get("kmeans")
    assert issubclass(terms.TermError, ValueError)


def test_register_rejects_taken_names_and_non_terms(plugin):
    class Clash(NegMeanNorm):
        name = "Other"
        aliases = ("pairwise",)

    with pytest.raises(terms.TermError, match="'pairwise' is already taken by 'Pair_simi'"):
        terms.register(Clash)
    with pytest.raises(terms.TermError, match="expected a DiversityTerm"):
        terms.register(lambda batch, idx: None)
    assert "NegMeanNorm" in terms.names()
    assert terms.get("NEG_MEAN_NORM") is plugin


def test_capabilities():
    for name in ALL_TERMS:
        t = terms.get(name)
        assert all(t.supports(c) for c in terms.CAPABILITIES)
    plug = NegMeanNorm()
    assert not any(plug.supports(c) for c in terms.CAPABILITIES)
    with pytest.raises(ValueError, match="unknown capability"):
        plug.supports("teleport")


# ------------------------------------------------------------------ mixture
def test_mixture_is_the_weighted_sum_of_its_parts():
    x, q = _data(m=40, d=6, seed=4)
    batch = Batch(torch.as_tensor(x), torch.as_tensor(q))
    idx = torch.as_tensor(np.random.default_rng(3).choice(40, size=(12, 6)))
    mix = terms.Mixture({"DiSF": 0.5, "pairwise": 2.0, "Facility": 0.25})
    expected = (0.5 * terms.get("DiSF").batched(batch, idx)
                + 2.0 * terms.get("Pair_simi").batched(batch, idx)
                + 0.25 * terms.get("Facility").batched(batch, idx))
    torch.testing.assert_close(mix.batched(batch, idx), expected)
    # through score() as a {name: weight} mapping, and against the brute force on one mask
    fd = score(batch, idx, {"DiSF": 0.5, "Pair_simi": 2.0, "Facility": 0.25}, 0.3)[2]
    torch.testing.assert_close(fd, expected)
    sel = idx[0].numpy()
    ref = 0.5 * BRUTE["DiSF"](x, sel) + 2.0 * BRUTE["Pair_simi"](x, sel) \
        + 0.25 * BRUTE["Facility"](x, sel)
    assert fd[0].item() == pytest.approx(ref, rel=1e-9)
    assert mix.min_k == 2 and mix.weights == {"DiSF": 0.5, "Pair_simi": 2.0, "Facility": 0.25}
    assert terms.get({"disf": 1}) is terms.get("DiSF")


def test_mixture_validation_and_unsupported_moves():
    with pytest.raises(terms.TermError, match="weight of 'DiSF' must be > 0"):
        terms.Mixture({"DiSF": 0.0})
    with pytest.raises(terms.TermError, match="unknown diversity term 'nope'"):
        terms.Mixture({"nope": 1.0})
    with pytest.raises(terms.TermError, match="non-empty"):
        terms.Mixture({})
    mix = terms.Mixture({"DiSF": 1.0, "Pair_simi": 1.0})
    assert not mix.supports("greedy") and not mix.supports("polish")
    x, q = _data(m=30, d=4, seed=1)
    with pytest.raises(terms.NotSupported, match="no greedy move"):
        greedy(x, q, 5, mix, 0.5)
    with pytest.raises(terms.NotSupported, match="no polish"):
        polish(x, q, np.arange(5), mix, 0.5)
    assert mix.workspace_bytes(100, 10, 4, 4, 1 << 20) == (1 << 20) + 2 * 100 * 4 * 4


def test_workspace_bytes_counts_the_facility_similarity_matrix_when_it_fits():
    fac = terms.get("Facility")
    budget = 1 << 20
    assert fac.workspace_bytes(300, 30, 8, 4, budget) == budget + 300 * 8 * 4 + 300 * 300 * 4
    assert fac.workspace_bytes(3000, 30, 8, 4, budget) == budget + 3000 * 8 * 4  # S does not fit
    assert terms.get("DiSF").workspace_bytes(300, 30, 8, 4, budget) == budget + 300 * 8 * 4


# ------------------------------------------------------------------ plug-ins
def test_a_runtime_plugin_works_through_evaluate_selection_and_score(plugin):
    x, q = _data(m=30, d=5, seed=2)
    sel = np.array([1, 5, 9, 20])
    ev = evaluate_selection(x, q, sel, lamb=0.4, terms=("neg_mean_norm", "DiSF"))
    ref = -np.linalg.norm(x[sel].mean(0))
    assert ev["f_div"]["NegMeanNorm"] == pytest.approx(ref, rel=1e-12)
    assert ev["f"]["NegMeanNorm"] == pytest.approx(0.4 * q[sel].mean() + 0.6 * ref, rel=1e-12)
    assert ev["f_div"]["DiSF"] == pytest.approx(BRUTE["DiSF"](x, sel), rel=1e-9)
    batch = Batch(torch.as_tensor(x), torch.as_tensor(q))
    f, fq, fd = score(batch, torch.as_tensor(sel)[None], "NegMeanNorm", 0.4)
    assert fd[0].item() == pytest.approx(ref, rel=1e-12)
    # an unregistered instance works too, and in a mixture
    f2 = score(batch, torch.as_tensor(sel)[None], {NegMeanNorm(): 2.0, "DiSF": 1.0}, 0.4)[2]
    assert f2[0].item() == pytest.approx(2 * ref + BRUTE["DiSF"](x, sel), rel=1e-9)
    with pytest.raises(terms.NotSupported):
        greedy(x, q, 4, "NegMeanNorm", 0.5)


def _install_plugin(tmp_path, monkeypatch, target: str):
    dist = tmp_path / "datamask_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: datamask-test-plugin\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{terms.ENTRY_POINT_GROUP}]\nspread = {target}\n")
    (tmp_path / "datamask_test_plugin.py").write_text(textwrap.dedent('''
        from datamask_pipeline.engine.terms import DiversityTerm

        class Spread(DiversityTerm):
            name = "Spread"
            min_k = 2

            def batched(self, batch, idx, chunk=None):
                xu = batch.x[idx]
                return (xu - xu.mean(dim=1, keepdim=True)).norm(dim=2).mean(dim=1)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()


@pytest.fixture
def fresh_plugins():
    yield
    terms.unregister("Spread")
    sys.modules.pop("datamask_test_plugin", None)


def test_an_entry_point_plugin_is_loaded_lazily(tmp_path, monkeypatch, fresh_plugins):
    _install_plugin(tmp_path, monkeypatch, "datamask_test_plugin:Spread")
    assert terms.load_plugins(reload=True) == ["Spread"]
    x, q = _data(m=20, d=3, seed=6)
    sel = np.array([0, 3, 7])
    ev = evaluate_selection(x, q, sel, lamb=0.5, terms=("spread",))
    xs = x[sel]
    assert ev["f_div"]["Spread"] == pytest.approx(
        np.linalg.norm(xs - xs.mean(0), axis=1).mean(), rel=1e-12)
    assert "Spread" in terms.names()
    monkeypatch.undo()
    terms.unregister("Spread")
    assert terms.load_plugins(reload=True) == []


def test_a_broken_entry_point_is_named(tmp_path, monkeypatch, fresh_plugins):
    _install_plugin(tmp_path, monkeypatch, "datamask_test_plugin_missing:Spread")
    with pytest.raises(terms.TermError, match=r"entry point 'spread' \(datamask_test_plugin_missing"
                                              r":Spread\) of group 'datamask.diversity_terms' "
                                              r"failed to load: ModuleNotFoundError"):
        terms.load_plugins(reload=True)
    with pytest.raises(terms.TermError, match="entry point 'spread'"):
        terms.get("not-a-term")  # a look-up that needs the plug-ins reports it again
    assert terms.get("DiSF").name == "DiSF"  # built-ins never need the plug-ins
    monkeypatch.undo()
    assert terms.load_plugins(reload=True) == []


def test_disf_scratch_buffers_are_reused_and_never_leak_into_results(monkeypatch):
    from datamask_pipeline.engine.terms import disf as D

    torch.manual_seed(0)
    a, b = torch.randn(8, 12, 16), torch.randn(8, 12, 16)
    a0 = a.clone()

    def fresh(xu):  # the same kernel with every buffer newly allocated
        monkeypatch.setattr(D, "SCRATCH_MAX_BYTES", -1)
        try:
            return D.disf_from_points(xu)
        finally:
            monkeypatch.undo()

    want_a, want_b = fresh(a), fresh(b)
    got_a = D.disf_from_points(a)
    ptr = D._SCRATCH.bufs[("xc", torch.float32)].data_ptr()
    got_b = D.disf_from_points(b)
    assert D._SCRATCH.bufs[("xc", torch.float32)].data_ptr() == ptr  # same shape: the buffer was reused
    torch.testing.assert_close(got_a, want_a)  # the second call did not overwrite the first
    torch.testing.assert_close(got_b, want_b)
    assert a.equal(a0)  # the input is untouched
    # a stack larger than one cache block is scored block by block, with the same result
    big = torch.randn(3 * D.block_rollouts(12, 16, 4) + 1, 12, 16)
    torch.testing.assert_close(D.disf_from_points(big),
                               torch.cat([D._disf_block(v[None], D.DISF_STD_FLOOR, None)
                                          for v in big]))
    # the batched objective (gather into scratch) equals scoring each mask alone
    x, q = torch.randn(50, 16), torch.rand(50)
    idx = torch.stack([torch.randperm(50)[:12] for _ in range(6)])
    batch = Batch(x, q)
    fr = batch.disf_frame(D.DISF_STD_FLOOR)
    one = torch.stack([D.disf_from_points(fr.x[i][None])[0] for i in idx])
    torch.testing.assert_close(terms.get("DiSF").batched(batch, idx), one)
