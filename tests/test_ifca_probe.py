"""experiments/fmnist/ifca_empty_clusters.py: which rounds left a model of a run without members
(where the authors' released aggregation zeroes it)."""

from pathlib import Path

from conftest import EXPERIMENTS, TINY_TRAIN, load_script

from pipeline.run import files as rf
from pipeline.run.resolve import make_config
from pipeline.stages import train_stage


def test_the_reader_counts_members_per_model_and_finds_empty_rounds(
    tiny_data: Path, tmp_path: Path
) -> None:
    probe = load_script(EXPERIMENTS / "fmnist" / "ifca_empty_clusters.py")
    config = dict(TINY_TRAIN, clusters=4, eval_every=1, zero_empty=True)
    run = train_stage(
        make_config(data=str(tiny_data), algorithm="ifca", out=str(tmp_path / "r"), **config)
    )
    rounds, counts = probe.members(run)
    assert rounds == [1, 2, 3] and counts.shape == (3, 4)
    table = rf.read_assignments(run / rf.ASSIGNMENTS).to_pandas()
    participating = int(table[table["round"] == 1]["participating"].sum())
    assert (counts.sum(1) == participating).all()
    line = probe.summary(run)
    assert "ifca, zero_empty True; 3 rounds read" in line
    empty = [r for r, row in zip(rounds, counts) if (row == 0).any()]
    assert f"a model without members in {len(empty)} " in line
    assert f"at the last round {counts[-1].tolist()}" in line
    dead = probe.dead_models(run, 10)
    assert line.endswith(f"dead at the end: {dead}")
    assert bool(dead) == bool(empty)  # a zeroed model stays dead; none zeroed, none dead


def test_a_run_kept_without_its_model_needs_no_benchmark(tiny_data: Path, tmp_path: Path) -> None:
    """A GPU check keeps a run without model.pt, read where its benchmark was never made."""
    import json
    import shutil

    probe = load_script(EXPERIMENTS / "fmnist" / "ifca_empty_clusters.py")
    config = dict(TINY_TRAIN, clusters=2, eval_every=1)
    run = train_stage(
        make_config(data=str(tiny_data), algorithm="ifca", out=str(tmp_path / "r"), **config)
    )
    kept = tmp_path / "kept"
    shutil.copytree(run, kept, ignore=shutil.ignore_patterns(rf.MODEL))
    stored = json.loads((kept / "config.json").read_text())
    stored["data"] = str(tmp_path / "elsewhere")
    (kept / "config.json").write_text(json.dumps(stored))
    assert probe.summary(kept).endswith("dead at the end: no model.pt")


def test_a_zeroed_model_is_dead_but_for_its_output_bias(tmp_path: Path) -> None:
    import torch

    probe = load_script(EXPERIMENTS / "fmnist" / "ifca_empty_clusters.py")
    models = torch.tensor([[0.0, 0.0, 0.0, 0.3, -0.1], [0.0, 0.2, 0.0, 0.0, 0.0]])
    rf.save_state(tmp_path / rf.MODEL, {"models": models})
    assert probe.dead_models(tmp_path, 2) == [0]  # model 1 has a weight left
    assert probe.dead_models(tmp_path / "none", 2) is None
