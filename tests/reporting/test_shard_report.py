"""Per-shard selection report: real shard, real learner run, real whole-shard scores."""

from __future__ import annotations

import base64
import html.parser
import io
import json
import math
import os

import numpy as np
import pytest
import torch
from PIL import Image

from datamask_pipeline.engine import storage
from datamask_pipeline.reporting import (
    build_shard_report,
    correlation_spectrum,
    source_retention,
    spectral_flatness,
    write_shard_report,
)
from datamask_pipeline.reporting import shard_report as sr

from .conftest import ShardRun

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EXPECTED_KEYS = {
    "n_rows", "dim", "k_selected", "kept_fraction", "lamb",
    "f_datamask", "f_qua_datamask", "f_div_datamask",
    "f_topk", "f_qua_topk", "f_div_topk",
    "f_random", "f_qua_random", "f_div_random",
    "f_greedy", "f_qua_greedy", "f_div_greedy",
    "gain_f_over_topk", "gain_f_over_random", "delta_f_qua_vs_topk", "delta_f_div_vs_topk",
    "ratio_f_to_greedy", "gap_closed_vs_greedy",
    "quality_mean_shard", "quality_mean_selected", "quality_mean_topk", "overlap_with_topk",
    "spectrum_flatness_selected", "spectrum_flatness_topk", "spectrum_flatness_random",
    "spectrum_flatness_shard", "spectrum_flatness_greedy",
    "learner_steps", "learner_elapsed_s", "n_sources",
}


def _report(run: ShardRun, **kw):
    args = dict(ids=run.ids, sources=run.sources, lamb=run.lamb, algorithm=run.algorithm,
                reference=run.reference, title="tiny shard <000> & co", topk=run.topk_idx,
                random=run.random_idx, greedy=run.greedy_idx)
    args.update(kw)
    return build_shard_report(run.x, run.q, run.result.selected, run.result.history, **args)


@pytest.fixture(scope="module")
def report(shard_run):
    return _report(shard_run, extra={"config hash": shard_run.result.config_hash})


def _png_image(data: bytes) -> Image.Image:
    assert data[:8] == PNG_SIGNATURE
    img = Image.open(io.BytesIO(data))
    img.load()  # decodes every chunk; a truncated or corrupt file raises
    assert img.format == "PNG"
    return img


class _Attrs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.attrs = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend((tag, k, v) for k, v in attrs)


# ----------------------------------------------------------------------- the page
def test_html_is_self_contained_and_embeds_every_figure(report):
    p = _Attrs()
    p.feed(report.html)
    assert "script" not in p.tags and "link" not in p.tags and "iframe" not in p.tags
    refs = [(t, k, v) for t, k, v in p.attrs if k in ("src", "href", "srcset", "data", "action")]
    assert all(k == "src" and t == "img" for t, k, v in refs), refs
    srcs = [v for _, _, v in refs]
    assert len(srcs) == len(report.figures)
    prefix = "data:image/png;base64,"
    assert all(v.startswith(prefix) for v in srcs)
    embedded = [base64.b64decode(v[len(prefix):], validate=True) for v in srcs]
    assert embedded == list(report.figures.values())  # the same bytes, in figure order
    for blob in embedded:
        _png_image(blob)
    low = report.html.lower()
    assert "url(" not in low and "@import" not in low
    assert "http://" not in low and "https://" not in low
    # the title is escaped, not interpreted
    assert "tiny shard &lt;000&gt; &amp; co" in report.html
    assert report.html.startswith("<!DOCTYPE html>") and report.html.rstrip().endswith("</html>")


def test_every_figure_is_a_valid_nonblank_png(report, shard_run):
    assert set(report.figures) == {"curve", "quality", "projection", "spectrum", "sources"}
    for name, blob in report.figures.items():
        img = _png_image(blob)
        w, h = img.size
        assert w >= 600 and h >= 350, (name, img.size)
        px = np.asarray(img.convert("L"), dtype=np.float64)
        assert px.std() > 5, f"{name} looks blank"
    # byte-identical for the same input (no timestamps in the PNG metadata)
    again = _report(shard_run, extra={"config hash": shard_run.result.config_hash})
    assert again.figures == report.figures and again.html == report.html


# ----------------------------------------------------------------------- metrics
def test_metrics_are_finite_floats_with_the_expected_keys(report, shard_run):
    m = report.metrics
    missing = EXPECTED_KEYS - set(m)
    assert not missing, missing
    for key, v in m.items():
        assert type(v) is float and math.isfinite(v), (key, v)
    run = shard_run
    n, k = len(run.q), run.k
    assert m["n_rows"] == n and m["k_selected"] == k and m["dim"] == run.x.shape[1]
    assert m["kept_fraction"] == pytest.approx(k / n)
    ref = run.reference
    alg = run.algorithm
    assert m["f_datamask"] == pytest.approx(ref["datamask"]["f"][alg])
    assert m["f_topk"] == pytest.approx(ref["quality_topk"]["f"][alg])
    assert m["f_div_random"] == pytest.approx(ref["random"]["f_div"][alg])
    assert m["f_qua_greedy"] == pytest.approx(ref["greedy"]["f_qua"])
    assert m["gain_f_over_topk"] == pytest.approx(m["f_datamask"] - m["f_topk"])
    gap = (m["f_datamask"] - m["f_topk"]) / (m["f_greedy"] - m["f_topk"])
    assert m["gap_closed_vs_greedy"] == pytest.approx(gap)
    sel = run.result.selected
    assert m["quality_mean_selected"] == pytest.approx(run.q[sel].mean())
    assert m["quality_mean_topk"] == pytest.approx(run.q[run.topk_idx].mean())
    assert m["overlap_with_topk"] == pytest.approx(np.isin(np.flatnonzero(sel), run.topk_idx).mean())
    assert m["learner_steps"] == run.cfg.n_epochs
    assert m["spectrum_flatness_selected"] == pytest.approx(
        spectral_flatness(correlation_spectrum(run.x[sel])))
    assert m["spectrum_flatness_random"] == pytest.approx(
        spectral_flatness(correlation_spectrum(run.x[run.random_idx])))


def test_scores_without_a_datamask_reference_are_computed_on_the_whole_shard(shard_run):
    # the pipeline's call: a torch tensor of embeddings, numpy quality, no random / greedy subset
    ref = {k: v for k, v in shard_run.reference.items() if k != "datamask"}
    ref["topk"] = ref.pop("quality_topk")  # the alias works too
    rep = build_shard_report(torch.as_tensor(shard_run.x), shard_run.q, shard_run.result.selected,
                             shard_run.result.history, ids=shard_run.ids, lamb=shard_run.lamb,
                             algorithm=shard_run.algorithm, reference=ref, title="t",
                             topk=shard_run.topk_idx, device=torch.device("cpu"))
    from datamask_pipeline.engine.baselines import random_selection

    rnd = random_selection(len(shard_run.q), shard_run.k, seed=0)  # the documented default
    assert rep.metrics["spectrum_flatness_random"] == pytest.approx(
        spectral_flatness(correlation_spectrum(shard_run.x[rnd])))
    dm = shard_run.reference["datamask"]
    assert rep.metrics["f_datamask"] == pytest.approx(dm["f"][shard_run.algorithm], rel=1e-5)
    assert rep.metrics["f_qua_datamask"] == pytest.approx(dm["f_qua"], rel=1e-6)
    assert "sources" not in rep.figures and "n_sources" not in rep.metrics
    assert not any(k.startswith("retention_") for k in rep.metrics)
    with pytest.raises(KeyError, match="random"):
        _report(shard_run, reference={"quality_topk": ref["topk"]})


def test_lambda_one_has_no_history_and_leaves_undefined_ratios_out():
    # lamb = 1: the learner reads out quality top-k without steps, and greedy is top-k too,
    # so the gap to greedy is 0/0: it must be left out rather than reported as NaN.
    run = ShardRun(n=300, dim=16, lamb=1.0)
    assert run.result.history == []
    rep = _report(run)
    assert "gap_closed_vs_greedy" not in rep.metrics and "learner_steps" not in rep.metrics
    assert rep.metrics["ratio_f_to_greedy"] == pytest.approx(1.0)
    assert all(math.isfinite(v) for v in rep.metrics.values())
    assert rep.metrics["overlap_with_topk"] == 1.0
    # no steps, no curve: the figure is left out and the page says why in one line
    assert "curve" not in rep.figures and 'id="no-curve"' in rep.html


# ----------------------------------------------------------------------- sources
def test_source_retention_adds_up(report, shard_run):
    run = shard_run
    sel = run.result.selected
    topk = sr.as_mask(run.topk_idx, len(run.q))
    ret = source_retention(run.sources, sel, topk)
    assert sorted(ret["names"]) == sorted(set(run.sources))
    assert ret["rows"].sum() == len(run.q) and list(ret["rows"]) == sorted(ret["rows"], reverse=True)
    assert ret["selected"].sum() == run.k and ret["topk"].sum() == run.k
    for name, rows, kept in zip(ret["names"], ret["rows"], ret["selected"]):
        assert rows == (run.sources == name).sum()
        assert kept == (sel & (run.sources == name)).sum()
    assert (ret["rows"] * ret["retention_selected"]).sum() == pytest.approx(run.k)
    for key in ("share_shard", "share_selected", "share_topk"):
        assert ret[key].sum() == pytest.approx(1.0)
    # the same numbers as flat metrics
    m = report.metrics
    names = [k[len("share_shard["):-1] for k in m if k.startswith("share_shard[")]
    assert len(names) == m["n_sources"] == len(ret["names"])
    assert sum(m[f"share_selected[{s}]"] for s in names) == pytest.approx(1.0)
    assert sum(m[f"share_shard[{s}]"] * m[f"retention_selected[{s}]"] for s in names) \
        == pytest.approx(m["kept_fraction"])
    assert sum(m[f"share_shard[{s}]"] * m[f"retention_topk[{s}]"] for s in names) \
        == pytest.approx(m["kept_fraction"])
    for s in ret["names"]:
        assert f"| {s} |" in report.markdown


def test_many_sources_fold_into_other_and_similar_names_stay_apart():
    rng = np.random.default_rng(0)
    n = 2000
    names = [f"domain {i:02d}" for i in range(38)] + ["a b", "a_b"]
    src = np.array(names, dtype=object)[rng.integers(0, len(names), n)]
    src[:5] = None  # missing labels are their own group
    sel = rng.random(n) < 0.2
    topk = rng.random(n) < 0.2
    ret = source_retention(src, sel, topk)
    assert "<null>" in ret["names"] and len(ret["names"]) == len(names) + 1
    folded = sr.fold_sources(ret, 15)
    assert len(folded["names"]) == 15 and folded["names"][-1] == sr.OTHER_SOURCES
    assert folded["n_folded"] == len(ret["names"]) - 14
    assert folded["rows"].sum() == n and folded["selected"].sum() == sel.sum()
    assert folded["topk"].sum() == topk.sum()
    assert (folded["rows"] * folded["retention_selected"]).sum() == pytest.approx(sel.sum())
    assert sr.fold_sources(ret, 100)["names"] == ret["names"]

    x = rng.normal(size=(n, 8)).astype(np.float32)
    q = rng.random(n)
    ref = {"random": {"f": 0.1, "f_qua": 0.2, "f_div": 0.0},
           "quality_topk": {"f": 0.3, "f_qua": 0.6, "f_div": 0.0}}
    rep = build_shard_report(x, q, sel, [], sources=src, lamb=0.5, algorithm="Pair_simi",
                             reference=ref, title="many sources", topk=topk)
    keys = [k for k in rep.metrics if k.startswith("retention_selected[")]
    assert len(keys) == 15 and "retention_selected[other]" in keys
    assert sum(rep.metrics[f"share_selected[{k[19:-1]}]"] for k in keys) == pytest.approx(1.0)
    # "a b" and "a_b" both sanitise to "a_b": neither overwrites the other
    few = build_shard_report(x, q, sel, [], sources=np.where(rng.random(n) < 0.5, "a b", "a_b"),
                             lamb=0.5, algorithm="Pair_simi", reference=ref, title="t", topk=topk)
    ks = sorted(k for k in few.metrics if k.startswith("retention_selected["))
    assert ks == ["retention_selected[a_b]", "retention_selected[a_b~2]"]
    assert f"other ({len(ret['names']) - 14} sources)" in rep.markdown


# ----------------------------------------------------------------------- input
def test_selection_input_validation(shard_run):
    run = shard_run
    with pytest.raises(ValueError, match="at least 2"):
        build_shard_report(run.x, run.q, [3], [], lamb=0.5, algorithm="pairwise",
                           reference=run.reference, title="t")
    with pytest.raises(ValueError, match="out of range"):
        build_shard_report(run.x, run.q, [0, len(run.q)], [], lamb=0.5, algorithm="Pair_simi",
                           reference=run.reference, title="t")
    with pytest.raises(ValueError, match="duplicates"):
        build_shard_report(run.x, run.q, [0, 0, 1], [], lamb=0.5, algorithm="Pair_simi",
                           reference=run.reference, title="t")


# ----------------------------------------------------------------------- writing
def test_write_publishes_every_file_atomically(report, shard_run, tmp_path, monkeypatch):
    calls = []
    real = storage.atomic_write_bytes

    def spy(uri, data):
        calls.append(os.path.basename(str(uri)))
        return real(uri, data)

    monkeypatch.setattr(storage, "atomic_write_bytes", spy)
    out_dir = tmp_path / "shard_000"
    paths = write_shard_report(report, str(out_dir))
    files = sorted(os.listdir(out_dir))
    assert files == sorted(calls)  # nothing reached the directory any other way
    assert calls[-1] == "report.html"  # the page appears last, after what it describes
    assert set(paths) == {"html", "metrics", "markdown", *report.figures}
    assert not [f for f in files if f.startswith(".")]  # no temp files left behind
    assert open(paths["html"], encoding="utf-8").read() == report.html
    for name in report.figures:
        assert open(paths[name], "rb").read() == report.figures[name]

    def strict(c):
        raise ValueError(f"non-strict JSON constant {c}")

    metrics = json.loads(open(paths["metrics"]).read(), parse_constant=strict)
    assert metrics == pytest.approx(report.metrics)
    md = open(paths["markdown"], encoding="utf-8").read()
    assert md.startswith(f"# {report.title}") and report.markdown in md

    # A later report without sources removes the stale per-source figure.
    no_src = _report(shard_run, sources=None)
    write_shard_report(no_src, str(out_dir))
    assert "report_sources.png" not in os.listdir(out_dir)


def test_a_failed_write_publishes_no_page_and_leaves_no_temp_files(report, tmp_path, monkeypatch):
    real = storage.publish._open_tmp
    seen = []

    class Boom(OSError):
        pass

    import contextlib

    @contextlib.contextmanager
    def failing(fs, tmp):
        seen.append(tmp)
        with real(fs, tmp) as fh:
            if len(seen) == 3:  # the third file dies half-way through
                fh.write(b"\x89PNG partial")
                raise Boom("disk full")
            yield fh

    monkeypatch.setattr(storage.publish, "_open_tmp", failing)
    out_dir = tmp_path / "r"
    with pytest.raises(Boom):
        write_shard_report(report, str(out_dir))
    files = os.listdir(out_dir)
    assert "report.html" not in files and "report_metrics.json" not in files
    assert len(files) == 2 and not [f for f in files if f.startswith(".")]
    for f in files:
        _png_image((out_dir / f).read_bytes())  # what did appear is complete


def test_selection_is_labelled_by_its_route(shard_run):
    """Issue 20 item 13: the report names the route that produced the selection; "DATAMASK"
    only where the learner ran; a guard that returned top-k says so."""
    from datamask_pipeline.reporting.numerics import selection_label

    assert selection_label(None) == "selection"
    assert selection_label("topk+polish") == "topk+polish"
    assert selection_label("greedy") == "greedy"
    assert selection_label("paper+polish") == "DATAMASK (paper+polish)"
    assert selection_label("topk+polish", "quality_topk scored f=0.5 on the whole shard, above "
                           "topk+polish's 0.4: returned quality_topk") == \
        "topk+polish → quality top-k (guard)"
    rep = _report(shard_run, route="sgreedy+polish")
    assert "| sgreedy+polish |" in rep.markdown and "DATAMASK" not in rep.markdown
    assert "sgreedy+polish" in rep.html and "DATAMASK" not in rep.html
    plain = _report(shard_run)
    assert "| selection |" in plain.markdown and "DATAMASK" not in plain.markdown
    learned = _report(shard_run, route="paper")
    assert "| DATAMASK (paper) |" in learned.markdown
