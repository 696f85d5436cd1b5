"""The code a training run is made of, and the key that names a run by everything that decides
its numbers.

`run_code` digests fedrc's training code and the plugin packages the run's algorithm and model
come from (`pipeline.common.sources`); `fedrc check` writes it into resolved/train.json, so
that DVC reruns a stage whose plugin changed. `run_key` adds the configuration's identity and
the benchmark's digest: a sweep keeps a finished point, and a staged run under DVC resumes its
checkpoint, only while the key is the same.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pipeline.algorithms import ALGORITHMS
from pipeline.common.sources import module_digest, subpackages_digest
from pipeline.config import TrainConfig
from pipeline.models import MODELS

# the subpackages of `pipeline` a training imports (`pipeline.outputs`, `pipeline.flower` and
# `pipeline.stages` do not decide a run's numbers)
TRAINING_CODE = (
    "algorithms",
    "engine",
    "models",
    "run",
    "evaluation",
    "places",
    "config",
    "common",
    "data",
)


def run_code(config: TrainConfig) -> dict[str, str]:
    """{"fedrc": digest of its training code, <plugin package>: its digest, …} for the run's
    algorithm and model (each loaded, so that a plugin that does not import is one line)."""
    code = {"fedrc": subpackages_digest("pipeline", TRAINING_CODE)}
    for registry, name in ((ALGORITHMS, config.algorithm), (MODELS, config.model)):
        registry.get(name)
        module = registry.module(name)
        if module is not None:
            top, digest = module_digest(module)
            code[top] = digest
    return code


def run_key(config: TrainConfig, code: dict[str, str], data_digest: str | None) -> str:
    """SHA-256 of what decides a run's numbers: the configuration's identity (rounds aside: a
    run may be extended), its code and its benchmark's digest (None: not built yet)."""
    identity: dict[str, Any] = {**config.identity(), "code": code, "data_digest": data_digest}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
