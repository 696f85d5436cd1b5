"""Tabular concept-drift streams as datasets: SINE, CIRCLE, SEA, STAGGER, Agrawal, Hyperplane.

The drift literature (FedDrift: Jothimurugesan et al., AISTATS 2023) benchmarks concept drift on
synthetic streams whose features keep their distribution while the labelling rule changes. Here
each stream is one pool of features, drawn once from the stream's fixed seed (never the
partition seed, so it is the same dataset everywhere), and one labelling rule per concept:
`RawDataset.label_rules[k]` is the stream's concept k (`partition.concepts: native:k`), and the
dataset's own labels are concept 0's. docs/streams.md defines every stream and concept.

Quantisation: a feature with range [low, high] is stored as the uint8 round(255 (v − low) /
(high − low)) in an image of shape (1, d, 1) (H = 1, W = d features, C = 1), and every label is
computed from the stored value, low + code (high − low) / 255 (an integer attribute rounds back
to itself), so labels and features agree exactly.

Library: numpy only. river (0.26) bundles SINE, SEA, STAGGER, Agrawal and Hyperplane, installs
cleanly and is seeded, but it labels only the samples a generator draws under its own variant:
the rules are private (`Sine._classification_function_zero`, SEA's threshold inside `__iter__`,
Hyperplane's weights drawn from the sample stream), so the labels of every concept for one
shared set of features, computed from quantised values, would need river's private methods. Its
Agrawal also carries MOA's slips (function 5 tests salary where the paper tests loan; the house
value is 0 for zip code 8) and is slow (1.5 s for 36,000 samples); its SINE swaps the axes of
Gama et al.'s. The rules below are a few numpy lines each and follow the papers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.data.loaders.raw import RawDataset

N_TRAIN, N_TEST = 30_000, 6_000  # FedDrift draws 500 samples per client and time step
TOP = 255  # the largest stored code


@dataclass(frozen=True)
class Feature:
    """One attribute, stored as a code 0..255 over [low, high]; `integer`: whole numbers only
    (at most 256 of them, each stored exactly)."""

    name: str
    low: float
    high: float
    integer: bool = False

    def encode(self, values: np.ndarray) -> np.ndarray:
        codes = np.rint((np.asarray(values, np.float64) - self.low) * TOP / (self.high - self.low))
        return np.clip(codes, 0, TOP).astype(np.uint8)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        values = self.low + codes.astype(np.float64) * (self.high - self.low) / TOP
        return np.rint(values) if self.integer else values


Rule = Callable[[np.ndarray], np.ndarray]  # decoded features (N, d) → labels, bool or int


@dataclass(frozen=True)
class Stream:
    name: str
    features: tuple[Feature, ...]
    draw: Callable[[np.random.Generator, int], np.ndarray]  # raw features (n, d)
    concepts: tuple[Rule, ...]
    seed: int

    def encode(self, values: np.ndarray) -> np.ndarray:
        """Raw features (N, d) → stored samples (N, 1, d, 1) uint8."""
        codes = [f.encode(values[:, j]) for j, f in enumerate(self.features)]
        return np.stack(codes, axis=1)[:, None, :, None]

    def decode(self, samples: np.ndarray) -> np.ndarray:
        """Stored samples (N, 1, d, 1) uint8 → the feature values the rules see (N, d)."""
        d = len(self.features)
        if samples.dtype != np.uint8 or samples.shape[1:] != (1, d, 1):
            raise ValueError(
                f"{self.name}: expected uint8 samples (N, 1, {d}, 1), got {samples.dtype} "
                f"{samples.shape}"
            )
        flat = samples.reshape(len(samples), d)
        return np.stack([f.decode(flat[:, j]) for j, f in enumerate(self.features)], axis=1)


@dataclass(frozen=True)
class StreamRule:
    """Concept `concept` of stream `stream` as a `RawDataset.label_rules` entry (picklable)."""

    stream: str
    concept: int

    def __call__(self, samples: np.ndarray) -> np.ndarray:
        spec = STREAMS[self.stream]
        return spec.concepts[self.concept](spec.decode(samples)).astype(np.int64)


def load_stream(name: str) -> RawDataset:
    """The stream's train and test pools (labels: concept 0) and its rules, from its seed."""
    spec = STREAMS[name]
    rng = np.random.default_rng(spec.seed)
    train, test = (spec.encode(spec.draw(rng, n)) for n in (N_TRAIN, N_TEST))
    rules = tuple(StreamRule(name, k) for k in range(len(spec.concepts)))
    return RawDataset(
        name, train, rules[0](train), test, rules[0](test), 2, "built-in", label_rules=rules
    )


def _uniform(d: int, high: float = 1.0) -> Callable[[np.random.Generator, int], np.ndarray]:
    return lambda rng, n: rng.uniform(0, high, size=(n, d))


def _unit(name: str) -> Feature:
    return Feature(name, 0.0, 1.0)


# SINE (Gama et al., SBIA 2004; FedDrift): below the curve is positive; 2, 3 are SINE2
def _below_sine(x: np.ndarray) -> np.ndarray:
    return x[:, 1] <= np.sin(x[:, 0])


def _below_sine2(x: np.ndarray) -> np.ndarray:
    return x[:, 1] < 0.5 + 0.3 * np.sin(3 * np.pi * x[:, 0])


# CIRCLE (FedDrift): positive outside the concept's circle
def _outside(cx: float, cy: float, r: float) -> Rule:
    return lambda x: (x[:, 0] - cx) ** 2 + (x[:, 1] - cy) ** 2 - r**2 > 0


# SEA (Street & Kim, KDD 2001): positive when f1 + f2 exceeds the concept's threshold
SEA_THRESHOLDS = (8.0, 9.0, 7.0, 9.5)


def _sea(theta: float) -> Rule:
    return lambda x: x[:, 0] + x[:, 1] > theta


# STAGGER (Schlimmer & Granger, Machine Learning 1986): size, colour, shape, each 0..2
SMALL, RED, GREEN, CIRCLE_SHAPE = 0, 0, 2, 0
STAGGER_CONCEPTS: tuple[Rule, ...] = (
    lambda x: (x[:, 0] == SMALL) & (x[:, 1] == RED),
    lambda x: (x[:, 1] == GREEN) | (x[:, 2] == CIRCLE_SHAPE),
    lambda x: x[:, 0] >= 1,  # medium or large
)


def _stagger_draw(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 3, size=(n, 3)).astype(np.float64)


# Agrawal et al. (IEEE TKDE 1993): nine loan attributes, ten functions for group A (label 1)
AGRAWAL_FEATURES = (
    Feature("salary", 20_000, 150_000),
    Feature("commission", 0, 75_000),
    Feature("age", 20, 80, integer=True),
    Feature("elevel", 0, 4, integer=True),
    Feature("car", 1, 20, integer=True),
    Feature("zipcode", 0, 8, integer=True),
    Feature("hvalue", 50_000, 1_350_000),
    Feature("hyears", 1, 30, integer=True),
    Feature("loan", 0, 500_000),
)


def _agrawal_draw(rng: np.random.Generator, n: int) -> np.ndarray:
    salary = rng.uniform(20_000, 150_000, n)
    commission = np.where(salary >= 75_000, 0.0, rng.uniform(10_000, 75_000, n))
    age = rng.integers(20, 81, n)
    elevel = rng.integers(0, 5, n)
    car = rng.integers(1, 21, n)
    zipcode = rng.integers(0, 9, n)
    hvalue = (9 - zipcode) * 100_000 * rng.uniform(0.5, 1.5, n)  # k = 9 − zipcode, as MOA
    hyears = rng.integers(1, 31, n)
    loan = rng.uniform(0, 500_000, n)
    columns = (salary, commission, age, elevel, car, zipcode, hvalue, hyears, loan)
    return np.stack(columns, axis=1).astype(np.float64)


def _within(v: np.ndarray, low: float, high: float) -> np.ndarray:
    return (low <= v) & (v <= high)


def _by_age(x: np.ndarray, young: np.ndarray, middle: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Age < 40, 40 ≤ age < 60, age ≥ 60: the three bands of functions 2–6."""
    age = x[:, 2]
    return np.where(age < 40, young, np.where(age < 60, middle, old))


def _agrawal(f: int) -> Rule:
    """Function f (1..10) of Agrawal et al., Table 3."""

    def rule(x: np.ndarray) -> np.ndarray:
        salary, commission, age, elevel = x[:, 0], x[:, 1], x[:, 2], x[:, 3]
        hvalue, hyears, loan = x[:, 6], x[:, 7], x[:, 8]
        k = 1_000
        if f == 1:
            return (age < 40) | (age >= 60)
        if f in (2, 6):
            pay = salary if f == 2 else salary + commission
            return _by_age(
                x, _within(pay, 50 * k, 100 * k), _within(pay, 75 * k, 125 * k),
                _within(pay, 25 * k, 75 * k),
            )  # fmt: skip
        if f == 3:
            return _by_age(x, _within(elevel, 0, 1), _within(elevel, 1, 3), _within(elevel, 2, 4))
        if f == 4:
            return _by_age(
                x,
                np.where(
                    _within(elevel, 0, 1),
                    _within(salary, 25 * k, 75 * k),
                    _within(salary, 50 * k, 100 * k),
                ),
                np.where(
                    _within(elevel, 1, 3),
                    _within(salary, 50 * k, 100 * k),
                    _within(salary, 75 * k, 125 * k),
                ),
                np.where(
                    _within(elevel, 2, 4),
                    _within(salary, 50 * k, 100 * k),
                    _within(salary, 25 * k, 75 * k),
                ),
            )
        if f == 5:
            return _by_age(
                x,
                np.where(
                    _within(salary, 50 * k, 100 * k),
                    _within(loan, 100 * k, 300 * k),
                    _within(loan, 200 * k, 400 * k),
                ),
                np.where(
                    _within(salary, 75 * k, 125 * k),
                    _within(loan, 200 * k, 400 * k),
                    _within(loan, 300 * k, 500 * k),
                ),
                np.where(
                    _within(salary, 25 * k, 75 * k),
                    _within(loan, 300 * k, 500 * k),
                    _within(loan, 100 * k, 300 * k),
                ),
            )
        income = 2 * (salary + commission) / 3
        if f == 7:
            disposable = income - loan / 5 - 20 * k
        elif f == 8:
            disposable = income - 5_000 * elevel - 20 * k
        elif f == 9:
            disposable = income - 5_000 * elevel - loan / 5 - 10 * k
        else:
            equity = hvalue * np.maximum(hyears - 20, 0) / 10
            disposable = income - 5_000 * elevel + equity / 5 - 10 * k
        return disposable > 0

    return rule


# Hyperplane (Hulten et al., KDD 2001): positive when w · x ≥ Σw / 2, w seeded per concept
HYPERPLANE_DIMS, HYPERPLANE_CONCEPTS, HYPERPLANE_SEED = 10, 4, 4801


def hyperplane_weights(concept: int) -> np.ndarray:
    return np.random.default_rng([HYPERPLANE_SEED, concept]).uniform(0, 1, HYPERPLANE_DIMS)


def _hyperplane(concept: int) -> Rule:
    w = hyperplane_weights(concept)
    return lambda x: x @ w >= w.sum() / 2


STREAMS: dict[str, Stream] = {
    s.name: s
    for s in (
        Stream(
            "sine",
            (_unit("x1"), _unit("x2")),
            _uniform(2),
            (_below_sine, lambda x: ~_below_sine(x), _below_sine2, lambda x: ~_below_sine2(x)),
            seed=4701,
        ),
        Stream(
            "circle",
            (_unit("x1"), _unit("x2")),
            _uniform(2),
            (_outside(0.2, 0.5, 0.15), _outside(0.6, 0.5, 0.25)),
            seed=4702,
        ),
        Stream(
            "sea",
            tuple(Feature(f"f{j}", 0.0, 10.0) for j in (1, 2, 3)),
            _uniform(3, 10.0),
            tuple(_sea(theta) for theta in SEA_THRESHOLDS),
            seed=4703,
        ),
        Stream(
            "stagger",
            tuple(Feature(name, 0, 2, integer=True) for name in ("size", "colour", "shape")),
            _stagger_draw,
            STAGGER_CONCEPTS,
            seed=4704,
        ),
        Stream(
            "agrawal",
            AGRAWAL_FEATURES,
            _agrawal_draw,
            tuple(_agrawal(f) for f in range(1, 11)),
            seed=4705,
        ),
        Stream(
            "hyperplane",
            tuple(_unit(f"x{j}") for j in range(1, HYPERPLANE_DIMS + 1)),
            _uniform(HYPERPLANE_DIMS),
            tuple(_hyperplane(k) for k in range(HYPERPLANE_CONCEPTS)),
            seed=4706,
        ),
    )
}
