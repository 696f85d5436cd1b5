"""The built-in models' own settings, apart from the models' code so that `fedrc info NAME`
lists them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.common.settings import Settings, require, setting

NORMS = ("batch", "group")


@dataclass(frozen=True)
class TorchvisionSettings(Settings):
    pretrained: bool = setting(False, "start from torchvision's ImageNet weights")
    norm: str = setting("batch", "batch, or group: GroupNorm in place of BatchNorm")

    def validate(self) -> None:
        require(self.norm in NORMS, "norm", f"one of {NORMS}", self.norm)
        ok = not (self.pretrained and self.norm == "group")
        require(ok, "pretrained", "false with norm: group (ImageNet weights need BatchNorm)", True)


@dataclass(frozen=True)
class MLPSettings(Settings):
    hidden: int | None = setting(
        None, "width of each hidden layer; null: 2 × the input size (FedDrift)"
    )
    layers: int = setting(1, "number of hidden layers")

    def validate(self) -> None:
        ok = self.hidden is None or self.hidden >= 1
        require(ok, "hidden", "an integer >= 1 or null", self.hidden)
        require(self.layers >= 1, "layers", "an integer >= 1", self.layers)
