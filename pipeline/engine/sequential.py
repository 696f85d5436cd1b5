"""The sequential executor: one local training at a time, on one reused module.

On a 2-core CPU the FMNIST CNN is compute-bound, and this plain loop is the fastest way to run
it. It is also the reference that faster executors are checked against.

Precision. `precision="bf16"` runs every forward pass (training, the E-step's and evaluation's
logits) under `torch.autocast` in bfloat16, on the CPU or CUDA; the outputs are cast back to
float32 before the loss, the backward pass happens outside autocast, and the parameters, their
gradients, the momentum and everything returned stay float32 (the "master weights"). "fp32"
leaves autocast off and the numbers exactly as they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.engine.heap import keep_freed_buffers
from pipeline.engine.local_opt import Adam, local_rule
from pipeline.engine.rules import Net
from pipeline.engine.task import Job, LocalResult, LocalTask, Stage

INFERENCE_CHUNK = 256  # measured fastest for the CNN on the 2-core CPU
PRECISIONS = ("fp32", "bf16")


def as_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (N, C, H, W) → float inputs in [-1, 1]."""
    return images.float().div_(127.5).sub_(1.0)


class NonFiniteLoss(ArithmeticError):
    """A local training produced a NaN or infinite loss (usually: learning rate too large).

    `index`: the position of the failing job in the jobs a `stream` was given; `job`: that job.
    """

    def __init__(self, message: str, index: int | None = None, job: Job | None = None) -> None:
        super().__init__(message)
        self.index, self.job = index, job


def compact_layout(tensors: list[torch.Tensor]) -> bool:
    """Whether the flat layout of `tensors` (one after the other) can be their storage as it is:
    on the CPU, with every tensor starting on a 64-byte boundary, the alignment torch's CPU
    allocator gives each tensor of its own, so kernels see the memory they would otherwise see.
    (The FMNIST CNN's layout is compact; elsewhere the module keeps its own tensors.)"""
    offset = 0
    for t in tensors:
        if t.device.type != "cpu" or offset * t.element_size() % 64:
            return False
        offset += t.numel()
    return True


class SequentialExecutor:
    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        *,
        lr: float,
        momentum: float,
        weight_decay: float,
        batch_size: int,
        local_epochs: int,
        drop_last: bool,
        precision: str = "fp32",
        optimizer: str = "sgd",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision: expected fp32 or bf16, got {precision!r}")
        self.precision = precision
        self.device = device
        if device.type == "cpu":
            keep_freed_buffers()  # no page faults for each training's model-sized buffers
        self.model = model.to(device).train()  # every module in one mode (`_mode`)
        self.params = list(self.model.parameters())
        # The flat layout: every parameter, then every floating-point buffer (BatchNorm stats).
        self.tensors = self.params + [b for b in self.model.buffers() if b.is_floating_point()]
        self.lr = lr  # the round's: the round loop sets it when a schedule changes it
        self.momentum = momentum
        self.weight_decay = weight_decay
        # Adam or AdamW (`pipeline.engine.local_opt`); None: SGD, written out here
        self.rule: Adam | None = local_rule(optimizer, betas, eps, weight_decay)
        # where each tensor lives outside a plain training (`load`, `logits`, staged training)
        self.own = [t.data for t in self.tensors]
        self.compact = compact_layout(self.tensors)
        # the final layer, whose input is the features of staged tasks (the rule of
        # `models.layout.head_range`: the last module that owns parameters)
        self.final = [m for m in self.model.modules() if any(True for _ in m.parameters(False))][-1]
        self.batch_size = batch_size
        self.local_epochs = local_epochs
        self.drop_last = drop_last

    @property
    def num_params(self) -> int:
        """Length of a model's flat vector (parameters and floating-point buffers)."""
        return sum(t.numel() for t in self.tensors)

    @property
    def num_trainable(self) -> int:
        """The leading part of the flat vector that SGD updates."""
        return sum(p.numel() for p in self.params)

    def flatten(self) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1) for t in self.tensors])

    def load(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            offset = 0
            for t in self.tensors:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    def _mode(self, training: bool) -> None:
        """Training or eval mode for the whole module, set only when it changes: `Module.train`
        visits every submodule, a cost paid per local training (1.3 s of a round at 3,000
        clients, under cProfile). Only this executor switches modes, always for the whole
        module, so the root's flag is every module's."""
        if self.model.training != training:
            self.model.train(training)

    def autocast(self) -> torch.autocast:
        """bfloat16 autocast on this device when the precision is bf16, else a no-op."""
        return torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The model's float32 output on uint8 `images`, the forward pass under `autocast`."""
        with self.autocast():
            out = self.model(as_input(images))
        return out.float()

    def forward_with(self, tensors: dict[str, torch.Tensor], images: torch.Tensor) -> torch.Tensor:
        """`forward` with `tensors` (parameters and buffers by name) in place of the module's
        own (`torch.func.functional_call`): what a `LocalRule` computes with."""
        with self.autocast():
            out = torch.func.functional_call(self.model, tensors, (as_input(images),))
        return out.float()

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """`flat`'s trainable part cut into tensors shaped like the parameters."""
        sizes = [p.numel() for p in self.params]
        return [v.view_as(p) for v, p in zip(flat[: sum(sizes)].split(sizes), self.params)]

    def logits(self, models: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """Logits of every model on every image: (K, N, classes), no gradients, eval mode.

        Each chunk's output is copied into one preallocated tensor and freed at once: a list
        of small chunk outputs, each allocated between large activations, keeps the allocator
        from reusing their memory (measured: +380 MiB for 54,000 images per model)."""
        self._mode(False)
        out = None
        with torch.no_grad():
            for k, flat in enumerate(models):
                self.load(flat)
                for s in range(0, images.shape[0], INFERENCE_CHUNK):
                    chunk = self.forward(images[s : s + INFERENCE_CHUNK])
                    if out is None:
                        shape = (models.shape[0], images.shape[0], chunk.shape[1])
                        out = chunk.new_empty(shape)
                    out[k, s : s + chunk.shape[0]] = chunk
        if out is None:  # no images
            return torch.zeros(models.shape[0], 0, 0, device=self.device)
        return out

    def losses(self, models: torch.Tensor, images: torch.Tensor, labels: torch.Tensor):
        """Per-sample cross-entropy of every model: (N, K)."""
        logits = self.logits(models, images)
        return torch.stack([F.cross_entropy(z, labels, reduction="none") for z in logits], 1)

    def stream(self, jobs: Iterable[Job]) -> Iterator[tuple[Job, LocalResult]]:
        """Each (task, images, labels, seed) job with its result, one at a time and in order:
        the caller folds a result into its aggregate before the next job is even built, so
        memory holds one trained model whatever the number of jobs."""
        for index, job in enumerate(jobs):
            try:
                yield job, self.train(*job)
            except NonFiniteLoss as e:
                raise NonFiniteLoss(str(e), index=index, job=job) from None

    def train_many(self, jobs: list[Job]) -> list[LocalResult]:
        """Every job's result, in order (for tests and small batches of work)."""
        return [result for _, result in self.stream(jobs)]

    def train(
        self, task: LocalTask, images: torch.Tensor, labels: torch.Tensor, seed: int
    ) -> LocalResult:
        """Local SGD for `task`: loss (1/B) Σ_b w_b f(x_b, y_b) [+ (μ/2)‖w − anchor‖²].

        Momentum starts fresh unless the task brings a buffer. Batches are drawn from a
        generator seeded with `seed`, so a task's result depends only on its inputs. A task with
        `stages` runs them in turn (`train_staged`); one with a `rule` hands it its batches
        (`train_rule`); one with `stop_gain` γ > 0 stops after epoch e ≥ 2 when its loss gained
        less than γ / e over epoch e (`early_stop`).
        """
        if task.stages:
            return self.train_staged(task, images, labels, seed)
        if task.rule is not None:
            return self.train_rule(task, images, labels, seed)
        anchor = None if task.anchor is None or task.mu == 0 else self._views(task.anchor)
        gen = torch.Generator().manual_seed(seed)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        bufs = self._start_momentum(task) if self.rule is None else self._start_moments()
        trained = self._start(task)
        previous = math.inf
        try:
            for epoch in range(1, self.local_epochs + 1):
                order = torch.randperm(labels.shape[0], generator=gen).to(self.device)
                for idx in self._batches(order):
                    total += self._sgd_step(task, images, labels, idx, anchor, bufs)
                if task.stop_gain > 0 and epoch < self.local_epochs:
                    loss = self.early_stop_loss(task, images, labels)
                    if previous - loss < task.stop_gain / epoch:
                        break
                    previous = loss
            if trained is None:
                trained = self.flatten()
        finally:
            self._bind(self.own)
        loss_sum = float(total)
        if not math.isfinite(loss_sum):
            raise NonFiniteLoss(f"local loss {loss_sum}")
        return LocalResult(trained, loss_sum, self._momentum_of(task, bufs))

    def _start(self, task: LocalTask) -> torch.Tensor | None:
        """The model at the task's start, in training mode. With a compact layout it trains in
        a fresh copy of `task.start`, returned: that copy is the result, no flattening needed
        (the module is bound back to its own tensors afterwards). Otherwise the start is loaded
        into the module's own tensors, and None is returned."""
        self._mode(True)
        if not self.compact:
            self.load(task.start)
            return None
        trained = task.start.to(self.device, copy=True)
        self._bind(self._split(trained))
        return trained

    def _bind(self, tensors: list[torch.Tensor]) -> None:
        """Point the module's parameters and buffers at `tensors` (no copy)."""
        for t, data in zip(self.tensors, tensors):
            t.data = data

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """`flat` cut into views shaped like the module's tensors (parameters, then buffers)."""
        pieces = flat.split([t.numel() for t in self.tensors])
        return [v.view_as(t) for v, t in zip(pieces, self.tensors)]

    def _start_moments(self) -> dict[str, list]:
        """Adam's state at the start of a local training: zero moments, no step yet."""
        zeros = [[torch.zeros_like(p) for p in self.params] for _ in range(2)]
        return {"exp_avg": zeros[0], "exp_avg_sq": zeros[1], "step": [0]}

    def early_stop_loss(self, task: LocalTask, images: torch.Tensor, labels: torch.Tensor) -> float:
        """The model's mean loss Σ w·f / Σ w on the task's samples after an epoch, in eval mode
        and without gradients (Flash's client-side check); the module goes back to training."""
        self._mode(False)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        with torch.no_grad():
            for s in range(0, labels.shape[0], INFERENCE_CHUNK):
                rows = slice(s, s + INFERENCE_CHUNK)
                out = self.forward(images[rows])
                if task.offset is not None:
                    out = out + task.offset[rows]
                f = F.cross_entropy(out, labels[rows], reduction="none")
                total += (task.weights[rows] * f).sum()
        self._mode(True)
        return float(total) / max(float(task.weights.sum()), 1e-12)

    def _start_momentum(self, task: LocalTask) -> list[torch.Tensor | None]:
        """Each parameter's SGD momentum buffer at the start: a copy of the task's, or None
        (fresh: the first step's gradient becomes it)."""
        if task.momentum is None:
            return [None] * len(self.params)
        return [buf.clone() for buf in self._views(task.momentum.to(self.device))]

    def _batches(self, order: torch.Tensor) -> Iterator[torch.Tensor]:
        """`order` cut into batches of `batch_size`; with `drop_last`, without a final partial
        batch (a client with fewer samples than a batch keeps its one)."""
        n = order.numel()
        stop = n - n % self.batch_size if self.drop_last and n >= self.batch_size else n
        for s in range(0, stop, self.batch_size):
            yield order[s : min(s + self.batch_size, stop)]

    def _sgd_step(
        self,
        task: LocalTask,
        images: torch.Tensor,
        labels: torch.Tensor,
        idx: torch.Tensor,
        anchor: list[torch.Tensor] | None,
        bufs: list[torch.Tensor | None] | dict[str, list],
    ) -> torch.Tensor:
        """One step of the local optimizer on the batch of rows `idx` (SGD; with a `rule`,
        Adam's state in `bufs`); returns its Σ w·f, detached."""
        out = self.forward(images[idx])
        if task.offset is not None:
            out = out + task.offset[idx]
        per_sample = F.cross_entropy(out, labels[idx], reduction="none")
        weighted = (task.weights[idx] * per_sample).sum()
        for p in self.params:
            p.grad = None
        (weighted / idx.numel()).backward()
        with torch.no_grad():
            if anchor is not None:  # gradient of (μ/2)‖w − anchor‖²
                for p, a in zip(self.params, anchor):
                    p.grad.add_(p - a, alpha=task.mu)
            if self.rule is None:
                self._sgd_update(bufs)
            else:
                self._adam_update(bufs)
        return weighted.detach()

    def _adam_update(self, state: dict[str, list]) -> None:
        """`torch.optim.Adam`'s (or AdamW's) step on the module's parameters (`local_opt`); a
        parameter without a gradient is skipped, as torch does."""
        state["step"][0] += 1
        moments = zip(state["exp_avg"], state["exp_avg_sq"])
        for i, (p, (m, v)) in enumerate(zip(self.params, moments)):
            if p.grad is None:
                continue
            new, state["exp_avg"][i], state["exp_avg_sq"][i] = self.rule.step(
                p, p.grad, m, v, state["step"][0], self.lr
            )
            p.copy_(new)

    def _sgd_update(self, bufs: list[torch.Tensor | None]) -> None:
        """`torch.optim.SGD`'s step, operation for operation (its single-tensor path: dampening
        0, no Nesterov), on the module's parameters; `bufs[i]` is parameter i's momentum buffer,
        None before its first step. A fresh buffer is the gradient itself where torch copies it:
        each step's gradients are new tensors here (`p.grad = None` before every backward
        pass), so the buffer owns its gradient, and the model-sized copy is saved. A parameter
        without a gradient is skipped, as torch does."""
        for i, p in enumerate(self.params):
            grad = p.grad
            if grad is None:
                continue
            if self.weight_decay != 0:
                grad = grad.add(p, alpha=self.weight_decay)
            if self.momentum != 0:
                if bufs[i] is None:
                    bufs[i] = grad
                else:
                    bufs[i].mul_(self.momentum).add_(grad, alpha=1)
                grad = bufs[i]
            p.add_(grad, alpha=-self.lr)

    def _momentum_of(self, task: LocalTask, bufs: list | dict) -> torch.Tensor | None:
        """The flat momentum buffer to hand back when the task brought one (None otherwise;
        with momentum 0 SGD leaves the task's buffer as it was)."""
        if task.momentum is None or self.rule is not None:
            return None
        return torch.cat([b.reshape(-1) for b in bufs])

    def train_rule(
        self, task: LocalTask, images: torch.Tensor, labels: torch.Tensor, seed: int
    ) -> LocalResult:
        """A task's own training (`LocalTask.rule`, `pipeline.engine.rules`) on the batches a
        plain training of the task would draw."""
        if task.momentum is not None:
            raise ValueError("persistent momentum does not combine with LocalTask.rule")
        net, rule = Net(self), task.rule
        self._mode(True)
        rule.begin(net, task.start)
        gen = torch.Generator().manual_seed(seed)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for _ in range(self.local_epochs):
            order = torch.randperm(labels.shape[0], generator=gen).to(self.device)
            for idx in self._batches(order):
                total += rule.batch(net, images[idx], labels[idx])
        trained, extras = rule.end(net)
        loss_sum = float(total)
        if not math.isfinite(loss_sum):
            raise NonFiniteLoss(f"local loss {loss_sum}")
        return LocalResult(trained, loss_sum, None, extras=extras)

    # --- staged training (LocalTask.stages; task.py's docstring) ---------------------------
    def trains(self, stage: Stage) -> list[bool]:
        """Which parameters `stage` updates: inside `train`, outside `freeze`."""
        out, offset = [], 0
        for p in self.params:
            lo, hi = offset, offset + p.numel()
            offset = hi
            keep = True
            for span, inside_trains in ((stage.train, True), (stage.freeze, False)):
                if span is None:
                    continue
                inside, outside = span[0] <= lo and hi <= span[1], hi <= span[0] or span[1] <= lo
                if not (inside or outside):
                    raise ValueError(f"stage slice {span} cuts the parameter at [{lo}, {hi})")
                keep = keep and inside == inside_trains
            out.append(keep)
        if not any(out):
            raise ValueError(f"stage {stage} trains no parameter")
        return out

    def train_staged(
        self, task: LocalTask, images: torch.Tensor, labels: torch.Tensor, seed: int
    ) -> LocalResult:
        """Each stage's epochs on its parameters, lr, samples and loss; then the prototypes."""
        if task.momentum is not None:
            raise ValueError("persistent momentum does not combine with LocalTask.stages")
        self.load(task.start)
        gen = torch.Generator().manual_seed(seed)
        features: list[torch.Tensor] = []
        hook = self.final.register_forward_pre_hook(lambda _, args: features.append(args[0]))
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        checked = torch.zeros((), dtype=torch.float64, device=self.device)
        counted = 0
        try:
            for stage in task.stages:
                loss, objective = self.run_stage(task, stage, images, labels, gen, features)
                checked += objective
                if stage.balanced is None:
                    total += loss
                    counted += stage.epochs
            prototypes = self.class_means(images, labels, features) if task.prototypes else None
        finally:
            hook.remove()
            for p in self.params:
                p.requires_grad_(True)
        if not torch.isfinite(checked):
            raise NonFiniteLoss(f"local loss {float(checked)}")
        loss_sum = float(total) * self.local_epochs / counted if counted else 0.0
        return LocalResult(self.flatten(), loss_sum, None, prototypes)

    def run_stage(
        self,
        task: LocalTask,
        stage: Stage,
        images: torch.Tensor,
        labels: torch.Tensor,
        gen: torch.Generator,
        features: list[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One stage: (Σ w·f of its cross-entropy, Σ of its whole objective)."""
        self._mode(True)
        chosen = [p for p, t in zip(self.params, self.trains(stage)) if t]
        for p in self.params:
            p.requires_grad_(False)
        for p in chosen:
            p.requires_grad_(True)
        optimizer = torch.optim.SGD(
            chosen, lr=stage.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )
        rows = torch.arange(labels.shape[0])
        if stage.balanced is not None:
            rows = balanced_rows(labels.cpu(), stage.balanced, gen)
        rows = rows.to(self.device)
        anchors = task.class_anchors if stage.align > 0 else None
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        objective = torch.zeros((), dtype=torch.float64, device=self.device)
        for _ in range(stage.epochs):
            order = rows[torch.randperm(rows.numel(), generator=gen).to(self.device)]
            for idx in self._batches(order):
                features.clear()
                out = self.forward(images[idx])
                if task.offset is not None:
                    out = out + task.offset[idx]
                per_sample = F.cross_entropy(out, labels[idx], reduction="none")
                loss = per_sample
                if anchors is not None:
                    align = alignment(
                        features[0], labels[idx], anchors, stage.temperature, stage.penalize
                    )
                    loss = per_sample + stage.align * align
                weights = task.weights[idx]
                weighted = (weights * loss).sum()
                optimizer.zero_grad(set_to_none=True)
                (weighted / idx.numel()).backward()
                optimizer.step()
                total += (weights * per_sample).sum().detach()
                objective += weighted.detach()
        features.clear()
        return total, objective

    def class_means(
        self, images: torch.Tensor, labels: torch.Tensor, features: list[torch.Tensor]
    ) -> torch.Tensor:
        """(classes, D) mean feature of each class over the samples (zeros: class absent)."""
        self._mode(False)
        sums = counts = None
        with torch.no_grad():
            for s in range(0, labels.shape[0], INFERENCE_CHUNK):
                features.clear()
                out = self.forward(images[s : s + INFERENCE_CHUNK])
                h = features[0].reshape(out.shape[0], -1).double()
                if sums is None:
                    sums = h.new_zeros(out.shape[1], h.shape[1])
                    counts = h.new_zeros(out.shape[1])
                y = labels[s : s + INFERENCE_CHUNK]
                sums.index_add_(0, y, h)
                counts.index_add_(0, y, torch.ones_like(y, dtype=h.dtype))
        features.clear()
        return (sums / counts.clamp(min=1)[:, None]).float()


def balanced_rows(labels: torch.Tensor, per_class: int, gen: torch.Generator) -> torch.Tensor:
    """Indices of a class-balanced subset: min(per_class, the smallest count of a present
    class) samples of every class present, each drawn without replacement."""
    classes, counts = labels.unique(return_counts=True)
    m = min(per_class, int(counts.min()))
    picks = []
    for c, count in zip(classes.tolist(), counts.tolist()):
        members = (labels == c).nonzero().flatten()
        picks.append(members[torch.randperm(count, generator=gen)[:m]])
    return torch.cat(picks)


def alignment(
    h: torch.Tensor,
    y: torch.Tensor,
    anchors: torch.Tensor,
    temperature: float,
    penalize: str = "CL",
) -> torch.Tensor:
    """Per-sample prototype alignment (FedCCFA's `penalize`), 0 for a sample whose class has no
    (finite) anchor. CL: ℓ_b = −log softmax_c(cos(h_b, A_c) / τ)[y_b], over the classes with an
    anchor; L2: ℓ_b = ‖h_b − A_{y_b}‖² / D, whose batch mean is the authors' MSELoss."""
    valid = torch.isfinite(anchors).all(1)
    if not bool(valid.any()):
        return h.new_zeros(h.shape[0])
    h = h.reshape(h.shape[0], -1).float()  # bf16 features under autocast
    has = valid[y]
    if penalize == "L2":
        target = torch.nan_to_num(anchors.to(h))[y]  # a NaN row's samples are masked below
        return ((h - target) ** 2).mean(1) * has
    position = torch.cumsum(valid.long(), 0) - 1  # class → its column among the anchors
    cos = F.cosine_similarity(h[:, None, :], anchors[valid].to(h)[None], dim=-1)
    ell = F.cross_entropy(cos / temperature, position[y].clamp(min=0), reduction="none")
    return ell * has
