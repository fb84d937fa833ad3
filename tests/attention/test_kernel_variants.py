"""The kernel variants a GPU chooses between, each against the float64 definition under the
interpreter: tensor-descriptor (TMA) loads and stores against pointer loads, the dQ kernel with
its own tile config, and launches whose tensors descriptors cannot address (they fall back to
pointers). The other kernel tests run the interpreter's default: pointer loads."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import check_kernels_against_definition, cu_seqlens

from flashtrain.kernels import tma, tuning
from flashtrain.kernels.dropout_mask import dropout_keep_mask
from flashtrain.kernels.tuning import TileConfig

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route


def _qkv(shape_q, shape_k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    make = lambda shape: torch.randn(shape, generator=gen).to(dtype)
    return make(shape_q), make(shape_k), make(shape_k)


@pytest.fixture
def descriptor_launches(monkeypatch):
    """Every launch asks for descriptors; returns the list of use_descriptors answers."""
    answers: list[bool] = []
    choose = tma.use_descriptors

    def recording(cfg, device, *tensors):
        answers.append(choose(cfg, device, *tensors))
        return answers[-1]

    for module in ("flash_fwd", "flash_bwd"):
        monkeypatch.setattr(f"flashtrain.kernels.{module}.use_descriptors", recording)
    with tuning.forced_tma(True):
        yield answers


@pytest.mark.parametrize("deterministic", [True, False], ids=["two-kernel", "atomic-dq"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_descriptor_loads_dense_gqa(descriptor_launches, dtype, deterministic):
    # Sq != Sk (causal bottom-right), GQA 2:1, head_dim 24 (padded to 32 inside the tile)
    q, k, v = _qkv((2, 37, 4, 24), (2, 45, 2, 24), dtype, seed=1)
    check_kernels_against_definition(q, k, v, scale=0.4, causal=True, deterministic=deterministic)
    assert descriptor_launches and all(descriptor_launches)


def test_descriptor_loads_with_every_score_feature(descriptor_launches):
    q, k, v = _qkv((1, 50, 2, 32), (1, 41, 1, 32), torch.float32, seed=2)
    slopes = 0.1 + 0.3 * torch.rand(1, 2, generator=torch.Generator().manual_seed(3))
    check_kernels_against_definition(
        q, k, v, scale=0.3, window=(7, 4), softcap=3.0, alibi_slopes=slopes
    )
    assert all(descriptor_launches)


def test_descriptor_loads_varlen_with_empty_sequence_and_dropout(descriptor_launches):
    lens_q, lens_k = [9, 0, 30], [12, 5, 21]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q, k, v = _qkv((sum(lens_q), 2, 16), (sum(lens_k), 1, 16), torch.float32, seed=4)
    keep = dropout_keep_mask(11, 3, 2, max(lens_q), max(lens_k), 0.3, "cpu", cu_q, cu_k)
    check_kernels_against_definition(
        q, k, v, scale=0.4, causal=True, dropout_p=0.3, seed=11, cu_q=cu_q, cu_k=cu_k,
        keep_mask=keep, deterministic=False,
    )  # fmt: skip
    assert all(descriptor_launches)


@pytest.mark.parametrize("deterministic", [True, False], ids=["two-kernel", "atomic-dq"])
def test_descriptor_loads_blocksparse(descriptor_launches, deterministic):
    # 150 tokens in 64-token blocks: the last block is partial; 4 key tiles per kept block
    block_mask = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(5)) < 0.6
    block_mask[:, :, 0] = True
    block_mask[0, 1, :] = False  # a query block that sees nothing
    q, k, v = _qkv((1, 150, 2, 16), (1, 150, 2, 16), torch.float16, seed=6)
    check_kernels_against_definition(
        q, k, v, scale=0.5, causal=True, block_mask=block_mask, block_size=64,
        deterministic=deterministic,
    )  # fmt: skip
    assert all(descriptor_launches)


def test_unaligned_tensors_fall_back_to_pointer_loads(descriptor_launches):
    """A row stride of 3 x 12 fp16 = 72 bytes is no multiple of 16: no descriptor can address
    the tensor, so the launch takes the pointer path, with the same results."""
    q, k, v = _qkv((1, 33, 3, 12), (1, 33, 3, 12), torch.float16, seed=7)
    check_kernels_against_definition(q, k, v, scale=0.5, causal=True)
    assert descriptor_launches and not any(descriptor_launches)


def test_alignment_rules():
    base = torch.zeros(2, 64, 4, 32, dtype=torch.float16)
    assert tma.aligned(base)
    shifted = torch.zeros(base.numel() + 1, dtype=torch.float16)[1:].view(2, 64, 4, 32)
    assert not tma.aligned(shifted)  # base 2 bytes off
    assert not tma.aligned(torch.zeros(2, 64, 3, 12, dtype=torch.float16))  # 72-byte rows
    assert tma.aligned(torch.zeros(1, 64, 1, 8, dtype=torch.float16))  # 16-byte rows
    # a size-1 head dimension's stride addresses nothing
    assert tma.aligned(torch.zeros(2, 64, 1, 32, dtype=torch.float32)[:, :, :1])


def test_dq_kernel_uses_its_own_config():
    """The deterministic backward's dQ kernel with a held tile of 16 queries streaming 64 keys,
    unlike dK/dV's (32 keys held, 16 queries streamed) and the forward's."""
    q, k, v = _qkv((1, 90, 2, 16), (1, 77, 1, 16), torch.float32, seed=8)
    dq_cfg = TileConfig(16, 64, 16, 4, 1)
    with tuning.overridden("dq", dq_cfg):
        assert tuning.config("dq", 16, torch.float32, q.device) == dq_cfg
        assert tuning.config("dkdv", 16, torch.float32, q.device) != dq_cfg
        check_kernels_against_definition(q, k, v, scale=0.5, causal=True, deterministic=True)
