"""Shapes, argument validation and key properties of the built-in models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpctrain.models.convnet import ConvNet
from hpctrain.models.gpt import GPT
from hpctrain.models.mlp import MLP


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# ConvNet --------------------------------------------------------------------------------------


def test_convnet_logits_shape() -> None:
    model = ConvNet(num_classes=10).eval()
    out = model(torch.rand(5, 1, 8, 8))
    assert out.shape == (5, 10)
    assert out.dtype == torch.float32
    # Logits, not probabilities: rows do not sum to one.
    assert not torch.allclose(out.sum(dim=1), torch.ones(5))


def test_convnet_pool_output_is_64x4x4_for_8x8() -> None:
    model = ConvNet()
    assert model.features(torch.rand(2, 1, 8, 8)).shape == (2, 64, 4, 4)
    assert model.classifier[1].in_features == 64 * 4 * 4


def test_convnet_other_sizes_and_list_channels() -> None:
    model = ConvNet(num_classes=3, in_channels=3, image_size=28, channels=[8, 16, 16], hidden=32)
    assert model(torch.rand(2, 3, 28, 28)).shape == (2, 3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_classes": 1}, r"num_classes \(got 1\) must be an integer >= 2"),
        ({"image_size": 1}, r"image_size \(got 1\)"),
        ({"channels": []}, r"channels \(got \[\]\)"),
        ({"channels": [32, 0]}, r"channels\[1\] \(got 0\)"),
        ({"dropout1": 1.0}, r"dropout1 \(got 1.0\) must be in \[0, 1\)"),
        ({"dropout2": -0.1}, r"dropout2 \(got -0.1\)"),
        ({"hidden": True}, r"hidden \(got True\)"),
    ],
)
def test_convnet_bad_args(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ConvNet(**kwargs)


def test_convnet_wrong_input_shape() -> None:
    with pytest.raises(ValueError, match=r"expects input \[B, 1, 8, 8\]"):
        ConvNet()(torch.rand(2, 1, 7, 7))


# MLP ------------------------------------------------------------------------------------------


def test_mlp_shapes_flat_and_image() -> None:
    model = MLP()
    x = torch.rand(4, 1, 8, 8)
    assert model(x).shape == (4, 10)
    assert torch.equal(model(x), model(x.flatten(1)))
    assert MLP(in_features=64, hidden=[], num_classes=3)(torch.rand(2, 64)).shape == (2, 3)


def test_mlp_has_no_dropout_or_batchnorm() -> None:
    model = MLP(hidden=[32, 32, 32])
    banned = (nn.Dropout, nn.modules.batchnorm._BatchNorm)
    assert not any(isinstance(m, banned) for m in model.modules())
    x = torch.rand(6, 64)
    # Deterministic and per-sample: train == eval, and batch split does not change results.
    out_train = model.train()(x)
    assert torch.equal(out_train, model.eval()(x))
    assert torch.allclose(torch.cat([model(x[:3]), model(x[3:])]), out_train)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"in_features": 0}, r"in_features \(got 0\) must be an integer >= 1"),
        ({"hidden": [128, -1]}, r"hidden\[1\] \(got -1\)"),
        ({"num_classes": 1}, r"num_classes \(got 1\)"),
    ],
)
def test_mlp_bad_args(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MLP(**kwargs)


def test_mlp_wrong_input_shape() -> None:
    with pytest.raises(ValueError, match="64 features per sample"):
        MLP()(torch.rand(2, 63))


# GPT ------------------------------------------------------------------------------------------


def _tiny_gpt(**kw: object) -> GPT:
    args = {"vocab_size": 50, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32}
    args.update(kw)
    return GPT(**args).eval()


def test_gpt_logits_shape() -> None:
    model = _tiny_gpt()
    idx = torch.randint(50, (3, 16))
    out = model(idx)
    assert out.shape == (3, 16, 50)
    assert model(idx[:, :5]).shape == (3, 5, 50)


def test_gpt_defaults_build_and_run() -> None:
    model = GPT().eval()
    assert model(torch.randint(512, (2, 128))).shape == (2, 128, 512)


def test_gpt_sequence_too_long() -> None:
    with pytest.raises(ValueError, match=r"sequence length \(got 17\) must be <= block_size"):
        _tiny_gpt()(torch.zeros(1, 17, dtype=torch.long))


def test_gpt_causal() -> None:
    model = _tiny_gpt()
    idx = torch.randint(50, (2, 12))
    changed = idx.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 50
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-6)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_gpt_head_tied_to_token_embedding() -> None:
    model = _tiny_gpt()
    assert model.lm_head.weight is model.wte.weight


def test_gpt_init_scales_residual_projections() -> None:
    model = GPT(vocab_size=256, block_size=32, n_layer=8, n_head=4, n_embd=256)
    std_proj = model.blocks[0].attn.c_proj.weight.std().item()
    std_fc = model.blocks[0].mlp.c_fc.weight.std().item()
    assert std_fc == pytest.approx(0.02, rel=0.05)
    assert std_proj == pytest.approx(0.02 / 4.0, rel=0.05)  # 1/sqrt(2 * 8)


def test_gpt2_small_param_count() -> None:
    with torch.device("meta"):
        model = GPT(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    # 124,439,808 for GPT-2 small with tied head (positions included).
    assert model.num_params() == pytest.approx(124.4e6, rel=0.01)


def test_gpt2_medium_param_count() -> None:
    with torch.device("meta"):
        model = GPT(vocab_size=50304, block_size=1024, n_layer=24, n_head=16, n_embd=1024)
    assert 340e6 < model.num_params() < 370e6


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_embd": 100, "n_head": 3}, r"n_embd \(got 100\) must be divisible by n_head \(got 3\)"),
        ({"n_layer": 0}, r"n_layer \(got 0\) must be an integer >= 1"),
        ({"vocab_size": 0}, r"vocab_size \(got 0\)"),
        ({"block_size": -4}, r"block_size \(got -4\)"),
        ({"dropout": 1.5}, r"dropout \(got 1.5\) must be in \[0, 1\)"),
        ({"bias": "yes"}, r"bias \(got 'yes'\)"),
    ],
)
def test_gpt_bad_args(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GPT(**kwargs)
