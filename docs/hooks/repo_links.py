"""MkDocs hook: links from a page to a repository file outside ``docs/``.

The pages link to files such as ``../deploy/SIZING.md`` or ``../bench/results/REPORT_peers.md``
by their relative path, so the links work where the Markdown is read in the repository. MkDocs
only knows the files under ``docs/`` and would report every such link as missing (an error under
``--strict``). This hook checks that the file exists (a missing one is a warning, so the strict
build fails) and rewrites the link: to ``repo_url``'s file view when ``mkdocs.yml`` sets one, else
to the file's repository path as text. Links inside ``docs/`` are left to MkDocs' own checks.
"""

import logging
import os
import re

log = logging.getLogger("mkdocs.hooks.repo_links")

_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def on_page_markdown(markdown, page, config, files):
    docs = os.path.abspath(config["docs_dir"])
    repo = os.path.dirname(os.path.abspath(config["config_file_path"]))
    here = os.path.dirname(os.path.abspath(page.file.abs_src_path))
    repo_url = (config.get("repo_url") or "").rstrip("/")
    branch = (config.get("extra") or {}).get("repo_branch", "main")

    def rewrite(m):
        text, target = m.group(1), m.group(2)
        if _SCHEME.match(target) or target.startswith(("#", "/")):
            return m.group(0)
        path = os.path.abspath(os.path.join(here, target.split("#", 1)[0]))
        if path == docs or path.startswith(docs + os.sep):
            return m.group(0)  # a page or image of the site: MkDocs validates it
        rel = os.path.relpath(path, repo).replace(os.sep, "/")
        if rel.startswith("..") or not os.path.exists(path):
            log.warning("Doc file '%s' links to '%s', which is not a file of the repository.",
                        page.file.src_uri, target)
            return m.group(0)
        if repo_url:
            kind = "tree" if os.path.isdir(path) else "blob"
            return f"[{text}]({repo_url}/{kind}/{branch}/{rel})"
        return text if rel.rstrip("/") in text else f"{text} (`{rel}`)"

    return _LINK.sub(rewrite, markdown)
