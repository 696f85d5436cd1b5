"""DVCLive logging of a run (when DVCLive is installed): a curve per metric, by round, and the
latest and best numbers, kept consistent across a resume."""

import json
from pathlib import Path

import pytest
from conftest import TINY_TRAIN

from pipeline.run.resolve import make_config
from pipeline.stages import train_stage

pytest.importorskip("dvclive")


def tsv_rounds(run: Path, name: str) -> list[int]:
    lines = (run / "dvclive/plots/metrics" / f"{name}.tsv").read_text().splitlines()
    return [int(line.split("\t")[0]) for line in lines[1:]]  # columns: step, value


def test_rounds_are_logged_once_each_also_after_a_resume(tiny_data: Path, tmp_path: Path) -> None:
    values = {**TINY_TRAIN, "data": str(tiny_data), "algorithm": "fedem", "eval_every": 2}
    run = tmp_path / "run"
    train_stage(make_config(**{**values, "rounds": 2}, out=str(run)))
    train_stage(make_config(**values, out=str(run)), resume=True)
    assert tsv_rounds(run, "loss") == [1, 2, 3]
    assert tsv_rounds(run, "global") == [2, 3]  # evaluated rounds only
    summary = json.loads((run / "dvclive/metrics.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in rows if "global_accuracy" in r]
    assert summary["step"] == 3 and summary["global"] == evaluated[-1]["global_accuracy"]
    assert summary["best_global"] == max(r["global_accuracy"] for r in evaluated)
    best_train = max(evaluated, key=lambda r: r["train_accuracy"])
    assert summary["selected_global"] == best_train["global_accuracy"]
