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


def test_the_authors_input_scaling_is_their_normalize_on_pixels_in_0_1() -> None:
    """`cnn.normalize: [0.1307, 0.3081]` gives the network (p/255 − 0.1307)/0.3081, the FedRC
    authors' torchvision Normalize, from the executors' p/127.5 − 1; null leaves it alone."""
    from pipeline.engine.sequential import as_input
    from pipeline.models import CNNSettings

    torch.manual_seed(0)
    plain = build_model((28, 28, 1), 10, "cnn")
    authors = build_model((28, 28, 1), 10, "cnn", CNNSettings(normalize=[0.1307, 0.3081]))
    authors.load_state_dict(plain.state_dict())
    pixels = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8)
    normalized = (pixels.float() / 255 - 0.1307) / 0.3081
    torch.testing.assert_close(authors(as_input(pixels)), plain(normalized), rtol=1e-5, atol=1e-5)
    assert torch.equal(plain(as_input(pixels)), plain.classifier(plain.features(as_input(pixels))))
    state = [(k, v.shape) for k, v in authors.state_dict().items()]
    assert state == [(k, v.shape) for k, v in plain.state_dict().items()]  # the same flat model


def test_the_input_scaling_is_part_of_a_runs_identity() -> None:
    from pipeline.run.resolve import make_config, recorded_identity

    default = make_config().identity()
    scaled = make_config(normalize=[0.1307, 0.3081]).identity()
    assert default["cnn.normalize"] is None and scaled["cnn.normalize"] == [0.1307, 0.3081]
    older = {k: v for k, v in default.items() if k != "cnn.normalize"}  # before the setting
    assert recorded_identity(older, "checkpoint") == default
    with pytest.raises(FedrcError, match=r"normalize: expected null or \[mean, std\]"):
        make_config(normalize=[0.5])
