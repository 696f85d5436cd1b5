import gzip
import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest
import torch

from pipeline.common.errors import FedrcError
from pipeline.config import PartitionConfig
from pipeline.data import shards
from pipeline.data.benchmark import write_benchmark
from pipeline.data.client_mix import client_types, mix_groups
from pipeline.data.concepts import parse_concept
from pipeline.data.describe import describe
from pipeline.data.label_splits import sequential_dirichlet_split
from pipeline.data.loaders import RawDataset
from pipeline.data.loaders.idx import DEBIAN_FMNIST, load_fmnist, read_idx
from pipeline.data.records import Manifest, read_manifest
from pipeline.data.shards import load_federated
from pipeline.stages import partition_stage


def test_paper_client_mix_shares() -> None:
    concept, corrupted = client_types(300, mix_groups("paper", 3), np.random.default_rng(0))
    groups = Counter(zip(concept.tolist(), corrupted.tolist()))
    assert groups == {
        (0, False): 90,
        (0, True): 60,
        (1, False): 60,
        (1, True): 15,
        (2, False): 60,
        (2, True): 15,
    }


def test_reference_client_mix_shares() -> None:
    concept, corrupted = client_types(300, mix_groups("reference", 3), np.random.default_rng(0))
    assert Counter(concept.tolist()) == {0: 120, 1: 90, 2: 90}
    assert corrupted.sum() == 120


def relabel(spec: str, y: np.ndarray, seed: int = 0) -> np.ndarray:
    return parse_concept(spec).relabel(y, 10, np.random.default_rng(seed))


def test_concept_label_maps() -> None:
    y = np.arange(10)
    assert relabel("identity", y).tolist() == y.tolist()
    assert relabel("reverse", y).tolist() == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
    assert relabel("shift", y).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]
    assert relabel("shift:3", y).tolist() == [3, 4, 5, 6, 7, 8, 9, 0, 1, 2]
    perm = relabel("permutation", y)
    assert sorted(perm.tolist()) == y.tolist() and perm.tolist() != y.tolist()
    assert relabel("permutation", y, seed=9).tolist() == perm.tolist()  # its own seed only
    assert relabel("permutation:1", y).tolist() != perm.tolist()


@pytest.mark.parametrize("kind", ["pair_flip", "symmetric"])
def test_label_noise_flips_exactly_sigma(kind: str) -> None:
    y = np.repeat(np.arange(10), 100)
    noisy = relabel(f"{kind}:0.3", y)
    flipped = noisy != y
    assert flipped.sum() == 300
    if kind == "pair_flip":
        assert (noisy[flipped] == (y[flipped] + 1) % 10).all()
    else:  # uniformly random other classes: many different offsets
        assert len(np.unique((noisy[flipped] - y[flipped]) % 10)) == 9
    assert (relabel(f"{kind}:0.3", y, seed=1) != noisy).any()  # fresh per client
    assert (relabel(kind, y) != y).sum() == 200  # σ = 0.2 by default (Table 13)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("flip", "unknown label map"),
        ("reverse:2", "takes no parameter"),
        ("shift:x", "expected an integer"),
        ("pair_flip:1.5", "noise rate"),
    ],
)
def test_bad_concepts_are_named(spec: str, message: str) -> None:
    with pytest.raises(FedrcError, match=f"partition.concepts.*{message}"):
        parse_concept(spec)


def test_sequential_dirichlet_quotas_disjoint_and_skewed() -> None:
    labels = np.repeat(np.arange(10), 600)
    parts = sequential_dirichlet_split(labels, 10, 30, 200, 1.0, np.random.default_rng(0))
    assert all(p.size == 200 for p in parts)
    everything = np.concatenate(parts)
    assert np.unique(everything).size == everything.size  # no sample given twice
    classes = [np.unique(labels[p]).size for p in parts]
    assert np.median(classes) < 7  # α = 1 spread over C classes: few classes per client


def test_sequential_dirichlet_tiny_alpha_terminates() -> None:
    labels = np.repeat(np.arange(10), 100)
    parts = sequential_dirichlet_split(labels, 10, 10, 100, 1e-6, np.random.default_rng(0))
    assert sum(p.size for p in parts) == 1000


def test_too_many_clients_names_the_option() -> None:
    with pytest.raises(FedrcError, match="--clients"):
        sequential_dirichlet_split(np.zeros(100, int), 10, 20, 10, 1.0, np.random.default_rng(0))


def test_partition_statistics(tiny_data: Path) -> None:
    manifest = read_manifest(tiny_data)
    clients = manifest.clients
    part = [c for c in clients if c.participating]
    held = [c for c in clients if not c.participating]
    assert len(part) == 12 and [c.concept for c in held] == [0, 1, 2]
    assert all(c.train_size + c.test_size == 60 and c.test_size == 6 for c in part)
    assert all(c.style != "none" and 1 <= c.severity <= 5 for c in part if c.severity > 0)
    assert all(c.style == "none" for c in held)
    table = ds.dataset(tiny_data / "shards").to_table()
    assert table.num_rows == 12 * 60 + 3 * 200
    label = table.column("label").to_numpy()
    true = table.column("true_label").to_numpy()
    concept = table.column("concept").to_numpy()
    for c in range(3):
        mask = concept == c
        assert (label[mask] == relabel(["identity", "reverse", "shift"][c], true[mask])).all()
    # held-out clients: class-balanced
    held_ids = [c.client_id for c in held]
    hist = np.asarray(held[0].label_histogram) + np.bincount(
        true[
            (table.column("client_id").to_numpy() == held_ids[0])
            & (table.column("split").to_numpy() == "test")
        ],
        minlength=10,
    )
    assert hist.min() == hist.max() == 20


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    def digest(seed: int, name: str) -> str:
        out = tmp_path / name
        partition_stage(
            PartitionConfig(
                dataset="synthetic",
                clients=10,
                samples_per_client=50,
                holdout_samples=100,
                seed=seed,
                out=str(out),
            ),
            overwrite=True,  # "a" is built twice
        )
        h = hashlib.sha256()
        for f in [*sorted((out / "shards").iterdir()), out / "manifest.json"]:
            h.update(f.read_bytes())
        return h.hexdigest()

    assert digest(3, "a") == digest(3, "b")
    assert digest(3, "a") != digest(4, "c")


def test_loaded_tensors_match_manifest(tiny_data: Path) -> None:
    data = load_federated(tiny_data)
    assert data.images.shape == (12 * 60 + 600, 1, 16, 16)
    assert data.train_slices[0].stop - data.train_slices[0].start == 54
    # the three held-out clients share their images: each is inferred once
    assert data.distinct.numel() <= 12 * 60 + 200


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_fmnist_from_data_root_in_torchvision_layout(tmp_path: Path) -> None:
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    _write_idx(raw / "train-images-idx3-ubyte.gz", rng.integers(0, 255, (20, 28, 28)))
    _write_idx(raw / "train-labels-idx1-ubyte.gz", np.arange(20) % 10)
    _write_idx(raw / "t10k-images-idx3-ubyte.gz", rng.integers(0, 255, (10, 28, 28)))
    _write_idx(raw / "t10k-labels-idx1-ubyte.gz", np.arange(10))
    data = load_fmnist(str(tmp_path))
    assert data.train_images.shape == (20, 28, 28, 1) and data.test_labels.tolist() == list(
        range(10)
    )


def test_truncated_idx_is_named(tmp_path: Path) -> None:
    path = tmp_path / "x-idx1-ubyte"
    path.write_bytes(bytes([0, 0, 8, 1]) + (100).to_bytes(4, "big") + b"\x00" * 10)
    with pytest.raises(FedrcError, match="truncated"):
        read_idx(path)


@pytest.mark.skipif(not DEBIAN_FMNIST.is_dir(), reason="needs Debian's dataset-fashion-mnist")
def test_real_fashion_mnist_from_debian() -> None:
    data = load_fmnist(None)
    assert data.train_images.shape == (60000, 28, 28, 1)
    assert data.test_images.shape == (10000, 28, 28, 1)
    assert np.bincount(data.train_labels).tolist() == [6000] * 10


def build(tmp_path: Path, name: str, **settings) -> Manifest:
    base = dict(dataset="synthetic", clients=10, samples_per_client=40, holdout_samples=50)
    return partition_stage(PartitionConfig(**{**base, **settings}, out=str(tmp_path / name)))


def test_manifest_records_enough_to_rebuild_the_same_shards(tmp_path: Path) -> None:
    settings = dict(
        label_split="cluster_n_class", label_groups=2, concepts=["identity", "pair_flip"]
    )
    first = build(tmp_path, "a", **settings)
    assert first.format_version == 2 and first.config["label_split"] == "cluster_n_class"
    assert {"numpy", "pyarrow", "torch", "python"} <= set(first.versions)
    files = sorted((tmp_path / "a" / "shards").iterdir())
    per_shard = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    # the content hash covers the shards by name and every record that says what they mean
    written = json.loads((tmp_path / "a" / "manifest.json").read_text())
    covered = ("dataset", "image_shape", "num_classes", "concepts", "num_participating")
    meaning = {k: written[k] for k in (*covered, "clients")} | {"time_steps": 1}
    assert written["content_hash_covers"] == [*covered, "time_steps", "clients"]
    canonical = json.dumps({**meaning, "files": per_shard}, sort_keys=True, separators=(",", ":"))
    assert first.content_hash == hashlib.sha256(canonical.encode()).hexdigest()
    rebuilt = partition_stage(PartitionConfig(**first.config, out=str(tmp_path / "b")))
    assert rebuilt.content_hash == first.content_hash
    assert {c.label_group for c in first.clients if c.participating} == {0, 1}


def test_changed_shard_and_old_format_are_refused(tmp_path: Path) -> None:
    build(tmp_path, "a")
    shard = tmp_path / "a" / "shards" / "client-00002.parquet"
    shard.write_bytes(shard.read_bytes() + b"\0")
    with pytest.raises(FedrcError, match=r"client-00002\.parquet: SHA-256 does not match"):
        load_federated(tmp_path / "a")
    manifest = tmp_path / "a" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"format_version": 2', '"format_version": 1'))
    with pytest.raises(FedrcError, match="older fedrc"):
        read_manifest(tmp_path / "a")


def test_a_shard_is_parsed_from_the_bytes_its_hash_was_checked_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard replaced on disk right after its SHA-256 was checked (another client's valid
    shard) cannot slip in: the file is read once, and the checked bytes are the parsed ones."""
    build(tmp_path, "a")
    honest = load_federated(tmp_path / "a")
    folder = tmp_path / "a" / "shards"
    real = shards.check_shard_hash

    def check_then_swap(path: Path, manifest: Manifest, data: bytes) -> None:
        real(path, manifest, data)
        if path.name == "client-00002.parquet":
            path.write_bytes((folder / "client-00003.parquet").read_bytes())

    monkeypatch.setattr(shards, "check_shard_hash", check_then_swap)
    loaded = load_federated(tmp_path / "a")
    swapped = (folder / "client-00002.parquet").read_bytes()
    assert swapped == (folder / "client-00003.parquet").read_bytes()  # the swap happened
    assert torch.equal(loaded.images, honest.images) and torch.equal(loaded.labels, honest.labels)


def test_replicated_colour_pool_goes_through_the_same_builder(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    raw = RawDataset(
        "cifar10",
        rng.integers(0, 256, (100, 32, 32, 3), dtype=np.uint8),
        np.arange(100) % 10,
        rng.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8),
        np.arange(20) % 10,
        10,
        "test",
    )
    config = PartitionConfig(dataset="cifar10", clients=6, replicate=3, out=str(tmp_path / "c"))
    manifest = write_benchmark(config, raw)
    assert manifest.image_shape == (32, 32, 3)
    part = [c for c in manifest.clients if c.participating]
    assert [c.train_size + c.test_size for c in part] == [50] * 6  # 3 × 100 / 6
    assert load_federated(tmp_path / "c").images.shape[1:] == (3, 32, 32)


@pytest.mark.parametrize(
    ("shifts", "concepts", "corrupted"),
    [(["label"], {0}, False), (["feature"], {0}, True), (["concept"], {0, 1, 2}, False)],
)
def test_single_shift_settings(tmp_path: Path, shifts, concepts, corrupted) -> None:
    manifest = build(tmp_path, "s", clients=20, shifts=shifts)
    part = [c for c in manifest.clients if c.participating]
    assert {c.concept for c in part} == concepts
    assert any(c.style != "none" for c in part) == corrupted
    assert len(manifest.clients) - len(part) == len(concepts)  # one held-out per concept
    classes = [sum(v > 0 for v in c.true_label_histogram) for c in part]
    assert (np.mean(classes) > 8) == ("label" not in shifts)


def test_imbalanced_and_custom_mixes() -> None:
    concept, corrupted = client_types(100, mix_groups("imbalanced", 3), np.random.default_rng(0))
    assert Counter(concept.tolist()) == {0: 80, 1: 10, 2: 10} and corrupted.sum() == 30
    shares = [0.5, 0.0, 0.0, 0.25, 0.25, 0.0]
    concept, corrupted = client_types(8, mix_groups("custom", 3, shares), np.random.default_rng(0))
    assert Counter(zip(concept.tolist(), corrupted.tolist())) == {
        (0, False): 4,
        (1, True): 2,
        (2, False): 2,
    }


def test_many_concepts_and_corrupted_holdouts(tmp_path: Path) -> None:
    names = ["identity", "reverse", "shift:2", "permutation", "symmetric:0.5"]
    manifest = build(tmp_path, "m", clients=20, concepts=names, holdout_corrupted=True)
    held = [c for c in manifest.clients if not c.participating]
    assert list(manifest.concepts) == names and [c.concept for c in held] == list(range(5))
    assert all(c.style != "none" for c in held)
    info = describe(manifest)
    assert sum(sum(s.values()) for s in info["clients_by_concept_and_style"].values()) == 20
    assert info["held_out"] == 5 and 0 < info["label_heterogeneity"]["mean_pairwise_tv"] < 1


def test_a_folder_of_images_partitions_with_every_shift(tmp_path: Path) -> None:
    """Images on disk, no code: label, feature and concept shift, and the class-count checks
    that wait for the loaded data."""
    from test_loaders import write_tree

    write_tree(tmp_path / "tree", {f"c{i}": 20 for i in range(4)}, sizes=((16, 16),))
    config = PartitionConfig(
        dataset="folder", data_root=str(tmp_path / "tree"), clients=8, holdout_samples=10,
        concepts=["identity", "reverse"], out=str(tmp_path / "out"),
    )  # fmt: skip
    manifest = partition_stage(config)
    assert manifest.dataset == "folder" and manifest.num_classes == 4
    assert {manifest.concept_name(c.client_id) for c in manifest.clients} == {"identity", "reverse"}
    assert any(c.style != "none" for c in manifest.clients)  # feature shift
    too_many = PartitionConfig(
        dataset="folder", data_root=str(tmp_path / "tree"), label_split="n_class",
        classes_per_client=5, out=str(tmp_path / "o2"),
    )  # fmt: skip
    with pytest.raises(FedrcError, match=r"partition\.classes_per_client.*folder has 4 classes"):
        partition_stage(too_many)
    assert not (tmp_path / "o2").exists()
