"""The batched executor: many local trainings (clients × models) as one computation.

The tasks' parameters are stacked along a new leading dimension and one module is run on all of
them at once with `torch.func.functional_call` inside `torch.func.vmap`; autograd over the
vmapped loss gives every task its own gradient (the tasks share nothing, so the gradient of the
sum is the stack of the gradients). SGD with momentum, weight decay and the proximal pull is
written out on the stacked tensors with the same operations as `torch.optim.SGD`, so the numbers
equal the sequential executor's up to float rounding (tests/test_batched.py).

How the tasks are kept apart (one computation for many small trainings is what a GPU needs):

- Batches. Every task draws its batch order from its own `torch.Generator().manual_seed(seed)`
  exactly like the sequential executor, so both see the same batches. The whole schedule is
  built on the host before training and moved to the device once: no host syncs in the loop.
- Different sizes. At global step j a task is *active* if it still has a batch; active tasks
  are grouped by the length of their batch (usually one group: every full batch; the final
  partial batches form small extra groups). Each group is one vmapped forward, so no sample is
  padded and BatchNorm's batch statistics are those of the task's real batch.
- Masking. A task with no batch at step j is *masked*: its parameters, momentum buffer and
  BatchNorm running statistics are left exactly as they were (weight decay, the proximal pull
  and momentum would otherwise keep moving it).
- BatchNorm. Floating-point buffers are stacked like the parameters and passed to
  `functional_call`; the training-mode forward updates each task's running statistics in place.
- Convolutions. vmap turns a convolution whose weights differ per task into a grouped one
  (groups = tasks), which cuDNN runs one task at a time (docs/performance.md, the H200 profile).
  With `conv="im2col"`, the default on CUDA, the model's plain convolutions have a batching rule
  of their own (`pipeline.engine.im2col`): every task's batch unfolded and one batched matrix
  product over all tasks, so forward and backward are a few large kernels per layer whatever
  the number of tasks; other convolutions (depthwise, grouped) keep vmap's rule, layer by
  layer. On the CPU vmap's grouped convolution measured faster, and `auto` keeps it there.
- Dropout draws different masks per task (`randomness="different"`), from the global generator
  in another order than the sequential executor: models with dropout (MobileNetV2's head) do not
  match it number for number.
- Memory. Tasks are trained in chunks of `chunk_tasks`; by default the chunk is sized from the
  free GPU memory with a conservative estimate per task, and a modest fixed size on the CPU.
- Precision. `precision="bf16"` runs the vmapped forward passes and losses under bfloat16
  autocast, on CUDA or the CPU, as the sequential executor does; the parameters, gradients,
  momentum and the update stay float32.
- Compilation. With `compile=True` each global step of SGD (the groups' forward passes, the
  gradient and the update) runs under `torch.compile`, once per batch shape
  (`pipeline.engine.compiled`); the step takes and returns new tensors, so that on CUDA it can
  be one CUDA graph. Its numbers equal the eager step's up to float rounding.

On a CPU this is slower than the sequential loop (protocol §6); `executor: auto` picks it only on
CUDA. On a CPU shared by several runs, give each process one thread (`OMP_NUM_THREADS=1` or
`torch.set_num_threads(1)`); the executor does not change torch's global thread settings.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from pipeline.engine.compiled import CompiledStep
from pipeline.engine.im2col import column_elements, conv_path, with_im2col
from pipeline.engine.sequential import NonFiniteLoss, SequentialExecutor, as_input
from pipeline.engine.task import Job, LocalResult, LocalTask

CPU_CHUNK = 32  # tasks per chunk on the CPU, where batching is only for tests and comparisons
GPU_INFERENCE_CHUNK = 2048  # images per vmapped inference pass on a GPU
MEMORY_SHARE = 0.5  # of the free GPU memory that the automatic chunk size plans to use


class Pool(NamedTuple):
    """A chunk's data on the device (`BatchedExecutor._pool`)."""

    images: torch.Tensor  # uint8, the rows of every distinct client one after another
    labels: torch.Tensor
    weights: torch.Tensor  # every task's weights one after another
    offsets: torch.Tensor | None  # every task's logit offsets (zeros for a task without)
    bases: torch.Tensor  # (2, tasks): each task's first image row and first weight row


Group = tuple[int, torch.Tensor, torch.Tensor]  # batch length L, task ids (G,), positions (G, L)


class Batch(NamedTuple):
    """One group's data at a step, gathered from the chunk's `Pool` (`BatchedExecutor._gather`)."""

    ids: torch.Tensor  # (G,) the group's tasks
    images: torch.Tensor  # (G, L, C, H, W) uint8
    labels: torch.Tensor  # (G, L)
    weights: torch.Tensor  # (G, L)
    offsets: torch.Tensor | None  # (G, L, classes)


class Rates(NamedTuple):
    """Each task's SGD numbers, (T,) tensors, when a chunk holds the tasks of several runs
    (`pipeline.engine.cohort`); a chunk of one run uses its executor's numbers as they are."""

    lr: torch.Tensor
    weight_decay: torch.Tensor
    momentum: torch.Tensor


class BatchedExecutor(SequentialExecutor):
    """Same contract as `SequentialExecutor` (flat models, `train`, `logits`, `losses`), with
    `stream` and `logits` vectorised over tasks / model rows.

    `chunk_tasks`: local trainings run at once (None: from free GPU memory, `CPU_CHUNK` on a
    CPU). `precision`: "fp32" (default) or "bf16" (autocast, `SequentialExecutor`). `conv`:
    how convolutions with per-task weights run: "im2col" (one batched product per layer,
    `pipeline.engine.im2col`), "grouped" (vmap's grouped convolution) or "auto" (im2col on
    CUDA, grouped on the CPU). `compile`: the local step under `torch.compile`
    (`pipeline.engine.compiled`; CUDA graphs on CUDA).
    """

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
        chunk_tasks: int | None = None,
        precision: str = "fp32",
        conv: str = "auto",
        optimizer: str = "sgd",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        compile: bool = False,
    ) -> None:
        super().__init__(
            model,
            device,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            batch_size=batch_size,
            local_epochs=local_epochs,
            drop_last=drop_last,
            precision=precision,
            optimizer=optimizer,
            betas=betas,
            eps=eps,
        )
        self.lr, self.weight_decay = lr, weight_decay
        self.chunk_tasks = chunk_tasks
        self.param_names = [n for n, _ in self.model.named_parameters()]
        self.buffer_names = [n for n, b in self.model.named_buffers() if b.is_floating_point()]
        self.shapes = [t.shape for t in self.tensors]
        # a `Cohort` (pipeline.engine.cohort) whose batched steps train this executor's chunks
        # together with other runs' chunks; None: this executor trains its chunks itself
        self.cohort = None
        self.conv = conv_path(conv, device)
        # the module that vmap runs: the model, or its copy whose convolutions take im2col
        self.vmapped = with_im2col(self.model) if self.conv == "im2col" else self.model
        # SGD's step, compiled once per batch shape
        if compile and self.rule is not None:
            raise ValueError(f"compile: compiles SGD's step, not {optimizer}'s")
        self.compiled = CompiledStep(self._step, device) if compile else None
        self.compiled_chunk: int | None = None  # `chunk_size` when compiled

    # --- stacked flat vectors ↔ dictionaries of stacked tensors ---------------------------
    def _unflatten(self, flat: torch.Tensor) -> tuple[dict, dict]:
        """(T, P) flat rows → ({name: (T, *shape)} parameters, {name: (T, *shape)} buffers)."""
        sizes = [s.numel() for s in self.shapes]
        parts = [
            v.reshape(flat.shape[0], *s).contiguous()
            for v, s in zip(flat.split(sizes, dim=1), self.shapes)
        ]
        k = len(self.param_names)
        return dict(zip(self.param_names, parts[:k])), dict(zip(self.buffer_names, parts[k:]))

    def _flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.reshape(t.shape[0], -1) for t in tensors], dim=1)

    # --- inference ------------------------------------------------------------------------
    def logits(self, models: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """Logits of every model row on every image (K, N, classes), the rows vmapped."""
        self.vmapped.eval()
        params, buffers = self._unflatten(models.to(self.device))

        def one(p, b, x):
            return functional_call(self.vmapped, (p, b), (x,))

        batched = vmap(one, in_dims=(0, 0, None))
        step = GPU_INFERENCE_CHUNK if self.device.type == "cuda" else 256
        out = None
        with torch.no_grad(), self.autocast():
            for s in range(0, images.shape[0], step):  # into one tensor (see the sequential's)
                chunk = batched(params, buffers, as_input(images[s : s + step])).float()
                if out is None:
                    out = chunk.new_empty((models.shape[0], images.shape[0], chunk.shape[2]))
                out[:, s : s + chunk.shape[1]] = chunk
        if out is None:
            return torch.zeros(models.shape[0], 0, 0, device=self.device)
        return out

    # --- training -------------------------------------------------------------------------
    def train(
        self, task: LocalTask, images: torch.Tensor, labels: torch.Tensor, seed: int
    ) -> LocalResult:
        return self.train_many([(task, images, labels, seed)])[0]

    def stream(self, jobs: Iterable[Job]) -> Iterator[tuple[Job, LocalResult]]:
        """Every job's local SGD, a chunk of tasks at a time; results in the order of `jobs`.
        Only one chunk's jobs and results are alive at once.

        Raises `NonFiniteLoss` (with `.index` and `.job`, the first bad job) after a chunk in
        which some task's loss was not finite.
        """
        jobs = iter(jobs)
        first = next(jobs, None)
        if first is None:
            return
        size = self.chunk_size(first[1])
        jobs, done = itertools.chain([first], jobs), 0
        while chunk := list(itertools.islice(jobs, size)):
            try:
                yield from zip(chunk, self._train_chunk(chunk))
            except NonFiniteLoss as e:
                raise NonFiniteLoss(str(e), done + e.index, chunk[e.index]) from None
            done += len(chunk)

    def _schedule(
        self, jobs: list[Job], owners: list[BatchedExecutor]
    ) -> tuple[list[list[Group]], torch.Tensor]:
        """The batches of every task, grouped per global step, built on the host; task t's
        batch size, epochs and drop_last are its owner's.

        Returns one list per step of (batch length L, task ids (G,), sample positions (G, L)
        within each task's own data) and an (steps, tasks) mask of the tasks that take a step.
        """
        per_task = []
        for (_, _, labels, seed), owner in zip(jobs, owners):
            gen = torch.Generator().manual_seed(seed)  # as in SequentialExecutor.train
            batches = []
            for _ in range(owner.local_epochs):
                batches += owner._batches(torch.randperm(labels.shape[0], generator=gen))
            per_task.append(batches)
        steps = []
        mask = torch.zeros(max(map(len, per_task)), len(jobs), dtype=torch.bool)
        for j in range(mask.shape[0]):
            groups: dict[int, list[int]] = {}
            for t, batches in enumerate(per_task):
                if j < len(batches):
                    groups.setdefault(batches[j].numel(), []).append(t)
                    mask[j, t] = True
            steps.append(
                [
                    (length, torch.tensor(ts), torch.stack([per_task[t][j] for t in ts]))
                    for length, ts in groups.items()
                ]
            )
        return steps, mask

    def _pool(self, jobs: list[Job]) -> Pool:
        """The chunk's data once on the device: the images and labels of each distinct client
        (K tasks of one client share them), and every task's weights and logit offsets
        one after another, with each task's first image row and first weight row."""
        images, labels, where, image_base, weight_base = [], [], {}, [], []
        rows = weights = 0
        for _, x, y, _ in jobs:
            key = (x.data_ptr(), y.data_ptr(), x.shape[0])
            if key not in where:
                where[key] = rows
                images.append(x)
                labels.append(y)
                rows += x.shape[0]
            image_base.append(where[key])
            weight_base.append(weights)
            weights += x.shape[0]
        tasks = [job[0] for job in jobs]
        w = torch.cat([t.weights.to(self.device) for t in tasks])
        offsets = None
        if any(t.offset is not None for t in tasks):
            classes = next(t.offset.shape[1] for t in tasks if t.offset is not None)
            offsets = torch.cat(
                [
                    t.offset.to(self.device, torch.float32)
                    if t.offset is not None
                    else torch.zeros(len(t.weights), classes, device=self.device)
                    for t in tasks
                ]
            )
        x = torch.cat(images).to(self.device)
        y = torch.cat(labels).to(self.device)
        bases = torch.tensor([image_base, weight_base]).to(self.device)
        return Pool(x, y, w, offsets, bases)

    def _stack(self, rows: list[torch.Tensor]) -> list[torch.Tensor]:
        """(trainable,) rows → per-parameter stacked tensors (T, *shape)."""
        flat = torch.stack([r[: self.num_trainable].to(self.device) for r in rows])
        return [
            v.reshape(len(rows), *s).contiguous() for v, s in zip(self._split(flat), self.shapes)
        ]

    def _train_chunk(self, jobs: list[Job]) -> list[LocalResult]:
        """Local SGD of a chunk's tasks at once (`train_tasks`), or, in a cohort, together with
        the chunks other runs have ready."""
        if self.cohort is not None:
            return self.cohort.train(self, jobs)
        return self.train_tasks(jobs, [self] * len(jobs))

    def train_tasks(self, jobs: list[Job], owners: list[BatchedExecutor]) -> list[LocalResult]:
        """Local SGD of the tasks at once, one global step at a time (the module's docstring:
        batches, sizes, masking); task t trains with the batch size, epochs and SGD numbers of
        `owners[t]`, an executor of the same model (itself, or another run's in a cohort)."""
        tasks = [job[0] for job in jobs]
        if any(t.stages or t.prototypes or t.rule is not None or t.stop_gain for t in tasks):
            raise ValueError(  # `needs_sequential`
                "the batched executor runs neither staged tasks (LocalTask.stages), rules "
                "(LocalTask.rule) nor early stopping (LocalTask.stop_gain)"
            )
        pool = self._pool(jobs)
        steps, mask = self._schedule(jobs, owners)
        groups_per_step, mask_dev = self._on_device(steps), mask.to(self.device)
        params, buffers = self._unflatten(torch.stack([t.start for t in tasks]).to(self.device))
        params, buffers = list(params.values()), list(buffers.values())
        # compiled, the numbers are tensors: a schedule's new lr is no new shape to compile
        rates = self._rates(owners, always=self.compiled is not None)
        if self.rule is None:
            bufs = self._momentum_start(tasks, owners)
        else:
            bufs = self._moments_start(tasks)
        anchors, mus = self._proximal(tasks)
        self.vmapped.train()
        total = torch.zeros(len(jobs), dtype=torch.float64, device=self.device)
        for j, groups in enumerate(groups_per_step):
            batches = [self._gather(group, pool) for group in groups]
            masked = None if bool(mask[j].all()) else mask_dev[j]
            optional = (masked, bufs, anchors, pool.offsets)
            key = (len(jobs), *(b.images.shape for b in batches), *(t is None for t in optional))
            if self.rule is None:
                args = (params, buffers, batches, total, bufs, anchors, mus, masked, rates)
                params, buffers, bufs, total = self._run(key, *args)
            else:  # every task still training takes its step j + 1 (a task stops, never pauses)
                grads, buffers, total = self._gradients(params, buffers, batches, total)
                params, bufs = self._adam(params, grads, bufs, anchors, mus, masked, j + 1)
        _raise_if_not_finite(total)  # one check per chunk, not per step
        return self._results(tasks, params, buffers, bufs, total, owners)

    def _rates(self, owners: list[BatchedExecutor], always: bool = False) -> Rates | None:
        """Per-task SGD numbers when the owners' differ or `always`; None when they are this
        executor's (the numbers of a run trained alone, as scalars)."""
        numbers = [(o.lr, o.weight_decay, o.momentum) for o in owners]
        if not always and all(n == (self.lr, self.weight_decay, self.momentum) for n in numbers):
            return None
        columns = torch.tensor(numbers, dtype=torch.float32, device=self.device).T
        return Rates(*columns)

    def _on_device(self, steps: list[list[Group]]) -> list[list[Group]]:
        """The whole schedule's task ids and positions moved to the device at once, before the
        loop: the loop only slices them there."""
        groups = [group for step in steps for group in step]
        ids = torch.cat([g[1] for g in groups]).to(self.device)
        positions = torch.cat([g[2].reshape(-1) for g in groups]).to(self.device)
        ids = ids.split([g[1].numel() for g in groups])
        positions = positions.split([g[2].numel() for g in groups])
        moved = iter([(g[0], i, p.view(g[2].shape)) for g, i, p in zip(groups, ids, positions)])
        return [[next(moved) for _ in step] for step in steps]

    def _momentum_start(
        self, tasks: list[LocalTask], owners: list[BatchedExecutor]
    ) -> list[torch.Tensor] | None:
        """Stacked momentum buffers: the task's own, or zeros (0·m + d = d, torch's first
        step exactly); None when no owner's SGD has momentum."""
        if all(o.momentum == 0 for o in owners):
            return None
        zero = torch.zeros(self.num_trainable, device=self.device)
        return self._stack([zero if t.momentum is None else t.momentum for t in tasks])

    def _moments_start(self, tasks: list[LocalTask]) -> list[torch.Tensor]:
        """Adam's stacked moments at the start: m and v of zeros, for every parameter."""
        zero = torch.zeros(self.num_trainable, device=self.device)
        return [self._stack([zero] * len(tasks)) for _ in range(2)]

    def _proximal(self, tasks: list[LocalTask]) -> tuple[list | None, torch.Tensor | None]:
        """Stacked proximal anchors and each task's μ (0 for a task without a pull); None,
        None when no task has one."""
        prox = [t.anchor is not None and t.mu != 0 for t in tasks]
        if not any(prox):
            return None, None
        anchors = self._stack([t.anchor if p else t.start for t, p in zip(tasks, prox)])
        mus = torch.tensor([t.mu if p else 0.0 for t, p in zip(tasks, prox)], device=self.device)
        return anchors, mus

    def _task_loss(self, p, b, x, y, w, o):
        """One task's Σ w·f on its batch, the function vmapped over a group's tasks."""
        state = (dict(zip(self.param_names, p)), dict(zip(self.buffer_names, b)))
        out = functional_call(self.vmapped, state, (x,))
        if o is not None:
            out = out + o
        return (w * F.cross_entropy(out.float(), y, reduction="none")).sum()

    def _gather(self, group: Group, pool: Pool) -> Batch:
        """One group's batches from the chunk's pool (outside the compiled step: the pool's
        size changes from chunk to chunk, a group's shape seldom)."""
        _, ids, pos = group
        rows = pos + pool.bases[0, ids, None]  # into the image pool
        cols = pos + pool.bases[1, ids, None]  # into the weights and offsets
        offsets = None if pool.offsets is None else pool.offsets[cols]
        return Batch(ids, pool.images[rows], pool.labels[rows], pool.weights[cols], offsets)

    def _run(self, key: tuple, *args):
        """`_step(*args)`, compiled for `key` (the step's shapes) when `compile` is on."""
        return self._step(*args) if self.compiled is None else self.compiled(key, *args)

    def _step(self, params, buffers, batches, total, bufs, anchors, mus, mask, rates):
        """One global step of SGD for every task: the gradients (`_gradients`), then `_sgd`.
        Returns new parameters, buffers, momentum and loss sums; leaves its inputs as they
        were (the compiled step's CUDA graph then mutates none of its inputs)."""
        grads, buffers, total = self._gradients(params, buffers, batches, total)
        params, bufs = self._sgd(params, grads, bufs, anchors, mus, mask, rates)
        return params, buffers, bufs, total

    def _gradients(self, params, buffers, batches: list[Batch], total: torch.Tensor):
        """The forward passes of a step's groups and the gradient of their objective with
        respect to every task's parameters (None for an unused one); the buffers that
        BatchNorm updated and the loss sums with each task's Σ w·f added, as new tensors."""
        leaves = [p.detach().requires_grad_() for p in params]
        buffers = [b.clone() for b in buffers]  # the step's own, updated in place
        in_dims = (0, 0, 0, 0, 0, None if batches[0].offsets is None else 0)
        loss = vmap(self._task_loss, in_dims=in_dims, randomness="different")
        objective = 0.0
        for batch in batches:
            part, total = self._group_objective(loss, leaves, buffers, batch, total)
            objective = objective + part
        grads = torch.autograd.grad(objective, leaves, allow_unused=True)
        return grads, buffers, total

    def _group_objective(
        self, loss, leaves, buffers, batch: Batch, total: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward pass of one group's tasks (one batch length) at a step: the group's
        part of the objective, Σ over tasks of Σ w·f / L, and `total` with each task's Σ w·f
        added. A group of only some tasks writes their BatchNorm statistics back."""
        ids, length = batch.ids, batch.images.shape[1]
        full = ids.numel() == total.numel()  # every task of the chunk, in order
        p_g = leaves if full else [p[ids] for p in leaves]
        b_g = buffers if full else [b[ids] for b in buffers]
        x = as_input(batch.images)
        with self.autocast():
            weighted = loss(p_g, b_g, x, batch.labels, batch.weights, batch.offsets)
        if not full:  # the running statistics this group's forward updated
            for b, new in zip(buffers, b_g):
                b.index_copy_(0, ids, new)
        total = total.index_add(0, ids, weighted.detach().double())
        return (weighted / length).sum(), total

    def _results(self, tasks, params, buffers, bufs, total, owners) -> list[LocalResult]:
        """Each task's trained flat vector, loss sum and, when it brought one, momentum."""
        trained = self._flatten([p.detach() for p in params] + buffers)
        sums = total.tolist()
        momentum = self._flatten(bufs) if bufs is not None and self.rule is None else None
        out = []
        for t, (task, owner) in enumerate(zip(tasks, owners)):
            m = None
            if task.momentum is not None:  # momentum 0: torch.optim.SGD leaves the buffer be
                kept = momentum is None or owner.momentum == 0
                m = task.momentum.to(self.device).clone() if kept else momentum[t]
            out.append(LocalResult(trained[t], sums[t], m))
        return out

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """(T, trainable) rows cut into per-parameter (T, numel) pieces."""
        sizes = [s.numel() for s in self.shapes[: len(self.param_names)]]
        return list(flat[:, : sum(sizes)].split(sizes, dim=1))

    def _sgd(self, params, grads, bufs, anchors, mus, mask, rates: Rates | None = None):
        """torch.optim.SGD's step on stacked tensors; rows where `mask` is False keep their
        parameters and momentum. A parameter without a gradient is skipped, as torch does.
        `rates`: each task's lr, weight decay and momentum (a cohort's chunk), else this
        executor's."""
        new_params, new_bufs = [], []
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads)):
                p = p.detach()
                if g is None:
                    new_params.append(p)
                    if bufs is not None:
                        new_bufs.append(bufs[i])
                    continue
                d = g
                if anchors is not None:  # gradient of (μ/2)‖w − anchor‖²
                    d = d + mus.view(-1, *[1] * (p.dim() - 1)) * (p - anchors[i])
                if rates is not None:
                    rows = [1] * (p.dim() - 1)
                    d = d + rates.weight_decay.view(-1, *rows) * p
                    if bufs is not None:
                        buf = bufs[i] * rates.momentum.view(-1, *rows) + d
                        d = buf
                    new = p - rates.lr.view(-1, *rows) * d
                else:
                    if self.weight_decay != 0:
                        d = d.add(p, alpha=self.weight_decay)
                    if bufs is not None:
                        buf = bufs[i].mul(self.momentum).add_(d)
                        d = buf
                    new = p.add(d, alpha=-self.lr)
                if mask is not None:
                    keep = mask.view(-1, *[1] * (p.dim() - 1))
                    new = torch.where(keep, new, p)
                    if bufs is not None:
                        buf = torch.where(keep, buf, bufs[i])
                new_params.append(new)
                if bufs is not None:
                    new_bufs.append(buf)
        return new_params, (new_bufs if bufs is not None else None)

    def _adam(self, params, grads, moments, anchors, mus, mask, step: int):
        """Adam's (AdamW's) step `step` on stacked tensors (`local_opt`), the proximal pull
        added to the gradient as in `_sgd`; rows where `mask` is False keep their parameters
        and moments. A parameter without a gradient is skipped, as torch does."""
        exp_avg, exp_avg_sq = moments
        new_params, new_m, new_v = [], [], []
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads)):
                p, m, v = p.detach(), exp_avg[i], exp_avg_sq[i]
                if g is not None:
                    if anchors is not None:  # gradient of (μ/2)‖w − anchor‖²
                        g = g + mus.view(-1, *[1] * (p.dim() - 1)) * (p - anchors[i])
                    new, m2, v2 = self.rule.step(p, g, m, v, step, self.lr)
                    if mask is not None:
                        keep = mask.view(-1, *[1] * (p.dim() - 1))
                        new, m2, v2 = (
                            torch.where(keep, a, b) for a, b in ((new, p), (m2, m), (v2, v))
                        )
                    p, m, v = new, m2, v2
                new_params.append(p)
                new_m.append(m)
                new_v.append(v)
        return new_params, [new_m, new_v]

    # --- memory ---------------------------------------------------------------------------
    def chunk_size(self, images: torch.Tensor) -> int:
        """Tasks per chunk: `chunk_tasks` when given, else `auto_chunk`; compiled, the first
        chunk's `auto_chunk` for good (the free memory moves, and each chunk size is another
        shape to compile)."""
        if self.chunk_tasks:
            return self.chunk_tasks
        if self.compiled is None:
            return self.auto_chunk(images)
        if self.compiled_chunk is None:
            self.compiled_chunk = self.auto_chunk(images)
        return self.compiled_chunk

    def auto_chunk(self, images: torch.Tensor) -> int:
        """Tasks per chunk: `CPU_CHUNK` on a CPU; on CUDA, MEMORY_SHARE of the free memory
        over a conservative per-task estimate (fp32 parameters, gradient, momentum, anchor,
        update and a stacked copy: 6×; activations kept for backward: 3× the outputs of every
        module and the im2col columns for one batch)."""
        if self.device.type != "cuda":
            return CPU_CHUNK
        free, _ = torch.cuda.mem_get_info(self.device)
        per_task = 4 * (6 * self.num_params + 3 * self.batch_size * self._activations(images))
        return max(1, int(MEMORY_SHARE * free // per_task))

    def _activations(self, images: torch.Tensor) -> int:
        """Elements output by all leaf modules for one sample, and the im2col columns that
        convolutions keep for backward (`conv="im2col"`)."""
        count = [0]

        def hook(module, args, output):
            if isinstance(output, torch.Tensor):
                count[0] += output[0].numel() + column_elements(module, output)

        leaves = [m for m in self.vmapped.modules() if not list(m.children())]
        handles = [m.register_forward_hook(hook) for m in leaves]
        try:
            self.vmapped.eval()
            with torch.no_grad():
                self.vmapped(as_input(images[:1].to(self.device)))
        finally:
            for h in handles:
                h.remove()
        return count[0]


def _raise_if_not_finite(total: torch.Tensor) -> None:
    """`NonFiniteLoss` for the first task whose loss sum is not finite."""
    bad = ~torch.isfinite(total)
    if bool(bad.any()):
        index = int(bad.nonzero()[0])
        raise NonFiniteLoss(f"local loss {float(total[index])}", index=index)
