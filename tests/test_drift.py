"""Concept drift over time: schedules, the stepped benchmark, training over steps, the per-step
scores, pictures and one-line errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import ALGORITHMS, TINY_PARTITION, TINY_TRAIN, snapshot
from test_cli import TINY, assert_one_line_error, invoke

from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.concepts import parse_concepts
from pipeline.data.drift import PRESETS, build_schedule, preset_schedule
from pipeline.data.shards import load_federated
from pipeline.data.time_steps import ends_step, step_of, step_rounds
from pipeline.evaluation.agreement import adjusted_rand_index, normalized_mutual_info
from pipeline.evaluation.drift_scores import omega_at, over_time, recovery
from pipeline.run import files as rf
from pipeline.run.resolve import make_config
from pipeline.stages import eval_stage, partition_stage, plot_stage, train_stage

# 12 clients, half of each of two concepts at step 0; at steps 1 and 2 a quarter of them flip
# to the other concept (no label or feature shift, so the concepts are all that separates them)
DRIFTING = dict(
    dataset="synthetic", clients=12, samples_per_client=80, holdout_samples=200,
    shifts=["concept"], concepts=["identity", "reverse"], client_mix="custom",
    client_shares=[0.5, 0.0, 0.5, 0.0], time_steps=3,
    drift=[{"step": 1, "share": 0.25}, {"step": 2, "share": 0.25}],
)  # fmt: skip
TRAIN = dict(
    rounds=15, local_epochs=2, batch_size=16, lr=0.05, clusters=2, device="cpu", eval_every=1
)  # fmt: skip


@pytest.fixture(scope="module")
def drifting(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("drift") / "data"
    config = PartitionConfig(**DRIFTING, out=str(out))
    config.validate()
    partition_stage(config)
    return out


@pytest.fixture(scope="module")
def fedrc_run(drifting: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "fedrc"
    return train_stage(make_config(data=str(drifting), algorithm="fedrc", out=str(out), **TRAIN))


def test_static_benchmark_shards_are_unchanged(tmp_path: Path) -> None:
    """time_steps 1 draws as fedrc did before drift existed: this digest of every shard's
    columns was taken with that fedrc (commit ceedc9b)."""
    config = PartitionConfig(**{**TINY_STATIC, "out": str(tmp_path / "b")})
    partition_stage(config)
    digest = hashlib.sha256()
    for path in sorted((tmp_path / "b" / "shards").iterdir()):
        table = pq.read_table(path)
        for name in table.column_names:
            digest.update(name.encode())
            digest.update(repr(table.column(name).to_pylist()).encode())
    assert digest.hexdigest() == "02d07edbcf9b2be38af794c79fce1302a256434f94106ca7232a23d1468ad033"
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert "time_steps" not in manifest and "steps" not in manifest["clients"][0]


TINY_STATIC = dict(dataset="synthetic", clients=12, samples_per_client=60, holdout_samples=200)


def test_presets_follow_client_groups() -> None:
    schedule = preset_schedule("feddrift-a", 23)
    assert schedule.shape == (11, 23)
    assert (schedule[:, 13] == schedule[:, 3]).all()  # client 13 follows group 3
    # FedDrift's A: clients on concept 1 at steps 1..8 number 1, 2, 5, 6, 6, 4, 5, 4
    on_new = preset_schedule("feddrift-a", 10)[1:9].sum(1)
    assert on_new.tolist() == [1, 2, 5, 6, 6, 4, 5, 4]
    recurrent = preset_schedule("fedccfa-recurrent", 10)
    assert recurrent[[0, 1, 3]].max() == 0
    assert recurrent[2].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    incremental = preset_schedule("fedccfa-incremental", 10)
    assert [int((row > 0).sum()) for row in incremental[9:13]] == [0, 3, 6, 10]
    assert all(p.num_concepts in (2, 4) for p in PRESETS.values())


def test_share_and_events_build_the_schedule() -> None:
    rng = np.random.default_rng(0)
    start = np.zeros(20, dtype=np.int64)
    names = ["identity", "reverse", "shift"]
    schedule = build_schedule(None, 0.25, 4, start, names, rng)
    for t in range(1, 4):  # 5 clients change concept at each step, to another concept
        assert 0 < int((schedule[t] != schedule[t - 1]).sum()) <= 5
    events = [{"step": 2, "clients": [1, 4], "concept": "shift"}, {"step": 3, "share": 0.5}]
    schedule = build_schedule(events, 0.0, 4, start, names, rng)
    assert (schedule[:2] == 0).all() and schedule[2].tolist().count(2) == 2
    assert schedule[2, 1] == schedule[2, 4] == 2
    assert int((schedule[3] != schedule[2]).sum()) == 10  # "another concept": every mover moves


def test_stepped_benchmark_on_disk(drifting: Path) -> None:
    data = load_federated(drifting)
    manifest = data.manifest
    schedule = np.asarray(manifest.schedule)
    assert manifest.time_steps == 3 and schedule.shape == (3, 12)
    assert [int((schedule[t] != schedule[t - 1]).sum()) for t in (1, 2)] == [3, 3]
    concepts = parse_concepts(DRIFTING["concepts"])
    client = 0
    table = pq.read_table(drifting / "shards" / "client-00000.parquet")
    assert table.column("step").to_pylist() == sorted(table.column("step").to_pylist())
    for t in range(3):
        view = data.at_step(t)
        record = view.clients[client]
        assert record.concept == schedule[t, client]
        rows = slice(view.train_slices[client].start, view.test_slices[client].stop)
        assert rows.stop - rows.start == 80 and record.train_size == 72
        steps = np.asarray(table.column("step").to_pylist())
        true = np.asarray(table.column("true_label").to_pylist())[steps == t]
        expected = concepts[record.concept].relabel(true, 10, np.random.default_rng(0))
        assert view.labels[rows].tolist() == expected.tolist()  # the step's label map
        assert view.held_out == [12, 13]  # one per concept, the same rows at every step
        assert view.test_slices[12] == data.test_slices[12]
    assert len({data.at_step(t).train_slices[client].start for t in range(3)}) == 3


def test_fedrc_moves_switched_clients_to_another_cluster(fedrc_run: Path, drifting: Path) -> None:
    """At the end of each step every client sits in its concept's cluster, so a client whose
    concept flips moves to the other cluster, and the others stay."""
    manifest = load_federated(drifting).manifest
    schedule = np.asarray(manifest.schedule)
    assignments = rf.read_assignments(fedrc_run / rf.ASSIGNMENTS)
    clusters = [omega_at(assignments, last)[0][:12].argmax(1) for last in (5, 10, 15)]
    for t in (1, 2):
        moved = schedule[t] != schedule[t - 1]
        assert (clusters[t][moved] != clusters[t - 1][moved]).all(), t
        assert (clusters[t][~moved] == clusters[t - 1][~moved]).all(), t
    for t in range(3):  # one cluster per concept
        assert len({(c, k) for c, k in zip(schedule[t], clusters[t])}) == 2


@pytest.fixture(scope="module")
def tiny_drifting(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-drift") / "data"
    partition_stage(PartitionConfig(**TINY_PARTITION, time_steps=3, drift_share=0.3, out=str(out)))
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_runs_over_steps(algorithm: str, tiny_drifting: Path, tmp_path: Path):
    """Unchanged algorithms on drifting data: a round per step, each boundary scored ahead."""
    values = {**TINY_TRAIN, "rounds": 3, "eval_every": 3}
    if algorithm.endswith("-cam"):  # past the warm-up, so that the clusters form
        values["warmup_rounds"] = 1
    if algorithm == "pfedme":  # the authors' 0.09 diverges on this CNN (protocol §14)
        values["personal_lr"] = 0.02
    run = train_stage(
        make_config(data=str(tiny_drifting), algorithm=algorithm, out=str(tmp_path), **values)
    )
    rows = rf.read_metrics(run / rf.METRICS)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("next_local_accuracy" in r for r in rows[:2]) and "train_accuracy" in rows[2]


def test_metrics_follow_the_steps(fedrc_run: Path) -> None:
    rows = rf.read_metrics(fedrc_run / rf.METRICS)
    assert [r["step"] for r in rows] == [0] * 5 + [1] * 5 + [2] * 5
    ends = [r["round"] for r in rows if "next_local_accuracy" in r]
    assert ends == [5, 10]  # the last round of each step that another follows
    assert all("drifted_accuracy" in r for r in rows[5:]) and "drifted_accuracy" not in rows[0]
    assert set(rows[0]["local_accuracy_by_concept"]) == {"identity", "reverse"}
    live = json.loads((fedrc_run / "dvclive" / "metrics.json").read_text())
    assert {"step", "next", "drifted"} <= set(live) or not (fedrc_run / "dvclive").exists()
    config = json.loads((fedrc_run / rf.CONFIG).read_text())
    assert config["rounds_per_step"] == 5  # rounds / T, fixed in the run's configuration


def test_eval_scores_each_step(fedrc_run: Path) -> None:
    from pipeline.config import EvalConfig

    result = eval_stage(EvalConfig(run=str(fedrc_run)))
    over = result["over_time"]
    assert over["time_steps"] == 3 and [s["rounds"] for s in over["steps"]] == [
        [1, 5],
        [6, 10],
        [11, 15],
    ]
    assert over["steps"][0]["drifted_clients"] == 0 and over["steps"][1]["drifted_clients"] == 3
    assert over["steps"][2]["next_accuracy"] is None  # no step follows the last
    # ω is soft: a step's purity is near 1 once its clusters have settled
    assert all(s["concept_purity"] > 0.95 for s in over["steps"][1:])
    for step in over["steps"][1:]:
        assert step["accuracy_before_drift"] > step["accuracy_after_drift"]  # the drift hurt
        assert step["recovery_rounds"] is not None and 1 <= step["recovery_rounds"] <= 5
    assert over["mean_next_accuracy"] == pytest.approx(
        np.mean([over["steps"][0]["next_accuracy"], over["steps"][1]["next_accuracy"]])
    )
    # ARI and NMI of each step's arg-max-ω clusters against the step's concepts
    assignments = rf.read_assignments(fedrc_run / rf.ASSIGNMENTS)
    part = np.arange(12)  # DRIFTING's participating clients; the held-out ones follow
    for step in over["steps"]:
        omega, concepts = omega_at(assignments, step["rounds"][1])
        found = omega[part].argmax(1)
        assert step["concept_ari"] == pytest.approx(adjusted_rand_index(concepts[part], found))
        assert step["concept_nmi"] == pytest.approx(normalized_mutual_info(concepts[part], found))
    assert over["mean_concept_ari"] == pytest.approx(
        np.mean([s["concept_ari"] for s in over["steps"]])
    )
    assert over["steps"][-1]["concept_ari"] > 0.5  # settled clusters follow the concepts


def test_report_has_the_over_time_table(fedrc_run: Path, tmp_path: Path) -> None:
    from pipeline.config import EvalConfig
    from pipeline.outputs.report import build_report

    eval_stage(EvalConfig(run=str(fedrc_run)))
    rows, caveat, names = build_report([str(fedrc_run)], tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Over time (3 steps)" in text and "| 0 → 1 | 1 → 2 |" in text
    assert rows[0]["steps_next_mean"] is not None and rows[0]["recovery_mean"] >= 1
    assert rows[0]["steps_ari_mean"] is not None
    assert "3 time steps (drift), not 1" in caveat  # the paper's static Table 1 is not shown
    assert "next_step.png" in names  # next-step accuracy over the steps, with seed bands


def test_plot_draws_the_timeline(fedrc_run: Path) -> None:
    from pipeline.config import PlotConfig

    written = plot_stage(PlotConfig(run=str(fedrc_run), dpi=40))
    assert [p.name for p in written][-1] == "timeline.png"
    assert all(p.stat().st_size > 1000 for p in written)


def test_a_drifting_runs_maps_and_omega_have_a_panel_per_step(
    fedrc_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cluster_map and omega draw every step at its last evaluated round, with the concepts
    held at that step (no empty rows); the clusters keep one order and the timeline's colours
    in every panel, and the timeline's rows carry client ids."""
    from pipeline.config import PlotConfig
    from pipeline.outputs.style import FigureStyle

    saved = {}
    monkeypatch.setattr(FigureStyle, "save", lambda self, fig, paths: saved.update(
        {paths[0].name: fig}
    ))  # fmt: skip
    plot_stage(PlotConfig(run=str(fedrc_run), dpi=40))
    maps = [ax for ax in saved["cluster_map.png"].axes if ax.get_title().startswith("step")]
    assert [ax.get_title() for ax in maps] == [
        "step 0 (round 5)", "step 1 (round 10)", "step 2 (round 15)"
    ]  # fmt: skip
    for ax in maps:
        rows = [t.get_text() for t in ax.get_yticklabels()]
        assert rows and all("(n=0)" not in r for r in rows), rows
    ticks = [[t.get_text() for t in ax.get_xticklabels()] for ax in maps]
    colours = [[t.get_color() for t in ax.get_xticklabels()] for ax in maps]
    assert ticks[0] == ticks[1] == ticks[2] and sorted(ticks[0]) == ["0", "1"]
    assert colours[0] == colours[1] == colours[2]
    omega = [ax for ax in saved["omega.png"].axes if ax.get_title().startswith("step")]
    assert len(omega) == 3
    left = saved["timeline.png"].axes[0]
    ids = [t.get_text() for t in left.get_yticklabels()]
    assert sorted(map(int, ids)) == list(range(12))  # every participating client's id


def test_recovery_counts_rounds_into_the_step() -> None:
    rows = [{"round": 6, "drifted_accuracy": 0.5}, {"round": 7, "drifted_accuracy": 0.795}]
    assert recovery(rows, 6, before=0.8, after=0.3, key="drifted_accuracy") == 2
    assert recovery(rows, 6, before=0.8, after=0.795, key="drifted_accuracy") == 0
    assert recovery(rows[:1], 6, before=0.8, after=0.3, key="drifted_accuracy") is None


def test_rounds_are_dealt_to_steps() -> None:
    assert [step_of(r, 3, 3) for r in range(1, 11)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert [r for r in range(1, 11) if ends_step(r, 3, 3)] == [3, 6]
    assert step_rounds(2, 3, 10, 3) == (7, 10) and step_rounds(0, 3, 10, 3) == (1, 3)
    assert step_of(7, None, 1) == 0 and not ends_step(7, None, 1)
    config = make_config(rounds=10)
    assert config.over_steps(3).rounds_per_step == 3
    with pytest.raises(FedrcError, match=r"train\.rounds: 2 for 3 time steps"):
        make_config(rounds=2).over_steps(3)
    # given rounds_per_step, a run may stop before the last step (and be resumed)
    assert make_config(rounds=3, rounds_per_step=2).over_steps(3).rounds_per_step == 2


def test_resume_mid_step_equals_the_uninterrupted_run(drifting: Path, tmp_path: Path) -> None:
    values = dict(data=str(drifting), algorithm="fedem", **{**TRAIN, "rounds": 6})
    whole = train_stage(make_config(**values, rounds_per_step=2, out=str(tmp_path / "a")))
    half = tmp_path / "b"
    train_stage(make_config(**{**values, "rounds": 3}, rounds_per_step=2, out=str(half)))
    train_stage(make_config(**values, rounds_per_step=2, out=str(half)), resume=True)
    rows = [rf.read_metrics(run / rf.METRICS) for run in (whole, half)]
    for row in (*rows[0], *rows[1]):
        row.pop("seconds")
    assert rows[0] == rows[1]
    models = [torch.load(run / rf.MODEL, weights_only=True) for run in (whole, half)]
    assert torch.equal(models[0]["models"], models[1]["models"])


def test_torchrun_equals_one_process(drifting: Path, tmp_path: Path) -> None:
    """Each rank serves its own clients' rows of the round's step; the numbers are one
    process's."""
    from test_distributed import BASE, assert_same_run, single, torchrun

    values = {**BASE, "algorithm": "fedem", "rounds": 4}
    expected = single(drifting, tmp_path / "single", values)
    torchrun(tmp_path, drifting, tmp_path / "two", values)
    assert_same_run(expected, tmp_path / "two", exact=False)
    assert [r["step"] for r in rf.read_metrics(tmp_path / "two" / rf.METRICS)] == [0, 1, 2, 2]


def test_info_shows_the_schedule(drifting: Path) -> None:
    described = json.loads(invoke("info", str(drifting), "--json").output)
    steps = described["drift"]["steps"]
    assert described["drift"]["time_steps"] == 3 and len(steps[1]["drifted"]) == 3
    assert steps[1]["recurring"] + steps[1]["new"] == 3
    assert "drift over 3 time steps" in invoke("info", str(drifting)).output


def test_preset_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    swaps = "identity,swap:1-2,swap:3-4,swap:5-6"
    done = invoke(
        "partition", *TINY, "--drift", "fedccfa-sudden", "--concepts", swaps, "--out", "d"
    )
    assert done.exit_code == 0, done.output
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert manifest["time_steps"] == 2 and manifest["config"]["drift"] == "fedccfa-sudden"


@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        (["--time-steps", "3", "--drift-share", "1.5"], "partition.drift_share"),
        (["--drift-share", "0.5"], "partition.drift_share"),  # one step: nothing to drift to
        (["--drift", "feddrift-z"], "partition.drift"),
        (["--drift", "fedccfa-sudden"], "partition.concepts"),  # 3 concepts, it needs 4
        (["--drift", "feddrift-a", "--time-steps", "4"], "partition.time_steps"),
        (["--time-steps", "0"], "partition.time_steps"),
        (["--time-steps", "31"], "partition.time_steps"),  # 12 × 60 × 31 > 4,000 samples
        (["--time-steps", "2", "--drift-share", "0.5", "--shifts", "label"], "partition.shifts"),
    ],
)
def test_bad_schedules_are_one_line(
    args: list[str], culprit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke("partition", *TINY, *args, "--out", "d"), culprit)
    assert snapshot(tmp_path) == {}


@pytest.mark.parametrize(
    ("events", "culprit"),
    [
        ([{"step": 3, "share": 0.5}], "partition.drift[0].step"),  # beyond T = 3
        ([{"step": 1, "share": 0.5, "concept": "upside"}], "partition.drift[0].concept"),
        ([{"step": 1, "share": 2}], "partition.drift[0].share"),
        ([{"step": 1, "clients": [40]}], "partition.drift[0].clients"),
        ([{"step": 1}], "partition.drift[0]"),
        ([{"step": 1, "share": 0.5, "when": 2}], "partition.drift[0]"),
    ],
)
def test_bad_events_are_one_line(
    events: list, culprit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    params = {"partition": {"time_steps": 3, "drift": events}}
    (tmp_path / "p.yaml").write_text(json.dumps(params))
    before = snapshot(tmp_path)
    result = invoke("partition", *TINY, "--params", "p.yaml", "--out", "d")
    assert_one_line_error(result, culprit)
    assert snapshot(tmp_path) == before


def test_too_few_rounds_for_the_steps(drifting: Path, tmp_path: Path) -> None:
    result = invoke(
        "train", "--data", drifting, "--rounds", "2", "--device", "cpu", "--out", tmp_path / "r"
    )
    assert_one_line_error(result, "train.rounds")
    assert not (tmp_path / "r").exists()


def test_over_time_on_a_hand_made_log() -> None:
    """Step 1's drifted clients: 0.9 before, 0.4 right after, back to 0.89 two rounds in."""
    from types import SimpleNamespace

    import pyarrow as pa

    rows = [
        {"round": 1, "step": 0, "local_accuracy": 0.8, "global_accuracy": 0.7},
        {"round": 2, "step": 0, "local_accuracy": 0.85, "global_accuracy": 0.7,
         "drifting_accuracy": 0.9, "next_local_accuracy": 0.6, "next_drifted_accuracy": 0.4},
        {"round": 3, "step": 1, "local_accuracy": 0.7, "global_accuracy": 0.7,
         "drifted_accuracy": 0.5},
        {"round": 4, "step": 1, "local_accuracy": 0.8, "global_accuracy": 0.7,
         "drifted_accuracy": 0.89},
    ]  # fmt: skip
    assignments = pa.table(
        {"round": [2, 2, 4, 4], "client_id": [0, 1, 0, 1], "concept": [0, 1, 1, 1],
         "omega_0": [1.0, 0.0, 0.0, 0.0], "omega_1": [0.0, 1.0, 1.0, 1.0]}
    )  # fmt: skip
    record = SimpleNamespace(train_size=10)
    manifest = SimpleNamespace(
        time_steps=2,
        schedule=[[0, 1], [1, 1]],
        at_step=lambda t: SimpleNamespace(participating=[0, 1], clients=[record, record]),
    )
    over = over_time(rows, assignments, manifest, 2, 4)
    first, second = over["steps"]
    assert first["next_accuracy"] == 0.6 and first["concept_purity"] == 1.0
    assert second["accuracy_before_drift"] == 0.9 and second["accuracy_after_drift"] == 0.4
    assert second["recovery_rounds"] == 2 and second["drifted_clients"] == 1
    assert second["concept_purity"] == 1.0  # both clients in cluster 1, both of concept 1
    assert first["concept_ari"] == 1.0 and first["concept_nmi"] == pytest.approx(1.0)
    # every client holds concept 1 at step 1: one cluster for them is perfect
    assert second["concept_ari"] == 1.0 and second["concept_nmi"] == 1.0
    assert over["mean_local_accuracy"] == pytest.approx(0.825)


def test_the_drift_experiment_is_valid() -> None:
    """experiments/drift/params.yaml builds a valid benchmark and training configuration."""
    from pipeline.config import build_config, read_params
    from pipeline.run.resolve import train_config

    params = read_params(Path(__file__).resolve().parents[1] / "experiments/drift/params.yaml")
    partition = build_config(PartitionConfig, params)
    assert partition.steps == 4 and partition.drift == "fedccfa-recurrent"
    for algorithm in params["sweep"]["grid"]["algorithm"]:
        config = train_config(params, {"algorithm": algorithm}).over_steps(partition.steps)
        assert config.rounds_per_step * partition.steps == config.rounds
