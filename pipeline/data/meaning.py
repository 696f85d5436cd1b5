"""A benchmark's manifest, read for a run: its records must mean something, not only be of
their types and match their hash (`records.read_manifest`), which an edit whose hash was
computed again passes.

Its concepts must be label maps fedrc knows (each shard's labels are then checked against
them as it loads: `shard_checks`), and a built-in dataset's classes and image shape its own. A
benchmark that a killed `partition --overwrite` left aside is named, not called missing.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.common.errors import FedrcError
from pipeline.common.io import OLD, leftovers
from pipeline.data.concepts import parse_concepts
from pipeline.data.loaders import shape_problem
from pipeline.data.records import MANIFEST, Manifest, read_manifest


def read_benchmark(folder: Path, option: str = "--data") -> Manifest:
    """`folder`'s manifest (`read_manifest`), checked for what it means (`check_meaning`)."""
    if not folder.exists():
        aside = [p.name for p in leftovers(folder.parent, [folder.name]) if OLD in p.name]
        if aside:  # `partition --overwrite` killed between its two renames
            raise FedrcError(
                f"{option}: {folder} not found: a replacement of it was stopped half-way and "
                f"its previous version waits in {folder.parent / aside[-1]}; the next "
                f"`fedrc partition --out {folder}` puts it back"
            )
    manifest = read_manifest(folder, option)
    check_meaning(manifest, folder / MANIFEST)
    return manifest


def check_meaning(manifest: Manifest, path: Path) -> None:
    """Concept names that are label maps fedrc knows, distinct by name, and the classes and
    image shape of the dataset named; a FedrcError naming `path` if not."""
    try:
        parse_concepts(list(manifest.concepts))
    except FedrcError as e:
        what = str(e).removeprefix("partition.concepts: ")
        raise FedrcError(f"{path}: concepts: {what}") from None
    problem = shape_problem(manifest.dataset, manifest.image_shape, manifest.num_classes)
    if problem is not None:
        raise FedrcError(f"{path}: {problem} (edited since `fedrc partition`?)")
