"""The batched executor's local step under `torch.compile` (issue 41, `train.compile`).

The step of local SGD (every group's vmapped forward pass, `torch.autograd.grad` and the
update on the stacked tensors) is one Python function; compiled, inductor fuses its small
operations into a few kernels and, on CUDA (`mode="reduce-overhead"`), replays them as one CUDA
graph: one launch a step instead of hundreds. Where torch traces `torch.autograd.grad`
(`trace_autograd_ops`, newer torch) the step is one graph; elsewhere it breaks there into the
forward graph (whose backward AOTAutograd compiles too) and the update's, with the same numbers.

Shapes are static (`dynamic=False`): each batch shape of a step (the chunk's tasks, each
group's tasks and batch length, which optional tensors are present) compiles once. A run whose
clients differ in size meets many shapes in the steps of their last, partial batches; past
`SHAPES` of them, the further shapes run eagerly, with one warning. Every executor compiles
for its own model, and torch counts the step's compilations over all of them (`RECOMPILES`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from pipeline.common.errors import FedrcWarning

SHAPES = 8  # batch shapes compiled per executor; further shapes run eagerly
# torch's limit of compilations of one function (default 8), shared by every executor in the
# process: a cohort's, a sweep's runs one after another; past it torch runs the step eagerly
RECOMPILES = 64


class CompiledStep:
    """`step` compiled for each new key (the batch shape) up to `shapes` keys, eager after;
    called as `compiled(key, *args)`."""

    def __init__(self, step: Callable[..., Any], device: torch.device, shapes: int = SHAPES):
        self.eager = step
        self.cuda = device.type == "cuda"
        mode = "reduce-overhead" if self.cuda else None  # CUDA graphs; inductor's default
        self.compiled = torch.compile(step, mode=mode, dynamic=False)
        self.shapes = shapes
        self.keys: set[Hashable] = set()
        self.warned = False

    def __call__(self, key: Hashable, *args: Any) -> Any:
        if key not in self.keys:
            if len(self.keys) >= self.shapes:
                self._warn_once()
                return self.eager(*args)
            self.keys.add(key)
        with torch._dynamo.config.patch(**_dynamo_settings()):
            if not self.cuda:
                return self.compiled(*args)
            torch.compiler.cudagraph_mark_step_begin()
            # The outputs live in the CUDA graph's memory, which its next replay overwrites;
            # the next step reads them (parameters, buffers, momentum, loss sums), so they
            # leave the graph as copies (an H200 found this: "accessing tensor output of
            # CUDAGraphs that has been overwritten by a subsequent run").
            return tree_map_only(torch.Tensor, torch.clone, self.compiled(*args))

    def _warn_once(self) -> None:
        if not self.warned:
            self.warned = True
            warnings.warn(
                FedrcWarning(
                    f"train.compile: the local step met more than {self.shapes} batch shapes "
                    "(clients of many sizes); the steps of the others run uncompiled"
                ),
                stacklevel=3,
            )


def _dynamo_settings() -> dict[str, Any]:
    """`torch._dynamo.config` while the step compiles: its limit of compilations raised to
    `RECOMPILES`, and `torch.autograd.grad` traced where this torch can."""
    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    settings: dict[str, Any] = {limit: max(getattr(config, limit), RECOMPILES)}
    if hasattr(config, "trace_autograd_ops"):
        settings["trace_autograd_ops"] = True
    return settings
