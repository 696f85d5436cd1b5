"""Small files in the real formats of the sources fedrc reads, with made-up values: what the
tests load, and what the docs' commands run on offline (`python -m tests.formats NAME FOLDER`
from a clone's root). The layouts and columns are the real ones; the numbers are not data.

- `femnist`: FEMNIST as Flower publishes it on the Hugging Face hub (`flwrlabs/femnist`): one
  Parquet file `data/train-00000-of-00001.parquet` written by `datasets`, columns `image`
  (28×28 grey PNG), `writer_id`, `hsf_id`, `character` (ClassLabel of 62: 0-9, A-Z, a-z).
- `hub`: an image classification dataset in the hub's Parquet layout, `train` and `test`
  splits, columns `img` (RGB PNG) and `label` (ClassLabel).
- `elec2`: river's `electricity.csv` (Elec2, MOA's normalised columns), or MOA's
  `elecNormNew.arff` with `--arff`.
- `airlines`: MOA's `airlines.arff`.
- `covertype`: UCI's header-less `covtype.data.gz` (54 features, Cover_Type 1..7).
"""

from __future__ import annotations

import argparse
import gzip
import io
from pathlib import Path

import numpy as np

FEMNIST_CLASSES = [str(d) for d in range(10)] + [chr(c) for c in range(65, 91)]
FEMNIST_CLASSES += [chr(c) for c in range(97, 123)]


def _datasets():
    import datasets

    datasets.disable_progress_bars()
    return datasets


def _png(pixels: np.ndarray) -> dict[str, object]:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def _patterns(labels: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A blocky pattern per class plus noise: images a small CNN can tell apart."""
    classes, (height, width) = int(labels.max()) + 1, shape[:2]
    coarse = rng.uniform(0, 255, size=(classes, 4, 4, *shape[2:]))
    prototypes = coarse.repeat(height // 4, axis=1).repeat(width // 4, axis=2)
    noise = rng.normal(0, 40, size=(labels.size, *shape))
    return np.clip(prototypes[labels] + noise, 0, 255).astype(np.uint8)


def femnist(folder: Path, samples: int = 1200, writers: int = 24, seed: int = 0) -> Path:
    """FEMNIST's hub layout; each writer writes a few of the 62 characters."""
    datasets = _datasets()
    rng = np.random.default_rng(seed)
    writer = np.sort(rng.integers(0, writers, samples))
    labels = np.array([rng.choice(10) + 10 * (w % 6) for w in writer])  # 10 characters a writer
    images = _patterns(labels, (28, 28), rng)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "writer_id": datasets.Value("string"),
            "hsf_id": datasets.Value("int64"),
            "character": datasets.ClassLabel(names=FEMNIST_CLASSES),
        }
    )
    table = {
        "image": [_png(i) for i in images],
        "writer_id": [f"f{w:04d}_{w % 100:02d}" for w in writer],
        "hsf_id": [int(w % 4) for w in writer],
        "character": labels.tolist(),
    }
    path = folder / "data" / "train-00000-of-00001.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(table, features=features).to_parquet(str(path))
    return folder


def hub(folder: Path, train: int = 600, test: int = 200, classes: int = 10, seed: int = 0) -> Path:
    """An image classification dataset in the hub's Parquet layout (train and test)."""
    datasets = _datasets()
    rng = np.random.default_rng(seed)
    features = datasets.Features(
        {
            "img": datasets.Image(),
            "label": datasets.ClassLabel(names=[f"class{c}" for c in range(classes)]),
        }
    )
    for split, n in (("train", train), ("test", test)):
        labels = np.arange(n) % classes
        rng.shuffle(labels)
        images = _patterns(labels, (16, 16, 3), np.random.default_rng(seed + 1))
        images = np.clip(images + rng.normal(0, 20, images.shape), 0, 255).astype(np.uint8)
        table = {"img": [_png(i) for i in images], "label": labels.tolist()}
        path = folder / "data" / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict(table, features=features).to_parquet(str(path))
    return folder


ELEC2_COLUMNS = ("date", "day", "period", "nswprice", "nswdemand", "vicprice", "vicdemand",
                 "transfer")  # fmt: skip


def _elec2_rows(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Half-hours in order; the price goes UP when demand exceeds a level that drifts."""
    rng = np.random.default_rng(seed)
    t = np.arange(rows)
    day = (t // 48) % 7 + 1
    period = (t % 48) / 47
    demand = np.clip(0.5 + 0.3 * np.sin(2 * np.pi * period) + rng.normal(0, 0.1, rows), 0, 1)
    level = 0.4 + 0.2 * (t > rows // 2)  # the drift: the level moves half-way
    up = demand > level
    values = np.stack(
        [t / rows, day, period, rng.uniform(0, 0.1, rows), demand, rng.uniform(0, 0.01, rows),
         rng.uniform(0, 1, rows), rng.uniform(0, 1, rows)], axis=1,
    )  # fmt: skip
    return values, np.where(up, "UP", "DOWN")


def elec2(folder: Path, rows: int = 2000, arff: bool = False, seed: int = 0) -> Path:
    """river's electricity.csv, or MOA's elecNormNew.arff."""
    values, labels = _elec2_rows(rows, seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        ",".join([f"{v:.6f}" if j != 1 else str(int(v)) for j, v in enumerate(row)] + [label])
        for row, label in zip(values, labels)
    ]
    if not arff:
        path = folder / "electricity.csv"
        path.write_text(",".join([*ELEC2_COLUMNS, "class"]) + "\n" + "\n".join(lines) + "\n")
        return path
    header = ["@relation elecNormNew", ""]
    for name in ELEC2_COLUMNS:
        kind = "{1,2,3,4,5,6,7}" if name == "day" else "numeric"
        header.append(f"@attribute {name} {kind}")
    header += ["@attribute class {UP,DOWN}", "", "@data"]
    path = folder / "elecNormNew.arff"
    path.write_text("\n".join(header + lines) + "\n")
    return path


AIRLINES = ("9E", "AA", "AS", "B6", "CO", "DL", "EV", "F9", "FL", "HA", "MQ", "OH", "OO", "UA",
            "US", "WN", "XE", "YV")  # fmt: skip


def airlines(folder: Path, rows: int = 3000, seed: int = 0) -> Path:
    """MOA's airlines.arff: flights in order, delayed more often on some carriers and later."""
    rng = np.random.default_rng(seed)
    airports = [f"A{k:02d}" for k in range(40)]
    carrier = rng.integers(0, len(AIRLINES), rows)
    time = np.sort(rng.integers(10, 1440, rows))
    delay = rng.uniform(size=rows) < 0.2 + 0.4 * (carrier % 3 == 0) + 0.2 * (time > 900)
    lines = [
        f"{AIRLINES[c]},{rng.integers(1, 7000)},{airports[rng.integers(40)]},"
        f"{airports[rng.integers(40)]},{rng.integers(1, 8)},{t},{rng.integers(20, 600)},{int(d)}"
        for c, t, d in zip(carrier, time, delay)
    ]
    header = [
        "@relation airlines",
        f"@attribute Airline {{{','.join(AIRLINES)}}}",
        "@attribute Flight numeric",
        f"@attribute AirportFrom {{{','.join(airports)}}}",
        f"@attribute AirportTo {{{','.join(airports)}}}",
        "@attribute DayOfWeek {1,2,3,4,5,6,7}",
        "@attribute Time numeric",
        "@attribute Length numeric",
        "@attribute Delay {0,1}",
        "@data",
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "airlines.arff"
    path.write_text("\n".join(header + lines) + "\n")
    return path


def covertype(folder: Path, rows: int = 2000, seed: int = 0) -> Path:
    """UCI's covtype.data.gz: 10 numbers, 4 + 40 one-hot columns, the cover type 1..7."""
    rng = np.random.default_rng(seed)
    area = rng.integers(0, 4, rows)
    soil = rng.integers(0, 40, rows)
    numbers = rng.integers(0, 3000, size=(rows, 10))
    cover = (numbers[:, 0] // 500 + area) % 7 + 1
    lines = []
    for i in range(rows):
        hot = ["0"] * 44
        hot[area[i]] = hot[4 + soil[i]] = "1"
        lines.append(",".join([*map(str, numbers[i]), *hot, str(cover[i])]))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "covtype.data.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


WRITERS = {"femnist": femnist, "hub": hub, "elec2": elec2, "airlines": airlines,
           "covertype": covertype}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(WRITERS))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--arff", action="store_true", help="elec2: MOA's ARFF file")
    args = parser.parse_args()
    if args.name == "elec2":
        elec2(args.folder, arff=args.arff)
    else:
        WRITERS[args.name](args.folder)
    print(f"wrote {args.name} (made-up values, the real layout) in {args.folder}")


if __name__ == "__main__":
    main()
