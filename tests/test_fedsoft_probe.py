"""experiments/fmnist/fedsoft_heldout.py: the probe of the authors' FedSoft held-out rule."""

import json
from pathlib import Path

import pytest
from conftest import EXPERIMENTS, TINY_TRAIN, load_script

from pipeline.config import EvalConfig
from pipeline.run.resolve import make_config
from pipeline.stages import eval_stage, train_stage


def test_probe_picks_the_models_fedrc_eval_scores_held_out_clients_with(
    tiny_data: Path, tmp_path: Path
) -> None:
    run = train_stage(
        make_config(
            data=str(tiny_data), algorithm="fedsoft", mu=0.1, out=str(tmp_path), **TINY_TRAIN
        )
    )
    result = eval_stage(EvalConfig(run=str(run)))
    held = [
        c for c in json.loads((run / "eval_clients.json").read_text()) if not c["participating"]
    ]

    rows = load_script(EXPERIMENTS / "fmnist" / "fedsoft_heldout.py").held_out_scores(run)

    assert [concept for concept, _, _ in rows] == list(result["final_global_accuracy_by_concept"])
    for (_, accuracy, chosen), client in zip(rows, held, strict=True):
        assert len(accuracy) == TINY_TRAIN["clusters"]
        assert client["omega"][chosen] == 1.0  # fedrc's held-out rule: the lowest-loss model
        assert accuracy[chosen] == pytest.approx(client["test_accuracy"])
    lowest = sum(accuracy[chosen] for _, accuracy, chosen in rows) / len(rows)
    assert lowest == pytest.approx(result["final_global_accuracy"])
