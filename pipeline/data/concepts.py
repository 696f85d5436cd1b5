"""Concept shift: label maps by name (FedRC paper §5 and appendix H.8; label noise, Table 13).

A concept is written `kind` or `kind:parameter` in `partition.concepts`:

| kind          | maps true class y to                                   | parameter (default)   |
|---------------|--------------------------------------------------------|-----------------------|
| `identity`    | y                                                      | –                     |
| `reverse`     | C − 1 − y                                              | –                     |
| `shift`       | (y + s) mod C                                          | s, an integer (1)     |
| `permutation` | π(y), π a random permutation seeded by the parameter   | seed, an integer (0)  |
| `pair_flip`   | (y + 1) mod C for a fraction σ of each client's labels | σ in [0, 1] (0.2)     |
| `symmetric`   | a uniformly random other class for a fraction σ        | σ in [0, 1] (0.2)     |
| `swap`        | a ↔ b, every other class unchanged (FedDrift, FedCCFA)  | `a-b` (`1-2`)         |
| `native`      | the dataset's own labelling rule k (drift streams)     | k, an integer (0)     |

The permutation depends only on its own seed, not on the partition seed, so a concept means the
same in every benchmark. The noise kinds draw which samples flip per client (fresh randomness).
Table 13's caption swaps the two noise names; these are the usual definitions (Xu et al., 2022).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.common.errors import FedrcError

KINDS = ("identity", "reverse", "shift", "permutation", "pair_flip", "symmetric", "swap", "native")
Parameter = float | int | tuple[int, int] | None
DEFAULTS: dict[str, Parameter] = {
    "identity": None,
    "reverse": None,
    "shift": 1,
    "permutation": 0,
    "pair_flip": 0.2,
    "symmetric": 0.2,
    "swap": (1, 2),
    "native": 0,
}


@dataclass(frozen=True)
class Concept:
    name: str  # as written in params, e.g. "shift:2"
    kind: str
    parameter: Parameter

    def check(self, num_classes: int, rules: int) -> None:
        """What only the loaded dataset can tell: classes a swap names, a rule it has."""
        if self.kind == "swap" and max(self.parameter) >= num_classes:  # type: ignore[arg-type]
            raise FedrcError(
                f"partition.concepts: {self.name!r} names a class beyond the dataset's "
                f"{num_classes} (0..{num_classes - 1})"
            )
        if self.kind == "native" and self.parameter >= rules:  # type: ignore[operator]
            has = f"has rules 0..{rules - 1}" if rules else "has no labelling rules of its own"
            raise FedrcError(f"partition.concepts: {self.name!r}: the dataset {has}")

    def relabel(
        self,
        labels: np.ndarray,
        num_classes: int,
        rng: np.random.Generator,
        samples: np.ndarray | None = None,
        rules: tuple = (),
    ) -> np.ndarray:
        """The labels a client of this concept sees for true classes `labels` (a `native`
        concept: for `samples`, by the dataset's rule)."""
        y = labels.astype(np.int64)
        if self.kind == "native":
            return np.asarray(rules[self.parameter](samples), dtype=np.int64)  # type: ignore[index]
        if self.kind == "swap":
            a, b = self.parameter  # type: ignore[misc]
            out = y.copy()
            out[y == a], out[y == b] = b, a
            return out
        if self.kind == "identity":
            return y.copy()
        if self.kind == "reverse":
            return num_classes - 1 - y
        if self.kind == "shift":
            return (y + int(self.parameter)) % num_classes  # type: ignore[arg-type]
        if self.kind == "permutation":
            return np.random.default_rng(self.parameter).permutation(num_classes)[y]
        flip = rng.permutation(y.size)[: round(float(self.parameter) * y.size)]  # type: ignore[arg-type]
        out = y.copy()
        if self.kind == "pair_flip":
            out[flip] = (y[flip] + 1) % num_classes
        else:  # symmetric: an offset in 1..C-1 is a uniformly random *other* class
            out[flip] = (y[flip] + rng.integers(1, num_classes, size=flip.size)) % num_classes
        return out


NOISE = ("pair_flip", "symmetric")


def label_map(concept: Concept, num_classes: int) -> tuple[Any, ...]:
    """What `concept` does to the labels, comparable between concepts: the map of every class
    for a fixed relabelling (a noise rate of 0 is one), else the kind and its parameter."""
    if concept.kind == "native" or (concept.kind in NOISE and concept.parameter != 0):
        return (concept.kind, concept.parameter)
    classes = np.arange(num_classes)
    if concept.kind in NOISE:
        return tuple(classes.tolist())
    return tuple(concept.relabel(classes, num_classes, np.random.default_rng(0)).tolist())


def check_distinct(concepts: list[Concept], num_classes: int) -> None:
    """Two concepts that map the labels alike (`shift:0` and `identity`, `swap:1-2` and
    `swap:2-1`, `shift:11` and `shift:1` with 10 classes) are one concept under two names: the
    benchmark would count it twice. A parameter that changes no label (`shift:10`, `pair_flip:0`)
    is the identity by another name."""
    identity = tuple(range(num_classes))
    seen: dict[tuple[Any, ...], str] = {}
    for concept in concepts:
        mapped = label_map(concept, num_classes)
        if mapped == identity and concept.kind != "identity":
            raise FedrcError(
                f"partition.concepts: {concept.name!r} changes no label with {num_classes} "
                "classes (it is the identity); write identity, or another parameter"
            )
        if mapped in seen:
            raise FedrcError(
                f"partition.concepts: {concept.name!r} maps the labels as {seen[mapped]!r} does "
                f"(with {num_classes} classes): one concept under two names; drop one"
            )
        seen[mapped] = concept.name


def agrees(concept: Concept, true: np.ndarray, labels: np.ndarray, num_classes: int) -> bool:
    """Whether `labels` can be `concept`'s labels of the true classes `true`: its map itself
    for a fixed relabelling, the true class or the next for `pair_flip`; any for `symmetric`
    noise and a stream's `native` rule (which the labels alone cannot show)."""
    if concept.kind in ("symmetric", "native"):
        return True
    if concept.kind == "pair_flip":
        return bool(((labels == true) | (labels == (true + 1) % num_classes)).all())
    mapped = concept.relabel(np.arange(num_classes), num_classes, np.random.default_rng(0))
    return bool((mapped[true] == labels).all())


def parse_concept(spec: str) -> Concept:
    """`kind` or `kind:parameter` → Concept; a FedrcError naming `partition.concepts` if bad."""
    kind, _, text = spec.partition(":")
    if kind not in KINDS:
        raise FedrcError(
            f"partition.concepts: unknown label map {kind!r} (known: {', '.join(KINDS)})"
        )
    default = DEFAULTS[kind]
    if not text:
        return Concept(spec, kind, default)
    if default is None:
        raise FedrcError(f"partition.concepts: {kind!r} takes no parameter, got {spec!r}")
    if kind == "swap":
        return Concept(spec, kind, _pair(spec, text))
    try:
        value: float | int = int(text) if isinstance(default, int) else float(text)
    except ValueError:
        expected = "an integer" if isinstance(default, int) else "a number"
        raise FedrcError(f"partition.concepts: {spec!r}: expected {expected} after ':'") from None
    if kind in ("pair_flip", "symmetric") and not 0 <= value <= 1:
        raise FedrcError(f"partition.concepts: {spec!r}: the noise rate must be in [0, 1]")
    if kind in ("permutation", "native") and value < 0:
        raise FedrcError(f"partition.concepts: {spec!r}: the parameter must be >= 0")
    return Concept(spec, kind, value)


def _pair(spec: str, text: str) -> tuple[int, int]:
    """`a-b` of a swap: two distinct classes."""
    a, _, b = text.partition("-")
    if not (a.isdigit() and b.isdigit()) or a == b or int(a) == int(b):
        raise FedrcError(
            f"partition.concepts: {spec!r}: expected swap:a-b with two distinct classes"
        )
    return int(a), int(b)


def parse_concepts(specs: list[str]) -> list[Concept]:
    """Every concept of the list, checked; names must be distinct (they key the results)."""
    if not specs:
        raise FedrcError("partition.concepts: expected a non-empty list of label maps")
    concepts = [parse_concept(s) for s in specs]
    seen = set()
    for c in concepts:
        if c.name in seen:
            raise FedrcError(
                f"partition.concepts: {c.name!r} twice (give one a parameter, e.g. {c.kind}:2)"
            )
        seen.add(c.name)
    return concepts
