"""The tabular drift streams (SINE, CIRCLE, SEA, STAGGER, Agrawal, Hyperplane) and the mlp model:
each concept's rule on hand-checked points, determinism, labels computed from the stored
(quantised) features, and the streams through `fedrc partition` and `fedrc train`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.config import PartitionConfig
from pipeline.data.loaders import BUILT_IN, DATASETS, load_dataset
from pipeline.data.loaders.streams import (
    N_TEST,
    N_TRAIN,
    SEA_THRESHOLDS,
    STREAMS,
    hyperplane_weights,
    load_stream,
)
from pipeline.data.shards import load_federated
from pipeline.models import MODELS, build_model
from pipeline.run.resolve import train_config
from pipeline.stages import partition_stage

NAMES = tuple(STREAMS)
CONCEPTS = {"sine": 4, "circle": 2, "sea": 4, "stagger": 3, "agrawal": 10, "hyperplane": 4}


def labels(stream: str, points: list[list[float]]) -> list[list[int]]:
    """Each point's label under every concept: points stored as the dataset stores them."""
    spec = STREAMS[stream]
    samples = spec.encode(np.array(points, dtype=np.float64))
    rules = load_stream(stream).label_rules
    return [[int(rule(samples)[j]) for rule in rules] for j in range(len(points))]


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


# ---- the rules, by hand ---------------------------------------------------------------------


def test_sine_concepts_are_below_the_curve_sine2_and_their_flips() -> None:
    """(0.5, 0.1): 0.1 ≤ sin 0.5 = 0.48 and 0.1 < 0.5 + 0.3 sin(1.5π) = 0.2; (0.5, 0.9): above
    both curves; (0.1, 0.45): above sin 0.1 = 0.10, below 0.5 + 0.3 sin(0.3π) = 0.74."""
    assert labels("sine", [[0.5, 0.1], [0.5, 0.9], [0.1, 0.45]]) == [
        [1, 0, 1, 0],
        [0, 1, 0, 1],
        [0, 1, 1, 0],
    ]


def test_circle_concepts_are_outside_their_circle() -> None:
    """Centre (0.2, 0.5) r 0.15, then (0.6, 0.5) r 0.25: each centre is inside its own circle
    only; a corner is outside both."""
    assert labels("circle", [[0.2, 0.5], [0.6, 0.5], [0.95, 0.05]]) == [[0, 1], [1, 0], [1, 1]]


def test_sea_concepts_are_thresholds_on_the_first_two_features() -> None:
    """f1 + f2 ≈ 8.5 exceeds θ = 8 and 7, not 9 or 9.5; f3 plays no part."""
    assert SEA_THRESHOLDS == (8.0, 9.0, 7.0, 9.5)
    got = labels("sea", [[4.25, 4.25, 0.0], [4.25, 4.25, 10.0], [1.0, 1.0, 9.0], [5.0, 4.9, 0]])
    assert got == [[1, 0, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]]


def test_stagger_concepts() -> None:
    """(size, colour, shape), 0 = small / red / circle, 1 = medium / blue / square, 2 = large /
    green / triangle. Concepts: small and red; green or circle; medium or large."""
    assert labels("stagger", [[0, 0, 1], [2, 2, 2], [1, 1, 0], [0, 1, 1]]) == [
        [1, 0, 0],
        [0, 1, 1],
        [0, 1, 1],
        [0, 0, 0],
    ]


def test_agrawal_functions_follow_the_paper() -> None:
    """Columns: salary, commission, age, elevel, car, zipcode, hvalue, hyears, loan.

    Point 1, age 30: in every group A. Point 2, age 65, salary 90K, loan 450K, elevel 4: F1, F3,
    F4 (elevel 2..4 → salary 50–100K), F8 (60K − 20K − 20K > 0) and F10 (no equity, 30K > 0).
    Point 3, age 30, salary 120K, loan 250K: F5 holds as the paper writes it (salary outside
    50–100K → loan in 200–400K; MOA's and river's version tests salary there), F7 (80K − 50K −
    20K), F8, F9 (80K − 15K − 50K − 10K) and F10."""
    k = 1_000
    points = [
        [60 * k, 20 * k, 30, 1, 5, 3, 300 * k, 25, 150 * k],
        [90 * k, 0, 65, 4, 1, 5, 200 * k, 10, 450 * k],
        [120 * k, 0, 30, 3, 20, 0, 1_000 * k, 30, 250 * k],
    ]
    assert labels("agrawal", points) == [
        [1] * 10,
        [1, 0, 1, 1, 0, 0, 0, 1, 0, 1],
        [1, 0, 0, 0, 1, 0, 1, 1, 1, 1],
    ]


def test_hyperplane_concepts_are_seeded_half_spaces() -> None:
    """x = 1 gives w·x = Σw ≥ Σw/2, x = 0 gives 0 < Σw/2 under every concept; the concepts'
    weight vectors differ, and so do their labels on a good share of the pool."""
    assert labels("hyperplane", [[1.0] * 10, [0.0] * 10]) == [[1] * 4, [0] * 4]
    weights = [hyperplane_weights(k) for k in range(4)]
    assert all(not np.allclose(weights[0], w) for w in weights[1:])
    raw = load_stream("hyperplane")
    first = raw.label_rules[0](raw.train_images)
    for rule in raw.label_rules[1:]:
        assert (rule(raw.train_images) != first).mean() > 0.1


# ---- the pools --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_a_stream_is_the_same_on_every_load_and_labelled_from_its_stored_features(
    name: str,
) -> None:
    a, b = load_dataset(name, None), load_dataset(name, None)
    d = len(STREAMS[name].features)
    assert a.train_images.shape == (N_TRAIN, 1, d, 1) and a.test_images.shape == (N_TEST, 1, d, 1)
    assert a.train_images.dtype == np.uint8 and a.num_classes == 2
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert len(a.label_rules) == CONCEPTS[name]
    # labels are concept 0's rule on the stored bytes, and storing the decoded values again
    # gives the same bytes: what the rules see is exactly what a model sees
    spec = STREAMS[name]
    assert np.array_equal(a.train_labels, a.label_rules[0](a.train_images))
    assert np.array_equal(a.test_labels, a.label_rules[0](a.test_images))
    assert np.array_equal(spec.encode(spec.decode(a.train_images)), a.train_images)
    for rule in a.label_rules:
        share = rule(a.train_images).mean()
        assert 0 < share < 1  # both classes under every concept
    assert np.array_equal(
        a.label_rules[1](a.train_images[:5]), b.label_rules[1](b.train_images[:5])
    )


def test_the_pools_match_the_definitions() -> None:
    """P(y = 1) of the pools against the closed forms: SINE 1 − cos 1 below the curve, CIRCLE
    1 − πr², SEA 1 − θ²/200 (θ ≤ 10); integer attributes decode to whole numbers."""
    sine, circle, sea = (load_stream(n) for n in ("sine", "circle", "sea"))
    assert sine.train_labels.mean() == pytest.approx(1 - math.cos(1), abs=0.01)
    for rule, r in zip(circle.label_rules, (0.15, 0.25)):
        assert rule(circle.train_images).mean() == pytest.approx(1 - math.pi * r**2, abs=0.01)
    for rule, theta in zip(sea.label_rules, SEA_THRESHOLDS):
        assert rule(sea.train_images).mean() == pytest.approx(1 - theta**2 / 200, abs=0.01)
    agrawal = STREAMS["agrawal"]
    values = agrawal.decode(load_stream("agrawal").train_images)
    for j, feature in enumerate(agrawal.features):
        if feature.integer:
            assert np.array_equal(values[:, j], np.round(values[:, j]))
            assert values[:, j].min() == feature.low and values[:, j].max() == feature.high


def test_every_stream_is_listed_tabular_with_a_summary() -> None:
    for name in NAMES:
        spec = DATASETS.get(name)
        assert spec is BUILT_IN[name] and spec.tabular and spec.num_classes == 2
        assert spec.summary and "\n" not in spec.summary
    assert "mlp" in MODELS.names()
    listing = CliRunner().invoke(app, ["info"], terminal_width=400).output
    for name in (*NAMES, "mlp"):
        assert f" {name} " in listing


# ---- the mlp model ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 2, 1), (1, 9, 1), (8, 8, 1), (32, 32, 3)])
def test_mlp_takes_any_shape_with_fedrifts_width(shape: tuple[int, int, int]) -> None:
    model = build_model(shape, 2, "mlp")
    inputs = int(np.prod(shape))
    assert model[1].in_features == inputs and model[1].out_features == 2 * inputs  # fnn
    x = torch.zeros(5, shape[2], shape[0], shape[1])  # (N, C, H, W), as the executors give it
    assert model(x).shape == (5, 2)


def test_cnn_on_a_stream_is_a_one_line_error(tmp_path: Path) -> None:
    partition_stage(PartitionConfig(**tiny("sine"), out=str(tmp_path / "d")))
    args = ["train", "--data", str(tmp_path / "d"), "--device", "cpu", "--model", "cnn"]
    result = CliRunner().invoke(app, args)
    assert_one_line_error(result, "train.model: cnn does not fit 1×2 images")
    assert "mlp takes any shape" in result.output


def test_a_stream_trains_the_mlp_and_takes_its_shifts_when_none_are_named(tmp_path: Path) -> None:
    """Issue 39: `--model mlp` and `--shifts label,concept` need not be typed for a stream."""
    values = {k: v for k, v in tiny("sine").items() if k != "shifts"}
    config = PartitionConfig(**values, out=str(tmp_path / "d"))
    assert config.shifts == ["label", "concept"]  # no feature shift for a tabular dataset
    partition_stage(config)
    assert train_config({}, {"data": str(tmp_path / "d")}).model == "mlp"
    assert train_config({}, {"data": str(tmp_path / "d"), "model": "cnn"}).model == "cnn"
    assert train_config({}, {"data": str(tmp_path / "nothing")}).model == "cnn"


# ---- through the CLI --------------------------------------------------------------------------


def tiny(name: str, **extra) -> dict:
    """A small static benchmark of concepts native:0 and native:1."""
    return {
        "dataset": name, "clients": 6, "samples_per_client": 40, "holdout_samples": 60,
        "shifts": ["label", "concept"], "concepts": ["native:0", "native:1"], **extra,
    }  # fmt: skip


def assert_one_line_error(result, culprit: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Error" in lines[0] and culprit in lines[0], result.output


@pytest.mark.parametrize("name", ["sine", "circle", "sea"])
def test_a_stream_runs_partition_train_eval(name: str) -> None:
    def invoke(*args: str) -> None:
        result = CliRunner().invoke(app, list(args))
        assert result.exit_code == 0, result.output

    invoke(
        "partition", "--dataset", name, "--concepts", "native:0,native:1", "--shifts",
        "label,concept", "--clients", "6", "--samples-per-client", "40", "--holdout-samples",
        "60", "--out", "d",
    )  # fmt: skip
    # every client's labels, train and test, are its concept's rule on its stored features
    data = load_federated(Path("d"))
    assert data.manifest.concepts == ("native:0", "native:1")
    rules = load_stream(name).label_rules
    images = data.images.permute(0, 2, 3, 1).numpy()  # back to (N, H, W, C)
    seen = set()
    for record in data.clients:
        k = int(data.manifest.concepts[record.concept].split(":")[1])
        seen.add(k)
        for rows in (data.train_slices[record.client_id], data.test_slices[record.client_id]):
            assert np.array_equal(data.labels[rows].numpy(), rules[k](images[rows]))
    assert seen == {0, 1}
    invoke(
        "train", "--data", "d", "--model", "mlp", "--algorithm", "fedavg", "--rounds", "2",
        "--batch-size", "16", "--device", "cpu", "--out", "r",
    )  # fmt: skip
    config = json.loads(Path("r/config.json").read_text())
    assert config["settings"]["mlp"] == {"hidden": None, "layers": 1}
    invoke("eval", "--run", "r")
    assert 0 <= json.loads(Path("r/eval.json").read_text())["final_global_accuracy"] <= 1


def test_a_rule_the_stream_lacks_is_a_one_line_error() -> None:
    result = CliRunner().invoke(
        app, ["partition", *args(tiny("sine", concepts=["native:0", "native:5"])), "--out", "d"]
    )
    assert_one_line_error(result, "partition.concepts: 'native:5': the dataset has rules 0..3")
    assert not Path("d").exists()


def args(config: dict) -> list[str]:
    out = []
    for key, value in config.items():
        text = ",".join(value) if isinstance(value, list) else str(value)
        out += [f"--{key.replace('_', '-')}", text]
    return out


def test_feature_shift_and_corruptions_are_refused_on_a_stream() -> None:
    """Feature shift asked for on a stream is one line naming the setting (the default leaves
    it out there)."""
    asked = ["--shifts", "label,feature,concept"]
    result = CliRunner().invoke(app, ["partition", "--dataset", "sine", *asked, "--out", "d"])
    assert_one_line_error(result, "partition.shifts")
    assert "tabular" in result.output
    styles = CliRunner().invoke(
        app, ["partition", *args(tiny("sea")), "--styles", "rotate", "--out", "d"]
    )
    assert_one_line_error(styles, "partition.styles")
    assert not Path("d").exists()


@pytest.mark.parametrize(
    "split",
    [
        {"label_split": "sequential_dirichlet", "alpha": 0.1},
        {"label_split": "dirichlet", "alpha": 0.5, "min_samples": 2},
        {"label_split": "n_class", "classes_per_client": 1},
        {"label_split": "n_class"},
        {"label_split": "cluster_dirichlet", "label_groups": 2, "min_samples": 2},
        {"label_split": "cluster_n_class", "label_groups": 2, "group_classes": 2},
    ],
)
def test_label_splits_work_with_two_classes(split: dict, tmp_path: Path) -> None:
    """The default group_classes (3) exceeds two classes; only cluster_n_class uses it."""
    config = PartitionConfig(**{**tiny("sea"), **split}, out=str(tmp_path / "d"))
    config.validate()
    manifest = partition_stage(config)
    assert manifest.num_classes == 2 and len(manifest.participating) == 6
    if split.get("classes_per_client") == 1:
        assert all(np.count_nonzero(c.true_label_histogram) == 1 for c in manifest.clients[:6])


def test_a_stream_drifts_over_time_steps(tmp_path: Path) -> None:
    """With the time steps of `partition.drift_share`, a client's concept changes between its
    steps and each step's labels are that step's rule."""
    config = PartitionConfig(**tiny("sine", time_steps=3, drift_share=0.5), out=str(tmp_path / "d"))
    config.validate()
    manifest = partition_stage(config)
    assert manifest.time_steps == 3
    data = load_federated(tmp_path / "d")
    rules = load_stream("sine").label_rules
    images = data.images.permute(0, 2, 3, 1).numpy()
    held: dict[int, set[int]] = {}
    for step in range(3):
        at = data.at_step(step)
        for record in at.clients:
            if not record.participating:
                continue
            k = int(at.manifest.concepts[record.concept].split(":")[1])
            held.setdefault(record.client_id, set()).add(k)
            rows = at.train_slices[record.client_id]
            assert np.array_equal(at.labels[rows].numpy(), rules[k](images[rows]))
    assert any(len(concepts) == 2 for concepts in held.values())  # some client drifted
