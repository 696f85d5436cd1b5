"""The documentation a clone carries: every relative link in a Markdown file resolves inside the
repository, nothing points at files a clone does not have, and every shell block that claims to
run (right after `<!-- runs -->`) runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def tracked(*patterns: str) -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def test_markdown_links_resolve_inside_the_repository() -> None:
    broken = []
    for page in tracked("*.md"):
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            resolved = (page.parent / target).resolve()
            if not resolved.exists() or ROOT not in (resolved, *resolved.parents):
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert not broken


def test_nothing_refers_to_the_papers_folder_outside_the_repository() -> None:
    # spelt apart: this file is tracked too
    outside = (
        "shared" + "/papers",
        "NOTES" + ".md",
        "DESIGN" + ".md",
        "STYLE" + ".md",
        "../" + "shared",
    )
    for path in tracked("*.md", "*.py", "*.yaml", "*.toml", "*.sh"):
        text = path.read_text()
        assert not any(name in text for name in outside), path


def test_the_documentation_site_builds_strictly(tmp_path: Path) -> None:
    """What `.ci/run` builds: a broken link, a missing page or an autorefs warning fails it
    (not with `--quiet`, which hides the warnings that `--strict` counts)."""
    pytest.importorskip("mkdocs")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "index.html").is_file()


# A shell block right after this comment runs as written, in an empty folder, on tiny data.
RUNS = re.compile(r"<!-- runs( \(slow\))? -->\n(```.*?\n(.*?)```)?", re.S)
BASH = re.compile(r"```(?:bash|sh)\n")


def runnable_blocks() -> dict[str, list[tuple[bool, str]]]:
    """Per page, its blocks that claim to run, in order, each with whether it is slow."""
    pages = {}
    for page in tracked("*.md"):
        found = [(bool(match[1]), match[3]) for match in RUNS.finditer(page.read_text())]
        if found:
            pages[str(page.relative_to(ROOT))] = found
    return pages


def run_blocks(page: str, blocks: list[str], folder: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),  # this checkout's fedrc, whichever one is installed
        "OMP_NUM_THREADS": "1",
    }
    for block in blocks:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=folder, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, f"{page}:\n{block}\n{done.stdout[-1500:]}{done.stderr[-1500:]}"


def test_every_runs_marker_is_followed_by_a_shell_block() -> None:
    for page in tracked("*.md"):
        for match in RUNS.finditer(page.read_text()):
            assert match[2] and BASH.match(match[2]), f"{page.relative_to(ROOT)}: {match[0]!r}"
    pages = runnable_blocks()
    assert "docs/getting-started.md" in pages
    assert any(not slow for slow, _ in pages["docs/getting-started.md"])


# Pages whose fast blocks take 15-25 s each (their data formats built and trained on): run with
# `-m slow` to keep the default run short; test_every_shell_block_that_claims_to_run_does, also
# slow, runs them too.
LONG_PAGES = ("docs/streams.md", "docs/benchmarks.md", "docs/outputs.md")


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(page, marks=pytest.mark.slow) if page in LONG_PAGES else page
        for page, blocks in runnable_blocks().items()
        if any(not s for s, _ in blocks)
    ],
)
def test_shell_blocks_that_claim_to_run_do(page: str, tmp_path: Path) -> None:
    """The fast blocks of a page, in order, in one empty folder."""
    run_blocks(page, [block for slow, block in runnable_blocks()[page] if not slow], tmp_path)
    if page == "docs/getting-started.md":
        assert (tmp_path / "runs" / "fedrc" / "eval.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("page", list(runnable_blocks()))
def test_every_shell_block_that_claims_to_run_does(page: str, tmp_path: Path) -> None:
    """Every block of a page, the slow ones included, in order, in one empty folder."""
    run_blocks(page, [block for _, block in runnable_blocks()[page]], tmp_path)
