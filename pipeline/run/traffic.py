"""Bytes a round's messages carry between the server and its clients, counted as they are made.

In one process nothing travels, but every message of a deployment exists as a value: what the
server hands a sampled client (the model rows its E-step scores, its step's fields) and what the
client hands back (each model it trained, its upload: ω, label tables…; a statistic of its
data; for an algorithm without a client part, the per-sample losses, labels and predictions its
server-side E-step reads). Each place counts its own clients' values and the counts are added
over places with the algorithm's sums, so one process, torchrun and a Flower server log the same
`bytes_down` and `bytes_up` in metrics.jsonl. A tensor counts its elements × their size, a
number 8 bytes, a flag 1, a string its UTF-8 bytes: the payload, without any protocol's framing.
Evaluation is not counted (a deployment's evaluation messages depend on where it scores).
"""

from __future__ import annotations

from typing import Any

import torch


def payload_bytes(value: Any) -> int:
    """The bytes of a message's values (tensors, numbers, flags, strings, and containers)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(payload_bytes(v) for v in value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, int | float):
        return 8
    if isinstance(value, str):
        return len(value.encode())
    return 0  # None: nothing is sent


class Traffic:
    """This place's bytes of one round, down (server → clients) and up (clients → server),
    kept as Python integers (no device work per message) until they are summed over places."""

    def __init__(self) -> None:
        self.bytes = [0, 0]

    def down(self, value: Any) -> None:
        self.bytes[0] += payload_bytes(value)

    def up(self, value: Any) -> None:
        self.bytes[1] += payload_bytes(value)

    def tensor(self, device: torch.device) -> torch.Tensor:
        """The two counts as a float64 tensor for the round's sum over places (exact up to
        2^53 bytes)."""
        return torch.tensor(self.bytes, dtype=torch.float64, device=device)

    @staticmethod
    def row(summed: torch.Tensor) -> dict[str, int]:
        """The metrics row's fields from the summed `tensor`."""
        down, up = summed.tolist()
        return {"bytes_down": int(down), "bytes_up": int(up)}
