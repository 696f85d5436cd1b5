"""`manifest.json` as typed records, read and written here and nowhere else.

The manifest (format 2) says how the shards were made (`config`, `seed`, `versions`), what they
hold (dataset, image shape, classes, concepts, one `ClientRecord` per client) and each shard's
SHA-256 (`files`) with `content_hash`. Since `content_hash_covers` exists the content hash is
the SHA-256 of the shard hashes (by file name) together with every record that says what the
data means (`COVERED`: classes, image shape, concepts, each client's sizes, splits and
histograms…), so an edited `num_classes` or a client's swapped split sizes are refused; a
manifest without that key was written before it and its hash covers the sorted shard hashes
only (it is still read, and the shards are checked against its records when they are loaded).
Equal content hashes mean byte-identical shards. Every JSON key is spelled out in `to_json` and
`from_json`, so the file format is visible here; the bytes written are those fedrc wrote before
the records existed, so older format-2 manifests load unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.common.errors import FedrcError

MANIFEST = "manifest.json"
FORMAT_VERSION = 2
# every key of a manifest but format_version, which is read first
MANIFEST_KEYS = (
    "dataset",
    "source",
    "image_shape",
    "num_classes",
    "concepts",
    "client_mix",
    "config",
    "seed",
    "versions",
    "num_participating",
    "clients",
    "files",
    "content_hash",
)
# What the content hash covers besides the shard hashes: every key that changes what the data
# means. How it was made (config, seed, source, versions, client_mix) is left out: two machines
# that build the same shards get the same hash.
COVERED = (
    "dataset",
    "image_shape",
    "num_classes",
    "concepts",
    "num_participating",
    "time_steps",
    "clients",
)


def content_hash(files: dict[str, str], records: dict[str, Any] | None = None) -> str:
    """Without `records` (manifests from before `content_hash_covers`): SHA-256 over the sorted
    per-shard SHA-256 values, one per line. With them (the `COVERED` keys of the manifest's
    JSON): SHA-256 of the canonical JSON of the shard hashes by file name and those records."""
    if records is None:
        return hashlib.sha256("\n".join(sorted(files.values())).encode()).hexdigest()
    canonical = json.dumps({**records, "files": files}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def covered_records(data: dict[str, Any]) -> dict[str, Any]:
    """The `COVERED` keys of a manifest's JSON (`time_steps` is 1 when the file omits it)."""
    return {key: data.get(key, 1) if key == "time_steps" else data[key] for key in COVERED}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Fields:
    """One JSON object of a manifest, read key by key: a missing key or a value of the wrong
    type is one FedrcError naming the file and the key (`clients[3].train_size`)."""

    def __init__(self, path: Path, name: str, value: Any) -> None:
        if not isinstance(value, dict):
            raise FedrcError(f"{path}: {name}: expected an object, got {value!r}")
        self.path, self.name, self.data = path, name, value

    def require(self, *keys: str) -> None:
        missing = [k for k in keys if k not in self.data]
        if missing:
            raise FedrcError(f"{self.path}: {self.name} lacks {', '.join(missing)}")

    def fail(self, key: str, expected: str) -> FedrcError:
        value = self.data[key]
        return FedrcError(f"{self.path}: {self.name}.{key}: expected {expected}, got {value!r}")

    def _get(self, key: str, ok: bool, expected: str) -> Any:
        if not ok:
            raise self.fail(key, expected)
        return self.data[key]

    def _value(self, key: str) -> Any:
        self.require(key)
        return self.data[key]

    def count(self, key: str) -> int:
        value = self._value(key)
        return self._get(key, _is_int(value) and value >= 0, "an integer >= 0")

    def integer(self, key: str) -> int:
        return self._get(key, _is_int(self._value(key)), "an integer")

    def optional_count(self, key: str) -> int | None:
        value = self._value(key)
        ok = value is None or (_is_int(value) and value >= 0)
        return self._get(key, ok, "an integer >= 0 or null")

    def boolean(self, key: str) -> bool:
        return self._get(key, isinstance(self._value(key), bool), "true or false")

    def string(self, key: str) -> str:
        return self._get(key, isinstance(self._value(key), str), "a string")

    def number(self, key: str) -> float:
        value = self._value(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return self._get(key, ok, "a number")

    def counts(self, key: str) -> tuple[int, ...]:
        value = self._value(key)
        ok = isinstance(value, list) and all(_is_int(v) and v >= 0 for v in value)
        return tuple(self._get(key, ok, "a list of integers >= 0"))

    def strings(self, key: str) -> tuple[str, ...]:
        value = self._value(key)
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return tuple(self._get(key, ok, "a list of strings"))

    def mapping(self, key: str) -> dict[str, Any]:
        return self._get(key, isinstance(self._value(key), dict), "an object")

    def string_map(self, key: str) -> dict[str, str]:
        value = self._value(key)
        ok = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        return self._get(key, ok, "an object of strings")

    def optional_items(self, key: str) -> list[tuple[str, Any]]:
        """`items` of a list that older files lack (none then)."""
        return self.items(key) if key in self.data else []

    def items(self, key: str) -> list[tuple[str, Any]]:
        """A list's items, each with its name for messages (`clients[3]`)."""
        value = self._get(key, isinstance(self._value(key), list), "a list")
        return [(f"{key}[{i}]", item) for i, item in enumerate(value)]


@dataclass(frozen=True)
class StepRecord:
    """What a client holds: its concept, style and split sizes and label histograms, over its
    whole shard (`ClientRecord`) or at one time step of a drifting benchmark."""

    concept: int  # index into Manifest.concepts
    style: str
    severity: int
    train_size: int
    test_size: int
    label_histogram: tuple[int, ...]
    true_label_histogram: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "concept": self.concept,
            "style": self.style,
            "severity": self.severity,
            "train_size": self.train_size,
            "test_size": self.test_size,
            "label_histogram": list(self.label_histogram),
            "true_label_histogram": list(self.true_label_histogram),
        }

    @classmethod
    def from_json(cls, data: Any, path: Path, name: str) -> StepRecord:
        fields = _Fields(path, name, data)
        return cls(
            concept=fields.count("concept"),
            style=fields.string("style"),
            severity=fields.count("severity"),
            train_size=fields.count("train_size"),
            test_size=fields.count("test_size"),
            label_histogram=fields.counts("label_histogram"),
            true_label_histogram=fields.counts("true_label_histogram"),
        )


@dataclass(frozen=True)
class ClientRecord:
    """One client's summary: who it is and how much of what it holds.

    In a drifting benchmark a participating client also has one `StepRecord` per time step; the
    top-level fields then describe its whole shard (sizes and histograms summed over the steps,
    the concept of step 0), and `at_step(t)` is the record as seen at step t."""

    client_id: int
    participating: bool
    concept: int  # index into Manifest.concepts
    style: str  # corruption name or "none"
    severity: int  # 0 when clean
    label_group: int | None  # Fed-CAM cluster-wise label splits only
    train_size: int
    test_size: int
    label_histogram: tuple[int, ...]  # training labels after the concept's label map
    true_label_histogram: tuple[int, ...]  # training labels before it
    steps: tuple[StepRecord, ...] = ()  # per time step (drifting benchmarks, participating)

    @property
    def size(self) -> int:
        """Rows of the client in the view: its train and test splits."""
        return self.train_size + self.test_size

    def at_step(self, step: int) -> ClientRecord:
        """The record at `step` (a held-out or static client is the same at every step)."""
        if not self.steps:
            return self
        return dataclasses.replace(self, **_holding(self.steps[step]))

    def to_json(self) -> dict[str, Any]:
        holding = StepRecord(**{k: getattr(self, k) for k in _holding(self)})
        return {
            "client_id": self.client_id,
            "participating": self.participating,
            "label_group": self.label_group,
            **holding.to_json(),
            **({"steps": [s.to_json() for s in self.steps]} if self.steps else {}),
        }

    @classmethod
    def from_json(cls, data: Any, path: Path, name: str = "client") -> ClientRecord:
        """The record in `data`, read from `path` where it is called `name` (`clients[3]`)."""
        fields = _Fields(path, name, data)
        return cls(
            client_id=fields.count("client_id"),
            participating=fields.boolean("participating"),
            label_group=fields.optional_count("label_group"),
            **_holding(StepRecord.from_json(data, path, name)),
            steps=tuple(
                StepRecord.from_json(step, path, f"{name}.{key}")
                for key, step in fields.optional_items("steps")
            ),
        )


def _holding(record: StepRecord | ClientRecord) -> dict[str, Any]:
    """The fields a `ClientRecord` shares with a `StepRecord`, by name."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(StepRecord)}


@dataclass(frozen=True)
class MixGroup:
    """One group of the client mix: clients of `concept`, corrupted or clean, and their share."""

    concept: str
    corrupted: bool
    share: float

    def to_json(self) -> dict[str, Any]:
        return {"concept": self.concept, "corrupted": self.corrupted, "share": self.share}

    @classmethod
    def from_json(cls, data: Any, path: Path, name: str = "client_mix group") -> MixGroup:
        fields = _Fields(path, name, data)
        return cls(
            concept=fields.string("concept"),
            corrupted=fields.boolean("corrupted"),
            share=fields.number("share"),
        )


@dataclass(frozen=True)
class Manifest:
    """What `fedrc partition` wrote: enough to rebuild the same shards and to check them.

    Clients are numbered by position (participating first, then one held-out client per
    concept); `from_json` refuses any other order.
    """

    dataset: str
    source: str  # where the raw files came from
    image_shape: tuple[int, int, int]  # (H, W, C)
    num_classes: int
    concepts: tuple[str, ...]  # the label maps in play, by name
    client_mix: tuple[MixGroup, ...]
    config: dict[str, Any]  # the partition settings without `out`: PartitionConfig(**config)
    seed: int
    versions: dict[str, str]  # the packages that decide the shard bytes
    num_participating: int
    clients: tuple[ClientRecord, ...]
    files: dict[str, str]  # shard file name → SHA-256
    content_hash: str
    format_version: int = FORMAT_VERSION
    time_steps: int = 1  # T; written only when > 1 (a drifting benchmark)
    covers: tuple[str, ...] = ()  # what content_hash covers beyond the shards (COVERED; () before)

    def sealed(self) -> Manifest:
        """This manifest with a content hash over its shards and its `COVERED` records."""
        hashed = content_hash(self.files, covered_records(self.to_json()))
        return dataclasses.replace(self, covers=COVERED, content_hash=hashed)

    def expected_hash(self) -> str:
        """The content hash its shard hashes and records give, by the rule it was written with."""
        if not self.covers:
            return content_hash(self.files)
        return content_hash(self.files, covered_records(self.to_json()))

    @property
    def schedule(self) -> list[list[int]]:
        """[step][participating client] → concept index: the drift schedule."""
        return [
            [c.at_step(t).concept for c in self.clients if c.participating]
            for t in range(self.time_steps)
        ]

    def at_step(self, step: int) -> Manifest:
        """The manifest as seen at `step`: each client's record of that step."""
        if self.time_steps == 1:
            return self
        return dataclasses.replace(self, clients=tuple(c.at_step(step) for c in self.clients))

    @property
    def participating(self) -> list[int]:
        return [c.client_id for c in self.clients if c.participating]

    @property
    def held_out(self) -> list[int]:
        return [c.client_id for c in self.clients if not c.participating]

    def concept_name(self, client_id: int) -> str:
        return self.concepts[self.clients[client_id].concept]

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "source": self.source,
            "image_shape": list(self.image_shape),
            "num_classes": self.num_classes,
            "concepts": list(self.concepts),
            "client_mix": [group.to_json() for group in self.client_mix],
            "config": self.config,
            "seed": self.seed,
            "versions": self.versions,
            "num_participating": self.num_participating,
            "clients": [client.to_json() for client in self.clients],
            "format_version": self.format_version,
            "files": self.files,
            "content_hash": self.content_hash,
            **({"time_steps": self.time_steps} if self.time_steps > 1 else {}),
            **({"content_hash_covers": list(self.covers)} if self.covers else {}),
        }

    @classmethod
    def from_json(cls, data: Any, path: Path) -> Manifest:
        """The manifest parsed from `path`, checked: its format version first (a file from
        another fedrc says so, rather than which key it lacks), then every key, the client
        order and the content hash."""
        if not isinstance(data, dict) or "format_version" not in data:
            raise FedrcError(f"{path}: not a fedrc manifest (no format_version)")
        fields = _Fields(path, "manifest", data)
        version = fields.integer("format_version")
        if version != FORMAT_VERSION:
            age = "a newer" if version > FORMAT_VERSION else "an older"
            raise FedrcError(
                f"{path}: written by {age} fedrc (format {version}, expected {FORMAT_VERSION}); "
                "rebuild it with `fedrc partition`"
            )
        fields.require(*MANIFEST_KEYS)
        shape = fields.counts("image_shape")
        if len(shape) != 3:
            raise fields.fail("image_shape", "[height, width, channels]")
        manifest = cls(
            dataset=fields.string("dataset"),
            source=fields.string("source"),
            image_shape=(shape[0], shape[1], shape[2]),
            num_classes=fields.count("num_classes"),
            concepts=fields.strings("concepts"),
            client_mix=tuple(
                MixGroup.from_json(group, path, name) for name, group in fields.items("client_mix")
            ),
            config=fields.mapping("config"),
            seed=fields.integer("seed"),
            versions=fields.string_map("versions"),
            num_participating=fields.count("num_participating"),
            clients=tuple(
                ClientRecord.from_json(client, path, name)
                for name, client in fields.items("clients")
            ),
            files=fields.string_map("files"),
            content_hash=fields.string("content_hash"),
            format_version=version,
            time_steps=fields.count("time_steps") if "time_steps" in data else 1,
            covers=_covers(fields, path) if "content_hash_covers" in data else (),
        )
        manifest._check(path)
        return manifest

    def _check(self, path: Path) -> None:
        """What the keys' types cannot say: clients by position, concepts in range, hashes."""
        n = len(self.clients)
        if [c.client_id for c in self.clients] != list(range(n)):
            raise FedrcError(f"{path}: client ids must be 0..{n - 1} in order")
        for i, client in enumerate(self.clients):
            if client.concept >= len(self.concepts):
                raise FedrcError(
                    f"{path}: clients[{i}].concept: expected an index into concepts "
                    f"(0..{len(self.concepts) - 1}), got {client.concept}"
                )
        if self.num_participating != len(self.participating):
            raise FedrcError(
                f"{path}: num_participating is {self.num_participating}, but "
                f"{len(self.participating)} clients are marked participating"
            )
        self._check_steps(path)
        self._check_histograms(path)
        if self.expected_hash() != self.content_hash:
            if not self.covers:
                raise FedrcError(f"{path}: content_hash does not match the shard hashes it lists")
            raise FedrcError(
                f"{path}: content_hash does not match the shard hashes and records it covers "
                "(num_classes, clients, …): the manifest was edited; partition again"
            )

    def _check_histograms(self, path: Path) -> None:
        """Every label histogram has one count per class: num_classes agrees with them."""
        for i, client in enumerate(self.clients):
            named = [(f"clients[{i}]", client)]
            named += [(f"clients[{i}].steps[{t}]", s) for t, s in enumerate(client.steps)]
            for name, record in named:
                for key in ("label_histogram", "true_label_histogram"):
                    if len(getattr(record, key)) != self.num_classes:
                        raise FedrcError(
                            f"{path}: {name}.{key}: expected {self.num_classes} counts "
                            f"(num_classes), got {len(getattr(record, key))}"
                        )

    def _check_steps(self, path: Path) -> None:
        """A participating client of a drifting benchmark has a record per step that adds up
        to its shard; a static one, and every held-out client, has none."""
        if self.time_steps < 1:
            raise FedrcError(f"{path}: time_steps: expected an integer >= 1, got {self.time_steps}")
        for i, client in enumerate(self.clients):
            want = self.time_steps if client.participating and self.time_steps > 1 else 0
            if len(client.steps) != want:
                raise FedrcError(
                    f"{path}: clients[{i}].steps: expected {want} step records, got "
                    f"{len(client.steps)}"
                )
            if not want:
                continue
            sizes = (
                sum(s.train_size for s in client.steps),
                sum(s.test_size for s in client.steps),
            )
            if sizes != (client.train_size, client.test_size):
                raise FedrcError(f"{path}: clients[{i}].steps: sizes do not add up to the client's")
            for t, step in enumerate(client.steps):
                if step.concept >= len(self.concepts):
                    raise FedrcError(
                        f"{path}: clients[{i}].steps[{t}].concept: expected an index into "
                        f"concepts, got {step.concept}"
                    )


def _covers(fields: _Fields, path: Path) -> tuple[str, ...]:
    """`content_hash_covers`: this fedrc checks exactly `COVERED`; another list is another
    fedrc's rule, which it cannot check."""
    covers = fields.strings("content_hash_covers")
    if covers != COVERED:
        raise FedrcError(
            f"{path}: content_hash_covers lists {list(covers)}, this fedrc knows "
            f"{list(COVERED)} (written by another fedrc?); partition again"
        )
    return covers


def write_manifest(folder: Path, manifest: Manifest) -> None:
    (folder / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2, sort_keys=True) + "\n")


def read_manifest(folder: Path, option: str = "--data") -> Manifest:
    """`folder`'s manifest, refused with one line if it is missing, corrupt, of another format
    version, incomplete, mistyped, or if its content hash does not match its shard hashes.
    `option` is what the user gave the folder as, for the message when it is missing."""
    path = folder / MANIFEST
    if not path.is_file():
        raise FedrcError(f"{option}: {path} not found (run `fedrc partition` first)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FedrcError(f"{path}: corrupt manifest ({e})") from None
    except RecursionError:  # nested deeper than the parser follows
        raise FedrcError(f"{path}: corrupt manifest (nested too deeply)") from None
    return Manifest.from_json(data, path)
