"""A shard's rows against the manifest's record of its client, checked when it is loaded.

The shard's bytes are covered by its SHA-256; these checks make sure the records that say how
to read those bytes tell the truth: whose rows they are, which rows are training and which are
test rows (at each time step), what concept, style and labels they hold. A manifest edited
after `fedrc partition` (or one from before its content hash covered the records) is refused
here, naming the shard, instead of training on the wrong split or scoring a label that is not
a class.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.common.errors import FedrcError
from pipeline.data.concepts import Concept, agrees
from pipeline.data.records import ClientRecord, StepRecord


def checked_labels(
    path: Path, table: pa.Table, num_classes: int, column: str = "label"
) -> np.ndarray:
    """The shard's labels, refused unless each is a class of the benchmark, [0, classes)."""
    labels = table.column(column).to_numpy().astype(np.int64)
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if len(bad):
        what = "label" if column == "label" else column.replace("_", " ")
        raise FedrcError(
            f"{path}: {what} {labels[bad[0]]} in row {bad[0]} ({len(bad)} such rows) is outside "
            f"[0, {num_classes}), the benchmark's classes; partition again"
        )
    return labels


def _column(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False))


def _disagree(path: Path, name: str, what: str) -> FedrcError:
    return FedrcError(
        f"{path}: the shard and the manifest's {name} disagree ({what}); the manifest or the "
        "shard was changed after `fedrc partition`: partition again"
    )


def _histogram(labels: np.ndarray, num_classes: int) -> tuple[int, ...]:
    return tuple(np.bincount(labels, minlength=num_classes).tolist())


def check_rows(
    path: Path,
    table: pa.Table,
    entry: ClientRecord,
    labels: np.ndarray,
    num_classes: int,
    concepts: Sequence[Concept],
) -> None:
    """`table` (a shard of `entry.size` rows, `labels` its checked labels) holds what `entry`
    says: the client's id and participation, its train rows before its test rows at each step
    in the sizes recorded, each step's concept (index, and labels that its label map gives:
    `concepts` are the manifest's), the style, severity and label histograms."""
    name = f"clients[{entry.client_id}]"
    ids = _column(table, "client_id")
    if (ids != entry.client_id).any():
        other = int(ids[ids != entry.client_id][0])
        raise _disagree(path, name, f"rows of client {other}, expected client {entry.client_id}")
    if (_column(table, "participating") != entry.participating).any():
        raise _disagree(path, name, f"participating is {str(entry.participating).lower()}")
    true_labels = checked_labels(path, table, num_classes, "true_label")
    steps: tuple[StepRecord | ClientRecord, ...] = entry.steps or (entry,)
    split, step_column = _column(table, "split"), None
    if entry.steps:
        step_column = _column(table, "step")
    in_rows, start = _column(table, "concept"), 0
    for t, step in enumerate(steps):
        rows = slice(start, start + step.train_size + step.test_size)
        at = f" at step {t}" if entry.steps else ""
        expected = np.repeat(["train", "test"], [step.train_size, step.test_size])
        if (split[rows] != expected).any():
            held = (split[rows] == "train").sum(), (split[rows] == "test").sum()
            raise _disagree(
                path,
                name,
                f"train_size {step.train_size} and test_size {step.test_size}{at}, but the "
                f"shard holds {held[0]} train and {held[1]} test rows there",
            )
        if step_column is not None and (step_column[rows] != t).any():
            raise _disagree(path, name, f"rows {rows.start}..{rows.stop - 1} are not step {t}")
        if (in_rows[rows] != step.concept).any():
            raise _disagree(path, name, f"concept {step.concept}{at}")
        concept = concepts[step.concept]
        if not agrees(concept, true_labels[rows], labels[rows], num_classes):
            raise _disagree(path, name, f"concept {concept.name!r}: labels it does not give{at}")
        train = slice(rows.start, rows.start + step.train_size)
        for key, values in (("label", labels), ("true_label", true_labels)):
            if _histogram(values[train], num_classes) != getattr(step, f"{key}_histogram"):
                raise _disagree(path, name, f"{key}_histogram{at}")
        start = rows.stop
    if entry.steps:  # the client's own histograms: over its training rows of every step
        for key, values in (("label", labels), ("true_label", true_labels)):
            if _histogram(values[split == "train"], num_classes) != getattr(
                entry, f"{key}_histogram"
            ):
                raise _disagree(path, name, f"{key}_histogram")
    if (_column(table, "style") != entry.style).any():
        raise _disagree(path, name, f"style {entry.style!r}")
    if (_column(table, "severity") != entry.severity).any():
        raise _disagree(path, name, f"severity {entry.severity}")
