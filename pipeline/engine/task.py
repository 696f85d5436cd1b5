"""The unit of work between an algorithm and an executor: one local training of one client.

An algorithm says *what* to train (where to start, the per-sample loss weights, an optional
proximal centre, an optional frozen model's logits to add); an executor says *how* (one at a time
on the CPU, batched on a GPU). Every algorithm of the papers fits this shape:

- FedAvg / FedEM / FedRC / IFCA / FeSEM: start from a global model, weights γ (or 1, or 0/1)
- FedProx: plus a proximal pull (μ/2)‖w − w^t‖² towards the start
- FedSoft: start and pull towards the client's mixture Σ_k u_ik θ_k
- Fed-CAM: the frozen half of the additive model enters as fixed logits added to the output
- Flash: early stopping after an epoch whose loss improved too little (`stop_gain`; the
  sequential executor only)
- FedCCFA: `stages` of decoupled training (classifier only on class-balanced samples; classifier
  only, then extractor only with a prototype-alignment term towards `class_anchors`), each with
  its own epochs and learning rate; the client also returns its class `prototypes`

Stages (optional; an empty `stages` is the plain training above, bit for bit). Each `Stage`
runs `epochs` passes of SGD at its own `lr`, momentum starting fresh (a new optimiser per
stage, as FedCCFA's code makes one), on:
- `train`: only the parameters inside this [start, stop) slice of the flat vector (e.g. the
  final layer, `Algorithm.head`); `freeze`: every parameter except those inside it. A parameter
  must lie wholly inside or outside the slice. The others receive no gradient, so they come back
  bit for bit (floating-point buffers such as BatchNorm statistics still follow the forward passes)
- `balanced` = m: a class-balanced subset drawn once at the stage's start, min(m, smallest
  count of a class the client has) samples of each class it has, without replacement
- `align` = λ > 0 with the task's `class_anchors` A (classes, D): the loss of sample b gains
  λ ℓ_b, h_b the input of the final layer (the last module owning parameters: the features);
  `penalize` "CL": ℓ_b = −log softmax_c(cos(h_b, A_c) / `temperature`)[y_b] over the classes
  whose anchor is finite; "L2": ℓ_b = ‖h_b − A_{y_b}‖² / D (a NaN row: no anchor; a sample
  whose own class has none adds 0)
`prototypes`: after the last stage, the mean feature h of each class over the client's samples
(eval mode, no gradient), (classes, D), zero rows for absent classes.
A task with a `rule` (`pipeline.engine.rules.LocalRule`: APFL's and pFedMe's two models trained
together) hands its batches to the rule instead, which returns the trained row and named
`extras` (a personal model, a mixing weight).
The loss sum of a staged task (the round's train loss) is the cross-entropy part of the stages
that are not `balanced` (a balanced subset is not the client's data), rescaled to the executor's
`local_epochs`: Σ w·f × local_epochs / Σ epochs. Persistent momentum does not combine with stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.engine.rules import LocalRule

PERSONAL = -1  # `LocalTask.model` of a client's own model (FedSoft), not one of the K rows


@dataclass(frozen=True)
class Stage:
    """One phase of a staged local training (see the module docstring)."""

    epochs: int
    lr: float
    train: tuple[int, int] | None = None  # only the parameters in this flat [start, stop)
    freeze: tuple[int, int] | None = None  # every parameter except those in this slice
    balanced: int | None = None  # class-balanced subset: this many samples per class at most
    align: float = 0.0  # λ of the prototype-alignment term (needs `LocalTask.class_anchors`)
    temperature: float = 0.1  # τ of the alignment's softmax over cosine similarities
    penalize: str = "CL"  # the alignment loss: CL (contrastive) or L2 (squared distance / D)


@dataclass
class LocalTask:
    model: int  # the global row this task belongs to, or PERSONAL
    start: torch.Tensor  # (P,) flat parameters to start from
    weights: torch.Tensor  # (N_i,) per-sample weights of the loss (1/B) Σ_b w_b f(x_b, y_b)
    weight: float = 1.0  # how much the result counts when the algorithm aggregates it
    anchor: torch.Tensor | None = None  # proximal centre; the loss gains (μ/2)‖w − anchor‖²
    mu: float = 0.0
    offset: torch.Tensor | None = None  # (N_i, classes) logits added to the model's output
    momentum: torch.Tensor | None = None  # SGD momentum to start from (persistent-momentum mode)
    client: int = -1  # whose data it trains on (set by the round loop, for errors and momentum)
    stages: tuple[Stage, ...] = ()  # staged training; () is the plain local training
    class_anchors: torch.Tensor | None = None  # (classes, D) alignment targets, NaN row: none
    prototypes: bool = False  # return the mean feature of each class after training
    rule: LocalRule | None = None  # a local training of its own (`pipeline.engine.rules`)
    # early stopping (Flash): after epoch e ≥ 1 with more to go, the mean loss L_e on the task's
    # samples; stop when L_{e−1} − L_e < stop_gain / e (L_0 = ∞); 0: every epoch runs
    stop_gain: float = 0.0


Job = tuple[LocalTask, torch.Tensor, torch.Tensor, int]  # (task, images, labels, seed)


@dataclass
class LocalResult:
    params: torch.Tensor  # (P,) trained flat parameters
    loss_sum: float  # Σ w·f over every sample seen, for the train loss
    momentum: torch.Tensor | None  # final SGD momentum (returned when the task brought one)
    prototypes: torch.Tensor | None = None  # (classes, D) when the task asked for them
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # a rule's other outputs
