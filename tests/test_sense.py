"""Files read back are checked for sense, not only for type (issue 40): the ranges and shapes
that a file's meaning implies, and which run wrote it. Each case damages a copy of a small
world the way an edit, a copy from another run or a crafted file would; the command that reads
it answers with one line naming the file, exit 2, and writes nothing.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import assert_one_line, snapshot, working_copy
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.config import EvalConfig, PartitionConfig, PlotConfig
from pipeline.data.records import content_hash, covered_records
from pipeline.run import files as rf
from pipeline.run.resolve import make_config
from pipeline.stages import eval_stage, partition_stage, plot_stage, train_stage

runner = CliRunner()
PART = dict(dataset="synthetic", clients=6, samples_per_client=40, holdout_samples=30)
TRAIN = dict(rounds=2, local_epochs=1, batch_size=16, lr=0.05, clusters=2, device="cpu")
RESUME = ["train", "--out", "r", "--resume", "--rounds", "3"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """d, d2: two tiny benchmarks; r: fedrc on d (evaluated, plotted); r2: ifca on d
    (evaluated); r3: fedrc on d2."""
    root = tmp_path_factory.mktemp("world")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        partition_stage(PartitionConfig(**PART, out="d"))
        partition_stage(PartitionConfig(**PART, seed=1, out="d2"))
        for run, algorithm, data in (
            ("r", "fedrc", "d"),
            ("r2", "ifca", "d"),
            ("r3", "fedrc", "d2"),
        ):
            train_stage(make_config(data=data, algorithm=algorithm, out=run, **TRAIN))
        eval_stage(EvalConfig(run="r"))
        eval_stage(EvalConfig(run="r2"))
        plot_stage(PlotConfig(run="r", dpi=30))
    return root


@pytest.fixture
def here(world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return working_copy(world, tmp_path, monkeypatch)


# ---- how a case damages the copy -------------------------------------------------------------


def metrics_field(line: int, key: str, value) -> Callable[[Path], None]:
    """Set `key` on line `line` of r/metrics.jsonl (JSON allows NaN and Infinity)."""

    def go(root: Path) -> None:
        path = root / "r/metrics.jsonl"
        rows = [json.loads(text) for text in path.read_text().splitlines()]
        rows[line - 1][key] = value
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))

    return go


def json_field(rel: str, key: str, value) -> Callable[[Path], None]:
    def go(root: Path) -> None:
        data = json.loads((root / rel).read_text())
        if isinstance(data, list):
            data[0][key] = value
        else:
            data[key] = value
        (root / rel).write_text(json.dumps(data))

    return go


def copy_from(source: str, rel: str) -> Callable[[Path], None]:
    """r's file `rel` replaced by another run's."""
    return lambda root: shutil.copy(root / source / rel, root / "r" / rel)


def assignments(change: Callable[[pa.Table], pa.Table], keep_id: bool = True):
    """r/assignments.parquet rewritten after `change`, with its run id kept (as an edit with
    a tool that keeps the metadata would)."""

    def go(root: Path) -> None:
        path = root / "r/assignments.parquet"
        table = pq.read_table(path)
        changed = change(table)
        if keep_id:
            changed = changed.replace_schema_metadata(table.schema.metadata)
        pq.write_table(changed, path)

    return go


def omega_column(j: int, values: Callable[[np.ndarray], np.ndarray]):
    def change(table: pa.Table) -> pa.Table:
        name = f"omega_{j}"
        at = table.column_names.index(name)
        column = values(table.column(name).to_numpy().copy())
        return table.set_column(at, name, pa.array(column, pa.float32()))

    return change


def with_column(table: pa.Table, name: str, value: float) -> pa.Table:
    return table.append_column(name, pa.array(np.full(table.num_rows, value, np.float32)))


def edit_state(rel: str, **changes) -> Callable[[Path], None]:
    """Fields of a checkpoint or model.pt changed and sealed again, as fedrc would write them."""

    def go(root: Path) -> None:
        state = rf.load_state(root / rel)
        state.update({k: v(state) if callable(v) else v for k, v in changes.items()})
        rf.save_state(root / rel, state, format=state.pop("format"))

    return go


def edit_manifest(change: Callable[[dict], None]) -> Callable[[Path], None]:
    """d/manifest.json edited and its content hash computed again, as `fedrc partition` does:
    only the checks of what the records mean can refuse it."""

    def go(root: Path) -> None:
        manifest = json.loads((root / "d/manifest.json").read_text())
        change(manifest)
        manifest["content_hash"] = content_hash(manifest["files"], covered_records(manifest))
        (root / "d/manifest.json").write_text(json.dumps(manifest))

    return go


def swap_concept_names(manifest: dict) -> None:
    names = manifest["concepts"]
    names[1], names[2] = names[2], names[1]


def ones(shape_of: str) -> Callable[[dict], torch.Tensor]:
    return lambda state: torch.ones_like(state[shape_of])


def omega_table(rows: list[float]) -> Callable[[dict], torch.Tensor]:
    """ω with every row set to `rows`."""
    return lambda state: torch.tensor(rows, dtype=state["omega"].dtype).expand_as(state["omega"])


def history(rows: list[float]) -> Callable[[dict], list[torch.Tensor]]:
    return lambda state: [
        torch.tensor(rows, dtype=t.dtype).expand_as(t).clone() for t in state["omega_history"]
    ]


CASES = [
    # metrics.jsonl: accuracies in [0, 1], losses finite and >= 0 (plot, report, resume)
    (metrics_field(1, "train_accuracy", 1.5), ["plot", "--run", "r"], ["line 1", "[0, 1]"]),
    (metrics_field(2, "global_accuracy", -0.1), ["plot", "--run", "r"], ["global_accuracy"]),
    (metrics_field(1, "local_accuracy", float("nan")), ["report", "r", "--out", "o"], ["nan"]),
    (metrics_field(1, "train_loss", -1.0), ["plot", "--run", "r"], ["finite number >= 0"]),
    (metrics_field(2, "train_loss", float("inf")), RESUME, ["train_loss", ">= 0"]),
    (
        metrics_field(1, "global_accuracy_by_concept", {"identity": 2.0}),
        ["plot", "--run", "r"],
        ["global_accuracy_by_concept: expected accuracies in [0, 1] by concept"],
    ),
    # eval.json and eval_clients.json (report)
    (json_field("r/eval.json", "global_accuracy", 1.5), ["report", "r"], ["in [0, 1], got"]),
    (json_field("r/eval.json", "local_accuracy", float("nan")), ["report", "r"], ["[0, 1]"]),
    (json_field("r/eval.json", "concept_purity", 3), ["report", "r"], ["concept_purity"]),
    (
        json_field("r/eval_clients.json", "test_accuracy", 2.0),
        ["report", "r"],
        ["r/eval_clients.json: [0].test_accuracy", "[0, 1]"],
    ),
    (
        json_field("r/eval_clients.json", "omega", [0.7, 0.7]),
        ["report", "r"],
        ["[0].omega", "summing to 1"],
    ),
    (
        copy_from("r2", "eval_clients.json"),
        ["report", "r"],
        ["r/eval_clients.json: not the one", "r/eval.json was written with"],
    ),
    # config.json must be the one model.pt was trained with (report)
    (
        json_field("r/config.json", "seed", 7),
        ["report", "r"],
        ["r/model.pt: does not belong to", "seed"],
    ),
    # assignments.parquet (plot)
    (copy_from("r2", "assignments.parquet"), ["plot", "--run", "r"], ["another run"]),
    (copy_from("r3", "assignments.parquet"), ["plot", "--run", "r"], ["another run"]),
    (assignments(lambda t: t.slice(0, t.num_rows - 1)), ["plot", "--run", "r"], ["row per"]),
    (assignments(lambda t: t.slice(0, t.num_rows // 2)), ["plot", "--run", "r"], ["rounds"]),
    (
        assignments(lambda t: with_column(t, "omega_2", 0.0)),
        ["plot", "--run", "r"],
        ["ω for 3 models", "K = 2"],
    ),
    (assignments(omega_column(0, lambda w: w - 2)), ["plot", "--run", "r"], ["outside [0, 1]"]),
    (
        assignments(omega_column(1, lambda w: w * np.nan)),
        ["plot", "--run", "r"],
        ["NaN or infinite"],
    ),
    (assignments(omega_column(1, lambda w: w * 0.5)), ["plot", "--run", "r"], ["sums to"]),
    (
        assignments(lambda t: t.rename_columns([*t.column_names[:-1], "omega"])),
        ["plot", "--run", "r"],
        ["columns"],
    ),
    # the manifest: what its records mean (train, eval read the shards)
    (edit_manifest(swap_concept_names), ["eval", "--run", "r"], ["labels it does not give"]),
    (
        edit_manifest(lambda m: m["concepts"].__setitem__(1, "mirror")),
        ["eval", "--run", "r"],
        ["d/manifest.json: concepts", "mirror"],
    ),
    (
        edit_manifest(lambda m: m.__setitem__("image_shape", [8, 32, 1])),
        ["eval", "--run", "r"],
        ["image_shape [8, 32, 1]", "synthetic's images are [16, 16, 1]"],
    ),
    (
        edit_manifest(lambda m: m.__setitem__("image_shape", [16, 1, 16])),
        ["plot", "--run", "r"],
        ["d/manifest.json", "image_shape"],
    ),
    # checkpoint.pt and model.pt: dtypes, the RNG state, ω as mixtures
    (
        edit_state("r/checkpoint.pt", models=lambda s: s["models"].double()),
        RESUME,
        ["r/checkpoint.pt: models: expected a float32 tensor", "float64"],
    ),
    (
        edit_state("r/checkpoint.pt", rng=lambda s: torch.zeros_like(s["rng"])),
        RESUME,
        ["r/checkpoint.pt: rng: not a state of torch's generator"],
    ),
    (
        edit_state("r/checkpoint.pt", omega_history=history([0.9, 0.9])),
        RESUME,
        ["omega_history[0]", "sums to 1.8"],
    ),
    (
        edit_state("r/checkpoint.pt", omega_history=history([1.5, -0.5])),
        RESUME,
        ["omega_history[0]", "outside [0, 1]"],
    ),
    (
        edit_state(
            "r/checkpoint.pt",
            algorithm=lambda s: {**s["algorithm"], "omega": s["algorithm"]["omega"] * 0},
        ),
        RESUME,
        ["algorithm.omega", "sums to 0"],
    ),
    (
        edit_state("r/model.pt", models=lambda s: s["models"].half()),
        ["eval", "--run", "r"],
        ["r/model.pt: models: expected a float32 tensor", "float16"],
    ),
    (edit_state("r/model.pt", omega=omega_table([0.2, 0.2])), ["eval", "--run", "r"], ["sums"]),
]


@pytest.mark.parametrize(("mutate", "args", "culprits"), CASES)
def test_a_file_that_makes_no_sense_is_one_line(
    here: Path, mutate, args: list[str], culprits: list[str]
) -> None:
    mutate(here)
    before = snapshot(here)
    assert_one_line(runner.invoke(app, [str(a) for a in args]), *culprits, code=2)
    assert snapshot(here) == before


def test_the_same_run_given_twice_is_refused_not_counted_as_seeds(here: Path) -> None:
    """A copy of a run (the same model), with or without its seed edited in config.json:
    three "seeds" of one run would show a spread of 0."""
    shutil.copytree("r", "copy")
    line = assert_one_line(runner.invoke(app, ["report", "r", "copy", "--out", "o"]), code=2)
    assert "the same run as" in line or "same configuration and seed" in line
    json_field("copy/config.json", "seed", 1)(here)
    assert_one_line(runner.invoke(app, ["report", "r", "copy"]), "does not belong to", code=2)
    (here / "copy/model.pt").unlink()  # a copy kept without model.pt: its digest file
    (here / "copy/model.sha256").write_text(
        json.loads((here / "r/eval.json").read_text())["made_from"]["model_digest"] + "\n"
    )
    line = assert_one_line(runner.invoke(app, ["report", "r", "copy", "--out", "o"]), code=2)
    assert "copy: the same run as" in line and not Path("o").exists()


def test_every_derived_file_names_the_run_that_wrote_it(here: Path) -> None:
    """assignments.parquet carries the run id, eval.json the digest of its eval_clients.json,
    plots/made_from.json the figures it drew: a run recognises its own files."""
    recorded = pq.read_schema(here / "r/assignments.parquet").metadata[b"fedrc.run"]
    other = pq.read_schema(here / "r2/assignments.parquet").metadata[b"fedrc.run"]
    assert len(recorded) == 16 and recorded != other
    made = json.loads((here / "r/eval.json").read_text())["made_from"]
    assert {"model_digest", "round", "data_digest", "clients_digest"} <= set(made)
    figures = json.loads((here / "r/plots/made_from.json").read_text())["files"]
    assert "omega.png" in figures and "made_from.json" not in figures


def test_deeply_nested_json_in_a_run_file_is_one_line(here: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    for rel, args in (
        ("r/config.json", ["eval", "--run", "r"]),
        ("r/eval.json", ["report", "r"]),
        ("d/manifest.json", ["plot", "--run", "r"]),
    ):
        saved = (here / rel).read_bytes()
        (here / rel).write_text(deep)
        line = assert_one_line(runner.invoke(app, args), rel, code=2)
        assert "nested too deeply" in line or "not" in line
        (here / rel).write_bytes(saved)
    lines = (here / "r/metrics.jsonl").read_text().splitlines()
    (here / "r/metrics.jsonl").write_text("\n".join([deep, *lines[1:]]) + "\n")
    assert_one_line(runner.invoke(app, ["plot", "--run", "r"]), "line 1", code=2)


def test_a_divergence_right_after_a_resume_names_the_checkpoint(here: Path) -> None:
    """Models blown up to 1e30 in a checkpoint (finite: every field check passes) give NaN in
    the first round after the resume: the message names the checkpoint beside --lr."""
    edit_state("r/checkpoint.pt", models=lambda s: s["models"] * 1e30)(here)
    line = assert_one_line(runner.invoke(app, RESUME), "diverged", code=2)
    assert "--lr" in line and "checkpoint.pt (round 2, which this run resumed from)" in line


def denied(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Opening any file called `name` fails as a mode of 000 or another user's file would
    (the tests may run as root, whom no mode stops)."""
    real = builtins.open

    def guarded(file, *args, **kwargs):
        if isinstance(file, str | os.PathLike) and Path(file).name == name:
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("manifest.json", ["eval", "--run", "r"]),
        ("manifest.json", ["info", "d"]),
        ("model.pt", ["eval", "--run", "r"]),
        ("checkpoint.pt", RESUME),
        ("metrics.jsonl", ["plot", "--run", "r"]),
        ("config.json", ["report", "r", "--out", "o"]),
        ("p.yaml", ["check", "--params", "p.yaml"]),
    ],
)
def test_a_file_that_exists_but_cannot_be_read_is_one_line(
    here: Path, monkeypatch: pytest.MonkeyPatch, name: str, args: list[str]
) -> None:
    Path("p.yaml").write_text("train: {}\n")
    before = snapshot(here)
    denied(monkeypatch, name)
    assert_one_line(runner.invoke(app, args), name, "permission denied", code=2)
    monkeypatch.undo()  # the snapshot reads every file
    assert snapshot(here) == before
