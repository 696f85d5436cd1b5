"""The federated benchmark (FedRC appendix H.8, protocol §4; Fed-CAM partitions, protocol §3).

Participating clients: a label split of the (optionally replicated) training pool, client types
from the chosen mix (concept, corrupted or not), one corruption and severity per corrupted
client, the concept's label map, a seeded train/test split. Non-participating clients: one per
concept, a class-balanced part of the test set with that concept's label map (clean unless
`holdout_corrupted`), split the same way into a labelled part for the E-step (`train`) and a
scored part (`test`). `shifts` switches label, feature or concept shift off (Table 8).

Drift over time (T = `time_steps` > 1, `pipeline.data.drift`): a participating client's samples
(`samples_per_client` per step) are dealt at random into T parts, one per step, each split into
train and test and labelled by the client's concept at that step; its style stays. The static
benchmark (T = 1) draws exactly as before, so its shards are unchanged byte for byte.

Where the clients come from instead of a label split: a Flower Datasets partitioner
(`pipeline.data.partitioners`), or clients the data defines (`pipeline.data.natural`): natural
ids, whose held-out clients are unseen ids from the training pool, and a recorded stream, whose
rows keep their time order: each client's part of a time window is its step, the last rows of
each part its test split.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import re
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import numpy as np

from pipeline.common.errors import FedrcError
from pipeline.common.io import atomic_dir
from pipeline.common.settings import config_dict
from pipeline.data.client_mix import client_types, mix_groups
from pipeline.data.concepts import Concept, check_distinct, parse_concepts
from pipeline.data.corruptions import check_style, corrupt, suite_for
from pipeline.data.drift import build_schedule
from pipeline.data.label_splits import LabelSplit, split_labels
from pipeline.data.loaders import RawDataset
from pipeline.data.natural import natural_split, segment_split
from pipeline.data.partition_config import PartitionConfig
from pipeline.data.partitioners import flower_split
from pipeline.data.records import MANIFEST, ClientRecord, Manifest, MixGroup, write_manifest
from pipeline.data.sampling import balanced_subset, train_test_split
from pipeline.data.shards import SHARDS, ClientData, write_shards


def resolve_styles(config: PartitionConfig, channels: int) -> list[str]:
    """The corruptions corrupted clients draw from: `partition.styles`, or the whole suite of
    the images' channel count (grey or colour)."""
    try:
        if not config.styles:
            return list(suite_for(channels))
        for style in config.styles:
            check_style(style, channels)
    except ValueError as e:
        raise FedrcError(f"partition.styles: {e}") from None
    return sorted(config.styles)


def used_concepts(config: PartitionConfig) -> list[Concept]:
    """The concepts in play: all of `concepts`, or only the first without concept shift."""
    concepts = parse_concepts(config.concepts)
    return concepts if "concept" in config.shifts else concepts[:1]


def build_clients(config: PartitionConfig, raw: RawDataset) -> Iterator[ClientData]:
    """Every client, participating ones first. Splits and types are drawn now (so bad settings
    fail before anything is written); images are gathered and corrupted one client at a time."""
    # the first five as in every fedrc before drift, so a static benchmark draws the same
    split_seq, types_seq, style_seq, holdout_seq, client_seq, drift_seq = np.random.SeedSequence(
        config.seed
    ).spawn(6)
    config.check_classes(raw.num_classes)  # a dataset may tell its classes only once loaded
    pool_labels = np.tile(raw.train_labels, config.replicate)
    steps, quota = config.steps, config.samples_per_client
    if steps > 1 and quota is not None and config.clients * quota * steps > pool_labels.size:
        raise FedrcError(
            f"partition.time_steps: {config.clients} clients × {quota} samples × {steps} steps "
            f"exceed the {pool_labels.size} training samples; lower samples_per_client or "
            "time_steps, or raise replicate"
        )
    split_config = (
        config
        if steps == 1 or quota is None
        else dataclasses.replace(config, samples_per_client=quota * steps)
    )
    concepts = used_concepts(config)
    split = _split(split_config, raw, pool_labels, len(concepts), np.random.default_rng(split_seq))
    for concept_ in concepts:
        concept_.check(raw.num_classes, len(raw.label_rules))
    check_distinct(concepts, raw.num_classes)
    groups = mix_groups(config.client_mix, len(config.concepts), config.client_shares)
    concept, corrupted = client_types(config.clients, groups, np.random.default_rng(types_seq))
    if "concept" not in config.shifts:
        concept[:] = 0
    if "feature" not in config.shifts:
        corrupted[:] = False
    holdout = balanced_subset(
        raw.test_labels, raw.num_classes, config.holdout_samples, np.random.default_rng(holdout_seq)
    )  # drawn in any case, so that the draws after it stay as they were
    styles = resolve_styles(config, raw.image_shape[-1])
    schedule = None
    if steps > 1:
        names = [c.name for c in concepts]
        rng = np.random.default_rng(drift_seq)
        schedule = build_schedule(config.drift, config.drift_share, steps, concept, names, rng)
        concept = schedule[0]
        _check_parts(split, steps)
    return _clients(
        config,
        raw,
        split,
        concepts,
        concept,
        corrupted,
        holdout,
        style_seq,
        client_seq,
        styles,
        schedule,
    )


def _split(
    config: PartitionConfig,
    raw: RawDataset,
    labels: np.ndarray,
    held_out: int,
    rng: np.random.Generator,
) -> LabelSplit:
    """The participating clients' samples: natural ids, a recorded stream's segments, a Flower
    partitioner, or fedrc's label split."""
    if (config.partition_by is not None or raw.ordered) and config.replicate != 1:
        raise FedrcError("partition.replicate: 1 with natural ids or a recorded stream")
    if config.partition_by is not None:
        if config.partition_by not in raw.columns:
            named = ", ".join(raw.columns) or "none"
            raise FedrcError(
                f"partition.partition_by: {raw.name} has no column {config.partition_by!r} to "
                f"name clients by (columns: {named})"
            )
        ids = raw.columns[config.partition_by]
        return natural_split(
            ids, config.partition_by, config.clients, held_out, config.holdout_ids,
            config.steps, raw.ordered, rng,
        )  # fmt: skip
    if raw.ordered:
        return segment_split(labels.size, config.clients, config.steps)
    if config.partitioner is not None:
        parts = flower_split(
            config.partitioner, config.partitioner_options, labels,
            {k: np.tile(v, config.replicate) for k, v in raw.columns.items()},
            config.clients, config.seed,
        )  # fmt: skip
        return LabelSplit(parts, None)
    return split_labels(config, labels, raw.num_classes, rng)


def _check_parts(split: LabelSplit, steps: int) -> None:
    """Every step of every client needs a train and a test sample."""
    smallest = min(len(idx) for idx in split.indices)
    if smallest < 2 * steps:
        raise FedrcError(
            f"partition.time_steps: a client holds {smallest} samples, too few for {steps} steps "
            "(each needs a train and a test sample); raise samples_per_client or lower time_steps"
        )


def _clients(
    config: PartitionConfig,
    raw: RawDataset,
    split: LabelSplit,
    concepts: list[Concept],
    concept: np.ndarray,
    corrupted: np.ndarray,
    holdout: np.ndarray,
    style_seq: np.random.SeedSequence,
    client_seq: np.random.SeedSequence,
    styles: list[str],
    schedule: np.ndarray | None = None,
) -> Iterator[ClientData]:
    style_rng = np.random.default_rng(style_seq)
    seeds = client_seq.spawn(config.clients + len(concepts))

    def make(
        i: int,
        participating: bool,
        c: int,
        is_corrupted: bool,
        images: np.ndarray,
        true: np.ndarray,
        group: int | None,
    ) -> ClientData:
        rng = np.random.default_rng(seeds[i])
        style, severity, clean = "none", 0, images
        if is_corrupted:
            style = styles[style_rng.integers(len(styles))]
            severity = int(style_rng.integers(1, 6))
            images = corrupt(images, style, severity, seed=int(rng.integers(2**31)))
        client = ClientData(i, participating, c, style, severity, images, true, true, true, group)
        ordered = split.steps is not None and participating
        if ordered and schedule is None:  # a recorded stream, one step: its last rows test
            client.is_test = _last(true.size, config.test_fraction)
            client.labels = concepts[c].relabel(true, raw.num_classes, rng, clean, raw.label_rules)
            return client
        if schedule is not None and participating:
            return _over_time(
                client, clean, schedule[:, i], rng, split.steps[i] if ordered else None
            )
        if schedule is not None:  # a held-out client: the same rows at every step
            client.step = np.zeros(true.size, dtype=np.int64)
        client.is_test = train_test_split(true.size, config.test_fraction, rng)
        client.labels = concepts[c].relabel(true, raw.num_classes, rng, clean, raw.label_rules)
        return client

    def _over_time(
        client: ClientData,
        clean: np.ndarray,
        row: np.ndarray,
        rng: np.random.Generator,
        steps: np.ndarray | None = None,
    ) -> ClientData:
        """The client's samples dealt into one part per step, each with that step's concept;
        `steps` (a recorded stream): each row's step, the parts in time order."""
        if steps is None:
            parts = np.array_split(rng.permutation(client.true_labels.size), row.size)
        else:
            parts = [np.flatnonzero(steps == t) for t in range(row.size)]
        order = np.concatenate(parts)
        labels = [
            concepts[k].relabel(
                client.true_labels[p], raw.num_classes, rng, clean[p], raw.label_rules
            )
            for p, k in zip(parts, row)
        ]
        sizes = [p.size for p in parts]

        def split_part(n: int) -> np.ndarray:
            if steps is None:
                return train_test_split(n, config.test_fraction, rng)
            return _last(n, config.test_fraction)

        return dataclasses.replace(
            client,
            concept=int(row[0]),
            images=client.images[order],
            true_labels=client.true_labels[order],
            labels=np.concatenate(labels),
            is_test=np.concatenate([split_part(n) for n in sizes]),
            step=np.repeat(np.arange(row.size), sizes),
            row_concept=np.repeat(row, sizes),
        )

    n = raw.train_labels.size
    for i, idx in enumerate(split.indices):
        group = None if split.groups is None else int(split.groups[i])
        yield make(
            i,
            True,
            int(concept[i]),
            corrupted[i],
            raw.train_images[idx % n],
            raw.train_labels[idx % n],
            group,
        )
    held_corrupted = config.holdout_corrupted and "feature" in config.shifts
    for c in range(len(concepts)):
        images, labels = raw.test_images, raw.test_labels
        rows = holdout
        if split.held is not None:  # unseen natural ids, from the training pool
            images, labels, rows = raw.train_images, raw.train_labels, split.held[c]
        yield make(config.clients + c, False, c, held_corrupted, images[rows], labels[rows], None)


def _last(n: int, test_fraction: float) -> np.ndarray:
    """The test mask of `n` rows in time order: the last round(n · test_fraction), at least one."""
    mask = np.zeros(n, dtype=bool)
    mask[n - min(n - 1, max(1, round(n * test_fraction))) :] = True
    return mask


def versions() -> dict[str, str]:
    """The versions that decide the shard bytes, recorded in the manifest."""
    found = {"python": platform.python_version()}
    for package in ("fedrc", "numpy", "pyarrow", "torch", "torchvision", "pillow"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def benchmark_manifest(
    config: PartitionConfig,
    raw: RawDataset,
    clients: tuple[ClientRecord, ...],
    files: dict[str, str],
) -> Manifest:
    """Everything needed to rebuild the shards, the written clients and their shards' hashes."""
    names = [c.name for c in parse_concepts(config.concepts)]
    return Manifest(
        dataset=raw.name,
        source=raw.source,
        image_shape=raw.image_shape,
        num_classes=raw.num_classes,
        concepts=tuple(c.name for c in used_concepts(config)),
        client_mix=tuple(
            MixGroup(names[c], x, share)
            for c, x, share in mix_groups(config.client_mix, len(names), config.client_shares)
        ),
        config={k: v for k, v in config_dict(config).items() if k != "out"},
        seed=config.seed,
        versions=versions(),
        num_participating=config.clients,
        clients=clients,
        files=files,
        content_hash="",
        time_steps=config.steps,
    ).sealed()


CONFIG = "config.json"
SHARD = re.compile(r"client-\d{5,}\.parquet")  # `shards.shard_name`


def foreign_files(folder: Path) -> list[str]:
    """What in the benchmark folder `folder` fedrc did not write (its manifest, config.json
    and shards are its own), sorted: replacing the folder would delete it."""
    names = [p.name for p in folder.iterdir() if p.name not in (MANIFEST, CONFIG, SHARDS)]
    shards = folder / SHARDS
    if shards.is_dir() and not shards.is_symlink():
        names += [f"{SHARDS}/{p.name}" for p in shards.iterdir() if not SHARD.fullmatch(p.name)]
    elif shards.exists() or shards.is_symlink():
        names.append(SHARDS)
    return sorted(names)


def write_benchmark(config: PartitionConfig, raw: RawDataset) -> Manifest:
    """Build the benchmark from `raw` into `config.out` in one atomic step; returns the manifest."""
    clients = build_clients(config, raw)
    with atomic_dir(Path(config.out)) as tmp:
        records, files = write_shards(tmp, clients, raw.num_classes, config.steps)
        manifest = benchmark_manifest(config, raw, records, files)
        write_manifest(tmp, manifest)
        (tmp / CONFIG).write_text(json.dumps(config_dict(config), indent=2) + "\n")
    return manifest
