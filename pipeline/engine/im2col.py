"""Convolutions with per-task weights as one matrix product over all tasks (issue 41).

Under `torch.func.vmap`, a convolution whose weights differ per task becomes a grouped
convolution (groups = tasks), which cuDNN runs one group at a time: on the GPU profile
(docs/performance.md) one forward, one data-gradient and one weight-gradient kernel per task and
step, plus layout conversions. Here the batching rule of such a convolution is written out
instead: im2col (`F.unfold`) of every task's batch, then one `torch.baddbmm` of all tasks'
weights with their columns. Autograd then records these few large operations, so the backward
pass is also a handful of kernels (two batched products and `fold`) whatever the number of tasks.
The price is memory: the columns, C·kh·kw × H'·W' per sample and layer, are kept for backward
(the executor's automatic chunk size counts them, `column_elements`).

Which layers take it is decided per layer by `with_im2col`: a plain `nn.Conv2d` of one group with
zero padding given as numbers. Anything else (MobileNetV2's depthwise convolutions, other padding
modes, subclasses of Conv2d) keeps vmap's own rule, and so does a call whose weights are not
batched. On CUDA the products follow `torch.backends.cuda.matmul.allow_tf32` (torch's default:
full fp32), while cuDNN's convolutions follow `torch.backends.cudnn.allow_tf32` (default: TF32).
"""

from __future__ import annotations

import copy
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

CONV_PATHS = ("auto", "im2col", "grouped")

Pair = tuple[int, int]


def conv_path(conv: str, device: torch.device) -> str:
    """The path that the option `conv` names, im2col or grouped: "auto" is im2col on CUDA
    only, because on the CPU vmap's grouped convolution measured faster (docs/performance.md,
    benchmarks/conv_paths.py)."""
    if conv not in CONV_PATHS:
        raise ValueError(f"conv: expected one of {CONV_PATHS}, got {conv!r}")
    if conv == "auto":
        return "im2col" if device.type == "cuda" else "grouped"
    return conv


def supports(module: nn.Module) -> bool:
    """Whether `module` is a convolution the im2col rule computes exactly as `F.conv2d` does."""
    return (
        type(module) is nn.Conv2d
        and module.groups == 1
        and module.padding_mode == "zeros"
        and not isinstance(module.padding, str)
    )


def with_im2col(model: nn.Module) -> nn.Module:
    """A copy of `model` whose supported convolutions take the im2col rule under vmap (the same
    parameter and buffer names, for `functional_call`); `model` itself when it has none."""
    if not any(supports(m) for m in model.modules()):
        return model
    twin = copy.deepcopy(model)
    for module in twin.modules():
        if supports(module):
            module.__class__ = Im2colConv2d
    return twin


def column_elements(module: nn.Module, output: torch.Tensor) -> int:
    """Elements of the im2col columns that `module` keeps for backward per sample (0 for any
    other module): the executor's memory estimate counts them with the activations."""
    if not isinstance(module, Im2colConv2d):
        return 0
    return module.weight[0].numel() * output.shape[-2] * output.shape[-1]


class Im2colConv2d(nn.Conv2d):
    """`nn.Conv2d` (only ever made by `with_im2col`) whose convolution is `TaskConv2d`."""

    def _conv_forward(
        self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return TaskConv2d.apply(input, weight, bias, self.stride, self.padding, self.dilation)


class TaskConv2d(torch.autograd.Function):
    """`F.conv2d`, whose batching rule for per-task weights is im2col and one batched product.

    Called outside vmap it is `F.conv2d` with its usual gradient. Under vmap only `vmap` runs,
    on the unbatched tensors one level down, so autograd records its operations and never this
    function's `backward`.
    """

    @staticmethod
    def forward(x, weight, bias, stride: Pair, padding: Pair, dilation: Pair) -> torch.Tensor:
        return F.conv2d(x, weight, bias, stride, padding, dilation)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias, ctx.stride, ctx.padding, ctx.dilation = inputs
        ctx.save_for_backward(x, weight)
        ctx.bias_sizes = None if bias is None else [bias.shape[0]]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        """As autograd differentiates `F.conv2d`; under autocast its inputs were cast to the
        output's dtype, as they are here."""
        x, weight = ctx.saved_tensors
        grads = torch.ops.aten.convolution_backward(
            grad,
            x.to(grad.dtype),
            weight.to(grad.dtype),
            ctx.bias_sizes,
            ctx.stride,
            ctx.padding,
            ctx.dilation,
            False,
            [0, 0],
            1,
            list(ctx.needs_input_grad[:3]),
        )
        return *grads, None, None, None

    @staticmethod
    def vmap(info, in_dims, x, weight, bias, stride: Pair, padding: Pair, dilation: Pair):
        x_dim, w_dim, b_dim = in_dims[:3]
        per_sample = x.dim() - (x_dim is not None) == 4  # (N, C, H, W), not one (C, H, W)
        if w_dim is None or not per_sample:  # nothing per task to gain from: vmap's own rule
            conv = partial(F.conv2d, stride=stride, padding=padding, dilation=dilation)
            return vmap(conv, in_dims=(x_dim, w_dim, b_dim))(x, weight, bias), 0
        weight = weight.movedim(w_dim, 0)
        x = x.unsqueeze(0) if x_dim is None else x.movedim(x_dim, 0)
        if bias is not None:
            bias = bias.expand(info.batch_size, -1) if b_dim is None else bias.movedim(b_dim, 0)
        return im2col_conv2d(x, weight, bias, stride, padding, dilation), 0


def im2col_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Pair,
    padding: Pair,
    dilation: Pair,
) -> torch.Tensor:
    """Every task's convolution at once: x (T or 1, N, C, H, W), one batch per task or one for
    all; weight (T, O, C, kh, kw); bias (T, O) or None → (T, N, O, H', W'), a transposed view
    of the products' (T, O, N, H', W')."""
    tasks, out_channels = weight.shape[:2]
    sets, n, channels, height, width = x.shape
    kernel = weight.shape[3:]
    cols = F.unfold(
        x.reshape(sets * n, channels, height, width),
        kernel,
        dilation=dilation,
        padding=padding,
        stride=stride,
    )  # (sets·N, K, L): K = C·kh·kw, L = H'·W'
    k, length = cols.shape[1:]
    cols = cols.view(sets, n, k, length).transpose(1, 2).reshape(sets, k, n * length)
    out = _products(weight.reshape(tasks, out_channels, k), cols, bias)
    size = [_output_size(*a) for a in zip((height, width), kernel, stride, padding, dilation)]
    return out.view(tasks, out_channels, n, *size).transpose(1, 2)


def _products(weight: torch.Tensor, cols: torch.Tensor, bias: torch.Tensor | None):
    """weight (T, O, K) times cols (T, K, M), or (1, K, M) shared by every task (one product
    of all tasks' stacked weights), plus bias (T, O): (T, O, M). The bias goes into the
    product (`baddbmm`, `addmm`) so that autocast casts it with the operands, as `conv2d`'s."""
    if cols.shape[0] == 1:
        tasks, out_channels, k = weight.shape
        rows = weight.reshape(tasks * out_channels, k)
        if bias is None:
            return torch.mm(rows, cols[0]).view(tasks, out_channels, -1)
        out = torch.addmm(bias.reshape(-1, 1), rows, cols[0])
        return out.view(tasks, out_channels, -1)
    if bias is None:
        return torch.bmm(weight, cols)
    return torch.baddbmm(bias.unsqueeze(2), weight, cols)


def _output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
