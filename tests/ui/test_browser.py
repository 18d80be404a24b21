"""Real-browser test of the Dagster UI on a real run (no mocks).

Set-up, once for the module:

1. a fresh ``DAGSTER_HOME`` (with the repository's ``dagster.yaml``) and data root in a
   temporary directory; a tiny sample corpus (2 shards x 400 rows, 16-d embeddings);
2. ``python -m datamask_pipeline.register`` registers the shards as partitions;
3. ``dagster asset materialize`` runs the per-shard chain (features -> blocking checks ->
   mask -> selected_subset) for one partition with MaskConfig's defaults and ``n_epochs`` = 60, so the run is recorded in that ``DAGSTER_HOME``;
4. ``dagster dev -w workspace.yaml -h 127.0.0.1 -p <free port>`` on that instance; the test
   waits for ``/server_info`` and the code location, and dismisses the community pop-up
   through the GraphQL mutation ``setNuxSeen``;
5. Debian's Chromium, headless, driven by Playwright (``executable_path`` = ``chromium`` on the
   PATH; ``playwright install`` is never used).

The tests open the global asset lineage, the ``mask`` asset's partitions page for the
materialized shard and the ``features`` asset's checks, assert what a user must see there,
and save screenshots under ``test-artifacts/ui/``. With ``DATAMASK_UPDATE_DOC_IMAGES=1`` the
two README pictures (``docs/images/ui_asset_graph.png``, ``docs/images/ui_mask_asset.png``) are
refreshed from this run.

Without Chromium the test FAILS (it is not skipped) and says how to install it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ui"
DOC_IMAGES = REPO / "docs" / "images"

SHARDS, ROWS, DIM = 2, 400, 16
KEYS = [f"shard_{i:03d}" for i in range(SHARDS)]
DEMO_KEY = KEYS[0]  # materialized; KEYS[1] stays missing
N_EPOCHS = 60
ASSETS = ["raw_shard", "features", "mask", "shard_report", "selected_subset", "corpus_summary",
          "corpus_selection", "corpus_subset", "corpus_dedup"]
GROUPS = ["datamask", "corpus"]
CHAIN = "features,mask,shard_report,selected_subset"

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
INSTALL_HINT = (
    "Debian's Chromium is not installed (`chromium` is not on the PATH), and the real-browser "
    "UI test needs it. Install it with `sudo apt-get install chromium` or run "
    "`scripts/bootstrap.sh test` (never `playwright install`)."
)
TIMEOUT_MS = 30_000
# The asset graph draws node details (checks, partitions) only at zoom >= 0.6; the layout of
# the five assets fits at that zoom in a viewport this wide once the navigation and the
# asset sidebar are hidden.
GRAPH_VIEWPORT = {"width": 2400, "height": 2000}
PAGE_VIEWPORT = {"width": 1600, "height": 1000}


# --------------------------------------------------------------------------- helpers
def _fast_tmp() -> str | None:
    """tmpfs when there is one: the instance's sqlite syncs every event."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def _run(cmd: list, env: dict, log: Path, timeout: float) -> None:
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}; log {log}:\n{_tail(log)}")


def _graphql(url: str, query: str) -> dict:
    req = urllib.request.Request(f"{url}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = json.loads(resp.read())
    if body.get("errors"):
        raise AssertionError(f"GraphQL errors for {query!r}: {body['errors']}")
    return body["data"]


def _default_interrupts() -> None:
    """In the child before exec: SIGINT and SIGTERM back to their defaults. A process started
    from a background job inherits SIGINT = ignored, and dagster maps SIGTERM to SIGINT's
    handler, so without this ``dagster dev`` would ignore the SIGTERM that stops it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_process_group(proc: subprocess.Popen, log: Path, grace: float = 15.0) -> None:
    """SIGTERM to the process group (dagster dev, its webserver, daemon and code servers);
    after the parent has shut down, a few seconds for the rest, then SIGKILL for what is
    left. What happened is appended to ``log``."""
    pgid = proc.pid  # started with start_new_session=True: its own group
    t0 = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    parent_s = time.monotonic() - t0
    deadline = time.monotonic() + 5
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftovers = ""
    if _group_alive(pgid):
        leftovers = subprocess.run(["ps", "-o", "pid,stat,args", "-g", str(pgid)],
                                   capture_output=True, text=True).stdout
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    with open(log, "a") as fh:
        fh.write(f"\n[test] SIGTERM to process group {pgid}: dagster dev exited "
                 f"{proc.returncode} after {parent_s:.1f}s; group gone after "
                 f"{time.monotonic() - t0:.1f}s" + (f"; SIGKILLed leftovers:\n{leftovers}" if leftovers else "") + "\n")


@contextlib.contextmanager
def _shot_on_failure(page, name: str):
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            page.screenshot(path=str(ARTIFACTS / f"FAILED_{name}.png"), full_page=True)
        raise


def _shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def _tall_shot(page, name: str, width: int) -> Path:
    """Dagster's pages scroll inside panels, so ``full_page`` alone shows one viewport: grow
    the viewport to the tallest scrolling panel first."""
    page.evaluate("document.querySelectorAll('*').forEach(e => { e.scrollTop = 0; })")
    height = page.evaluate(
        "Math.max(...Array.from(document.querySelectorAll('*')).map("
        "e => e.getBoundingClientRect().top + e.scrollHeight))")
    page.set_viewport_size({"width": width, "height": int(min(max(height + 24, 800), 8000))})
    page.wait_for_timeout(500)
    return _shot(page, name)


def _update_doc_image(src: Path, name: str) -> None:
    if os.environ.get("DATAMASK_UPDATE_DOC_IMAGES") == "1":
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, DOC_IMAGES / name)


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    return path


@pytest.fixture(scope="module")
def demo(chromium):
    """A fresh instance + data root with one partition materialized through the chain.
    Returns a dict: env, home, data_root, run_id, mask metadata (plain values)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in [*ARTIFACTS.glob("*.png"), *ARTIFACTS.glob("*.log")]:
        old.unlink()  # screenshots and logs of an earlier session would mislead
    with tempfile.TemporaryDirectory(dir=_fast_tmp(), prefix="datamask-ui-") as tmp:
        home, data_root = Path(tmp) / "dagster_home", Path(tmp) / "data"
        home.mkdir()
        shutil.copyfile(REPO / "dagster.yaml", home / "dagster.yaml")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DATAMASK_")}
        env.update({
            "DAGSTER_HOME": str(home),
            "DATAMASK_DATA_ROOT": str(data_root),
            "DATAMASK_DEVICE": "cpu",
            "DATAMASK_EMBEDDING_DIM": str(DIM),
            "PYTHONUNBUFFERED": "1",
        })

        from datamask_pipeline.engine.sample import generate_corpus

        generate_corpus(str(data_root / "raw"), n_shards=SHARDS, rows_per_shard=ROWS, dim=DIM, seed=0)
        _run([sys.executable, "-m", "datamask_pipeline.register"], env,
             ARTIFACTS / "register.log", timeout=60)
        assert f"added {SHARDS} partition(s): {', '.join(KEYS)}" in (ARTIFACTS / "register.log").read_text()

        # The executor is the definitions' own (no execution config here).
        run_config = {"ops": {"mask": {"config": {"n_epochs": N_EPOCHS}}}}
        _run([sys.executable, "-m", "dagster", "asset", "materialize",
              "-m", "datamask_pipeline.definitions", "--select", CHAIN, "--partition", DEMO_KEY,
              "--config-json", json.dumps(run_config)], env,
             ARTIFACTS / "materialize.log", timeout=180)

        # The run is recorded in this DAGSTER_HOME (what the UI will read).
        import dagster as dg

        instance = dg.DagsterInstance.from_config(str(home))
        try:
            runs = instance.get_runs()
            assert len(runs) == 1 and runs[0].status == dg.DagsterRunStatus.SUCCESS, runs
            recs = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("mask"), asset_partitions=[DEMO_KEY]),
                limit=1).records
            assert recs, "no materialization of mask recorded"
            meta = {k: v.value for k, v in recs[0].asset_materialization.metadata.items()}
            recs = instance.fetch_materializations(dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("shard_report"), asset_partitions=[DEMO_KEY]), limit=1).records
            assert recs, "no materialization of shard_report recorded"
            report_meta = {k: v.value for k, v in recs[0].asset_materialization.metadata.items()}
        finally:
            instance.dispose()
        yield {"env": env, "home": home, "data_root": data_root, "run_id": runs[0].run_id,
               "mask": meta, "shard_report": report_meta}


@pytest.fixture(scope="module")
def server(demo):
    """``dagster dev`` on the demo instance; yields its base URL; always stopped."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = ARTIFACTS / "dagster_dev.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml",
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO, env=demo["env"], stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_default_interrupts)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dagster dev exited {proc.returncode}; log {log}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                pytest.fail(f"dagster dev did not answer /server_info in 90 s; log:\n{_tail(log)}")
            try:
                with urllib.request.urlopen(f"{url}/server_info", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        # The code location loads after the server answers.
        while True:
            entries = _graphql(url, "{ workspaceOrError { __typename ... on Workspace { "
                               "locationEntries { name loadStatus locationOrLoadError { "
                               "__typename ... on PythonError { message } } } } } }"
                               )["workspaceOrError"]["locationEntries"]
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                for e in entries:
                    assert e["locationOrLoadError"]["__typename"] == "RepositoryLocation", e
                assert [e["name"] for e in entries] == ["datamask"], entries
                break
            if time.monotonic() > deadline:
                pytest.fail(f"code location not loaded in time: {entries}; log:\n{_tail(log)}")
            time.sleep(0.3)
        assert _graphql(url, "mutation { setNuxSeen }")["setNuxSeen"] is True
        assert _graphql(url, "{ shouldShowNux }")["shouldShowNux"] is False
        yield url
    finally:
        _stop_process_group(proc, log)


@pytest.fixture(scope="module")
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, server):
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    context = browser.new_context(viewport=PAGE_VIEWPORT)
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    try:
        yield pg
    finally:
        context.close()


def _metadata_row(page, key: str):
    """The row of the metadata table whose key cell reads ``key`` (scrolled into view)."""
    cell = page.get_by_role("cell", name=key, exact=True).first
    cell.scroll_into_view_if_needed()
    return page.get_by_role("row").filter(has=cell).first


def _row_value(row) -> str:
    return row.get_by_role("cell").nth(1).inner_text().strip()


# --------------------------------------------------------------------------- tests
def test_asset_graph_shows_assets_checks_and_partitions(page, server):
    from playwright.sync_api import expect

    from assets.validate import CHECKS

    page.set_viewport_size(GRAPH_VIEWPORT)
    with _shot_on_failure(page, "asset_graph"):
        page.goto(f"{server}/asset-groups")
        expect(page.get_by_text("Global asset lineage", exact=True)).to_be_visible()
        for group in GROUPS:  # several groups: the graph starts with them collapsed
            expect(page.get_by_text(group, exact=True).first).to_be_visible()

        # Room for the graph: hide the navigation and the asset sidebar (the button right of
        # "Jump to…"), then expand every group from the graph's context menu.
        page.get_by_text("Hide navigation", exact=True).click()
        jump = page.get_by_placeholder("Jump to…")
        box = jump.bounding_box()
        page.mouse.click(box["x"] + box["width"] + 24, box["y"] + box["height"] / 2)
        expect(jump).to_be_hidden()
        # an empty spot of the graph canvas (the collapsed groups sit in the middle)
        page.mouse.click(GRAPH_VIEWPORT["width"] * 0.4, GRAPH_VIEWPORT["height"] - 40, button="right")
        page.get_by_role("menuitem", name="Expand all groups").click()

        for name in ASSETS:
            expect(page.get_by_text(name, exact=True)).to_be_visible()
        for group in GROUPS:
            expect(page.get_by_text(group, exact=True)).to_be_visible()
        # node details: the features checks of the materialized partition, 1 of 2 shards filled
        expect(page.get_by_text(f"{len(CHECKS)} / {len(CHECKS)} Passed", exact=True)).to_be_visible()
        expect(page.get_by_text("50% filled", exact=True)).to_have_count(4)  # features, mask, report, subset
        expect(page.get_by_text(f"{SHARDS} partitions", exact=True)).to_have_count(4)
        # corpus_summary, corpus_dedup, corpus_selection, corpus_subset
        expect(page.get_by_text("Never materialized", exact=True)).to_have_count(4)
        page.wait_for_load_state("networkidle")
        shot = _shot(page, "asset_graph")
    _update_doc_image(shot, "ui_asset_graph.png")


def test_mask_partition_page_shows_partitions_and_report_metadata(page, server, demo):
    from playwright.sync_api import expect

    meta = demo["mask"]
    report_html = demo["data_root"] / "reports" / DEMO_KEY / "report.html"
    with _shot_on_failure(page, "mask_partition"):
        page.goto(f"{server}/assets/mask?view=partitions&partition={DEMO_KEY}")
        # the partitions: one materialized, one missing, both listed
        expect(page.get_by_text(f"{SHARDS} Partitions Selected", exact=True)).to_be_visible()
        expect(page.get_by_text("Materialized (1)", exact=True)).to_be_visible()
        expect(page.get_by_text("Missing (1)", exact=True)).to_be_visible()
        for key in KEYS:
            expect(page.get_by_text(key, exact=True).first).to_be_visible()
        # the selected partition's latest materialization, from our run
        expect(page.get_by_text("Materialized", exact=True)).to_be_visible()
        expect(page.get_by_text(demo["run_id"][:8], exact=True)).to_be_visible()

        # objective numbers: the UI shows what the run recorded
        for key in ("k_selected", "steps", "f_datamask", "f_quality_topk", "f_random",
                    "gain_f_over_quality_topk", "gain_f_over_random"):
            row = _metadata_row(page, key)
            expect(row).to_be_visible()
            assert float(_row_value(row)) == pytest.approx(float(meta[key]), rel=1e-9), key
        # the pipeline's default solver (auto) and the route it took, as the run recorded them
        assert meta["solver"] == "auto"
        assert meta["steps"] == (N_EPOCHS if meta["route"] in ("paper", "paper+polish") else 0)
        for key in ("solver", "route"):
            expect(_metadata_row(page, key)).to_contain_text(meta[key])
        for key in ("objective_curve", "whole_shard_scores"):
            expect(_metadata_row(page, key)).to_be_visible()
        expect(_metadata_row(page, "whole_shard_scores")).to_contain_text("quality_topk")

        # the shard report (its own asset): linked file (it exists) and its summary table
        assert "report_html" not in meta
        assert demo["shard_report"]["report_html"] == str(report_html) and report_html.is_file()
        page.goto(f"{server}/assets/shard_report?view=partitions&partition={DEMO_KEY}")
        row = _metadata_row(page, "report_html")
        expect(row).to_contain_text(str(report_html))
        report = _metadata_row(page, "report")
        expect(report).to_contain_text("f gain over quality top-k")
        expect(report).to_contain_text(f"{meta['k_selected']} of {ROWS}")
        expect(report).to_contain_text("spectrum flatness")

        # README picture: the partitions list next to the report metadata
        page.get_by_role("cell", name="report_html", exact=True).evaluate(
            "e => e.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(300)
        shot = _shot(page, "mask_partition_report")
        _tall_shot(page, "mask_partition_full", PAGE_VIEWPORT["width"])
    _update_doc_image(shot, "ui_mask_asset.png")


def test_features_checks_tab_shows_blocking_checks(page, server):
    from playwright.sync_api import expect

    from assets.validate import CHECKS

    with _shot_on_failure(page, "features_checks"):
        page.goto(f"{server}/assets/features?view=checks")
        expect(page.get_by_text(f"Checks ({len(CHECKS)})", exact=True)).to_be_visible()
        for name in CHECKS:
            expect(page.get_by_text(name, exact=True).first).to_be_visible()
        expect(page.get_by_text("Succeeded", exact=True)).to_have_count(len(CHECKS))
        # the first check's detail: blocking, passed, evaluated on the demo partition
        expect(page.get_by_text("This is a blocking asset check.")).to_be_visible()
        expect(page.get_by_text("Passed", exact=True)).to_be_visible()
        expect(page.get_by_text(DEMO_KEY, exact=True).first).to_be_visible()
        page.wait_for_load_state("networkidle")
        _shot(page, "features_checks")
