"""The FedRC benchmark (paper appendix H.8, NOTES §4): label, feature and concept shift at once.

Participating clients: the paper's sequential Dirichlet label split of the training set, client
types from the chosen mix (concept, corrupted or not), one corruption and severity per corrupted
client, a seeded train/test split. Non-participating clients: one per concept, a class-balanced
part of the test set with that concept's label map, clean, split the same way into a labelled
part for the E-step (`train`) and a scored part (`test`).
"""

from __future__ import annotations

import numpy as np

from pipeline.config import PartitionConfig, config_dict
from pipeline.data.corruptions import check_style, corrupt, suite_for
from pipeline.data.shards import ClientData, client_summary
from pipeline.data.shifts import (
    CLIENT_MIXES,
    CONCEPT_NAMES,
    apply_concept,
    balanced_subset,
    client_types,
    sequential_dirichlet_split,
    train_test_split,
)
from pipeline.data.sources import RawDataset
from pipeline.errors import FedrcError


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


def build_clients(config: PartitionConfig, raw: RawDataset) -> list[ClientData]:
    split_seq, types_seq, style_seq, holdout_seq, client_seq = np.random.SeedSequence(
        config.seed
    ).spawn(5)
    per_client = config.samples_per_client or raw.train_labels.size // config.clients
    indices = sequential_dirichlet_split(
        raw.train_labels,
        raw.num_classes,
        config.clients,
        per_client,
        config.alpha,
        np.random.default_rng(split_seq),
    )
    concept, corrupted = client_types(
        config.clients, config.client_mix, np.random.default_rng(types_seq)
    )
    styles = resolve_styles(config, raw.image_shape[-1])
    style_rng = np.random.default_rng(style_seq)
    client_seeds = client_seq.spawn(config.clients + len(CONCEPT_NAMES))

    clients = []
    for i, idx in enumerate(indices):
        rng = np.random.default_rng(client_seeds[i])
        images = raw.train_images[idx]
        style, severity = "none", 0
        if corrupted[i]:
            style = styles[style_rng.integers(len(styles))]
            severity = int(style_rng.integers(1, 6))
            images = corrupt(images, style, severity, seed=int(rng.integers(2**31)))
        true = raw.train_labels[idx]
        clients.append(
            ClientData(
                i,
                True,
                int(concept[i]),
                style,
                severity,
                images,
                true,
                apply_concept(true, int(concept[i]), raw.num_classes),
                train_test_split(idx.size, config.test_fraction, rng),
            )
        )

    holdout = balanced_subset(
        raw.test_labels,
        raw.num_classes,
        config.holdout_samples,
        np.random.default_rng(holdout_seq),
    )
    for c in range(len(CONCEPT_NAMES)):
        client_id = config.clients + c
        rng = np.random.default_rng(client_seeds[client_id])
        true = raw.test_labels[holdout]
        clients.append(
            ClientData(
                client_id,
                False,
                c,
                "none",
                0,
                raw.test_images[holdout],
                true,
                apply_concept(true, c, raw.num_classes),
                train_test_split(holdout.size, config.test_fraction, rng),
            )
        )
    return clients


def build_manifest(config: PartitionConfig, raw: RawDataset, clients: list[ClientData]) -> dict:
    return {
        "dataset": raw.name,
        "source": raw.source,
        "image_shape": list(raw.image_shape),
        "num_classes": raw.num_classes,
        "concepts": list(CONCEPT_NAMES),
        "client_mix": CLIENT_MIXES[config.client_mix],
        "params": {k: v for k, v in config_dict(config).items() if k != "out"},
        "seed": config.seed,
        "num_participating": config.clients,
        "clients": [client_summary(c, raw.num_classes) for c in clients],
    }
