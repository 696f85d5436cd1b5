"""Import directions this code relies on (layers import downwards only): the manifest records stand
on `pipeline.common.errors` alone, and the configuration (with the data's `partition:` section)
imports the data tables it checks names against (datasets, concepts, client mixes,
corruptions), never the builders that read a configuration (label splits, the benchmark
builder), so that `fedrc --help` and `fedrc check` stay fast."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pipeline_imports(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return {m for m in modules if m.split(".")[0] == "pipeline"}


def test_records_import_only_the_error_type() -> None:
    assert pipeline_imports(ROOT / "pipeline" / "data" / "records.py") == {"pipeline.common.errors"}


def test_the_configuration_loads_no_builder() -> None:
    code = "import sys, pipeline.config; print(*(m for m in sys.modules if m[:9] == 'pipeline.'))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "pipeline.config" in loaded and "pipeline.data.loaders" in loaded
    builders = {"pipeline.data.label_splits", "pipeline.data.benchmark", "pipeline.data.shards"}
    assert not builders & set(loaded)
