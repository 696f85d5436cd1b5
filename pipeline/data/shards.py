"""The federated dataset on disk: one Parquet file per client plus `manifest.json`.

A row is one sample: `image` (raw uint8 H×W×C bytes), `label` (after the concept's label map),
`true_label`, `client_id`, `participating`, `concept`, `style`, `severity`, `split`, and in a
drifting benchmark (T > 1 time steps) `step`: a client's rows are ordered by step, then train
before test, and carry the concept of their step. One file per
client lets a reader (or a distributed rank) load only the clients it needs; the whole folder
reads as one table with `pyarrow.dataset.dataset(DIR / "shards")`. The manifest, with each
shard's SHA-256, is read and written by `pipeline.data.records`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.common.errors import FedrcError
from pipeline.common.io import naming, read_parquet
from pipeline.data.concepts import parse_concepts
from pipeline.data.meaning import read_benchmark
from pipeline.data.records import ClientRecord, Manifest, StepRecord
from pipeline.data.shard_checks import check_rows, checked_labels

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
    step: np.ndarray | None = None  # (N,) time step of each row (drifting benchmarks)
    row_concept: np.ndarray | None = None  # (N,) concept of each row's step


def shard_name(client_id: int) -> str:
    return f"client-{client_id:05d}.parquet"


def _schema(image_bytes: int, stepped: bool = False) -> pa.Schema:
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
            *([("step", pa.int16())] if stepped else []),
        ]
    )


def client_table(client: ClientData) -> pa.Table:
    # Train rows first, then test rows (within each step): a reader gets each split as one
    # contiguous range.
    if client.step is None:
        order = np.argsort(client.is_test, kind="stable")
    else:
        order = np.lexsort((client.is_test, client.step))
    n, image_bytes = len(order), int(np.prod(client.images.shape[1:]))
    concept = np.full(n, client.concept) if client.row_concept is None else client.row_concept
    flat = np.ascontiguousarray(client.images[order]).reshape(-1)
    images = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(image_bytes), n, [None, pa.py_buffer(flat)]
    )
    columns = {
        "image": images,
        "label": pa.array(client.labels[order], pa.int16()),
        "true_label": pa.array(client.true_labels[order], pa.int16()),
        "client_id": pa.array(np.full(n, client.client_id), pa.int32()),
        "participating": pa.array(np.full(n, client.participating), pa.bool_()),
        "concept": pa.array(concept[order], pa.int8()),
        "style": pa.array([client.style] * n, pa.string()),
        "severity": pa.array(np.full(n, client.severity), pa.int8()),
        "split": pa.array(np.where(client.is_test[order], "test", "train"), pa.string()),
    }
    if client.step is not None:
        columns["step"] = pa.array(client.step[order], pa.int16())
    return pa.table(columns, schema=_schema(image_bytes, client.step is not None))


def _histogram(labels: np.ndarray, num_classes: int) -> tuple[int, ...]:
    return tuple(np.bincount(labels, minlength=num_classes).tolist())


def step_records(client: ClientData, num_classes: int, steps: int) -> tuple[StepRecord, ...]:
    """One record per time step of a participating client of a drifting benchmark."""
    if client.step is None or not client.participating:
        return ()
    records = []
    for t in range(steps):
        here = client.step == t
        train = here & ~client.is_test
        concept = client.row_concept[here] if client.row_concept is not None else []
        records.append(
            StepRecord(
                concept=int(concept[0]) if len(concept) else client.concept,
                style=client.style,
                severity=client.severity,
                train_size=int(train.sum()),
                test_size=int((here & client.is_test).sum()),
                label_histogram=_histogram(client.labels[train], num_classes),
                true_label_histogram=_histogram(client.true_labels[train], num_classes),
            )
        )
    return tuple(records)


def client_record(client: ClientData, num_classes: int, steps: int = 1) -> ClientRecord:
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
        label_histogram=_histogram(client.labels[train], num_classes),
        true_label_histogram=_histogram(client.true_labels[train], num_classes),
        steps=step_records(client, num_classes, steps),
    )


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_shards(
    folder: Path, clients: Iterable[ClientData], num_classes: int, steps: int = 1
) -> tuple[tuple[ClientRecord, ...], dict[str, str]]:
    """Write each client's shard as it comes (one client's images in memory at a time).
    Returns the clients' records and each shard file's SHA-256, for the manifest."""
    shards = folder / SHARDS
    shards.mkdir(parents=True)
    hashes, records = {}, []
    for client in clients:
        path = shards / shard_name(client.client_id)
        with naming(path):  # pyarrow's errors name no file
            pq.write_table(client_table(client), path, compression="zstd")
        hashes[path.name] = sha256_file(path)
        records.append(client_record(client, num_classes, steps))
    return tuple(records), hashes


@dataclass
class FederatedData:
    """The whole federated dataset as tensors: each client's train and test rows are contiguous.

    Client `i`'s training rows are `train_slices[i]`, its test rows `test_slices[i]`; clients
    are numbered as in the manifest (participating first, then the held-out ones). A drifting
    benchmark holds every time step's rows; the data is seen at one `step` at a time
    (`at_step`): the slices, the manifest's records and `distinct` are that step's.
    """

    images: torch.Tensor  # (N, C, H, W) uint8
    labels: torch.Tensor  # (N,) int64
    train_slices: list[slice]
    test_slices: list[slice]
    manifest: Manifest
    distinct: torch.Tensor  # rows holding each distinct image once (held-out clients share them)
    inverse: torch.Tensor  # row → position of its image in `distinct`
    loaded: list[int] | None = None  # the clients whose rows are here (None: all of them)
    step: int = 0
    # per step: (train slices, test slices, distinct, inverse); one entry for a static benchmark
    steps: list[tuple[list[slice], list[slice], torch.Tensor, torch.Tensor]] | None = None
    full_manifest: Manifest | None = None  # every step's records (None: `manifest` itself)

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

    @property
    def time_steps(self) -> int:
        return self.manifest.time_steps

    @property
    def benchmark(self) -> Manifest:
        """The manifest with every step's records (the view's `manifest` has one step's)."""
        return self.full_manifest or self.manifest

    def previous_train(self, client: int) -> slice:
        """Client's training rows at the step before this view's (empty at the first step, on
        a static benchmark, and where its rows are not loaded)."""
        if self.steps is None or self.step == 0:
            return slice(0, 0)
        return self.steps[self.step - 1][0][client]

    def previous_train_size(self, client: int) -> int:
        """How many training rows client held at the step before this view's, from the
        manifest (so on every place, its rows loaded or not; 0 at the first step)."""
        if self.step == 0:
            return 0
        return self.benchmark.clients[client].at_step(self.step - 1).train_size

    def at_step(self, step: int) -> FederatedData:
        """The data as client i holds it at `step` (itself for a static benchmark)."""
        if self.steps is None or step == self.step:
            return self
        train, test, distinct, inverse = self.steps[step]
        return dataclasses.replace(
            self,
            train_slices=train,
            test_slices=test,
            distinct=distinct,
            inverse=inverse,
            manifest=self.benchmark.at_step(step),
            step=step,
            full_manifest=self.benchmark,
        )

    def to(self, device: torch.device) -> FederatedData:
        steps = None
        if self.steps is not None:
            steps = [(tr, te, d.to(device), i.to(device)) for tr, te, d, i in self.steps]
        return dataclasses.replace(
            self,
            images=self.images.to(device),
            labels=self.labels.to(device),
            distinct=self.distinct.to(device),
            inverse=self.inverse.to(device),
            steps=steps,
        )


def _row_spans(entry: ClientRecord, offset: int, steps: int) -> list[tuple[slice, slice]]:
    """(train, test) rows of a client at each step, its shard starting at row `offset`."""
    if not entry.steps:  # static, or held out: the same rows at every step
        train = slice(offset, offset + entry.train_size)
        return [(train, slice(train.stop, offset + entry.size))] * steps
    spans = []
    for step in entry.steps:
        train = slice(offset, offset + step.train_size)
        offset = train.stop + step.test_size
        spans.append((train, slice(train.stop, offset)))
    return spans


def _distinct(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first row of each distinct image, and each row's position among them."""
    _, distinct, inverse = np.unique(
        rows.view(np.dtype((np.void, rows.shape[1]))).ravel(),
        return_index=True,
        return_inverse=True,
    )
    return distinct, inverse.reshape(-1)


def _step_views(
    spans: list[list[tuple[slice, slice]]], distinct: np.ndarray, inverse: np.ndarray
) -> list[tuple[list[slice], list[slice], torch.Tensor, torch.Tensor]]:
    """Per step, the clients' slices and the distinct images among that step's rows (the other
    rows map to position 0: nothing reads them while the data is at that step)."""
    views = []
    for t in range(len(spans[0]) if spans else 1):
        train = [client[t][0] for client in spans]
        test = [client[t][1] for client in spans]
        rows = np.concatenate(
            [np.arange(tr.start, te.stop) for tr, te in zip(train, test)] or [np.zeros(0, int)]
        )
        needed, position = np.unique(inverse[rows], return_inverse=True)
        step_inverse = np.zeros_like(inverse)
        step_inverse[rows] = position.reshape(-1)
        views.append(
            (train, test, torch.from_numpy(distinct[needed]), torch.from_numpy(step_inverse))
        )
    return views


def client_spans(manifest: Manifest) -> list[list[tuple[slice, slice]]]:
    """Every client's (train, test) rows at each step, with all clients' rows one block after
    another in client order (as `load_federated` lays out the whole benchmark)."""
    spans, offset = [], 0
    for entry in manifest.clients:
        spans.append(_row_spans(entry, offset, manifest.time_steps))
        offset += entry.size
    return spans


def over_steps(data: FederatedData, spans: list[list[tuple[slice, slice]]]) -> FederatedData:
    """`data` seen at step 0 of its steps (itself for a static benchmark); `spans`: each
    client's rows at each step, as `client_spans` gives them."""
    if data.time_steps == 1:
        return data
    views = _step_views(spans, data.distinct.numpy(), data.inverse.numpy())
    return dataclasses.replace(data, steps=views, step=-1).at_step(0)


def load_federated(folder: Path, clients: Collection[int] | None = None) -> FederatedData:
    """Every client's shard, or only those of `clients` (a distributed rank's share): the
    others get empty slices and are left out of `loaded`. A drifting benchmark is returned at
    step 0."""
    manifest = read_benchmark(folder)
    concepts = parse_concepts(list(manifest.concepts))  # names read_benchmark has checked
    shape = manifest.image_shape  # (H, W, C)
    image_bytes = int(np.prod(shape))
    steps = manifest.time_steps
    schema = _schema(image_bytes, stepped=steps > 1)
    images, labels, spans = [], [], []
    offset = 0
    for position, entry in enumerate(manifest.clients):  # client ids are positions
        if clients is not None and position not in clients:
            spans.append([(slice(offset, offset), slice(offset, offset))] * steps)
            continue
        path = folder / SHARDS / shard_name(position)
        table = read_parquet(path, "shard missing", partial(check_shard_hash, path, manifest))
        expected = entry.size
        if table.num_rows != expected or not table.schema.equals(schema):
            raise FedrcError(
                f"{path}: shard does not match the manifest ({table.num_rows} rows, expected "
                f"{expected} rows in fedrc's shard schema with {image_bytes}-byte images)"
            )
        column = table.column("image").combine_chunks()
        raw = np.frombuffer(column.buffers()[1], dtype=np.uint8)
        raw = raw[column.offset * image_bytes : (column.offset + len(column)) * image_bytes]
        images.append(raw.reshape(-1, *shape))
        labels.append(checked_labels(path, table, manifest.num_classes))
        check_rows(path, table, entry, labels[-1], manifest.num_classes, concepts)
        spans.append(_row_spans(entry, offset, steps))
        offset += expected
    pixels = np.concatenate(images) if images else np.zeros((0, *shape), np.uint8)
    labels = labels or [np.zeros(0, np.int64)]
    distinct, inverse = _distinct(np.ascontiguousarray(pixels.reshape(len(pixels), -1)))
    train, test = [s[0][0] for s in spans], [s[0][1] for s in spans]
    data = FederatedData(
        torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous(),
        torch.from_numpy(np.concatenate(labels)),
        train,
        test,
        manifest,
        torch.from_numpy(distinct),
        torch.from_numpy(inverse),
        None if clients is None else sorted(clients),
    )
    return over_steps(data, spans)


def check_shard_hash(path: Path, manifest: Manifest, data: bytes) -> None:
    """The shard's bytes `data` must have the SHA-256 the manifest recorded when it was
    written."""
    recorded = manifest.files.get(path.name)
    if recorded is None:
        raise FedrcError(f"{path}: the manifest records no SHA-256 for this shard")
    if hashlib.sha256(data).hexdigest() != recorded:
        raise FedrcError(
            f"{path}: SHA-256 does not match the manifest (the shard was changed or damaged "
            "after `fedrc partition`); partition again"
        )


def data_digest(manifest: Manifest) -> str:
    """One hash for the whole federated dataset (the manifest's content hash)."""
    return manifest.content_hash
