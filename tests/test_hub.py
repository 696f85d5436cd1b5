"""`hf:NAME`: Hugging Face datasets from local copies in the hub's layouts (Parquet, a
save_to_disk folder, an ImageFolder tree), every fedrc shift on top, and natural clients (one
per FEMNIST writer, held-out clients of unseen writers); never the network."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import TINY_TRAIN
from formats import femnist, hub
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data.loaders import HubColumns, load_dataset
from pipeline.data.records import read_manifest
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage, train_stage

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def hub_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hub(tmp_path_factory.mktemp("hub") / "images", train=300, test=100)


@pytest.fixture(scope="module")
def femnist_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return femnist(tmp_path_factory.mktemp("femnist") / "femnist", samples=600, writers=16)


def shard_images(folder: Path, client: int) -> list[bytes]:
    table = pq.read_table(folder / "shards" / f"client-{client:05d}.parquet")
    return table.column("image").to_pylist()


def test_a_parquet_copy_loads_as_the_pixels_and_labels_datasets_reads(hub_copy: Path) -> None:
    raw = load_dataset("hf:someone/images", str(hub_copy))
    assert raw.train_images.shape == (300, 16, 16, 3) and raw.train_images.dtype == np.uint8
    assert raw.test_images.shape == (100, 16, 16, 3) and raw.num_classes == 10
    read = datasets.load_dataset(str(hub_copy))
    for split, images, labels in (
        ("train", raw.train_images, raw.train_labels),
        ("test", raw.test_images, raw.test_labels),
    ):
        assert labels.tolist() == read[split]["label"]
        assert all(np.array_equal(np.asarray(read[split][i]["img"]), images[i]) for i in (0, 7))
    assert raw.name == "hf:someone/images" and str(hub_copy.resolve()) in raw.source


def test_saved_and_imagefolder_copies_load_too(hub_copy: Path, tmp_path: Path) -> None:
    parquet = load_dataset("hf:x", str(hub_copy))
    datasets.load_dataset(str(hub_copy)).save_to_disk(str(tmp_path / "saved"))
    saved = load_dataset("hf:x", str(tmp_path / "saved"))
    assert np.array_equal(saved.train_images, parquet.train_images)
    assert np.array_equal(saved.test_labels, parquet.test_labels)
    from PIL import Image

    tree = tmp_path / "tree"  # datasets' ImageFolder layout: split/class/file
    for split, count in (("train", 6), ("test", 2)):
        for c in ("cat", "dog"):
            (tree / split / c).mkdir(parents=True)
            for i in range(count):
                pixels = np.full((8, 8), 40 if c == "cat" else 200, dtype=np.uint8)
                Image.fromarray(pixels).save(tree / split / c / f"{i}.png")
    folder = load_dataset("hf:x", str(tree))
    assert folder.num_classes == 2 and folder.train_images.shape == (12, 8, 8, 1)
    assert (folder.train_images[folder.train_labels == 1] == 200).all()


def test_columns_and_splits_are_named_or_refused_in_one_line(hub_copy: Path) -> None:
    named = HubColumns(split="train", test_split="test", image="img", label="label")
    assert load_dataset("hf:x", str(hub_copy), named).train_images.shape[0] == 300
    for columns, message in (
        (
            HubColumns(image="pixels"),
            "partition.image_column: no column 'pixels' (columns: img, label)",
        ),
        (HubColumns(label="fine"), "partition.label_column: no column 'fine'"),
        (
            HubColumns(split="validation"),
            "partition.split: no split 'validation' (splits: train, test)",
        ),
        (HubColumns(test_split="valid"), "partition.test_split: no split 'valid'"),
    ):
        with pytest.raises(FedrcError, match=re.escape(message)):
            load_dataset("hf:x", str(hub_copy), columns)
    with pytest.raises(FedrcError, match=r"--data-root: .* does not exist"):
        load_dataset("hf:x", str(hub_copy / "nothing"))


def test_without_a_test_split_every_fifth_sample_is_a_test_sample(femnist_copy: Path) -> None:
    raw = load_dataset("hf:flwrlabs/femnist", str(femnist_copy))
    assert raw.num_classes == 62 and raw.train_images.shape == (480, 28, 28, 1)
    assert raw.test_images.shape == (120, 28, 28, 1)
    every = datasets.load_dataset(str(femnist_copy))["train"]["character"]
    assert raw.test_labels.tolist() == every[4::5]


def test_a_hub_benchmark_takes_every_fedrc_shift_and_trains(hub_copy: Path, tmp_path: Path) -> None:
    config = PartitionConfig(
        dataset="hf:someone/images", data_root=str(hub_copy), clients=6, label_split="dirichlet",
        alpha=0.5, min_samples=5, concepts=["identity", "reverse"], client_mix="custom",
        client_shares=[0.25, 0.25, 0.25, 0.25], styles=["gaussian_noise"], holdout_samples=40,
        out=str(tmp_path / "data"),
    )  # fmt: skip
    assert config.shifts == ["label", "feature", "concept"]
    manifest = partition_stage(config)
    part = [c for c in manifest.clients if c.participating]
    assert {c.style for c in part} == {"none", "gaussian_noise"}
    assert {manifest.concepts[c.concept] for c in part} == {"identity", "reverse"}
    run = train_stage(make_config(**TINY_TRAIN, data=config.out, out=str(tmp_path / "run")))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == TINY_TRAIN["rounds"] and "global_accuracy" in rows[-1]


def test_femnist_writers_are_clients_and_unseen_writers_are_held_out(
    femnist_copy: Path, tmp_path: Path
) -> None:
    source = datasets.load_dataset(str(femnist_copy))["train"]
    writer_of = {np.asarray(r["image"]).tobytes(): r["writer_id"] for r in source}
    config = PartitionConfig(
        dataset="hf:flwrlabs/femnist", data_root=str(femnist_copy), partition_by="writer_id",
        clients=8, holdout_ids=2, concepts=["identity", "permutation:1"], shifts=["concept"],
        out=str(tmp_path / "data"),
    )  # fmt: skip
    manifest = partition_stage(config)
    writers = [{writer_of[image] for image in shard_images(tmp_path / "data", c.client_id)}
               for c in manifest.clients]  # fmt: skip
    part, held = writers[: config.clients], writers[config.clients :]
    assert all(len(w) == 1 for w in part) and len(set.union(*part)) == config.clients
    assert len(held) == 2 and all(len(w) == 2 for w in held)  # two unseen writers each
    assert not set.union(*part) & set.union(*held) and not held[0] & held[1]
    whole = {w: sum(1 for x in source["writer_id"] if x == w) for w in set.union(*part)}
    assert sorted(c.size for c in manifest.clients[:8]) == sorted(whole.values())  # all of it
    assert read_manifest(tmp_path / "data").config["partition_by"] == "writer_id"
    run = train_stage(make_config(**TINY_TRAIN, data=config.out, out=str(tmp_path / "run")))
    assert (run / "model.pt").is_file()


def one_line_error(result, culprit: str) -> None:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and culprit in lines[0], result.output


def test_bad_hub_settings_are_one_line_errors_and_write_nothing(
    femnist_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    base = ["partition", "--dataset", "hf:f", "--data-root", str(femnist_copy), "--out", "d"]
    for extra, culprit in (
        (
            ["--partition-by", "author", "--clients", "4"],
            "partition.partition_by: no column 'author'",
        ),
        (["--partition-by", "writer_id", "--clients", "16"], "partition.clients: 16 clients"),
        (["--partition-by", "writer_id", "--shifts", "label"], "partition.shifts"),
        (["--partition-by", "writer_id", "--holdout-samples", "20"], "partition.holdout_samples"),
        (["--image-column", "character"], "image_column"),
    ):
        one_line_error(CliRunner().invoke(app, [*base, *extra]), culprit)
    fmnist = ["partition", "--dataset", "synthetic", "--split", "train", "--out", "d"]
    one_line_error(CliRunner().invoke(app, fmnist), "partition.split: expected null")
    assert not (tmp_path / "d").exists()


def test_without_the_datasets_library_it_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)  # import fails
    with pytest.raises(FedrcError, match=r"pip install 'fedrc\[hf\]'"):
        load_dataset("hf:flwrlabs/femnist", None)


def test_a_flower_partitioner_without_flwr_datasets_names_the_extra(
    hub_copy: Path, tmp_path: Path
) -> None:
    if importlib.util.find_spec("flwr_datasets") is not None:
        pytest.skip("flwr-datasets is installed here: tests/flower/test_partitioners.py")
    config = PartitionConfig(
        dataset="hf:x", data_root=str(hub_copy), partitioner="dirichlet", clients=4,
        out=str(tmp_path / "d"),
    )  # fmt: skip
    with pytest.raises(FedrcError, match=r"pip install 'fedrc\[partitioners\]'"):
        partition_stage(config)
    assert not (tmp_path / "d").exists()


def test_info_lists_the_sources_and_the_partitioners() -> None:
    from fedrc_cli.catalog import catalog

    table = catalog()
    kinds, names = table.columns[0]._cells, table.columns[1]._cells
    listed = {(kind, name) for kind, name in zip(kinds, names)}
    for source in ("hf:NAME", "elec2", "airlines", "covertype", "fmnist"):
        assert ("dataset", source) in listed
    for split in ("sequential_dirichlet", "dirichlet", "partition_by"):
        assert ("partitioner", split) in listed
    flower = [name for kind, name in zip(kinds, names) if kind == "partitioner"][6:]
    assert flower == ["(flwr-datasets)"] or {"dirichlet", "pathological", "shard"} <= set(flower)
