"""The reports' numerics (reporting.numerics) against properties known in advance: a dominant
direction PCA must find, spectra whose flatness is known, histograms that integrate to one,
retention that adds up, comparisons whose value follows from their definition."""

from __future__ import annotations

import math

import numpy as np
import pytest

from datamask_pipeline import reporting
from datamask_pipeline.reporting import numerics as nm
from datamask_pipeline.reporting.numerics import (
    correlation_spectrum,
    pca_2d,
    pca_projection,
    spectral_flatness,
)


def _unit(v):
    return v / np.linalg.norm(v)


def test_the_package_exports_the_numerics_themselves():
    # reporting.<name> (and shard_report.<name>) must stay the one implementation
    from datamask_pipeline.reporting import corpus_report, shard_report

    for name in ("correlation_spectrum", "spectral_flatness", "pca_2d", "source_retention",
                 "fold_sources"):
        assert getattr(reporting, name) is getattr(nm, name) is getattr(shard_report, name)
    for name in ("corpus_rows_from_metrics", "corpus_totals"):
        assert getattr(reporting, name) is getattr(nm, name) is getattr(corpus_report, name)
    assert corpus_report.ROW_FIELDS is nm.ROW_FIELDS


# ----------------------------------------------------------------------- projection
def _plane_data(rng, n, d, noise=0.02):
    """Rows t*u + s*v + noise with std(t) = 3 std(s): after unit-normalisation most variance
    lies along u, the rest along v (u, v orthonormal)."""
    u = _unit(rng.normal(size=d))
    v = rng.normal(size=d)
    v = _unit(v - (v @ u) * u)
    t = rng.normal(scale=3.0, size=(n, 1))
    s = rng.normal(scale=1.0, size=(n, 1))
    return t * u + s * v + noise * rng.normal(size=(n, d)), u, v


@pytest.mark.parametrize("n,d", [(2000, 24), (30, 80)])  # covariance branch and Gram branch
def test_pca_recovers_the_dominant_directions(n, d):
    rng = np.random.default_rng(n + d)
    x, u, v = _plane_data(rng, n, d)
    p = pca_projection(x)
    c = p.components
    assert c.shape == (d, 2) and p.coords.shape == (n, 2)
    assert abs(c[:, 0] @ u) > 0.99, "PC 1 is not the dominant direction"
    assert abs(c[:, 1] @ v) > 0.99, "PC 2 is not the second direction"
    np.testing.assert_allclose(c.T @ c, np.eye(2), atol=1e-9)  # orthonormal axes
    r = p.explained_ratio
    assert r[0] > r[1] > 0 and r.sum() > 0.97  # almost all variance lies in the plane
    # coords are the centred unit rows on the axes
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    np.testing.assert_allclose(p.mean, xn.mean(0), atol=1e-12)
    np.testing.assert_allclose(p.coords, (xn - xn.mean(0)) @ c, atol=1e-9)
    # orientation: the largest |loading| of each axis is positive
    pivot = np.abs(c).argmax(axis=0)
    assert (c[pivot, [0, 1]] > 0).all()


def test_pca_ignores_row_norms():
    # the projection is of unit-normalised rows: rescaling rows changes nothing
    rng = np.random.default_rng(3)
    x, _, _ = _plane_data(rng, 500, 12)
    a = pca_projection(x)
    b = pca_projection(x * rng.uniform(0.2, 7.0, size=(500, 1)))
    np.testing.assert_allclose(b.coords, a.coords, atol=1e-9)
    np.testing.assert_allclose(b.explained_ratio, a.explained_ratio, atol=1e-12)


def test_pca_pads_the_axes_the_data_does_not_have():
    x = np.array([[1.0], [-2.0], [3.0], [4.0]])  # d = 1: unit rows are +1 or -1
    p = pca_projection(x)
    assert p.coords.shape == (4, 2) and p.components.shape == (1, 2)
    assert p.explained_ratio[0] == pytest.approx(1.0) and p.explained_ratio[1] == 0.0
    assert (p.coords[:, 1] == 0).all() and p.components[0, 1] == 0
    with pytest.raises(ValueError, match="n_components"):
        pca_projection(x, n_components=0)


def test_pca_2d_matches_svd_and_subsamples():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 10)) * np.linspace(3, 0.3, 10)
    rows, coords, ratio = pca_2d(x)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    xc = xn - xn.mean(0)
    s = np.linalg.svd(xc, compute_uv=False)
    np.testing.assert_allclose(ratio, (s**2 / (s**2).sum())[:2], rtol=1e-8)
    np.testing.assert_allclose(np.abs(coords).std(0) ** 2 + np.abs(coords).mean(0) ** 2,
                               (s[:2] ** 2) / len(x), rtol=1e-8)  # E[c^2] = sigma^2 / n
    assert np.array_equal(rows, np.arange(300))
    rows2, coords2, _ = pca_2d(x, max_points=100, seed=3)
    assert rows2.shape == (100,) and np.all(np.diff(rows2) > 0) and coords2.shape == (100, 2)
    rows3, coords3, _ = pca_2d(x, max_points=100, seed=3)
    assert np.array_equal(rows2, rows3) and np.array_equal(coords2, coords3)
    # d > m: the Gram branch gives the same variance ratios as an SVD
    wide = rng.normal(size=(20, 50))
    _, _, r_wide = pca_2d(wide)
    wn = wide / np.linalg.norm(wide, axis=1, keepdims=True)
    sw = np.linalg.svd(wn - wn.mean(0), compute_uv=False)
    np.testing.assert_allclose(r_wide, (sw**2 / (sw**2).sum())[:2], rtol=1e-8)


# ----------------------------------------------------------------------- spectrum
def test_spectral_flatness_limits():
    for d in (1, 7, 64):
        assert spectral_flatness(np.full(d, 3.0)) == pytest.approx(1.0)
        collapsed = np.zeros(d)
        collapsed[0] = 5.0
        assert spectral_flatness(collapsed) == pytest.approx(1.0 / d)
    two = np.array([1.0, 1.0, 0.0, 0.0])
    assert spectral_flatness(two) == pytest.approx(0.5)  # effective rank 2 of 4
    assert 0.25 < spectral_flatness([4.0, 1.0, 1.0, 0.5]) < 1.0
    with pytest.raises(ValueError, match="no eigenvalues"):
        spectral_flatness([])


def test_flatness_of_isotropic_data_is_about_one_and_of_rank_one_data_is_low():
    rng = np.random.default_rng(0)
    d = 8
    iso = rng.normal(size=(20000, d))
    assert spectral_flatness(correlation_spectrum(iso)) > 0.995
    line = rng.normal(size=(500, 1)) * rng.normal(size=d) + 1e-9 * rng.normal(size=(500, d))
    assert spectral_flatness(correlation_spectrum(line)) < 1.5 / d


def test_spectrum_of_rank_r_data_has_d_minus_r_zeros_and_flatness_at_most_r_over_d():
    rng = np.random.default_rng(1)
    d, r = 16, 4
    x = rng.normal(size=(1000, r)) @ rng.normal(size=(r, d))
    ev = correlation_spectrum(x)
    assert ev.shape == (d,) and ev.sum() == pytest.approx(1.0)
    assert (np.diff(ev) <= 1e-15).all()  # descending
    assert (ev[:r] > 1e-6).all() and (ev[r:] < 1e-10).all()
    assert spectral_flatness(ev) <= r / d + 1e-9


def test_spectrum_ignores_column_scale_shift_and_row_order():
    # z-scoring per column: a correlation spectrum, not a covariance one
    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, 10)) @ rng.normal(size=(10, 10))
    base = correlation_spectrum(x)
    moved = x * rng.uniform(0.01, 100.0, size=10) + rng.normal(scale=50.0, size=10)
    np.testing.assert_allclose(correlation_spectrum(moved), base, atol=1e-10)
    np.testing.assert_allclose(correlation_spectrum(x[rng.permutation(300)]), base, atol=1e-10)


def test_correlation_spectrum_of_whitened_and_collapsed_data():
    rng = np.random.default_rng(0)
    k, d = 200, 16
    a = rng.normal(size=(k, d))
    a -= a.mean(axis=0)
    white, _ = np.linalg.qr(a)  # orthonormal, zero-mean columns: correlation = identity
    ev = correlation_spectrum(white * 3.0 + 1.0)
    assert ev == pytest.approx(np.full(d, 1.0 / d), abs=1e-9)
    assert spectral_flatness(ev) == pytest.approx(1.0, abs=1e-9)
    # every row a multiple of one direction: all dimensions perfectly correlated
    v = rng.normal(size=d)
    collapsed = rng.normal(size=(k, 1)) * v
    ev = correlation_spectrum(collapsed)
    assert spectral_flatness(ev) == pytest.approx(1.0 / d, rel=1e-6)


@pytest.mark.parametrize("k", [5, 40])  # Gram branch (k <= d) and the d x d branch
def test_correlation_spectrum_matches_numpy(k):
    rng = np.random.default_rng(k)
    d = 12
    x = rng.normal(size=(k, d)) @ rng.normal(size=(d, d))
    ev = correlation_spectrum(x)
    ref = np.sort(np.clip(np.linalg.eigvalsh(np.corrcoef(x, rowvar=False)), 0, None))[::-1]
    assert ev.shape == (d,) and ev.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(ev, ref / ref.sum(), atol=1e-10)


def test_correlation_spectrum_subsamples_deterministically_and_checks_its_input():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(500, 6))
    a = correlation_spectrum(x, max_rows=100, seed=7)
    assert np.array_equal(a, correlation_spectrum(x, max_rows=100, seed=7))
    assert not np.allclose(a, correlation_spectrum(x))  # it did use fewer rows
    with pytest.raises(ValueError, match="at least 2 rows"):
        correlation_spectrum(x[:1])
    with pytest.raises(ValueError, match=r"\(k, d\)"):
        correlation_spectrum(x[:, 0])


def test_subset_spectra_take_the_rows_of_each_subset():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(100, 5))
    mask = rng.random(100) < 0.5
    out = nm.subset_spectra(x, {"all": None, "mask": mask, "idx": np.flatnonzero(~mask)})
    np.testing.assert_allclose(out["all"], correlation_spectrum(x))
    np.testing.assert_allclose(out["mask"], correlation_spectrum(x[mask]))
    np.testing.assert_allclose(out["idx"], correlation_spectrum(x[~mask]))


# ----------------------------------------------------------------------- quality
def test_quality_histograms_integrate_to_one_on_shared_bins():
    rng = np.random.default_rng(0)
    q = rng.beta(2, 5, size=1000)
    q[:3] = np.nan  # not counted, and not stretching the bins
    top = np.argsort(np.nan_to_num(q, nan=-1))[-100:]
    sel = rng.random(1000) < 0.1
    h = nm.quality_histograms(q, {"topk": top, "datamask": sel}, n_bins=40)
    assert h.edges.shape == (41,)
    assert h.edges[0] == np.nanmin(q) and h.edges[-1] == np.nanmax(q)
    widths = np.diff(h.edges)
    for name, values in (("shard", q), ("topk", q[top]), ("datamask", q[sel])):
        assert (h.density[name] * widths).sum() == pytest.approx(1.0)
        ref, _ = np.histogram(values[np.isfinite(values)], bins=h.edges, density=True)
        np.testing.assert_allclose(h.density[name], ref)
        assert h.count[name] == values.size
    assert h.mean["topk"] == pytest.approx(q[top].mean())
    # the top-k mass sits in the upper bins only
    assert h.density["topk"][: 40 // 2].sum() == 0


def test_quality_histograms_edge_cases():
    h = nm.quality_histograms(np.full(10, 0.3), {"none": np.zeros(10, dtype=bool)}, n_bins=5)
    assert h.edges[0] == 0.3 and h.edges[-1] == pytest.approx(1.3)  # constant q: a unit range
    assert (h.density["none"] == 0).all() and math.isnan(h.mean["none"])
    assert h.count["none"] == 0
    with pytest.raises(ValueError, match="shard"):
        nm.quality_histograms(np.arange(4.0), {"shard": [0, 1]})


def test_selection_quality():
    q = np.array([0.1, 0.2, 0.9, 0.8, 0.5, 0.4])
    sel = np.array([1, 0, 1, 0, 1, 0], dtype=bool)
    top = np.array([0, 0, 1, 1, 1, 0], dtype=bool)
    s = nm.selection_quality(q, sel, top)
    assert s["quality_mean_shard"] == pytest.approx(q.mean())
    assert s["quality_mean_selected"] == pytest.approx(0.5)
    assert s["quality_mean_topk"] == pytest.approx(2.2 / 3)
    assert s["overlap_with_topk"] == pytest.approx(2 / 3)
    assert nm.selection_quality(q, top, top)["overlap_with_topk"] == 1.0
    assert nm.selection_quality(q, sel, ~sel)["overlap_with_topk"] == 0.0


# ----------------------------------------------------------------------- objective
def _lv(f, f_qua=0.5, f_div=0.1):
    return {"f": f, "f_qua": f_qua, "f_div": f_div}


def test_objective_metrics_follow_their_definitions():
    m = nm.objective_metrics({"datamask": _lv(0.7, 0.6, 0.2), "topk": _lv(0.5, 0.9, 0.05),
                              "random": _lv(0.3), "greedy": _lv(0.9)})
    assert m["f_datamask"] == 0.7 and m["f_qua_topk"] == 0.9 and m["f_div_random"] == 0.1
    assert m["gain_f_over_topk"] == pytest.approx(0.2)
    assert m["gain_f_over_random"] == pytest.approx(0.4)
    assert m["delta_f_qua_vs_topk"] == pytest.approx(-0.3)
    assert m["delta_f_div_vs_topk"] == pytest.approx(0.15)
    assert m["ratio_f_to_greedy"] == pytest.approx(0.7 / 0.9)
    assert m["gap_closed_vs_greedy"] == pytest.approx(0.5)  # half way from top-k to greedy
    # at greedy: the gap is closed; at top-k: none of it
    at_greedy = nm.objective_metrics({"datamask": _lv(0.9), "topk": _lv(0.5), "random": _lv(0.3),
                                      "greedy": _lv(0.9)})
    assert at_greedy["gap_closed_vs_greedy"] == pytest.approx(1.0)
    assert at_greedy["ratio_f_to_greedy"] == pytest.approx(1.0)
    at_topk = nm.objective_metrics({"datamask": _lv(0.5), "topk": _lv(0.5), "random": _lv(0.3),
                                    "greedy": _lv(0.9)})
    assert at_topk["gap_closed_vs_greedy"] == 0.0


def test_objective_metrics_leave_undefined_ratios_out():
    base = {"datamask": _lv(0.5), "topk": _lv(0.5), "random": _lv(0.3)}
    no_gap = nm.objective_metrics({**base, "greedy": _lv(0.5)})  # greedy == top-k: 0 / 0
    assert "gap_closed_vs_greedy" not in no_gap and no_gap["ratio_f_to_greedy"] == 1.0
    zero = nm.objective_metrics({**base, "greedy": _lv(0.0)})
    assert "ratio_f_to_greedy" not in zero and "gap_closed_vs_greedy" in zero
    assert not any("greedy" in k for k in nm.objective_metrics(base))
    with pytest.raises(KeyError, match="random"):
        nm.objective_metrics({"datamask": _lv(0.5), "topk": _lv(0.5)})


def test_scores_of_reads_nested_and_flat_entries():
    nested = {"f": {"Pair_simi": 0.4, "DiSF": 0.1}, "f_qua": 0.6, "f_div": {"pair_simi": 0.2}}
    assert nm.scores_of(nested, "Pair_simi") == {"f": 0.4, "f_qua": 0.6, "f_div": 0.2}
    with pytest.raises(KeyError, match="Facility"):
        nm.scores_of(nested, "Facility")
    assert nm.find_reference({"top_k": 1, "quality_topk": None}, "topk") == 1
    assert nm.find_reference({}, "greedy") is None


# ----------------------------------------------------------------------- sources
def test_source_retention_by_hand():
    src = np.array(["b", "a", "a", "c", "a", "b"], dtype=object)
    sel = np.array([1, 1, 0, 0, 1, 1], dtype=bool)
    top = np.array([0, 1, 1, 1, 0, 0], dtype=bool)
    r = nm.source_retention(src, sel, top)
    assert r["names"] == ["a", "b", "c"]  # by rows, descending
    assert list(r["rows"]) == [3, 2, 1] and list(r["selected"]) == [2, 2, 0]
    assert list(r["topk"]) == [2, 0, 1]
    np.testing.assert_allclose(r["retention_selected"], [2 / 3, 1.0, 0.0])
    np.testing.assert_allclose(r["share_selected"], [0.5, 0.5, 0.0])
    np.testing.assert_allclose(r["share_topk"], [2 / 3, 0.0, 1 / 3])
    no_top = nm.source_retention(src, sel)
    assert no_top["topk"] is None and no_top["retention_topk"] is None
    with pytest.raises(ValueError, match="sources has 6 rows"):
        nm.source_retention(src, sel[:5])


def test_source_metrics_fold_the_tail_and_keep_totals():
    rng = np.random.default_rng(0)
    n = 3000
    src = np.array([f"s{i:02d}" for i in range(30)], dtype=object)[rng.integers(0, 30, n)]
    sel = rng.random(n) < 0.3
    ret = nm.source_retention(src, sel, rng.random(n) < 0.3)
    m = nm.source_metrics(ret, max_shown=6)
    assert m["n_sources"] == 30
    keys = [k[len("share_shard["):-1] for k in m if k.startswith("share_shard[")]
    assert len(keys) == 6 and keys[-1] == "other"  # metric_key("(other)")
    assert sum(m[f"share_shard[{k}]"] for k in keys) == pytest.approx(1.0)
    assert sum(m[f"share_shard[{k}]"] * m[f"retention_selected[{k}]"] for k in keys) \
        == pytest.approx(sel.mean())
    assert not any(k.startswith("retention_topk[") for k in
                   nm.source_metrics(nm.source_retention(src, sel), 6))


# ----------------------------------------------------------------------- corpus
def test_corpus_totals_by_hand():
    rows = nm.corpus_rows_from_metrics({
        "b": {"n_rows": 100, "k_selected": 10, "quality_mean_shard": 0.5,
              "quality_mean_selected": 0.8, "f_datamask": 0.4, "f_topk": 0.3, "lamb": 0.5},
        "a": {"n_rows": 300, "k_selected": 30, "quality_mean_shard": 0.1,
              "quality_mean_selected": 0.4, "f_datamask": 0.2, "f_topk": 0.25, "lamb": 0.5},
        "c": {"f_datamask": float("inf"), "quality_mean_shard": 0.9},  # no counts, no finite f
    })
    assert [r["shard"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["kept_fraction"] == pytest.approx(0.1)  # derived from the counts
    assert rows[0]["gain_f_over_topk"] == pytest.approx(-0.05)  # derived from f and f_topk
    assert rows[2]["f_datamask"] is None
    t = nm.corpus_totals(rows)
    assert t["n_shards"] == 3 and t["n_shards_counted"] == 2
    assert t["rows_total"] == 400 and t["rows_kept"] == 40 and t["kept_fraction"] == 0.1
    assert t["quality_mean_before"] == pytest.approx((100 * 0.5 + 300 * 0.1) / 400)
    assert t["quality_mean_after"] == pytest.approx((10 * 0.8 + 30 * 0.4) / 40)
    assert t["gain_f_over_topk_mean"] == pytest.approx(0.025)
    assert t["gain_f_over_topk_min"] == pytest.approx(-0.05)
    assert t["shards_beating_topk"] == 1 and t["shards_with_gain"] == 2
    assert t["lamb"] == 0.5 and t["lamb_values"] == 1
    assert all(type(v) is float and math.isfinite(v) for v in t.values())
