"""MkDocs hook: the site carries the repository files its pages link to.

The pages in docs/ link to source files, experiment results and figures elsewhere in the
repository by relative paths, which work in a clone and on a code host. On the site each such
file is published under `repo/` and the link is rewritten to it: a linked folder becomes a page
listing its files, and a linked Markdown file becomes a page whose own links are followed the
same way. A link that resolves to nothing in the repository is left alone, so that
`mkdocs build --strict` reports it.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent
DOCS = "docs/"
PREFIX = "repo/"
LINK = re.compile(r"(\]\()([^)\s#]+)")  # a Markdown link's or image's target, without its anchor
_repository: set[str] = set()  # what a clone has, listed once per build by on_files


def _repository_files() -> set[str]:
    """Tracked files and new ones git does not ignore: what a clone has."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {name for name in listed.split("\0") if name and (ROOT / name).is_file()}


def _repository_path(site_uri: str) -> str:
    """Where a page of the site lives in the repository."""
    return site_uri[len(PREFIX) :] if site_uri.startswith(PREFIX) else DOCS + site_uri


def _site_uri(page_path: str, target: str, files: set[str]) -> tuple[str, str] | None:
    """(the site's path, the repository's path) of a link target, or None if it is a web
    address or names nothing in the repository."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target):
        return None
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page_path), target))
    if resolved.startswith(DOCS):
        return resolved[len(DOCS) :], resolved
    if resolved in files:
        return PREFIX + resolved, resolved
    if any(name.startswith(resolved + "/") for name in files):
        return f"{PREFIX}{resolved}/index.md", f"{resolved}/index.md"
    return None


def _listing(folder: str, files: set[str]) -> str:
    """A page for a linked folder: its files, each a link."""
    names = sorted(name[len(folder) + 1 :] for name in files if name.startswith(folder + "/"))
    return f"# {folder}/\n\n" + "".join(f"- [{name}]({name})\n" for name in names)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Publish every repository file that a page links to, following linked Markdown files."""
    _repository.clear()
    _repository.update(_repository_files())
    repository = _repository
    pending = [
        (DOCS + page.src_uri, Path(page.abs_src_path).read_text())
        for page in files.documentation_pages()
        if page.abs_src_path
    ]
    while pending:
        page_path, text = pending.pop()
        for _, target in LINK.findall(text):
            found = _site_uri(page_path, target, repository)
            if found is None or not found[0].startswith(PREFIX):
                continue  # a web address, a page of docs/, or nothing (mkdocs reports it)
            site_uri, path = found
            if files.get_file_from_path(site_uri):
                continue  # published already
            if path.endswith("/index.md") and path not in repository:
                content = _listing(path[: -len("/index.md")], repository)
                files.append(File.generated(config, site_uri, content=content))
                pending.append((path, content))
                continue
            files.append(File.generated(config, site_uri, abs_src_path=str(ROOT / path)))
            if path.endswith(".md"):
                pending.append((path, (ROOT / path).read_text()))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Point each link to a repository file at its copy on the site."""
    page_path = _repository_path(page.file.src_uri)
    here = posixpath.dirname(page.file.src_uri) or "."

    def rewrite(match: re.Match[str]) -> str:
        found = _site_uri(page_path, match.group(2), _repository)
        if found is None:
            return match.group(0)
        return match.group(1) + posixpath.relpath(found[0], here)

    return LINK.sub(rewrite, markdown)
