"""The federated dataset on disk: one Parquet file per client plus `manifest.json`.

A row is one sample: `image` (raw uint8 H×W×C bytes), `label` (after the concept's label map),
`true_label`, `client_id`, `participating`, `concept`, `style`, `severity`, `split`. One file per
client lets a reader (or a distributed rank) load only the clients it needs; the whole folder
reads as one table with `pyarrow.dataset.dataset(DIR / "shards")`. The manifest, with each
shard's SHA-256, is read and written by `pipeline.data.records`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.data.records import ClientRecord, Manifest, read_manifest
from pipeline.errors import FedrcError
from pipeline.io import read_parquet

SHARDS = "shards"


@dataclass
class ClientData:
    client_id: int
    participating: bool
    concept: int
    style: str  # corruption name or "none"
    severity: int  # 0 when clean
    images: np.ndarray  # (N, H, W, C) uint8
    true_labels: np.ndarray  # (N,)
    labels: np.ndarray  # (N,) after the concept's label map
    is_test: np.ndarray  # (N,) bool
    label_group: int | None = None  # Fed-CAM cluster-wise label splits only


def shard_name(client_id: int) -> str:
    return f"client-{client_id:05d}.parquet"


def _schema(image_bytes: int) -> pa.Schema:
    return pa.schema(
        [
            ("image", pa.binary(image_bytes)),
            ("label", pa.int16()),
            ("true_label", pa.int16()),
            ("client_id", pa.int32()),
            ("participating", pa.bool_()),
            ("concept", pa.int8()),
            ("style", pa.string()),
            ("severity", pa.int8()),
            ("split", pa.string()),
        ]
    )


def client_table(client: ClientData) -> pa.Table:
    # Train rows first, then test rows: a reader gets each split as one contiguous range.
    order = np.argsort(client.is_test, kind="stable")
    n, image_bytes = len(order), int(np.prod(client.images.shape[1:]))
    flat = np.ascontiguousarray(client.images[order]).reshape(-1)
    images = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(image_bytes), n, [None, pa.py_buffer(flat)]
    )
    return pa.table(
        {
            "image": images,
            "label": pa.array(client.labels[order], pa.int16()),
            "true_label": pa.array(client.true_labels[order], pa.int16()),
            "client_id": pa.array(np.full(n, client.client_id), pa.int32()),
            "participating": pa.array(np.full(n, client.participating), pa.bool_()),
            "concept": pa.array(np.full(n, client.concept), pa.int8()),
            "style": pa.array([client.style] * n, pa.string()),
            "severity": pa.array(np.full(n, client.severity), pa.int8()),
            "split": pa.array(np.where(client.is_test[order], "test", "train"), pa.string()),
        },
        schema=_schema(image_bytes),
    )


def client_record(client: ClientData, num_classes: int) -> ClientRecord:
    train = ~client.is_test
    return ClientRecord(
        client_id=client.client_id,
        participating=client.participating,
        concept=client.concept,
        style=client.style,
        severity=client.severity,
        label_group=client.label_group,
        train_size=int(train.sum()),
        test_size=int(client.is_test.sum()),
        label_histogram=tuple(np.bincount(client.labels[train], minlength=num_classes).tolist()),
        true_label_histogram=tuple(
            np.bincount(client.true_labels[train], minlength=num_classes).tolist()
        ),
    )


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_shards(
    folder: Path, clients: Iterable[ClientData], num_classes: int
) -> tuple[tuple[ClientRecord, ...], dict[str, str]]:
    """Write each client's shard as it comes (one client's images in memory at a time).
    Returns the clients' records and each shard file's SHA-256, for the manifest."""
    shards = folder / SHARDS
    shards.mkdir(parents=True)
    hashes, records = {}, []
    for client in clients:
        path = shards / shard_name(client.client_id)
        pq.write_table(client_table(client), path, compression="zstd")
        hashes[path.name] = sha256_file(path)
        records.append(client_record(client, num_classes))
    return tuple(records), hashes


@dataclass
class FederatedData:
    """The whole federated dataset as tensors: each client's train and test rows are contiguous.

    Client `i`'s training rows are `train_slices[i]`, its test rows `test_slices[i]`; clients
    are numbered as in the manifest (participating first, then the held-out ones).
    """

    images: torch.Tensor  # (N, C, H, W) uint8
    labels: torch.Tensor  # (N,) int64
    train_slices: list[slice]
    test_slices: list[slice]
    manifest: Manifest
    distinct: torch.Tensor  # rows holding each distinct image once (held-out clients share them)
    inverse: torch.Tensor  # row → position of its image in `distinct`
    loaded: list[int] | None = None  # the clients whose rows are here (None: all of them)

    @property
    def num_classes(self) -> int:
        return self.manifest.num_classes

    @property
    def clients(self) -> tuple[ClientRecord, ...]:
        return self.manifest.clients

    @property
    def participating(self) -> list[int]:
        return self.manifest.participating

    @property
    def held_out(self) -> list[int]:
        return self.manifest.held_out

    def to(self, device: torch.device) -> FederatedData:
        return FederatedData(
            self.images.to(device),
            self.labels.to(device),
            self.train_slices,
            self.test_slices,
            self.manifest,
            self.distinct.to(device),
            self.inverse.to(device),
            self.loaded,
        )


def load_federated(folder: Path, clients: Collection[int] | None = None) -> FederatedData:
    """Every client's shard, or only those of `clients` (a distributed rank's share): the
    others get empty slices and are left out of `loaded`."""
    manifest = read_manifest(folder)
    shape = manifest.image_shape  # (H, W, C)
    image_bytes = int(np.prod(shape))
    images, labels, train_slices, test_slices = [], [], [], []
    offset = 0
    for position, entry in enumerate(manifest.clients):  # client ids are positions
        if clients is not None and position not in clients:
            train_slices.append(slice(offset, offset))
            test_slices.append(slice(offset, offset))
            continue
        path = folder / SHARDS / shard_name(position)
        if not path.is_file():
            raise FedrcError(f"{path}: shard missing")
        check_shard_hash(path, manifest)
        table = read_parquet(path, "shard missing")
        expected = entry.size
        if table.num_rows != expected or not table.schema.equals(_schema(image_bytes)):
            raise FedrcError(
                f"{path}: shard does not match the manifest ({table.num_rows} rows, expected "
                f"{expected} rows in fedrc's shard schema with {image_bytes}-byte images)"
            )
        column = table.column("image").combine_chunks()
        raw = np.frombuffer(column.buffers()[1], dtype=np.uint8)
        raw = raw[column.offset * image_bytes : (column.offset + len(column)) * image_bytes]
        images.append(raw.reshape(-1, *shape))
        labels.append(table.column("label").to_numpy().astype(np.int64))
        n_train = entry.train_size
        train_slices.append(slice(offset, offset + n_train))
        test_slices.append(slice(offset + n_train, offset + expected))
        offset += expected
    pixels = np.concatenate(images) if images else np.zeros((0, *shape), np.uint8)
    labels = labels or [np.zeros(0, np.int64)]
    rows = np.ascontiguousarray(pixels.reshape(len(pixels), -1))
    _, distinct, inverse = np.unique(
        rows.view(np.dtype((np.void, rows.shape[1]))).ravel(),
        return_index=True,
        return_inverse=True,
    )
    return FederatedData(
        torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous(),
        torch.from_numpy(np.concatenate(labels)),
        train_slices,
        test_slices,
        manifest,
        torch.from_numpy(distinct),
        torch.from_numpy(inverse.reshape(-1)),
        None if clients is None else sorted(clients),
    )


def check_shard_hash(path: Path, manifest: Manifest) -> None:
    """The shard's SHA-256 must be the one the manifest recorded when it was written."""
    recorded = manifest.files.get(path.name)
    if recorded is None:
        raise FedrcError(f"{path}: the manifest records no SHA-256 for this shard")
    if sha256_file(path) != recorded:
        raise FedrcError(
            f"{path}: SHA-256 does not match the manifest (the shard was changed or damaged "
            "after `fedrc partition`); partition again"
        )


def data_digest(manifest: Manifest) -> str:
    """One hash for the whole federated dataset (the manifest's content hash)."""
    return manifest.content_hash
