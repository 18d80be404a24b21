"""The documentation as a whole (issue 26 item 12): the README is a front page that links to a
MkDocs site, the site builds with ``--strict`` (every page in the nav, every link and anchor
resolves, links to repository files outside docs/ name files that exist), the README's links
resolve, its commands are the site's (where the other tests run or check them), and every page
exports DAGSTER_HOME before its first ``dagster``/``dg`` command."""

import os
import re
import subprocess
import sys

import pytest

from tests.doc_pages import REPO, page, site_pages

README_MAX_LINES = 250
_LINK = re.compile(r"(?<!`)\[[^\]]*\]\(([^)\s]+)\)")
_BASH = re.compile(r"```bash\n(.*?)```", flags=re.S)


def _github_slug(heading: str) -> str:
    """GitHub's anchor of a heading (what mkdocs.yml's pymdownx slugify also gives)."""
    text = re.sub(r"`|\*\*", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _bash_lines(text: str) -> list:
    """The command lines of the fenced bash blocks, continuations joined, comments dropped."""
    out = []
    for block in _BASH.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(line.split(" #")[0].split())
            if line:
                out.append(line)
    return out


def test_mkdocs_builds_the_site_strictly(tmp_path):
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError as e:  # the docs extra (in the test extra) is not installed
        pytest.skip(f"mkdocs / mkdocs-material not importable: {e!r}; pip install -e '.[docs]'")
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                        str(REPO / "mkdocs.yml"), "-d", str(site)], cwd=REPO,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert "WARNING" not in r.stderr, r.stderr[-6000:]
    # every page of docs/ was built (the nav names them all: an omitted page is a warning)
    for name in site_pages():
        stem = name[:-3]
        built = site / ("index.html" if stem == "index" else f"{stem}/index.html")
        assert built.is_file(), name


def _build_copy(tmp_path, name: str, page_name: str, extra: str):
    """Build a copy of the site (docs/ and mkdocs.yml copied, the rest of the repository linked)
    with ``extra`` appended to one page; the completed mkdocs process."""
    import shutil

    copy = tmp_path / name
    copy.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in ("docs", "mkdocs.yml", "site", ".git"):
            (copy / entry.name).symlink_to(entry)
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "docs" / page_name).write_text(page(page_name) + extra, encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(copy / "site")], cwd=copy,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                          capture_output=True, text=True, timeout=300)


def test_mkdocs_strict_fails_on_a_broken_link(tmp_path):
    """The strict build is not vacuous: a link to a missing repository file, to a missing page
    or to a missing anchor fails it (a copy of the site, one page broken at a time)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    ok = _build_copy(tmp_path, "clean", "deploy.md", "")
    assert ok.returncode == 0, ok.stderr[-3000:]
    for i, (broken, said) in enumerate((("[x](../deploy/NO_SUCH_FILE.md)", "NO_SUCH_FILE.md"),
                                        ("[x](no_such_page.md)", "no_such_page.md"),
                                        ("[x](corpus.md#no-such-anchor)", "no-such-anchor"))):
        r = _build_copy(tmp_path, f"broken{i}", "deploy.md", f"\n{broken}\n")
        assert r.returncode != 0 and "WARNING" in r.stderr and said in r.stderr, r.stderr[-3000:]


def test_readme_is_a_front_page():
    lines = page("README.md").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    # the picture, the two commands, your own data, the outputs, the links to the reference
    text = page("README.md")
    assert "![" in text and "docs/images/" in text
    assert "scripts/demo.sh" in _bash_lines(text) and "scripts/test.sh" in _bash_lines(text)
    for heading in ("## Two commands", "## Your own data", "## Where the outputs are",
                    "## Documentation"):
        assert f"\n{heading}\n" in text, heading
    linked = {m for m in _LINK.findall(text) if m.startswith("docs/") and m.endswith(".md")}
    assert {f"docs/{p}" for p in site_pages() if not p.startswith("hooks/")} <= linked


def test_every_readme_link_resolves():
    text = page("README.md")
    anchors = {_github_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    links = _LINK.findall(text)
    assert links
    for target in links:
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        if not path:
            assert anchor in anchors, target
            continue
        assert (REPO / path).exists(), target
        if anchor:  # an anchor in a page of the site
            headings = re.findall(r"^#+ (.+)$", (REPO / path).read_text(encoding="utf-8"),
                                  flags=re.M)
            assert anchor in {_github_slug(h) for h in headings}, target


def test_readme_commands_are_the_sites():
    """Each command of the README is a command of a page of the site, as written, so the tests
    that run or check the site's commands (test_readme_commands, test_demo_corpus, test_help,
    test_security) cover the front page too."""
    site = {line for name in site_pages() for line in _bash_lines(page(name))}
    readme = _bash_lines(page("README.md"))
    assert len(readme) >= 5
    for line in readme:
        assert line in site, line


@pytest.mark.parametrize("name", ["README.md", *site_pages()])
def test_dagster_home_is_exported_before_the_first_dagster_command(name):
    """Issue 26 item 3: a reader who copies a page's commands top to bottom exports
    DAGSTER_HOME before the first ``dagster`` or ``dg`` command that needs it."""
    lines = _bash_lines(page(name))
    uses = [i for i, ln in enumerate(lines) if re.search(r"(^|/)(dagster|dg) ", ln)]
    if not uses:
        return
    exports = [i for i, ln in enumerate(lines) if ln.startswith("export DAGSTER_HOME=")]
    assert exports and exports[0] < uses[0], (name, lines[uses[0]])
