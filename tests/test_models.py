"""Tests for fedaudit.models (CPU, offline, fast)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
from safetensors.torch import save_file
from torch import nn

from fedaudit.errors import FedauditError
from fedaudit.models import (
    ARCHITECTURES,
    HEADS,
    NORM_LAYERS,
    Classifier,
    bn_layers,
    build_model,
    load_pretrained,
    make_norm,
)

X32 = torch.randn(2, 3, 32, 32)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("norm", ["bn", "in", "gn"])
@pytest.mark.parametrize("arch,dim", [("cnn", 256), ("resnet18", 512)])
def test_output_shapes(arch: str, dim: int, norm: str) -> None:
    model = build_model(arch, num_classes=7, image_size=32, norm=norm)
    assert isinstance(model, Classifier)
    assert (model.arch, model.norm, model.feature_dim, model.num_classes) == (arch, norm, dim, 7)
    assert model(X32).shape == (2, 7)
    assert model.features(X32).shape == (2, dim)


def test_resnet50_shape_gn() -> None:
    model = build_model("resnet50", num_classes=5, norm="gn")
    assert model.features(X32).shape == (2, 2048)
    assert model(X32).shape == (2, 5)


def test_registries() -> None:
    assert set(ARCHITECTURES) == {"cnn", "resnet18", "resnet50"}
    assert set(HEADS) == {"linear", "bn_linear"}
    assert {"bn", "in", "gn"} <= set(NORM_LAYERS)


def test_small_image_stem() -> None:
    small = build_model("resnet18", 7, image_size=32).encoder.backbone
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1)
    assert isinstance(small.maxpool, nn.Identity)
    big = build_model("resnet18", 7, image_size=224).encoder.backbone
    assert big.conv1.kernel_size == (7, 7) and isinstance(big.maxpool, nn.MaxPool2d)


@pytest.mark.parametrize("arch,count", [("resnet18", 11_180_103), ("resnet50", 23_522_375)])
def test_parameter_counts(arch: str, count: int) -> None:
    assert n_params(build_model(arch, num_classes=7, image_size=224)) == count


def test_feature_dim_projection() -> None:
    model = build_model("resnet18", 10, feature_dim=512, head="bn_linear")
    assert model.feature_dim == 512
    assert isinstance(model.encoder.proj, nn.Linear) and model.encoder.proj.in_features == 512
    cnn = build_model("cnn", 10, feature_dim=64)
    assert cnn.feature_dim == 64 and cnn.features(X32).shape == (2, 64)
    assert cnn.head.in_features == 64


def test_bn_linear_head() -> None:
    model = build_model("cnn", 7, head="bn_linear", norm="gn")
    bn = model.head[0]
    assert isinstance(bn, nn.BatchNorm1d) and not bn.affine and bn.num_features == 256
    assert model.head.bn is bn and isinstance(model.head.fc, nn.Linear)
    assert model(X32).shape == (2, 7)
    assert bn_layers(model) == [("head.bn", bn)]


def test_norm_factory() -> None:
    assert isinstance(make_norm("bn", 8), nn.BatchNorm2d)
    assert isinstance(make_norm("bn", 8, dims=1), nn.BatchNorm1d)
    inorm = make_norm("in", 8)
    assert isinstance(inorm, nn.InstanceNorm2d) and inorm.affine and not inorm.track_running_stats
    gn = make_norm("gn", 64)
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 32
    assert make_norm("gn", 48).num_groups == 24  # largest divisor <= 32
    assert make_norm("gn", 16).num_groups == 16


def test_norm_registry_is_extensible() -> None:
    NORM_LAYERS["test_ln"] = lambda c, d: nn.GroupNorm(1, c)
    try:
        model = build_model("cnn", 3, norm="test_ln")
        assert model(X32).shape == (2, 3)
    finally:
        del NORM_LAYERS["test_ln"]


def test_unknown_choices_name_valid_ones() -> None:
    with pytest.raises(FedauditError, match=r"unknown norm layer 'ln'.*bn, gn, in"):
        make_norm("ln", 8)
    with pytest.raises(FedauditError, match=r"unknown norm layer 'xn'.*bn, gn, in"):
        build_model("cnn", 7, norm="xn")
    with pytest.raises(FedauditError, match=r"unknown architecture 'vgg'.*cnn, resnet18, resnet50"):
        build_model("vgg", 7)
    with pytest.raises(FedauditError, match=r"unknown head 'mlp'.*bn_linear, linear"):
        build_model("cnn", 7, head="mlp")
    with pytest.raises(FedauditError, match="num_classes"):
        build_model("cnn", 0)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_pretrained_round_trip(tmp_path: Path, suffix: str) -> None:
    src = build_model("resnet18", 7, head="bn_linear", feature_dim=128)
    src.train()
    src(torch.randn(4, 3, 32, 32))  # move BN running stats away from init
    path = tmp_path / f"w{suffix}"
    state = {k: v.contiguous() for k, v in src.state_dict().items()}
    if suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path)

    dst = build_model("resnet18", 7, head="bn_linear", feature_dim=128, pretrained=str(path))
    src.eval(), dst.eval()
    with torch.no_grad():
        assert torch.equal(src(X32), dst(X32))


def test_encoder_only_state_dict_and_new_head(tmp_path: Path) -> None:
    src = build_model("cnn", 7).eval()
    path = tmp_path / "w.pt"
    torch.save(src.state_dict(), path)
    with pytest.warns(UserWarning, match="head"):
        dst = build_model("cnn", 3, pretrained=str(path)).eval()  # other classes: head stays fresh
    with torch.no_grad():
        assert torch.equal(src.features(X32), dst.features(X32))
    torch.save({"state_dict": src.encoder.state_dict()}, path)  # wrapped, encoder-relative keys
    dst = build_model("cnn", 7, pretrained=str(path)).eval()
    with torch.no_grad():
        assert torch.equal(src.features(X32), dst.features(X32))


def test_torchvision_keys_load(tmp_path: Path) -> None:
    tv = torchvision.models.resnet18(weights=None)
    path = tmp_path / "tv.pth"
    torch.save(tv.state_dict(), path)  # includes fc.*, which is ignored
    model = build_model("resnet18", 7, image_size=224, pretrained=str(path)).eval()
    tv.fc = nn.Identity()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model.features(x), tv.eval()(x))
    # the small-image stem has a 3x3 conv1: the mismatch is named, with the fix
    with pytest.raises(FedauditError, match=r"conv1\.weight.*image_size > 64"):
        build_model("resnet18", 7, image_size=32, pretrained=str(path))
    # norm mismatch: BN running stats have no place in a GroupNorm model
    with pytest.raises(FedauditError, match="no place in this model"):
        build_model("resnet18", 7, image_size=224, norm="gn", pretrained=str(path))


def test_pretrained_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pt"
    with pytest.raises(FedauditError, match=r"nope\.pt does not exist; give a local state_dict"):
        build_model("cnn", 7, pretrained=str(missing))
    path = tmp_path / "other.pt"
    torch.save({"foo.weight": torch.zeros(3)}, path)
    with pytest.raises(FedauditError, match=r"no key in .* expected keys like 'encoder\..*found 'foo\.weight'"):
        build_model("cnn", 7, pretrained=str(path))
    # a resnet18 checkpoint lacks the resnet50 bottleneck weights / has wrong shapes
    torch.save(build_model("resnet18", 7).state_dict(), path)
    with pytest.raises(FedauditError, match="shape|no place|lacks"):
        build_model("resnet50", 7, pretrained=str(path))
    # shape mismatch names the first mismatching key
    state = build_model("cnn", 7).state_dict()
    state["encoder.blocks.0.0.weight"] = torch.zeros(16, 3, 3, 3)
    torch.save(state, path)
    with pytest.raises(FedauditError, match=r"'encoder\.blocks\.0\.0\.weight'.*\(16, 3, 3, 3\)"):
        build_model("cnn", 7, pretrained=str(path))


_EXECUTED: list[str] = []


def _payload(marker: str) -> dict:
    _EXECUTED.append(marker)
    Path(marker).write_text("executed")
    return {}


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # unpickling would call _payload(marker)
        return (_payload, (self.marker,))


def test_pickled_object_is_refused_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "executed.txt"
    path = tmp_path / "evil.pt"
    torch.save({"encoder.blocks.0.0.weight": torch.zeros(1), "x": _Evil(str(marker))}, path)
    model = build_model("cnn", 7)
    with pytest.raises(FedauditError, match="refuses to unpickle"):
        load_pretrained(model, str(path))
    assert not marker.exists() and not _EXECUTED


def test_bn_layers() -> None:
    bn = build_model("cnn", 7, norm="bn")
    layers = bn_layers(bn)
    assert [name for name, _ in layers] == [f"encoder.blocks.{i}.1" for i in range(4)]
    assert [m.num_features for _, m in layers] == [32, 64, 128, 256]
    assert bn_layers(build_model("cnn", 7, norm="gn")) == []
    names = [n for n, _ in bn_layers(build_model("resnet18", 7))]
    assert names[0] == "encoder.backbone.bn1" and names[-1].startswith("encoder.backbone.layer4")


class _Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.shape[1])
        return x


@pytest.mark.parametrize("arch,channels", [("cnn", [32, 64]), ("resnet18", [64, 128])])
def test_mixstyle_called_after_first_two_blocks(arch: str, channels: list[int]) -> None:
    counter = _Counter()
    model = build_model(arch, 7, mixstyle=counter)
    model(X32)
    assert counter.calls == channels
    model.eval()
    assert not counter.training  # registered as a submodule, so mode propagates


def test_cnn_blocks_are_a_module_list() -> None:
    model = build_model("cnn", 7)
    assert isinstance(model.encoder.blocks, nn.ModuleList) and len(model.encoder.blocks) == 4
