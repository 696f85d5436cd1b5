"""Bad input, interruption and untrusted files never cost a user their work (DESIGN principle 5).

Every failure is one line that names the option, key or file, a non-zero exit, no traceback,
and no half-written output: the folder a command would write is byte for byte what it was.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
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
from pipeline.common.checks import require_finite
from pipeline.common.errors import FedrcError
from pipeline.common.io import atomic_files
from pipeline.config import EvalConfig, PartitionConfig, PlotConfig
from pipeline.data.records import content_hash, covered_records
from pipeline.models import MODELS, build_model
from pipeline.run import files as rf
from pipeline.run.derived import model_digest, state_digest
from pipeline.run.resolve import make_config
from pipeline.stages import eval_stage, partition_stage, plot_stage, train_stage

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
PART = dict(dataset="synthetic", clients=6, samples_per_client=40, holdout_samples=30)
TRAIN = dict(rounds=2, local_epochs=1, batch_size=16, lr=0.05, clusters=2, device="cpu")
FAST = ["--local-epochs", "1", "--batch-size", "16", "--clusters", "2", "--device", "cpu"]
RUN_R = ["--data", "d", "--algorithm", "fedrc", "--lr", "0.05", *FAST]  # the options of run r


def options(values: dict) -> list[str]:
    return [x for k, v in values.items() for x in (f"--{k.replace('_', '-')}", str(v))]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """d, d2: two tiny partitions; r: a finished fedrc run (evaluated, plotted); r2: fedavg."""
    root = tmp_path_factory.mktemp("world")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)  # relative paths inside the run files: a copy of root is self-contained
        partition_stage(PartitionConfig(**PART, out="d"))
        partition_stage(PartitionConfig(**PART, seed=1, out="d2"))
        train_stage(make_config(data="d", algorithm="fedrc", out="r", **TRAIN))
        train_stage(make_config(data="d", algorithm="fedavg", out="r2", **TRAIN))
        eval_stage(EvalConfig(run="r"))
        plot_stage(PlotConfig(run="r", dpi=30))
    return root


@pytest.fixture
def here(world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return working_copy(world, tmp_path, monkeypatch)


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


class Evil:
    """What an attacker would put in a checkpoint: unpickling it runs a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# ---- mutations: how a case damages the copy of `world` before the command runs --------------


def write(rel: str, text: str) -> Callable[[Path], None]:
    return lambda root: (root / rel).write_text(text)


def remove(rel: str) -> Callable[[Path], None]:
    return lambda root: (root / rel).unlink()


def truncate(rel: str, keep: int = 100) -> Callable[[Path], None]:
    return lambda root: (root / rel).write_bytes((root / rel).read_bytes()[:keep])


def flip_byte(rel: str) -> Callable[[Path], None]:
    def go(root: Path) -> None:
        data = bytearray((root / rel).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (root / rel).write_bytes(bytes(data))

    return go


def crafted_pickle(rel: str) -> Callable[[Path], None]:
    def go(root: Path) -> None:
        torch.save({"format": 1, "payload": Evil(root / "PWNED")}, root / rel)

    return go


def edit_state(rel: str, **changes) -> Callable[[Path], None]:
    """Change fields of a checkpoint or model.pt and seal it again, as fedrc would write it:
    only the checks of what it holds can refuse it. A change may be a function of the old
    state."""

    def go(root: Path) -> None:
        state = rf.load_state(root / rel)
        state.update({k: v(state) if callable(v) else v for k, v in changes.items()})
        rf.save_state(root / rel, state, format=state.pop("format"))

    return go


def without(key: str) -> Callable[[dict], dict]:
    """The algorithm state less `key`."""
    return lambda state: {k: v for k, v in state["algorithm"].items() if k != key}


def retyped(key: str, dtype: torch.dtype) -> Callable[[dict], dict]:
    """The algorithm state with the tensor `key` of another type."""
    return lambda state: {**state["algorithm"], key: state["algorithm"][key].to(dtype)}


def unsealed(rel: str) -> Callable[[Path], None]:
    """The same state written by plain torch.save: its seal is gone."""
    return lambda root: torch.save(rf.load_state(root / rel), root / rel)


def legacy(rel: str) -> Callable[[Path], None]:
    """The file as a fedrc from before seals wrote it: no seal, no "checksum" key."""

    def go(root: Path) -> None:
        state = rf.load_state(root / rel)
        state.pop("checksum")
        torch.save(state, root / rel)

    return go


def nan_first(key: str) -> Callable[[dict], list]:
    def go(state: dict) -> list:
        tables = [t.clone() for t in state[key]]
        tables[0][0, 0] = float("nan")
        return tables

    return go


def schema_change(root: Path) -> None:
    """Shard 0 with an int32 label column, and a manifest that records the new file's hash."""
    path = root / "d/shards/client-00000.parquet"
    table = pq.read_table(path)
    table = table.set_column(1, "label", table.column("label").cast(pa.int32()))
    pq.write_table(table, path)
    rehash(root, path)


def label_out_of_range(root: Path) -> None:
    """Shard 0 with a label 10 (the synthetic benchmark's classes are 0..9), hash recorded."""
    path = root / "d/shards/client-00000.parquet"
    table = pq.read_table(path)
    labels = table.column("label").to_numpy().copy()
    labels[3] = 10
    pq.write_table(table.set_column(1, "label", pa.array(labels, pa.int16())), path)
    rehash(root, path)


def rehash(root: Path, path: Path) -> None:
    """The manifest records `path`'s new SHA-256: only the shard checks can find the change."""
    edit_manifest(lambda m: m["files"].update({path.name: sha256(path)}))(root)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def edit_manifest(change: Callable[[dict], None], seal: bool = True) -> Callable[[Path], None]:
    """Change d/manifest.json; with `seal` its content hash is computed again as `fedrc
    partition` computes it, so only the checks of the shards against the records can refuse
    the edit."""

    def go(root: Path) -> None:
        manifest = json.loads((root / "d/manifest.json").read_text())
        change(manifest)
        if seal:
            manifest["content_hash"] = content_hash(manifest["files"], covered_records(manifest))
        (root / "d/manifest.json").write_text(json.dumps(manifest))

    return go


def edit_shard(client: int, column: str, row: int, value: int) -> Callable[[Path], None]:
    """One value of an int16 column of a client's shard, the manifest's hashes updated."""

    def go(root: Path) -> None:
        path = root / f"d/shards/client-{client:05d}.parquet"
        table = pq.read_table(path)
        values = table.column(column).to_numpy().copy()
        values[row] = value
        at = table.column_names.index(column)
        pq.write_table(table.set_column(at, column, pa.array(values, pa.int16())), path)
        rehash(root, path)

    return go


def swap_sizes(manifest: dict) -> None:
    client = manifest["clients"][0]
    client["train_size"], client["test_size"] = client["test_size"], client["train_size"]


def more_classes(manifest: dict) -> None:
    """num_classes 12, every label histogram given the two extra (empty) classes."""
    manifest["num_classes"] = 12
    for client in manifest["clients"]:
        for key in ("label_histogram", "true_label_histogram"):
            client[key] += [0, 0]


def repartitioned(root: Path) -> None:
    """d built again with another seed (as `fedrc partition --overwrite` would leave it)."""
    shutil.rmtree(root / "d")
    shutil.copytree(root / "d2", root / "d")


def extended_unfinished(root: Path) -> None:
    """What a `--resume --rounds 3` killed after its round 3 leaves: metrics.jsonl and
    config.json say 3 rounds, model.pt is still round 2's."""
    edit_config(rounds=3)(root)
    with (root / "r/metrics.jsonl").open("a") as f:
        f.write(json.dumps({"round": 3, "train_loss": 0.5}) + "\n")


def edit_config(**changes) -> Callable[[Path], None]:
    def go(root: Path) -> None:
        config = json.loads((root / "r/config.json").read_text())
        (root / "r/config.json").write_text(json.dumps({**config, **changes}))

    return go


def edit_lines(rel: str, change: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    """Edit a JSON-lines file by hand (as `sed` would), line by line."""

    def go(root: Path) -> None:
        lines = (root / rel).read_text().splitlines(keepends=True)
        (root / rel).write_text("".join(change(lines)))

    return go


def set_field(rel: str, key: str, value) -> Callable[[Path], None]:
    """Set `key` to `value` in every row of a JSON-lines file, or in a JSON object."""

    def one(text: str) -> str:
        row = json.loads(text)
        return json.dumps({**row, key: value} if key in row else row)

    def go(root: Path) -> None:
        path = root / rel
        if rel.endswith(".jsonl"):
            path.write_text("".join(one(line) + "\n" for line in path.read_text().splitlines()))
        else:
            path.write_text(one(path.read_text()))

    return go


def nothing(root: Path) -> None:
    pass


LONG = "x" * 300  # longer than any file system's NAME_MAX (255 bytes)
TORN = '{"round": 1, "train_loss": 0.5}\n{"round": 2, "train_lo'
RESUME = ["train", *RUN_R, "--rounds", "3", "--out", "r", "--resume"]

CASES = [
    # partition: options
    (
        "p-dataset",
        ["partition", "--dataset", "imagenet"],
        nothing,
        ["partition.dataset", "unknown dataset 'imagenet'"],
    ),
    (
        "p-alpha-0",
        ["partition", "--dataset", "synthetic", "--alpha", "0"],
        nothing,
        ["alpha", "> 0"],
    ),
    ("p-alpha-nan", ["partition", "--alpha", "nan"], nothing, ["partition.alpha", "finite"]),
    ("p-clients", ["partition", "--clients", "1"], nothing, ["partition.clients", ">= 2"]),
    ("p-test-frac", ["partition", "--test-fraction", "1.5"], nothing, ["test_fraction", "(0, 1)"]),
    ("p-styles", ["partition", "--styles", "fog"], nothing, ["partition.styles", "names from"]),
    (
        "p-holdout",
        ["partition", *options(PART), "--holdout-samples", "5", "--out", "d"],
        nothing,
        ["partition.holdout_samples", ">= 10"],
    ),
    (
        "p-too-many",
        [
            "partition",
            "--dataset",
            "synthetic",
            "--clients",
            "500",
            "--samples-per-client",
            "50",
            "--out",
            "new",
        ],
        nothing,
        ["--clients"],
    ),
    (
        "p-seed-neg",
        ["partition", "--seed", "-1"],
        nothing,
        ["partition.seed: expected an integer in [0, 2**32-1], got -1"],
    ),
    (
        "p-seed-huge",
        ["partition", "--seed", str(2**32)],
        nothing,
        ["partition.seed", "[0, 2**32-1]"],
    ),
    (
        "p-out-too-long",
        ["partition", *options(PART), "--out", "y" * 250],  # 250 fits, not its temporary name
        nothing,
        ["--out: yyy", "name too long for the file system (250 bytes; at most 241"],
    ),
    (
        "p-out-folder-too-long",
        ["partition", *options(PART), "--out", f"{LONG}/d"],
        nothing,
        ["--out: xxx", "a folder name in it is too long", "(300 bytes, at most 255)"],
    ),
    # partition: params files
    ("p-params-missing", ["partition", "--params", "missing.yaml"], nothing, ["--params"]),
    (
        "p-unknown-key",
        ["partition", "--params", "p.yaml"],
        write("p.yaml", "partition:\n  colour: 1\n"),
        ["partition.colour", "unknown key"],
    ),
    (
        "p-wrong-type",
        ["partition", "--params", "p.yaml"],
        write("p.yaml", "partition:\n  clients: ten\n"),
        ["partition.clients", "an integer"],
    ),
    (
        "p-not-yaml",
        ["partition", "--params", "p.yaml"],
        write("p.yaml", "partition: [1,\n"),
        ["p.yaml", "YAML"],
    ),
    (
        "p-section",
        ["partition", "--params", "p.yaml"],
        write("p.yaml", "partition: 3\n"),
        ["partition", "mapping"],
    ),
    (
        "p-section-typo",
        ["partition", "--params", "p.yaml"],
        write("p.yaml", "partitoin:\n  clients: 4\n"),
        ["p.yaml", "'partitoin'", "did you mean 'partition'"],
    ),
    (
        "p-duplicate-key",
        ["partition", "--params", "p.yaml"],
        write("p.yaml", "partition:\n  clients: 4\n  seed: 1\n  clients: 5\n"),
        ["p.yaml: partition.clients: given twice (lines 2 and 4)", "keep only the last"],
    ),
    (
        "p-duplicate-in-list",
        ["partition", "--params", "p.yaml"],
        write("p.yaml", "partition:\n  drift:\n    - {step: 1, share: 0.5, step: 2}\n"),
        ["p.yaml: partition.drift[0].step: given twice"],
    ),
    # train: options and params
    (
        "t-seed-neg",
        ["train", "--seed", "-1"],
        nothing,
        ["train.seed: expected an integer in [0, 2**32-1], got -1"],
    ),
    ("t-seed-huge", ["train", "--seed", str(2**40)], nothing, ["train.seed", "[0, 2**32-1]"]),
    (
        "t-seed-params",
        ["train", "--params", "p.yaml"],
        write("p.yaml", "train:\n  seed: -7\n"),
        ["train.seed", "got -7"],
    ),
    (
        "t-duplicate-section",
        ["train", "--params", "p.yaml"],
        write("p.yaml", "train:\n  lr: 0.1\neval: {}\ntrain:\n  lr: 0.2\n"),
        ["p.yaml: train: given twice (lines 1 and 4)"],
    ),
    (
        "t-duplicate-default-params",
        ["train", *RUN_R, "--out", "new"],
        write("params.yaml", "train:\n  lr: 0.1\n  lr: 0.2\n"),
        ["params.yaml: train.lr: given twice"],
    ),
    (
        "t-set-duplicate",
        ["train", *RUN_R, "--out", "new", "--set", "fedrc={estep: em, estep: adam}"],
        nothing,
        ["--set fedrc=", "estep: given twice"],
    ),
    ("t-out-too-long", ["train", *RUN_R, "--out", LONG], nothing, ["--out: xxx", "name too long"]),
    (
        "t-out-too-long-resume",
        ["train", *RUN_R, "--out", LONG, "--resume"],
        nothing,
        ["--out: xxx", "name too long"],
    ),
    (
        "t-data-too-long",
        ["train", "--data", LONG, "--out", "new"],
        nothing,
        ["xxx", "name too long"],
    ),
    (
        "t-label-out-of-range",
        ["train", *RUN_R, "--out", "new"],
        label_out_of_range,
        ["d/shards/client-00000.parquet: label 10 in row 3 (1 such rows) is outside [0, 10)"],
    ),
    (  # the true labels too, in a held-out client's test rows as anywhere
        "t-true-label-out-of-range",
        ["train", *RUN_R, "--out", "new"],
        edit_shard(7, "true_label", 29, 12),
        ["d/shards/client-00007.parquet: true label 12 in row 29", "outside [0, 10)"],
    ),
    (
        "e-label-out-of-range-held-out-test",
        ["eval", "--run", "r"],
        edit_shard(7, "label", 29, -1),
        ["d/shards/client-00007.parquet: label -1 in row 29", "outside [0, 10)"],
    ),
    (  # the manifest's hash covers num_classes: an edit is refused, whatever else it changes
        "t-num-classes-edited",
        ["train", *RUN_R, "--out", "new"],
        edit_manifest(lambda m: m.update(num_classes=12), seal=False),
        ["d/manifest.json: clients[0].label_histogram: expected 12 counts (num_classes), got 10"],
    ),
    (
        "t-num-classes-and-histograms-edited",
        ["train", *RUN_R, "--out", "new"],
        edit_manifest(more_classes, seal=False),
        ["d/manifest.json: content_hash does not match the shard hashes and records it covers"],
    ),
    (
        "t-sizes-swapped-hash",
        ["train", *RUN_R, "--out", "new"],
        edit_manifest(swap_sizes, seal=False),
        ["d/manifest.json: content_hash does not match", "the manifest was edited"],
    ),
    (  # sealed again: the shard's own rows say which are training rows
        "t-sizes-swapped",
        ["train", *RUN_R, "--out", "new"],
        edit_manifest(swap_sizes),
        [
            "d/shards/client-00000.parquet: the shard and the manifest's clients[0] disagree",
            "train_size 4 and test_size 36, but the shard holds 36 train and 4 test rows",
        ],
    ),
    (
        "t-row-count",
        ["train", *RUN_R, "--out", "new"],
        edit_manifest(lambda m: m["clients"][1].update(test_size=m["clients"][1]["test_size"] + 1)),
        ["d/shards/client-00001.parquet: shard does not match the manifest (40 rows, expected 41"],
    ),
    (
        "t-shards-renamed",
        ["train", *RUN_R, "--out", "new"],
        lambda root: (
            (root / "d/shards/client-00001.parquet").rename(root / "d/shards/x"),
            (root / "d/shards/client-00002.parquet").rename(root / "d/shards/client-00001.parquet"),
            (root / "d/shards/x").rename(root / "d/shards/client-00002.parquet"),
            edit_manifest(
                lambda m: m["files"].update(
                    {
                        "client-00001.parquet": m["files"]["client-00002.parquet"],
                        "client-00002.parquet": m["files"]["client-00001.parquet"],
                    }
                )
            )(root),
        ),
        ["d/shards/client-00001.parquet", "rows of client 2, expected client 1"],
    ),
    (
        "t-algorithm",
        ["train", "--algorithm", "fedfoo"],
        nothing,
        ["train.algorithm", "unknown algorithm 'fedfoo'"],
    ),
    ("t-participation", ["train", "--participation", "1.5"], nothing, ["participation", "(0, 1]"]),
    (
        "t-ckpt-every",
        ["train", "--checkpoint-every", "-1"],
        nothing,
        ["train.checkpoint_every", ">= 0"],
    ),
    ("t-lr-inf", ["train", "--lr", "inf"], nothing, ["train.lr", "finite"]),
    (
        "t-batch",
        ["train", "--params", "p.yaml"],
        write("p.yaml", "train:\n  batch_size: 0\n"),
        ["train.batch_size", ">= 1"],
    ),
    (
        "t-momentum",
        ["train", "--params", "p.yaml"],
        write("p.yaml", "train:\n  momentum: 1\n"),
        ["train.momentum", "[0, 1)"],
    ),
    # train: the manifest and the shards
    ("t-no-data", ["train", "--data", "nowhere", "--out", "new"], nothing, ["manifest.json"]),
    (
        "t-manifest-json",
        ["train", *RUN_R, "--out", "new"],
        truncate("d/manifest.json", 30),
        ["d/manifest.json", "corrupt"],
    ),
    (
        "t-manifest-keys",
        ["train", *RUN_R, "--out", "new"],
        write("d/manifest.json", "{}"),
        ["d/manifest.json", "not a fedrc manifest"],
    ),
    (
        "t-shard-missing",
        ["train", *RUN_R, "--out", "new"],
        remove("d/shards/client-00002.parquet"),
        ["client-00002.parquet", "missing"],
    ),
    (
        "t-shard-truncated",
        ["train", *RUN_R, "--out", "new"],
        truncate("d/shards/client-00003.parquet"),
        ["client-00003.parquet", "damaged"],
    ),
    (
        "t-shard-hash",
        ["train", *RUN_R, "--out", "new"],
        flip_byte("d/shards/client-00001.parquet"),
        ["client-00001.parquet", "SHA-256"],
    ),
    (
        "t-shard-schema",
        ["train", *RUN_R, "--out", "new"],
        schema_change,
        ["client-00000.parquet", "schema"],
    ),
    # train: run folders
    ("t-existing-run", ["train", *RUN_R, "--out", "r"], nothing, ["--out", "--resume"]),
    ("t-resume-empty", ["train", *RUN_R, "--out", "new", "--resume"], nothing, ["--resume"]),
    ("t-resume-overwrite", [*RESUME, "--overwrite"], nothing, ["--resume", "--overwrite"]),
    (
        "t-resume-algorithm",
        ["train", *RUN_R, "--algorithm", "fedem", "--rounds", "3", "--out", "r", "--resume"],
        nothing,
        ["--algorithm: r was trained with 'fedrc', not 'fedem'", "--overwrite"],
    ),
    (
        "t-resume-lr",
        ["train", *RUN_R, "--lr", "0.01", "--rounds", "3", "--out", "r", "--resume"],
        nothing,
        ["--lr: r was trained with 0.05, not 0.01", "--rounds"],
    ),
    (  # config.json edited after the checkpoint was written: the checkpoint says so
        "t-resume-edited-config",
        ["train", "--rounds", "3", "--out", "r", "--resume"],
        edit_config(lr=0.01),
        ["checkpoint.pt", "another configuration", "lr 0.05 there, 0.01 here"],
    ),
    (
        "t-resume-data",
        ["train", *RUN_R, "--data", "d2", "--rounds", "3", "--out", "r", "--resume"],
        nothing,
        ["checkpoint.pt", "another dataset"],
    ),
    (
        "t-resume-newer",
        RESUME,
        edit_state("r/checkpoint.pt", format=99),
        ["checkpoint.pt", "newer"],
    ),
    ("t-resume-pickle", RESUME, crafted_pickle("r/checkpoint.pt"), ["checkpoint.pt", "refused"]),
    # train --resume: a checkpoint checked, not trusted (the files stay as they were)
    (
        "t-resume-flipped",
        RESUME,
        flip_byte("r/checkpoint.pt"),
        ["r/checkpoint.pt: damaged", "SHA-256 does not match"],
    ),
    (
        "t-resume-unsealed",
        RESUME,
        unsealed("r/checkpoint.pt"),
        ["checkpoint.pt", "seal is missing"],
    ),
    (
        "t-resume-round-99",
        RESUME,
        edit_state("r/checkpoint.pt", round=99),
        ["r/checkpoint.pt: round: expected an integer in [0, 3]", "got 99"],
    ),
    (
        "t-resume-round-neg",
        RESUME,
        edit_state("r/checkpoint.pt", round=-3),
        ["r/checkpoint.pt: round: expected an integer in [0, 3]", "got -3"],
    ),
    (
        "t-resume-round-text",
        RESUME,
        edit_state("r/checkpoint.pt", round="2"),
        ["r/checkpoint.pt: round: expected an integer", "got '2'"],
    ),
    (
        "t-resume-round-past-metrics",
        ["train", *RUN_R, "--rounds", "100", "--out", "r", "--resume"],
        edit_state("r/checkpoint.pt", round=50),
        ["r/checkpoint.pt: round 50", "metrics.jsonl holds rounds 1..2"],
    ),
    (
        "t-resume-models-shape",
        RESUME,
        edit_state("r/checkpoint.pt", models=torch.zeros(2, 10)),
        [
            "r/checkpoint.pt: models: expected a float tensor of shape (2, ",
            "got a float32 tensor of shape (2, 10)",
        ],
    ),
    (
        "t-resume-models-nan",
        RESUME,
        edit_state("r/checkpoint.pt", models=lambda s: s["models"] * float("nan")),
        ["r/checkpoint.pt: models: holds NaN"],
    ),
    (
        "t-resume-omega-shape",
        RESUME,
        edit_state(
            "r/checkpoint.pt", algorithm=lambda s: {**s["algorithm"], "omega": torch.ones(3, 5)}
        ),
        ["r/checkpoint.pt: algorithm.omega: expected a float tensor of shape (", "(3, 5)"],
    ),
    (
        "t-resume-omega-history",
        RESUME,
        edit_state("r/checkpoint.pt", omega_history=nan_first("omega_history")),
        ["r/checkpoint.pt: omega_history[0]: holds NaN"],
    ),
    (
        "t-resume-eval-rounds",
        RESUME,
        edit_state("r/checkpoint.pt", eval_rounds=[2, 1]),
        ["r/checkpoint.pt: eval_rounds: expected increasing rounds in [1, 2]"],
    ),
    (
        "t-resume-history-count",
        RESUME,
        edit_state("r/checkpoint.pt", omega_history=lambda s: s["omega_history"][:1]),
        ["r/checkpoint.pt: omega_history", "each of the 2 evaluated rounds, got 1"],
    ),
    (
        "t-resume-algorithm-key",
        RESUME,
        edit_state("r/checkpoint.pt", algorithm=lambda s: {**s["algorithm"], "evil": 1}),
        ["r/checkpoint.pt: algorithm: unknown keys ['evil']"],
    ),
    (
        "t-resume-algorithm-missing",
        RESUME,
        edit_state("r/checkpoint.pt", algorithm=without("noise_state")),
        ["r/checkpoint.pt: algorithm.noise_state: missing"],
    ),
    (
        "t-resume-algorithm-dtype",
        RESUME,
        edit_state("r/checkpoint.pt", algorithm=retyped("noise_state", torch.int64)),
        ["r/checkpoint.pt: algorithm.noise_state: expected a uint8 tensor", "int64"],
    ),
    (
        "e-algorithm-missing",
        ["eval", "--run", "r"],
        edit_state("r/model.pt", algorithm=without("adam")),
        ["r/model.pt: algorithm.adam: missing"],
    ),
    (
        "e-algorithm-dtype",
        ["eval", "--run", "r"],
        edit_state("r/model.pt", algorithm=retyped("active", torch.int64)),
        ["r/model.pt: algorithm.active: expected a bool tensor", "int64"],
    ),
    (
        "t-resume-rng",
        RESUME,
        edit_state("r/checkpoint.pt", rng=torch.zeros(3, dtype=torch.uint8)),
        ["r/checkpoint.pt: rng"],
    ),
    ("t-resume-truncated", RESUME, truncate("r/checkpoint.pt", 500), ["checkpoint.pt", "damaged"]),
    (
        "t-resume-metrics",
        RESUME,
        write("r/metrics.jsonl", '{"round": 1\n{"round": 2}\n'),
        ["metrics.jsonl", "line 1"],
    ),
    # metrics.jsonl, eval.json and eval_clients.json edited by hand: every reader refuses them
    *[
        (
            f"{command[0]}-metrics-{name}",
            command,
            mutate,
            ["r/metrics.jsonl: line ", culprit],
        )
        for command in (["eval", "--run", "r"], ["plot", "--run", "r"], ["report", "r"])
        for name, mutate, culprit in (
            ("text", set_field("r/metrics.jsonl", "global_accuracy", "x"), "global_accuracy"),
            ("null", set_field("r/metrics.jsonl", "train_accuracy", None), "train_accuracy"),
            ("gap", edit_lines("r/metrics.jsonl", lambda rows: rows[1:]), "round 2, expected 1"),
            (
                "score",
                set_field("r/metrics.jsonl", "global_accuracy_by_concept", [0.5]),
                "global_accuracy_by_concept: expected numbers by concept",
            ),
        )
    ],
    (
        "rep-eval-text",
        ["report", "r", "--out", "rep"],
        set_field("r/eval.json", "global_accuracy", "x"),
        ["r/eval.json: global_accuracy: expected a number, got str 'x'"],
    ),
    (
        "rep-eval-finetune",
        ["report", "r", "--out", "rep"],
        set_field("r/eval.json", "finetune", "no"),
        ["r/eval.json: finetune: expected true or false"],
    ),
    (
        "rep-eval-clients",
        ["report", "r", "--out", "rep"],
        write("r/eval_clients.json", "{}"),
        ["r/eval_clients.json: expected a list of one entry per client"],
    ),
    (
        "rep-eval-clients-omega",
        ["report", "r", "--out", "rep"],
        write("r/eval_clients.json", '[{"client_id": 0, "train_accuracy": 1, "test_accuracy": 1}]'),
        ["r/eval_clients.json: [0].omega: expected a list of numbers"],
    ),
    # eval
    ("e-no-run", ["eval", "--run", "nowhere"], nothing, ["config.json"]),
    ("e-run-too-long", ["eval", "--run", LONG], nothing, ["--run: xxx", "too long"]),
    ("pl-run-too-long", ["plot", "--run", LONG], nothing, ["--run: xxx", "too long"]),
    ("e-config", ["eval", "--run", "r"], truncate("r/config.json", 20), ["r/config.json"]),
    ("e-config-value", ["eval", "--run", "r"], edit_config(lr=-1.0), ["r/config.json", "train.lr"]),
    ("e-model-missing", ["eval", "--run", "r"], remove("r/model.pt"), ["model.pt", "not found"]),
    (
        "e-model-pickle",
        ["eval", "--run", "r"],
        crafted_pickle("r/model.pt"),
        ["model.pt", "refused"],
    ),
    (
        "e-model-flipped",
        ["eval", "--run", "r"],
        flip_byte("r/model.pt"),
        ["r/model.pt: damaged", "SHA-256 does not match"],
    ),
    ("e-model-unsealed", ["eval", "--run", "r"], unsealed("r/model.pt"), ["model.pt", "seal"]),
    (
        "e-model-shape",
        ["eval", "--run", "r"],
        edit_state("r/model.pt", models=torch.zeros(2, 10)),
        ["r/model.pt: models: expected a float tensor of shape (2, ", "(2, 10)"],
    ),
    (
        "e-model-omega",
        ["eval", "--run", "r"],
        edit_state("r/model.pt", omega=lambda s: s["omega"][:, :1]),
        ["r/model.pt: omega: expected a float tensor of shape (", "clients × K"],
    ),
    (
        "e-model-omega-nan",
        ["eval", "--run", "r"],
        edit_state("r/model.pt", omega=lambda s: s["omega"] * float("nan")),
        ["r/model.pt: omega: holds NaN"],
    ),
    (
        "e-model-round",
        ["eval", "--run", "r"],
        edit_state("r/model.pt", round=99),
        ["r/model.pt: round: expected an integer in [0, 2]", "got 99"],
    ),
    (
        "e-model-other-alg",
        ["eval", "--run", "r"],
        lambda root: shutil.copy(root / "r2/model.pt", root / "r/model.pt"),
        ["model.pt", "algorithm 'fedavg' there, 'fedrc' here"],
    ),
    ("e-model-digest", ["eval", "--run", "r"], edit_config(data="d2"), ["model.pt", "other data"]),
    (  # eval.json would take its best-train round from rounds the model has not seen
        "e-extended-unfinished",
        ["eval", "--run", "r"],
        extended_unfinished,
        [
            "r/model.pt: holds round 2, but r/metrics.jsonl runs to round 3",
            "the run was extended and has not finished",
            "`fedrc train --resume`",
        ],
    ),
    (
        "e-model-newer",
        ["eval", "--run", "r"],
        edit_state("r/model.pt", format=7),
        ["model.pt", "newer"],
    ),
    (
        "e-metrics-torn",
        ["eval", "--run", "r"],
        write("r/metrics.jsonl", TORN),
        ["metrics.jsonl", "line 2"],
    ),
    (
        "e-unknown-key",
        ["eval", "--params", "p.yaml"],
        write("p.yaml", "eval:\n  hardd: true\n"),
        ["eval.hardd", "unknown key"],
    ),
    # plot
    ("pl-dpi", ["plot", "--run", "r", "--dpi", "1"], nothing, ["plot.dpi", "[20, 600]"]),
    ("pl-no-run", ["plot", "--run", "nowhere"], nothing, ["config.json"]),
    (
        "pl-assignments",
        ["plot", "--run", "r"],
        truncate("r/assignments.parquet"),
        ["assignments.parquet", "corrupt"],
    ),
    (
        "pl-no-assignments",
        ["plot", "--run", "r"],
        remove("r/assignments.parquet"),
        ["assignments.parquet"],
    ),
    (
        "pl-metrics-mid",
        ["plot", "--run", "r"],
        write("r/metrics.jsonl", "garbage\n{}\n"),
        ["metrics.jsonl", "line 1"],
    ),
    ("pl-manifest", ["plot", "--run", "r"], remove("d/manifest.json"), ["manifest.json"]),
    (  # as eval refuses it
        "pl-repartitioned",
        ["plot", "--run", "r"],
        repartitioned,
        ["r/config.json: trained on other data than d", "partitioned again or edited since"],
    ),
    (
        "rep-repartitioned",
        ["report", "r", "--out", "rep"],
        repartitioned,
        ["r: the benchmark it was trained on, ", "changed since (partitioned again or edited"],
    ),
    (
        "pl-manifest-edited",
        ["plot", "--run", "r"],
        edit_manifest(swap_sizes, seal=False),
        ["d/manifest.json: content_hash does not match"],
    ),
    (
        "e-manifest-edited",
        ["eval", "--run", "r"],
        edit_manifest(lambda m: m.update(concepts=m["concepts"][::-1]), seal=False),
        ["d/manifest.json: content_hash does not match"],
    ),
]


@pytest.mark.parametrize(
    ("args", "mutate", "culprits"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_line_and_leaves_outputs_alone(here: Path, args, mutate, culprits) -> None:
    mutate(here)
    before = snapshot(here)
    assert_one_line(invoke(*args), *culprits)
    assert snapshot(here) == before  # nothing written, nothing left half-written
    assert not (here / "PWNED").exists()


@pytest.mark.parametrize("name", ["checkpoint.pt", "model.pt"])
def test_crafted_pickle_never_runs(here: Path, name: str) -> None:
    marker = here / "PWNED"
    (here / "r" / name).write_bytes(pickle.dumps({"format": 1, "x": Evil(marker)}))  # plain pickle
    args = RESUME if name == "checkpoint.pt" else ["eval", "--run", "r"]
    assert_one_line(invoke(*args), name, "refused", code=2)
    assert not marker.exists()


def test_a_model_that_does_not_fit_the_images_is_one_line(here: Path) -> None:
    """The CNN's two 5×5 convolutions need more than 8×8 pixels: refused before training."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in range(4):
        folder = here / "tree8" / f"c{label}"
        folder.mkdir(parents=True)
        for i in range(40):
            pixels = rng.integers(0, 255, (8, 8), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    tiny = dict(clients=4, samples_per_client=30, holdout_samples=10, concepts=["identity"])
    partition_stage(PartitionConfig(dataset="folder", data_root="tree8", out="d8", **tiny))
    before = snapshot(here)
    result = invoke("train", "--data", "d8", "--device", "cpu", "--rounds", "1", "--out", "r8")
    assert_one_line(result, "train.model: cnn does not fit 8×8 images with 1 channel(s)", code=2)
    assert snapshot(here) == before  # no run folder


def test_the_model_check_leaves_no_trace() -> None:
    """The forward pass that checks a model against the image size draws no random number
    and leaves every module in the mode it was built in: the numbers do not change."""
    torch.manual_seed(0)
    checked = build_model((16, 16, 1), 10, "cnn")
    after_checked = torch.get_rng_state()
    torch.manual_seed(0)
    cnn = MODELS.get("cnn")
    plain = cnn.build((16, 16, 1), 10, cnn.settings())
    assert torch.equal(after_checked, torch.get_rng_state())
    for a, b in zip(checked.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)
    assert all(module.training for module in checked.modules())


def test_cached_logits_are_checked_in_one_process_only(here: Path) -> None:
    """Under torchrun a place holds its own clients' rows: a checkpoint's cached logits (of
    every row, written by one process) are not used there, so their shape is not checked."""
    from pipeline.data.shards import load_federated
    from pipeline.places.communicate import Communicator
    from pipeline.run.checkpoints import expected_state
    from pipeline.run.training import build_run
    from pipeline.stages import run_config

    data = load_federated(Path("d"))
    run = build_run(run_config(Path("r")), data, Communicator(torch.device("cpu")))
    rows = run.models.shape[0]
    assert expected_state(run, Path("r")).logits == (rows, data.labels.numel(), data.num_classes)

    class TwoPlaces(Communicator):
        size = 2

    run.comm = TwoPlaces(torch.device("cpu"))
    assert expected_state(run, Path("r")).logits is None


def test_files_from_before_seals_load_as_before(here: Path) -> None:
    """checkpoint.pt and model.pt without a seal (older fedrc) are read as they were; a sealed
    file is still a plain torch archive that torch.load reads without fedrc."""
    before = Path("r/eval.json").read_text()
    legacy("r/model.pt")(here)
    legacy("r/checkpoint.pt")(here)
    assert not rf.check_seal(Path("r/model.pt")) and not rf.check_seal(Path("r/checkpoint.pt"))
    result = invoke("eval", "--run", "r")
    assert result.exit_code == 0, result.output
    assert Path("r/eval.json").read_text() == before
    result = invoke(*RESUME)
    assert result.exit_code == 0, result.output
    assert [r["round"] for r in rf.read_metrics(Path("r/metrics.jsonl"))] == [1, 2, 3]
    assert rf.check_seal(Path("r/model.pt")) and rf.check_seal(Path("r/checkpoint.pt"))
    state = torch.load("r/model.pt", weights_only=True)
    assert state["round"] == 3 and state["checksum"] == "sha256"


def test_diverging_training_keeps_the_last_good_checkpoint(here: Path) -> None:
    args = ["train", *RUN_R, "--algorithm", "fedavg", "--rounds", "4", "--out", "nan"]
    line = assert_one_line(invoke(*args, "--lr", "1e6"), "round 1", "client", "--lr", code=2)
    assert "diverged" in line and not Path("nan/checkpoint.pt").exists()
    line = assert_one_line(invoke(*args, "--lr", "3", "--overwrite"), "client", "--lr", code=2)
    failed = int(line.split("round ")[1].split(",")[0])
    assert failed >= 2  # lr 3 survives round 1 on this data
    state = rf.load_state(Path("nan/checkpoint.pt"))  # intact and loadable: resumable
    assert state["round"] == failed - 1 and torch.isfinite(state["models"]).all()
    assert not Path("nan/model.pt").exists()


def test_non_finite_evaluation_names_the_round(here: Path, monkeypatch) -> None:
    import pipeline.run.clients as clients
    import pipeline.run.training as training

    real, real_raw = training.evaluate_round, clients.all_logits

    def nan_logits(*args):
        scores, logits = real(*args)
        return scores, torch.full_like(logits, float("nan"))

    def nan_raw(*args):  # an algorithm with a client part scores where its data is
        return torch.full_like(real_raw(*args), float("nan"))

    monkeypatch.setattr(training, "evaluate_round", nan_logits)
    monkeypatch.setattr(clients, "all_logits", nan_raw)
    line = assert_one_line(invoke("train", *RUN_R, "--rounds", "2", "--out", "x"), code=2)
    assert "round 1: evaluation: non-finite logits" in line
    monkeypatch.undo()
    monkeypatch.chdir(here)

    # model.pt with NaN weights: eval refuses it and leaves eval.json as it was
    state = rf.load_state(Path("r/model.pt"))
    state["models"] = torch.full_like(state["models"], float("nan"))
    rf.save_state(Path("r/model.pt"), state)
    before = Path("r/eval.json").read_bytes()
    assert_one_line(invoke("eval", "--run", "r"), "model.pt: round 2", "non-finite", code=2)
    assert Path("r/eval.json").read_bytes() == before
    with pytest.raises(FedrcError, match=r"non-finite global_accuracy_by_concept\.shift"):
        require_finite("x", {"global_accuracy_by_concept": {"shift": float("nan")}}, None)


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_names_the_file_and_leaves_no_partial_output(here: Path, monkeypatch) -> None:
    import pipeline.data.shards as shards

    before = snapshot(here)
    with monkeypatch.context() as m:
        m.setattr(shards.pq, "write_table", enospc)
        line = assert_one_line(invoke("partition", *options(PART), "--out", "fresh"), code=1)
    assert "fresh/shards/client-00000.parquet: no space left" in line and "--out" in line
    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", enospc)
        line = assert_one_line(invoke("eval", "--run", "r"), code=1)
    assert "eval" in line and "no space left" in line
    assert snapshot(here) == before  # no folder, no temporary files, eval.json unchanged

    calls = {"n": 0}
    real = Path.write_bytes

    def second_checkpoint_fails(self, data):
        if self.name.startswith(".checkpoint.pt.tmp"):
            calls["n"] += 1
            if calls["n"] == 2:
                enospc()
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", second_checkpoint_fails)
    line = assert_one_line(invoke("train", *RUN_R, "--rounds", "3", "--out", "full"), code=1)
    assert "full/checkpoint.pt: no space left" in line
    assert rf.load_state(Path("full/checkpoint.pt"))["round"] == 1  # the previous one, intact
    assert not [p for p in Path("full").iterdir() if p.name.startswith(".")]


def test_out_of_gpu_memory_names_the_options(here: Path, monkeypatch) -> None:
    import pipeline.run.training as training

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(training, "train_round", oom)
    line = assert_one_line(invoke("train", *RUN_R, "--out", "x"), "out of GPU memory", code=1)
    assert "--batch-size" in line and "--device cpu" in line


def test_ctrl_c_says_where_it_stopped_and_how_to_resume(here: Path, monkeypatch) -> None:
    import pipeline.run.training as training

    real = training.train_round

    def ctrl_c_in_round_5(round_, *args):
        if round_ == 5:
            raise KeyboardInterrupt
        return real(round_, *args)

    monkeypatch.setattr(training, "train_round", ctrl_c_in_round_5)
    args = ["train", *RUN_R, "--rounds", "6", "--checkpoint-every", "3", "--out", "c"]
    line = assert_one_line(invoke(*args), "interrupted after round 4", code=130)
    assert "last checkpoint: round 3" in line and "fedrc train --out c --resume" in line
    assert rf.load_state(Path("c/checkpoint.pt"))["round"] == 3
    assert len(Path("c/metrics.jsonl").read_text().splitlines()) == 4
    monkeypatch.setattr(training, "train_round", real)
    assert invoke(*args, "--resume").exit_code == 0
    assert [r["round"] for r in read_rows(Path("c/metrics.jsonl"))] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("command", ["partition", "eval", "plot"])
def test_sigterm_in_any_stage_is_one_line_and_exit_143(here: Path, monkeypatch, command) -> None:
    from pipeline import stages as module  # the commands import it when they run

    stage = {"partition": "partition_stage", "eval": "eval_stage", "plot": "plot_stage"}[command]
    real = getattr(module, stage)

    def killed_midway(config, **options):
        real(config, **options)  # writes its output (atomically) ...
        os.kill(os.getpid(), signal.SIGTERM)  # ... and a scheduler stops the job before exit

    monkeypatch.setattr(module, stage, killed_midway)
    previous = signal.getsignal(signal.SIGTERM)
    tiny = ["--dataset", "synthetic", "--clients", "4", "--samples-per-client", "20"]
    args = {"partition": [*tiny, "--holdout-samples", "20", "--out", "fresh"]}
    line = assert_one_line(invoke(command, *args.get(command, ["--run", "r"])), code=143)
    assert "terminated (SIGTERM)" in line
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler is put back


def test_metrics_torn_tail_only_tolerated_on_resume(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(TORN)
    assert [r["round"] for r in rf.read_metrics(path, torn_tail_ok=True)] == [1]
    with pytest.raises(FedrcError, match="line 2"):
        rf.read_metrics(path)
    path.write_text('{"round": 1, "train_lo\n{"round": 2}\n')  # torn, then more: not a crash
    with pytest.raises(FedrcError, match="line 1"):
        rf.read_metrics(path, torn_tail_ok=True)
    rf.truncate_metrics(path.with_name("none.jsonl"), 3)  # no file: nothing to do


DERIVED = ("eval.json", "eval_clients.json", "plots")


def test_derived_outputs_name_what_they_were_made_from(here: Path) -> None:
    """eval.json and plots/ record the model.pt they describe (its SHA-256), the round and
    the benchmark; eval.json also its eval_clients.json's SHA-256, plots/ its figures."""
    digest = json.loads(Path("r/config.json").read_text())["data_digest"]
    model = state_digest(rf.load_state(here / "r/model.pt"))
    wanted = {"model_digest": model, "round": 2, "data_digest": digest}
    clients = hashlib.sha256(Path("r/eval_clients.json").read_bytes()).hexdigest()
    made = json.loads(Path("r/eval.json").read_text())["made_from"]
    assert made == {**wanted, "clients_digest": clients}
    drawn = json.loads(Path("r/plots/made_from.json").read_text())
    figures = sorted(p.name for p in Path("r/plots").iterdir() if p.suffix == ".png")
    assert drawn == {**wanted, "assignments_round": 2, "files": figures}


@pytest.mark.parametrize("how", ["--overwrite", "--resume"])
def test_a_new_or_extended_run_leaves_nothing_stale(here: Path, how: str) -> None:
    """`train --overwrite` removes what eval and plot made of the old run; so does a
    `--resume` that trains more rounds. `fedrc report` then asks for eval again."""
    assert all((here / "r" / name).exists() for name in DERIVED)
    result = invoke("train", *RUN_R, "--rounds", "3", "--out", "r", how)
    assert result.exit_code == 0, result.output
    assert [name for name in DERIVED if (here / "r" / name).exists()] == []
    assert_one_line(invoke("report", "r", "--out", "rep"), "r: no eval.json", code=2)


def test_report_refuses_an_eval_json_of_another_model(here: Path) -> None:
    """An eval.json kept from before a retraining (or copied from another run) no longer
    matches the run's model.pt: `fedrc report` refuses it in one line instead of showing the
    old run's numbers under the new run's name."""
    old = Path("r/eval.json").read_text()
    assert invoke("report", "r", "--out", "rep").exit_code == 0
    result = invoke("train", *RUN_R, "--rounds", "2", "--seed", "1", "--out", "r", "--overwrite")
    assert result.exit_code == 0, result.output
    Path("r/eval.json").write_text(old)
    before = snapshot(here)
    line = assert_one_line(invoke("report", "r", "--out", "rep2"), code=2)
    assert f"{here}/r/eval.json: scored another model (digest " in line, line
    assert line.endswith(f"run `fedrc eval --run {here}/r` again"), line
    assert snapshot(here) == before
    recorded = json.loads(old)
    del recorded["made_from"]  # an eval.json from before fedrc recorded it
    Path("r/eval.json").write_text(json.dumps(recorded))
    line = assert_one_line(invoke("report", "r", "--out", "rep2"), code=2)
    assert "r/eval.json: does not record the model.pt it scored" in line, line
    assert invoke("eval", "--run", "r").exit_code == 0
    assert invoke("report", "r", "--out", "rep2").exit_code == 0
    with open("rep2/report.csv") as f:
        assert model_digest(here / "r")[:12] in f.read()  # the report names what it read


def test_report_refuses_an_eval_json_behind_its_metrics(here: Path) -> None:
    extended_unfinished(here)
    line = assert_one_line(invoke("report", "r", "--out", "rep"), code=2)
    assert (
        f"{here}/r/eval.json: made at round 2, but {here}/r/metrics.jsonl runs to round 3" in line
    )


def test_checkpoint_every_does_not_change_identity() -> None:
    a, b = make_config(checkpoint_every=1), make_config(checkpoint_every=5)
    assert a.identity() == b.identity() and "checkpoint_every" not in a.identity()


def test_atomic_files_rename_all_or_none(tmp_path: Path) -> None:
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text("old one")
    with pytest.raises(RuntimeError), atomic_files(one, two) as (a, b):
        b.write_text("new two")
        a.write_text("new one")
        raise RuntimeError("interrupted between the two files")
    assert one.read_text() == "old one" and not two.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.json"]


# ---- interrupted training, as a real process ------------------------------------------------

# Rounds to spare: on a loaded machine the child runs several rounds past the line the test
# waits for before the signal lands, and it must still be mid-run when it does.
KILL_ROUNDS = dict(rounds=16, checkpoint_every=2, eval_every=3)
LAST = KILL_ROUNDS["rounds"]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedrc_cli", *[str(a) for a in args]]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "400"}


def read_rows(path: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if k != "seconds"}
        for line in path.read_text().splitlines()
    ]


def start(root: Path, *extra: str) -> subprocess.Popen:
    args = cli("train", *RUN_R, *options(KILL_ROUNDS), "--out", "part", *extra)
    return subprocess.Popen(
        args, cwd=root, env=child_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def stop_after(proc: subprocess.Popen, metrics: Path, lines: int, sig: signal.Signals) -> str:
    """Send `sig` once metrics.jsonl has `lines` lines; the child's stderr."""
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= lines):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(sig)
    return proc.communicate(timeout=60)[1]


def test_terminated_then_killed_training_resumes_to_identical_numbers(here: Path) -> None:
    """SIGTERM, --resume, SIGKILL (plus a torn metrics line), --resume: the same numbers and
    the same model.pt, bit for bit, as one uninterrupted run."""
    metrics = here / "part" / "metrics.jsonl"
    err = stop_after(start(here), metrics, 3, signal.SIGTERM)
    saved = rf.load_state(here / "part" / "checkpoint.pt")["round"]  # intact
    assert saved in range(2, LAST, 2), saved
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("Error: terminated (SIGTERM) after round"), lines[0]
    assert f"last checkpoint: round {saved};" in lines[0] and "--resume" in lines[0], lines[0]

    proc = start(here, "--resume")
    stop_after(proc, metrics, saved + 3, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    killed_at = rf.load_state(here / "part" / "checkpoint.pt")["round"]
    assert saved < killed_at < LAST
    with metrics.open("a") as f:  # what a kill in the middle of a write leaves behind
        f.write('{"round": 99, "train_lo')

    proc = start(here, "--resume")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.count("round ") == LAST - killed_at and f"round {killed_at + 1}/{LAST}" in out

    # the reference: the same run, uninterrupted, in this process with the child's threads
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = train_stage(
            make_config(data="d", algorithm="fedrc", out="ref", **{**TRAIN, **KILL_ROUNDS})
        )
    finally:
        torch.set_num_threads(threads)
    assert read_rows(here / "part" / "metrics.jsonl") == read_rows(ref / "metrics.jsonl")
    ours, theirs = rf.load_state(here / "part" / "model.pt"), rf.load_state(ref / "model.pt")
    for key in ("models", "omega"):
        assert torch.equal(ours[key], theirs[key]), key


def limited(size: int) -> Callable[[], None]:
    """`ulimit -f` for a child: a write past `size` bytes fails with EFBIG (Python ignores the
    SIGXFSZ that would otherwise kill it)."""
    import resource

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))

    return apply


FILE_SIZE_CASES = {  # command, the file-size limit in bytes, the file it stops at
    "partition": (["partition", *options(PART), "--out", "big"], 8_000, "big/shards/client-"),
    "train": (["train", *RUN_R, "--rounds", "2", "--out", "big"], 100_000, "big/checkpoint.pt"),
    "eval": (["eval", "--run", "r"], 1, "r/eval"),
    "plot": (["plot", "--run", "r", "--dpi", "30"], 1, "r/plots/cluster_map.png"),
    "report": (["report", "r", "--out", "big/today"], 1, "big/today/"),
}


@pytest.mark.parametrize("command", list(FILE_SIZE_CASES))
def test_a_file_size_limit_names_the_file_and_leaves_outputs_alone(here: Path, command) -> None:
    args, size, culprit = FILE_SIZE_CASES[command]
    before = snapshot(here)
    proc = subprocess.run(
        cli(*args),
        cwd=here,
        env=child_env(),
        capture_output=True,
        text=True,
        preexec_fn=limited(size),
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"Error: {culprit}"), lines[0]
    assert "file too large for the file-size limit" in lines[0], lines[0]
    after = snapshot(here)
    if command == "train":  # stopped before its first checkpoint: restartable, nothing torn
        assert {k for k in after if k not in before and k.startswith("big/.")} == set()
        after = {k: v for k, v in after.items() if not k.startswith("big")}
    assert after == before
