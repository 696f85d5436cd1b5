"""The manifest records: JSON round trip, old files, one-line errors naming the file and key."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.common.errors import FedrcError
from pipeline.data.records import (
    COVERED,
    MANIFEST,
    ClientRecord,
    Manifest,
    MixGroup,
    content_hash,
    read_manifest,
    write_manifest,
)
from pipeline.data.shards import data_digest, load_federated

# Written by fedrc before the records existed (format 2, the dict-based writer): synthetic data,
# 4 participating clients in 2 label groups, concepts identity and pair_flip, seed 5.
FORMAT2 = Path(__file__).parent / "golden" / "manifest-format2"


def test_a_manifest_from_before_the_records_loads_and_writes_back_the_same(tmp_path) -> None:
    manifest = read_manifest(FORMAT2)
    assert manifest.dataset == "synthetic" and manifest.source == "built-in"
    assert manifest.image_shape == (16, 16, 1) and manifest.num_classes == 10
    assert manifest.participating == [0, 1, 2, 3] and manifest.held_out == [4, 5]
    assert [manifest.concept_name(i) for i in manifest.held_out] == ["identity", "pair_flip"]
    assert {c.label_group for c in manifest.clients} == {0, 1, None}
    assert all(c.size == c.train_size + c.test_size == 20 for c in manifest.clients)
    assert manifest.config["label_split"] == "cluster_n_class" and manifest.seed == 5
    assert manifest.client_mix[0].concept == "identity" and manifest.client_mix[0].share == 0.3
    write_manifest(tmp_path, manifest)
    assert (tmp_path / MANIFEST).read_bytes() == (FORMAT2 / MANIFEST).read_bytes()


def test_json_round_trip(tmp_path: Path) -> None:
    files = {"client-00000.parquet": "ab", "client-00001.parquet": "cd"}
    manifest = Manifest(
        dataset="tiny-test",  # a plugin's: a built-in name would fix its classes and shape
        source="test",
        image_shape=(4, 4, 1),
        num_classes=2,
        concepts=("identity", "reverse"),
        client_mix=(MixGroup("reverse", True, 1.0),),
        config={"seed": 1, "styles": None},
        seed=1,
        versions={"python": "3"},
        num_participating=1,
        clients=(
            ClientRecord(0, True, 1, "stripe", 3, 0, 8, 2, (4, 4), (8, 0)),
            ClientRecord(1, False, 0, "none", 0, None, 1, 1, (0, 1), (0, 1)),
        ),
        files=files,
        content_hash=content_hash(files),
    )
    write_manifest(tmp_path, manifest)
    assert read_manifest(tmp_path) == manifest
    assert Manifest.from_json(manifest.to_json(), tmp_path / MANIFEST) == manifest
    assert manifest.participating == [0] and manifest.held_out == [1]
    assert manifest.concept_name(0) == "reverse" and manifest.clients[0].size == 10


def test_loaded_data_carries_the_records(tiny_data: Path) -> None:
    data = load_federated(tiny_data)
    assert data.manifest == read_manifest(tiny_data) and data.clients == data.manifest.clients
    assert data.num_classes == data.manifest.num_classes == 10
    assert data.participating == list(range(12)) and data.held_out == [12, 13, 14]
    assert data_digest(data.manifest) == data.manifest.content_hash


def _drop(key: str) -> Callable[[dict], None]:
    return lambda m: m.pop(key)


def _set(value, *keys) -> Callable[[dict], None]:
    def go(m: dict) -> None:
        for key in keys[:-1]:
            m = m[key]
        m[keys[-1]] = value

    return go


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_drop("seed"), "manifest lacks seed"),
        (lambda m: m["clients"][2].pop("train_size"), "clients[2] lacks train_size"),
        (lambda m: m["client_mix"][1].pop("share"), "client_mix[1] lacks share"),
        (_set("10", "num_classes"), "manifest.num_classes: expected an integer >= 0, got '10'"),
        (_set(1, "clients", 1, "participating"), "clients[1].participating: expected true or"),
        (_set([1, "2"], "clients", 0, "label_histogram"), "clients[0].label_histogram: expected"),
        (_set(-4, "clients", 3, "test_size"), "clients[3].test_size: expected an integer >= 0"),
        (_set("a", "clients", 4, "label_group"), "clients[4].label_group: expected an integer"),
        (_set([16, 16], "image_shape"), "manifest.image_shape: expected [height, width, channels]"),
        (_set({"a": 1}, "versions"), "manifest.versions: expected an object of strings"),
        (_set(None, "clients"), "manifest.clients: expected a list, got None"),
        (_set(7, "clients", 5), "clients[5]: expected an object, got 7"),
        (_set("2", "format_version"), "manifest.format_version: expected an integer, got '2'"),
        (_set(3, "format_version"), "written by a newer fedrc (format 3, expected 2)"),
        (_set(1, "format_version"), "written by an older fedrc (format 1, expected 2)"),
        (_drop("format_version"), "not a fedrc manifest (no format_version)"),
        (_set(5, "clients", 1, "client_id"), "client ids must be 0..5 in order"),
        (_set(2, "clients", 0, "concept"), "clients[0].concept: expected an index into concepts"),
        (_set("0" * 64, "content_hash"), "content_hash does not match the shard hashes"),
    ],
)
def test_a_bad_manifest_is_one_line_naming_the_file_and_the_key(
    tmp_path: Path, change: Callable[[dict], None], message: str
) -> None:
    data = json.loads((FORMAT2 / MANIFEST).read_text())
    change(data)
    (tmp_path / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(FedrcError) as caught:
        read_manifest(tmp_path)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"{tmp_path / MANIFEST}: ") and message in line


def test_every_key_missing_at_once_is_listed(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_text(json.dumps({"format_version": 2, "dataset": "fmnist"}))
    with pytest.raises(FedrcError, match=r"manifest lacks source, image_shape, num_classes, "):
        read_manifest(tmp_path)


def _swap_sizes(m: dict) -> None:
    client = m["clients"][0]
    client["train_size"], client["test_size"] = client["test_size"], client["train_size"]


def _swap_shards(m: dict) -> None:
    files = m["files"]
    a, b = "client-00001.parquet", "client-00002.parquet"
    files[a], files[b] = files[b], files[a]


@pytest.mark.parametrize(
    "change",
    [
        _set(12, "num_classes"),
        _set([8, 32, 1], "image_shape"),
        lambda m: m.update(concepts=m["concepts"][::-1]),
        _set("fmnist", "dataset"),
        _set(3, "time_steps"),
        _swap_sizes,
        lambda m: m["clients"][13].update(concept=0),
        lambda m: m["clients"][3].update(style="fog"),
        lambda m: m["clients"][4].update(participating=False),
        _swap_shards,
    ],
    ids=[
        "num_classes",
        "image_shape",
        "concepts",
        "dataset",
        "time_steps",
        "sizes",
        "concept",
        "style",
        "participating",
        "shards",
    ],
)
def test_the_content_hash_covers_what_the_data_means(tiny_data: Path, tmp_path: Path, change):
    """An edit of any record that changes what the shards mean is refused by the hash (a
    benchmark written by this fedrc: `content_hash_covers`)."""
    data = json.loads((tiny_data / MANIFEST).read_text())
    assert data["content_hash_covers"] == list(COVERED)
    write_manifest(tmp_path, read_manifest(tiny_data))  # written back: the same hash
    assert read_manifest(tmp_path).content_hash == data["content_hash"]
    change(data)
    (tmp_path / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(FedrcError) as caught:
        read_manifest(tmp_path)
    line = str(caught.value)
    assert line.startswith(f"{tmp_path / MANIFEST}: ") and "\n" not in line, line


def test_a_manifest_from_before_the_covering_hash_still_checks_num_classes(tmp_path) -> None:
    data = json.loads((FORMAT2 / MANIFEST).read_text())
    assert "content_hash_covers" not in data  # its hash covers the shards only
    data["num_classes"] = 12
    (tmp_path / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(FedrcError, match=r"clients\[0\]\.label_histogram: expected 12 counts"):
        read_manifest(tmp_path)


def test_a_hash_rule_this_fedrc_does_not_know_is_refused(tiny_data: Path, tmp_path) -> None:
    data = json.loads((tiny_data / MANIFEST).read_text())
    data["content_hash_covers"] = ["num_classes"]
    (tmp_path / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(FedrcError, match=r"content_hash_covers lists \['num_classes'\], this"):
        read_manifest(tmp_path)
