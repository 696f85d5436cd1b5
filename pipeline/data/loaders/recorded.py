"""Real drifting streams, read from their usual files in time order: Elec2, Airlines, Covertype.

Unlike the synthetic streams (`streams.py`), a recorded stream's concepts are unknown: its drift
is whatever happened over time, so the benchmark keeps the file's order (`RawDataset.ordered`):
time steps are cut along it and clients are contiguous segments or the values of a column
(`partition.partition_by`, e.g. Airlines' `Airline`). The last tenth of the stream is the test
set (the future no participating client trains on); held-out clients draw from it.

Files (`--data-root`, else `data/raw`; docs/streams.md has each one's origin and licence): an
ARFF file (read with scipy.io.arff) or a CSV file (read with pyarrow; `.gz` is fine), under one
of the names in `RecordedStream.files`; a missing file is downloaded when the machine is online.

Encoding to fedrc's (1, d, 1) uint8 rows: a numeric column is scaled min–max over the file to
0..255; a nominal column with at most ONE_HOT values becomes one byte per value (0 or 255); a
nominal column with more values (Airlines' airports) becomes the rank of its value by
frequency, 0..254, with 255 for all the rarer ones. The label column's values are numbered in
the order of `classes`.
"""

from __future__ import annotations

import gzip
import io
import shutil
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.common.errors import FedrcError
from pipeline.data.loaders.raw import RawDataset, cleanup_on_failure, download_root

ONE_HOT = 32  # nominal columns with at most this many values are one-hot encoded
TEST_SHARE = 0.1  # the stream's last tenth is the test set
TOP = 255

Table = dict[str, np.ndarray]  # column name → values in file order (numbers or strings)


@dataclass(frozen=True)
class RecordedStream:
    """A real stream: where its file comes from and how its columns read."""

    name: str
    summary: str
    files: tuple[str, ...]  # accepted file names in --data-root; the first is downloaded
    url: str  # the download: the file itself, a .gz or a .zip holding it
    target: str  # the label column
    classes: tuple[str, ...]  # its values, in label order
    nominal: tuple[str, ...] = ()  # columns read as categories even when they look numeric
    drop: tuple[str, ...] = ()  # columns that are not features (a time stamp)
    header: tuple[str, ...] | None = None  # the column names of a header-less CSV
    derived: Callable[[Table], Table] | None = None  # extra columns to name clients by


COVERTYPE_COLUMNS = (
    "Elevation",
    "Aspect",
    "Slope",
    "Horizontal_Distance_To_Hydrology",
    "Vertical_Distance_To_Hydrology",
    "Horizontal_Distance_To_Roadways",
    "Hillshade_9am",
    "Hillshade_Noon",
    "Hillshade_3pm",
    "Horizontal_Distance_To_Fire_Points",
    *(f"Wilderness_Area{i}" for i in range(1, 5)),
    *(f"Soil_Type{i}" for i in range(1, 41)),
    "Cover_Type",
)


def _wilderness(table: Table) -> Table:
    """Covertype's four one-hot wilderness columns as one column of area numbers 1..4."""
    areas = np.stack([table[f"Wilderness_Area{i}"].astype(float) for i in range(1, 5)], axis=1)
    return {"wilderness": (areas.argmax(axis=1) + 1).astype(str)}


RECORDED = {
    s.name: s
    for s in (
        RecordedStream(
            "elec2",
            "Elec2: NSW electricity prices, 45,312 half-hours 1996–98, price UP / DOWN, 7 "
            "features (Harries, 1999); real drift, time order kept",
            ("electricity.csv", "elecNormNew.arff", "electricity-normalized.csv", "elec2.csv"),
            "https://maxhalford.github.io/files/datasets/electricity.zip",
            "class",
            ("DOWN", "UP"),
            nominal=("day",),
            drop=("date",),
        ),
        RecordedStream(
            "airlines",
            "Airlines: 539,383 US flights of 2008, delayed or not, 7 features (Ikonomovska, "
            "MOA); real drift, time order kept, clients by Airline or airport",
            ("airlines.arff", "airlines.csv"),
            "https://sourceforge.net/projects/moa-datastream/files/Datasets/Classification/"
            "airlines.arff.zip/download",
            "Delay",
            ("0", "1"),
            nominal=("Airline", "AirportFrom", "AirportTo", "DayOfWeek"),
        ),
        RecordedStream(
            "covertype",
            "Covertype: 581,012 forest cells, 7 cover types, 54 features (Blackard & Dean, UCI "
            "1998); the drift literature's file order, clients by wilderness area",
            ("covtype.data.gz", "covtype.data"),
            "https://archive.ics.uci.edu/ml/machine-learning-databases/covtype/covtype.data.gz",
            "Cover_Type",
            tuple(str(c) for c in range(1, 8)),
            header=COVERTYPE_COLUMNS,
            derived=_wilderness,
        ),
    )
}


def _read_arff(path: Path) -> Table:
    from scipy.io import arff

    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            data, meta = arff.loadarff(f)
    except (OSError, ValueError, arff.ArffError, NotImplementedError) as e:
        raise FedrcError(f"--data-root: {path}: not a readable ARFF file ({e})") from None
    table = {}
    for name in meta.names():
        values = data[name]
        if values.dtype.kind == "S":  # nominal values come as bytes
            values = np.char.decode(values, "utf-8")
        table[name] = values
    return table


def _read_csv(path: Path, header: tuple[str, ...] | None) -> Table:
    import pyarrow.csv as pcsv

    names = list(header) if header else None
    try:
        read = pcsv.read_csv(path, read_options=pcsv.ReadOptions(column_names=names))
    except Exception as e:  # pyarrow's ArrowInvalid and OSError: one line naming the file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise FedrcError(f"--data-root: {path}: not a readable CSV file ({reason})") from None
    return {name: read.column(name).to_numpy(zero_copy_only=False) for name in read.column_names}


def _read(spec: RecordedStream, path: Path) -> Table:
    arff = path.name.endswith((".arff", ".arff.gz"))
    table = _read_arff(path) if arff else _read_csv(path, _header(spec, path))
    missing = [c for c in (spec.target, *spec.nominal, *spec.drop) if c not in table]
    if missing:
        raise FedrcError(
            f"--data-root: {path}: no column {missing[0]!r} ({spec.name}'s columns: "
            f"{', '.join(table)})"
        )
    return table


def _header(spec: RecordedStream, path: Path) -> tuple[str, ...] | None:
    """The column names for a header-less file (covtype.data), else None (the file's own)."""
    return spec.header if spec.header and path.name.startswith("covtype.data") else None


def _encode(values: np.ndarray, nominal: bool) -> np.ndarray:
    """One column as byte features (N, k): see the module's docstring."""
    if not nominal:
        numbers = np.nan_to_num(values.astype(np.float64))  # a numeric column (USO: nominal)
        low, high = (numbers.min(), numbers.max()) if numbers.size else (0.0, 0.0)
        scale = TOP / (high - low) if high > low else 0.0
        return np.rint((numbers - low) * scale).astype(np.uint8)[:, None]
    text = values.astype(str)
    kinds, codes, counts = np.unique(text, return_inverse=True, return_counts=True)
    if kinds.size <= ONE_HOT:
        return (np.eye(kinds.size, dtype=np.uint8)[codes] * TOP).astype(np.uint8)
    rank = np.empty(kinds.size, dtype=np.int64)
    rank[np.argsort(-counts, kind="stable")] = np.arange(kinds.size)
    return np.minimum(rank[codes], TOP).astype(np.uint8)[:, None]


def encode(spec: RecordedStream, table: Table, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The rows as (N, 1, d, 1) uint8 and the labels as 0..C−1, in file order."""
    features = [c for c in table if c not in (spec.target, *spec.drop)]
    nominal = set(spec.nominal)
    for column in features:
        if table[column].dtype.kind in "USO" and column not in nominal:
            nominal.add(column)  # text can only be a category
    columns = [_encode(table[c], c in nominal) for c in features]
    rows = np.concatenate(columns, axis=1)[:, None, :, None]
    target = np.char.strip(table[spec.target].astype(str))
    labels = np.full(target.size, -1, dtype=np.int64)
    for k, value in enumerate(spec.classes):
        labels[target == value] = k
    if (labels < 0).any():
        odd = sorted(set(target[labels < 0].tolist()))[:3]
        raise FedrcError(
            f"--data-root: {path}: {spec.target} values {odd} are not {spec.name}'s classes "
            f"({', '.join(spec.classes)})"
        )
    return rows, labels


def _find(spec: RecordedStream, root: Path) -> Path | None:
    for name in spec.files:
        if (root / name).is_file():
            return root / name
    return None


def _download(spec: RecordedStream, root: Path) -> None:
    """The file from `spec.url` into `root` (unpacked from its .zip or kept .gz)."""
    root.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(spec.url, timeout=60) as response:
        payload = response.read()
    if payload[:2] == b"PK":
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            for member in archive.namelist():
                if Path(member).name in spec.files:
                    with archive.open(member) as src, open(root / Path(member).name, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    return
        raise FedrcError(f"--data-root: the download of {spec.name} holds none of {spec.files}")
    (root / spec.files[0]).write_bytes(payload)


def load_recorded(name: str, data_root: str | None) -> RawDataset:
    """The stream's rows in time order: the first nine tenths to train on, the rest the test."""
    spec = RECORDED[name]
    root = Path(download_root(data_root))
    path = _find(spec, root)
    if path is None:
        try:
            with cleanup_on_failure(root):
                _download(spec, root)
        except FedrcError:
            raise
        except Exception as e:  # network errors of several kinds
            raise FedrcError(
                f"--data-root: {spec.name} not found in {root} (any of {', '.join(spec.files)}) "
                f"and the download failed ({type(e).__name__}); pass --data-root DIR holding it"
            ) from None
        path = _find(spec, root)
        assert path is not None
    table = _read(spec, path)
    rows, labels = encode(spec, table, path)
    if spec.derived is not None:
        table = {**table, **spec.derived(table)}
    cut = len(labels) - max(1, round(len(labels) * TEST_SHARE))
    if cut < 2:
        raise FedrcError(f"--data-root: {path}: {len(labels)} rows; too few for a stream")
    columns = {c: np.asarray(v)[:cut] for c, v in table.items() if c != spec.target}
    return RawDataset(
        name,
        rows[:cut],
        labels[:cut],
        rows[cut:],
        labels[cut:],
        len(spec.classes),
        str(path.resolve()),
        columns=columns,
        ordered=True,
    )
