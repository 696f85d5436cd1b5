"""The CLI answers without torch: building the Typer app, `--help`, `--version`, listing the
components, showing a built-in's settings, describing a benchmark's folder and refusing a bad
option never import it (torch takes seconds to import;
benchmarks/cli_latency.py measures the time, these tests pin the cause without timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "scipy", "matplotlib")
NO_PLUGINS = (  # `fedrc ARGS` as if no plugin were installed
    "import importlib.metadata, sys; importlib.metadata.entry_points = lambda **_: (); "
    "from fedrc_cli.app import main; main()"
)


def imported(
    *args: str, cwd: Path, plugins: bool = True
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `python -X importtime -m fedrc_cli ARGS`: the result and every module it imported.
    `plugins=False` hides the installed plugins' entry points."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    command = ["-m", "fedrc_cli"] if plugins else ["-c", NO_PLUGINS]
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *command, *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return done, modules


def test_the_app_and_the_configuration_import_no_torch() -> None:
    code = (
        "import sys, fedrc_cli.app, pipeline.config, pipeline.flower.appconfig; "
        f"print(*(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == []


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["train", "--help"],
        ["partition", "--help"],
        ["flower", "app", "--help"],
        ["check", "--help"],
        ["sweep", "--help"],
    ],
)
def test_help_and_version_import_no_torch(args: list[str], tmp_path: Path) -> None:
    done, modules = imported(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "typer" in modules  # the listing is real: the CLI's own imports are in it
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


@pytest.mark.parametrize("name", ["fedrc", "feddrift", "mlp", "sine"])
def test_a_built_in_components_settings_import_no_torch(name: str, tmp_path: Path) -> None:
    done, modules = imported("info", name, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f" {name}: " in done.stdout  # the settings table's title
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_listing_the_components_imports_no_torch(tmp_path: Path) -> None:
    """`fedrc info` reads the built-ins from their cards. It imports each installed plugin to
    check that it loads (the example plugin of .ci/setup imports torch), so this runs it with
    the plugins' entry points hidden."""
    done, modules = imported("info", cwd=tmp_path, plugins=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fedrc" in done.stdout and "synthetic" in done.stdout
    assert "digits" not in done.stdout  # no plugin listed
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_describing_a_benchmark_imports_no_torch(tiny_data: Path, tmp_path: Path) -> None:
    done, modules = imported("info", str(tiny_data), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["participating"] == 12
    assert "torch" not in modules


@pytest.mark.parametrize(
    "args, option",
    [
        (["partition", "--clients", "1"], "partition.clients"),
        (["eval", "--params", "missing.yaml"], "--params"),
        (["train", "--rounds", "many"], "--rounds"),
    ],
)
def test_a_bad_option_is_refused_without_torch(args: list[str], option: str, tmp_path: Path):
    done, modules = imported(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert option in done.stderr
    assert "torch" not in modules
    assert list(tmp_path.iterdir()) == []  # nothing written
