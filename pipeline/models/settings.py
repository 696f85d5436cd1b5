"""The built-in models' own settings, apart from the models' code so that `fedrc info NAME`
lists them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.common.settings import Settings, require, setting

NORMS = ("batch", "group")


@dataclass(frozen=True)
class CNNSettings(Settings):
    """The FMNIST CNN's input scaling. fedrc feeds pixels as p/127.5 − 1, in [−1, 1]; the FedRC
    authors' loader applies torchvision's Normalize(0.1307, 0.3081) to p/255, Fashion-MNIST's
    training mean and std (docs/reproducing.md)."""

    normalize: list[float] | None = setting(  # noqa: RUF009 (None: no list is shared)
        None,
        "[mean, std]: inputs (p/255 − mean)/std, e.g. the authors' [0.1307, 0.3081]; "
        "null: fedrc's [−1, 1]",
    )

    def validate(self) -> None:
        n = self.normalize
        ok = n is None or (len(n) == 2 and n[1] > 0)
        require(ok, "normalize", "null or [mean, std] with std > 0", n)


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
