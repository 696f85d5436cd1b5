"""A benchmark in numbers, from its manifest: who has which concept and style, how big the
clients are, and how heterogeneous their label distributions are (`fedrc info`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from pipeline.data.loaders.recorded import RECORDED
from pipeline.data.records import Manifest


def mean_pairwise_tv(histograms: np.ndarray) -> float:
    """Mean total-variation distance ½‖p_i − p_j‖₁ over client pairs i < j (0: identical label
    distributions, 1: disjoint classes)."""
    p = histograms / np.maximum(histograms.sum(1, keepdims=True), 1)
    m = len(p)
    if m < 2:
        return 0.0
    total = sum(0.5 * np.abs(p[i + 1 :] - p[i]).sum() for i in range(m - 1))
    return float(total / (m * (m - 1) / 2))


def label_heterogeneity(histograms: np.ndarray) -> dict[str, Any]:
    """Classes per client and mean pairwise TV distance of (M, C) label histograms."""
    classes = (histograms > 0).sum(1)
    return {
        "classes_per_client": {
            "mean": round(float(classes.mean()), 3),
            "min": int(classes.min()),
            "max": int(classes.max()),
        },
        "mean_pairwise_tv": round(mean_pairwise_tv(histograms), 4),
    }


def drift_summary(manifest: Manifest) -> dict[str, Any] | None:
    """The drift schedule step by step: clients per concept, and who drifted to a concept they
    held before (recurring) or to one they had not (new). None for a static benchmark."""
    if manifest.time_steps == 1:
        return None
    schedule = np.asarray(manifest.schedule)
    config = manifest.config
    how = config.get("drift") or f"share {config.get('drift_share', 0):g} a step"
    steps = []
    for t, row in enumerate(schedule):
        moved = np.flatnonzero(row != schedule[t - 1]) if t else np.zeros(0, int)
        recurring = sum(int(row[i] in schedule[:t, i]) for i in moved)
        steps.append(
            {
                "step": t,
                "clients_by_concept": {
                    name: int((row == k).sum()) for k, name in enumerate(manifest.concepts)
                },
                "drifted": moved.tolist(),
                "recurring": recurring,
                "new": int(moved.size) - recurring,
            }
        )
    return {"time_steps": manifest.time_steps, "schedule": how, "steps": steps}


def describe(manifest: Manifest) -> dict[str, Any]:
    """The summary `fedrc info` prints (and writes with --json). Label statistics use the true
    labels of the training splits, so concept label maps do not count as label shift."""
    part = [c for c in manifest.clients if c.participating]
    held = [c for c in manifest.clients if not c.participating]
    by_concept: dict[str, Counter[str]] = {name: Counter() for name in manifest.concepts}
    for c in part:
        by_concept[manifest.concept_name(c.client_id)][c.style] += 1
    sizes = np.asarray([c.size for c in part])
    config = manifest.config
    groups = {c.label_group for c in part} - {None}
    return {
        "dataset": manifest.dataset,
        "image_shape": list(manifest.image_shape),
        "num_classes": manifest.num_classes,
        "seed": manifest.seed,
        "content_hash": manifest.content_hash,
        "shifts": config["shifts"],
        "label_split": label_split(config),
        "label_groups": len(groups),
        "participating": len(part),
        "held_out": len(held),
        "clients_by_concept_and_style": {
            name: dict(sorted(counts.items())) for name, counts in by_concept.items()
        },
        "held_out_clients": [
            {"concept": manifest.concept_name(c.client_id), "style": c.style, "samples": c.size}
            for c in held
        ],
        "samples_per_client": {
            "min": int(sizes.min()),
            "median": float(np.median(sizes)),
            "max": int(sizes.max()),
            "total": int(sizes.sum()),
        },
        "label_heterogeneity": label_heterogeneity(
            np.asarray([c.true_label_histogram for c in part], dtype=float)
        ),
        **({"drift": drift} if (drift := drift_summary(manifest)) else {}),
    }


def label_split(config: dict[str, Any]) -> str:
    """How the participating clients got their samples, in a few words."""
    if config.get("partition_by"):
        return f"natural ids ({config['partition_by']})"
    if config.get("dataset") in RECORDED:
        return "time segments"
    if config.get("partitioner"):
        return f"flwr-datasets {config['partitioner']}"
    return config["label_split"] if "label" in config["shifts"] else "iid"
