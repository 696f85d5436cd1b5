"""The CPU executor keeps freed model-sized buffers in the heap (`pipeline.engine.heap`)."""

from __future__ import annotations

import os
import resource

import pytest
import torch

from pipeline.engine.heap import keep_freed_buffers

glibc = pytest.mark.skipif(
    not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"), reason="glibc only"
)


@glibc
def test_model_sized_buffers_are_not_faulted_in_again() -> None:
    # Prepare: thresholds set, one warm-up round of the buffers a local training allocates
    assert keep_freed_buffers()
    size = 2_200_000  # the FMNIST CNN's parameters: 8.8 MB of float32

    def one_training() -> None:
        buffers = [torch.ones(size) for _ in range(3)]  # gradients, momentum, result
        del buffers

    for _ in range(3):
        one_training()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    # Execute
    for _ in range(20):
        one_training()
    # Assert: fresh pages for every buffer would be 20 × 3 × 2,150 faults (87,000 measured
    # without the thresholds); a buffer or two faulted in again is allowed
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 13_000
