"""What a dataset is to fedrc: a name and a function that loads its images."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.data.loaders.raw import RawDataset


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset `fedrc partition --dataset` can name; a plugin exports one instance (entry
    point group `fedrc.datasets`).

    `load(data_root)` returns the images (uint8, N × H × W × C) and labels of the train and test
    sets; `num_classes` and `channels` are None when only the files tell (then the partition
    checks its settings against the loaded data instead of before loading), `shape` (H, W, C)
    when every copy of the dataset has it (a benchmark's manifest is checked against it). A
    `tabular` dataset stores feature vectors as (1, d, 1) images: image corruptions (feature
    shift) do not apply.
    A dataset that reads no files (`reads_files` False: generated, like `synthetic`) refuses a
    `--data-root`, which it would ignore."""

    name: str
    summary: str
    load: Callable[[str | None], RawDataset]
    num_classes: int | None = None
    channels: int | None = None
    tabular: bool = False
    reads_files: bool = True
    shape: tuple[int, int, int] | None = None
