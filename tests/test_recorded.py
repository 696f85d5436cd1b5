"""Recorded drifting streams (Elec2, Airlines, Covertype) from small files in their real formats
(river's CSV, MOA's ARFF, UCI's header-less .gz): read in time order, encoded to bytes, cut into
time steps and clients along it (segments or a column), and trained on."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import TINY_TRAIN
from formats import AIRLINES, airlines, covertype, elec2
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.loaders import load_dataset
from pipeline.data.loaders import recorded as rec
from pipeline.run.resolve import make_config, train_config
from pipeline.stages import partition_stage, train_stage


def test_elec2_reads_the_same_from_rivers_csv_and_moas_arff(tmp_path: Path) -> None:
    csv = load_dataset("elec2", str(elec2(tmp_path / "csv", rows=500).parent))
    arff = load_dataset("elec2", str(elec2(tmp_path / "arff", rows=500, arff=True).parent))
    assert csv.train_images.shape == (450, 1, 13, 1)  # day one-hot (7) + 6 numbers; no date
    for a, b in ((csv.train_images, arff.train_images), (csv.test_labels, arff.test_labels)):
        assert np.array_equal(a, b)
    text = (tmp_path / "csv" / "electricity.csv").read_text().splitlines()[1:]
    up = [line.endswith(",UP") for line in text]  # time order kept: the first 450 rows train
    assert csv.train_labels.tolist() == up[:450] and csv.test_labels.tolist() == up[450:]
    assert csv.ordered and csv.columns["day"][:48].tolist() == [1] * 48


def test_columns_become_bytes_as_documented() -> None:
    numbers = rec._encode(np.array([2.0, 4.0, 3.0]), nominal=False)
    assert numbers[:, 0].tolist() == [0, 255, 128]  # min–max over the file
    few = rec._encode(np.array(["b", "a", "b"]), nominal=True)
    assert few.tolist() == [[0, 255], [255, 0], [0, 255]]  # one-hot, values sorted
    many = np.array([f"v{k}" for k in range(40)] + ["v7"] * 3)
    codes = rec._encode(many, nominal=True)[:, 0]
    assert codes[-1] == 0 and codes.max() == 39  # rank by frequency: v7 first


def parts(folder: Path, client: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    table = pq.read_table(folder / "shards" / f"client-{client:05d}.parquet")
    step = table.column("step").to_numpy() if "step" in table.column_names else None
    return table.column("true_label").to_numpy(), step, table.column("split").to_numpy()


def test_elec2_partitions_into_time_steps_along_its_order_and_trains(tmp_path: Path) -> None:
    source = elec2(tmp_path / "src", rows=1200).parent
    raw = load_dataset("elec2", str(source))
    config = PartitionConfig(
        dataset="elec2", data_root=str(source), clients=4, time_steps=3, out=str(tmp_path / "d")
    )
    assert config.shifts == []  # a recorded stream brings its own drift
    manifest = partition_stage(config)
    assert manifest.time_steps == 3 and manifest.image_shape == (1, 13, 1)
    windows = np.array_split(np.arange(raw.train_labels.size), 3)
    for client in range(4):
        labels, step, split = parts(tmp_path / "d", client)
        for t, window in enumerate(windows):
            mine = np.array_split(window, 4)[client]  # segment `client` of window t, in order
            here = step == t
            assert labels[here].tolist() == raw.train_labels[mine].tolist()
            tests = np.flatnonzero(split[here] == "test")
            assert tests.tolist() == list(range(here.sum() - tests.size, here.sum()))  # the last
    assert train_config({}, {"data": config.out}).model == "mlp"
    values = {**TINY_TRAIN, "rounds": 6, "data": config.out, "algorithm": "ifca"}
    run = train_stage(make_config(**values, model="mlp", out=str(tmp_path / "run")))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 0, 1, 1, 2, 2]
    assert "next_local_accuracy" in rows[1]  # scored on the next window before training on it


def test_airlines_clients_are_carriers_and_unseen_carriers_are_held_out(tmp_path: Path) -> None:
    source = airlines(tmp_path / "src", rows=3000).parent
    config = PartitionConfig(
        dataset="airlines", data_root=str(source), partition_by="Airline", clients=8,
        holdout_ids=2, time_steps=2, shifts=["concept"], concepts=["identity", "reverse"],
        out=str(tmp_path / "d"),
    )  # fmt: skip
    manifest = partition_stage(config)
    carriers = []
    for client in manifest.clients:
        table = pq.read_table(tmp_path / "d" / "shards" / f"client-{client.client_id:05d}.parquet")
        rows = np.frombuffer(b"".join(table.column("image").to_pylist()), np.uint8)
        one_hot = rows.reshape(table.num_rows, -1)[:, : len(AIRLINES)]  # Airline comes first
        carriers.append(set(one_hot.argmax(axis=1).tolist()))
    part, held = carriers[:8], carriers[8:]
    assert all(len(c) == 1 for c in part) and len(set.union(*part)) == 8
    assert [len(c) for c in held] == [2, 2] and not set.union(*part) & set.union(*held)
    run = train_stage(make_config(**TINY_TRAIN, data=config.out, out=str(tmp_path / "run")))
    assert (run / "model.pt").is_file()


def test_covertype_reads_ucis_headerless_gz_and_names_its_wilderness_areas(
    tmp_path: Path,
) -> None:
    raw = load_dataset("covertype", str(covertype(tmp_path, rows=500).parent))
    assert raw.train_images.shape == (450, 1, 54, 1) and raw.num_classes == 7
    assert sorted(set(raw.columns["wilderness"].tolist())) == ["1", "2", "3", "4"]


def one_line_error(result, culprit: str) -> None:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and culprit in lines[0], result.output


def test_bad_or_missing_files_are_one_line_errors_and_write_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "electricity.csv").write_text("date,day,price\n0.1,1,0.5\n")
    run = ["partition", "--dataset", "elec2", "--out", "d", "--data-root"]
    one_line_error(CliRunner().invoke(app, [*run, str(bad)]), "no column 'class'")
    (bad / "electricity.csv").write_text("date,day,period,class\n" + "0.1,1,0.2,SIDEWAYS\n" * 30)
    one_line_error(CliRunner().invoke(app, [*run, str(bad)]), "are not elec2's classes")
    shifts = ["--shifts", "label", str(bad)]
    one_line_error(CliRunner().invoke(app, [*run[:-1], *shifts[:2], "--data-root", shifts[2]]),
                   "partition.shifts")  # fmt: skip

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(rec.urllib.request, "urlopen", offline)
    one_line_error(CliRunner().invoke(app, [*run, "raw/elec"]), "download failed (URLError)")
    assert not (tmp_path / "d").exists() and not (tmp_path / "raw").exists()
    source = str(elec2(tmp_path / "e").parent)
    with pytest.raises(FedrcError, match=r"partition\.replicate"):
        partition_stage(
            PartitionConfig(dataset="elec2", data_root=source, replicate=2, clients=2, out="d")
        )
