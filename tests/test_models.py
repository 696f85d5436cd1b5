"""torchvision models with a new head, GroupNorm, and BatchNorm statistics in the flat vector."""

import urllib.error

import pytest
import torch
from torch import nn

from pipeline.common.errors import FedrcError
from pipeline.engine import LocalTask, SequentialExecutor
from pipeline.models import TorchvisionSettings, build_model


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18"])
@pytest.mark.parametrize("shape", [(32, 32, 3), (28, 28, 1)])
def test_torchvision_models_take_our_images(name: str, shape: tuple[int, int, int]) -> None:
    model = build_model(shape, 7, name).eval()
    h, w, c = shape
    assert model(torch.zeros(2, c, h, w)).shape == (2, 7)


def test_group_norm_replaces_every_batch_norm() -> None:
    model = build_model((32, 32, 3), 10, "resnet18", TorchvisionSettings(norm="group"))
    kinds = {type(m) for m in model.modules()}
    assert nn.GroupNorm in kinds and nn.BatchNorm2d not in kinds


def test_batch_norm_statistics_travel_in_the_flat_vector() -> None:
    torch.manual_seed(0)
    model = build_model((32, 32, 3), 10, "resnet18")
    ex = SequentialExecutor(
        model, torch.device("cpu"), lr=0.01, momentum=0.0, weight_decay=0.0,
        batch_size=8, local_epochs=1, drop_last=False,
    )  # fmt: skip
    assert ex.num_params > ex.num_trainable  # running means and variances follow the weights
    start = ex.flatten()
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    result = ex.train(LocalTask(0, start, torch.ones(8)), images, torch.arange(8) % 10, seed=0)
    stats = slice(ex.num_trainable, ex.num_params)
    assert not torch.equal(result.params[stats], start[stats])  # train mode updated them
    ex.load(start)
    assert torch.equal(ex.flatten(), start)


def test_pretrained_weights_offline_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    with pytest.raises(FedrcError, match=r"train\.mobilenet_v2\.pretrained: could not download"):
        build_model((32, 32, 3), 10, "mobilenet_v2", TorchvisionSettings(pretrained=True))
    with pytest.raises(FedrcError, match=r"train\.resnet18\.pretrained: .*norm: group"):
        build_model((32, 32, 3), 10, "resnet18", TorchvisionSettings(pretrained=True, norm="group"))
