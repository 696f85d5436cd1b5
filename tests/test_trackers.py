"""`--log tensorboard,wandb,mlflow`: each tracker gets the numbers of metrics.jsonl, round by
round, and the run's configuration, also across a resume; read back from what each wrote
(TensorBoard's event files, W&B's offline run file, MLflow's file store)."""

import json
import struct
from pathlib import Path

import pytest
from conftest import TINY_TRAIN

from pipeline.common.errors import FedrcError
from pipeline.run import trackers
from pipeline.run.resolve import make_config
from pipeline.stages import train_stage


def expected(run: Path) -> dict[str, dict[int, float]]:
    """metrics.jsonl's numbers: name → {round: value}."""
    found: dict[str, dict[int, float]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for name, value in trackers.numbers(row).items():
            found.setdefault(name, {})[row["round"]] = value
    return found


def wandb_records(path: Path) -> list[bytes]:
    """The records of a W&B transaction log (`run-<id>.wandb`): a 7-byte header (':W&B', magic,
    version), then 32 KiB blocks of chunks, each a 7-byte header (CRC, length, type: 1 whole,
    2 first, 3 middle, 4 last) and its bytes."""
    data, block, pos = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    records, partial = [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            break
        partial = chunk if kind in (1, 2) else partial + chunk
        if kind in (1, 4):
            records.append(partial)
    return records


def wandb_logged(path: Path) -> tuple[dict[str, dict[int, float]], dict[str, object]]:
    """The history (name → {step: value}) and config of one offline W&B run."""
    from wandb.proto import wandb_internal_pb2 as pb

    history: dict[str, dict[int, float]] = {}
    config: dict[str, object] = {}
    for data in wandb_records(path):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            for name, value in items.items():
                if not name.startswith("_"):
                    history.setdefault(name, {})[items["_step"]] = value
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
    return history, config


def test_every_tracker_gets_the_numbers_of_metrics_jsonl(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it as an opt-in
    run = tmp_path / "run"
    values = {**TINY_TRAIN, "data": str(tiny_data), "algorithm": "fedem", "eval_every": 2}
    values["log"] = ["tensorboard", "wandb", "mlflow"]
    train_stage(make_config(**{**values, "rounds": 2}, out=str(run)))
    train_stage(make_config(**values, out=str(run)), resume=True)
    want = expected(run)
    assert want["train_loss"].keys() == {1, 2, 3} and want["global_accuracy"].keys() == {2, 3}
    assert "global_accuracy_by_concept/identity" in want
    config = json.loads((run / "config.json").read_text())

    board = EventAccumulator(str(run / "tensorboard")).Reload()
    got = {t: {e.step: e.value for e in board.Scalars(t)} for t in board.Tags()["scalars"]}
    assert got.keys() == want.keys()
    for name, rounds in want.items():
        assert got[name] == pytest.approx(rounds, rel=1e-6), name  # stored as float32
    (text,) = board.Tensors("config/text_summary")
    assert json.dumps(config["algorithm"]) in text.tensor_proto.string_val[0].decode()

    first, resumed = sorted(
        (wandb_logged(path) for path in run.glob("wandb/offline-run-*/run-*.wandb")),
        key=lambda logged: len(logged[0]["train_loss"]),
    )  # one W&B run for rounds 1-2, then the resumed one, which holds every round once
    assert first[0]["train_loss"].keys() == {1, 2} and resumed[0] == want
    assert {key: resumed[1][key] for key in config} == config

    client = MlflowClient(tracking_uri=store)
    (experiment,) = [e for e in client.search_experiments() if e.name == "fedrc"]
    newest = client.search_runs([experiment.experiment_id], order_by=["start_time DESC"])[0]
    for name, rounds in want.items():
        history_ = client.get_metric_history(newest.info.run_id, name)
        assert {m.step: m.value for m in history_} == rounds, name
    assert newest.data.params == trackers.flat_config(config)
    assert newest.data.params["algorithm"] == "fedem"
    assert newest.info.run_name == "run" and newest.info.status == "FINISHED"


def test_a_missing_tracker_is_one_line_naming_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        FedrcError, match=r"--log wandb: wandb is not installed; pip install 'fedrc\[wandb\]'"
    ):
        trackers.require_trackers(["wandb"])


def test_an_unknown_tracker_is_refused() -> None:
    with pytest.raises(FedrcError, match=r"train\.log: expected names from"):
        make_config(log=["tensorbored"])
