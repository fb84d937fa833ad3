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


def _packed_with_dropout(lens_q, lens_k, dropout_p: float, seed: int) -> None:
    """Packed sequences (2 query heads over 1 kv head, head_dim 16), causal, with dropout,
    against the definition, the atomic-dQ backward."""
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q, k, v = _qkv((sum(lens_q), 2, 16), (sum(lens_k), 1, 16), torch.float32, seed=seed)
    keep = dropout_keep_mask(seed + 7, len(lens_q), 2, max(lens_q), max(lens_k), dropout_p,
                             "cpu", cu_q, cu_k)  # fmt: skip
    check_kernels_against_definition(
        q, k, v, scale=0.4, causal=True, dropout_p=dropout_p, seed=seed + 7, cu_q=cu_q,
        cu_k=cu_k, keep_mask=keep, deterministic=False,
    )  # fmt: skip


def test_descriptor_loads_varlen_with_empty_sequence_and_dropout(descriptor_launches):
    _packed_with_dropout([9, 0, 30], [12, 5, 21], 0.3, seed=4)
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


# ------------------------------------------------------------------ the Hopper forward variants
# (issue 30; docs/kernel_compile.md "Variants") at the interpreter's tiles: the warp-specialized
# one-loop forward (descriptor loads: it needs them), the persistent one (pointer loads), both.
FORWARD_VARIANTS = {
    "ws": TileConfig(32, 16, 0, 4, 1, tma=True, warp_specialize=True),
    "persistent": TileConfig(32, 16, 0, 4, 1, persistent=True),
    "ws+persistent": TileConfig(32, 16, 0, 4, 1, tma=True, warp_specialize=True, persistent=True),
}


class _LaunchRecorder:
    """Stands in for flash_forward_kernel and records each launch's grid and constexprs."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(dict(kwargs, grid=grid))
            return self.kernel[grid](*args, **kwargs)

        return launch


# The combined form in the normal suite (one loop and the queue at once); each form alone under
# -m slow (and in the FLASHTRAIN_TEST_FORWARD_VARIANT pass), but for the varlen test, whose
# tiles past a sequence's end each form handles its own way.
EVERY_VARIANT = list(FORWARD_VARIANTS)
COMBINED_VARIANT = [
    name if name == "ws+persistent" else pytest.param(name, marks=pytest.mark.slow)
    for name in FORWARD_VARIANTS
]


@pytest.fixture
def forward_variant(request, monkeypatch):
    """(name, config, launches): the forward runs as the variant inside the test; launches
    lists its launches' constexprs (and grid)."""
    from flashtrain.kernels import flash_fwd

    recorder = _LaunchRecorder(flash_fwd.flash_forward_kernel)
    monkeypatch.setattr(flash_fwd, "flash_forward_kernel", recorder)
    config = FORWARD_VARIANTS[request.param]
    with tuning.overridden("fwd", config):
        yield request.param, config, recorder.launches


def _ran_as(launches, config, *, one_loop=None):
    """Every forward launch ran the variant: the one-loop body where it applies (one_loop: the
    expected WARP_SPECIALIZE, by default the config's), a persistent grid of sm_count programs."""
    assert launches
    expected_loop = config.warp_specialize if one_loop is None else one_loop
    for launch in launches:
        assert launch["WARP_SPECIALIZE"] == expected_loop
        assert launch["PERSISTENT"] == config.persistent
        if config.persistent:
            assert len(launch["grid"]) == 1 and launch["grid"][0] <= tuning.INTERPRETER_SMS


@pytest.mark.parametrize("forward_variant", COMBINED_VARIANT, indirect=True)
@pytest.mark.parametrize(
    "causal, deterministic", [(True, True), (False, False)], ids=["causal", "full-atomic-dq"]
)
def test_forward_variant_dense_gqa(forward_variant, causal, deterministic):
    """Sq != Sk (bottom-right causal), GQA 3:1 over 2 kv heads, head_dim 24 (padded to 32): 3
    query tiles x 6 heads x 2 sequences = 36 work items over 3 persistent programs."""
    _, config, launches = forward_variant
    q, k, v = _qkv((2, 70, 6, 24), (2, 83, 2, 24), torch.float32, seed=11)
    check_kernels_against_definition(q, k, v, scale=0.4, causal=causal, deterministic=deterministic)
    _ran_as(launches, config)


@pytest.mark.parametrize("forward_variant", COMBINED_VARIANT, indirect=True)
def test_forward_variant_with_every_score_feature(forward_variant):
    """A two-sided window (masked tiles at both ends of the band, an unmasked middle), softcap
    and ALiBi, fp16."""
    _, config, launches = forward_variant
    q, k, v = _qkv((1, 90, 2, 32), (1, 75, 1, 32), torch.float16, seed=12)
    slopes = 0.1 + 0.3 * torch.rand(1, 2, generator=torch.Generator().manual_seed(13))
    check_kernels_against_definition(
        q, k, v, scale=0.3, window=(40, 20), softcap=3.0, alibi_slopes=slopes
    )
    _ran_as(launches, config)


@pytest.mark.parametrize("forward_variant", EVERY_VARIANT, indirect=True)
def test_forward_variant_varlen_with_tiles_past_a_sequence_and_dropout(forward_variant):
    """Packed sequences of 70, 0, 9 and 40 queries: the grid (or queue) holds 3 query tiles per
    sequence, so the shorter and the empty ones have tiles past their end, which the default
    returns from, the persistent loop skips and the warp-specialized loop streams nothing for
    and writes nothing from (the empty sequence's descriptor spans the next one's first row,
    which the persistent queue has written before: the bug this order caught)."""
    _, config, launches = forward_variant
    _packed_with_dropout([70, 0, 9, 40], [64, 5, 12, 40], 0.25, seed=14)
    _ran_as(launches, config)


@pytest.mark.parametrize("forward_variant", COMBINED_VARIANT, indirect=True)
def test_forward_variant_blocksparse(forward_variant):
    """Block-sparse launches read their tiles from the layout's tables, which Triton's warp
    specialization cannot take: the ws variants run the two-segment loop there (still
    persistent where asked)."""
    _, config, launches = forward_variant
    block_mask = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(16)) < 0.6
    block_mask[:, :, 0] = True
    block_mask[0, 1, :] = False  # a query block that sees nothing
    q, k, v = _qkv((1, 150, 2, 16), (1, 150, 2, 16), torch.float32, seed=17)
    check_kernels_against_definition(
        q, k, v, scale=0.5, causal=True, block_mask=block_mask, block_size=64
    )
    _ran_as(launches, config, one_loop=False)


@pytest.mark.parametrize("forward_variant", COMBINED_VARIANT, indirect=True)
def test_warp_specialized_forward_needs_descriptors(forward_variant):
    """Without descriptor loads (unaligned rows, or FLASHTRAIN_TMA=0) the warp-specialized
    variant runs the two-segment loop: same results."""
    name, config, launches = forward_variant
    q, k, v = _qkv((1, 33, 3, 12), (1, 33, 3, 12), torch.float16, seed=18)  # 72-byte rows
    check_kernels_against_definition(q, k, v, scale=0.5, causal=True)
    _ran_as(launches, config, one_loop=False)


def test_persistent_forward_counts_the_same_visits():
    """The persistent queue covers every (tile, head, sequence) once: the per-tile count of
    key tiles streamed equals the grid launch's, for a causal (heavy-first) and a windowed
    launch over 2 sequences x 3 heads."""
    from flashtrain.kernels.common import UNBOUNDED
    from flashtrain.kernels.flash_fwd import flash_forward

    q, k, v = _qkv((2, 100, 3, 16), (2, 100, 3, 16), torch.float32, seed=19)
    for left, right in ((UNBOUNDED, 0), (30, 10)):
        counts = []
        for config in (TileConfig(32, 16, 16, 4, 1), FORWARD_VARIANTS["persistent"],
                       FORWARD_VARIANTS["ws+persistent"]):  # fmt: skip
            visits = torch.zeros(2 * 3 * 4, dtype=torch.int32)
            with tuning.overridden("fwd", config):
                flash_forward(
                    q, k, v, torch.empty_like(q), torch.empty(2, 3, 100), cu_seqlens_q=None,
                    cu_seqlens_k=None, max_seqlen_q=100, max_seqlen_k=100, softmax_scale=0.25,
                    window_left=left, window_right=right, dropout_p=0.0, seed=0, visits=visits,
                )  # fmt: skip
            counts.append(visits)
        assert counts[0].sum() > 0 and (counts[0] > 0).all()
        torch.testing.assert_close(counts[1], counts[0])
        torch.testing.assert_close(counts[2], counts[0])


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "varlen"])
def test_warp_specialized_forward_keeps_masked_nonfinite_values_out(packed, monkeypatch):
    """docs/attention_semantics.md: a NaN or inf in V at a key a row cannot see never reaches the
    row. The warp-specialized loop cannot clean V itself: the launch hands it a cleaned copy and
    the keys' NaN score term (launch_args.cleaned_values). Rows 23..33 see key 23 (10-key
    causal window), the rest of its query and key tiles do not; packed: the same sequence after
    a 37-key one, so the term's columns are the key's position in its own sequence."""
    from flashtrain.attention import flash_attn_func, flash_attn_varlen_func
    from flashtrain.kernels import flash_fwd

    recorder = _LaunchRecorder(flash_fwd.flash_forward_kernel)
    monkeypatch.setattr(flash_fwd, "flash_forward_kernel", recorder)
    q, k, v = _qkv((1, 80, 2, 16), (1, 80, 1, 16), torch.float32, seed=20)
    v[:, 23, :, 5] = float("nan")
    v[:, 60, :, 2] = float("inf")  # rows 60..70 see it
    sees = torch.zeros(80, dtype=torch.bool)
    sees[23:34] = sees[60:71] = True
    outs = {}
    for name, config in (("default", TileConfig(32, 16, 16, 4, 1)), ("ws", FORWARD_VARIANTS["ws"])):
        with tuning.overridden("fwd", config):
            if packed:
                pad_q, pad_k, _ = _qkv((37, 2, 16), (37, 1, 16), torch.float32, seed=21)
                cu = cu_seqlens([37, 80])
                out = flash_attn_varlen_func(
                    torch.cat([pad_q, q[0]]), torch.cat([pad_k, k[0]]), torch.cat([pad_k, v[0]]),
                    cu, cu, 80, 80, causal=True, window_size=(10, 0))[37:][None]  # fmt: skip
            else:
                out = flash_attn_func(q, k, v, causal=True, window_size=(10, 0))
        outs[name] = out
    assert [launch["WARP_SPECIALIZE"] for launch in recorder.launches] == [False, True]
    for out in outs.values():
        assert torch.isfinite(out[:, ~sees]).all()
        assert not torch.isfinite(out[:, sees]).all(dim=-1).any()
    torch.testing.assert_close(outs["ws"][:, ~sees], outs["default"][:, ~sees])


def test_variant_tables_and_resources():
    """A per-GPU table entry carries the variant flags; the persistent forward's shared memory
    counts its output staging; the persistent grid's program count."""
    entry = dict(block_m=128, block_n=128, block_d=128, num_warps=4, num_stages=2, tma=True,
                 warp_specialize=True, persistent=True)  # fmt: skip
    assert TileConfig(**entry).persistent and TileConfig(**entry).warp_specialize
    plain = TileConfig(128, 128, 128, 8, 3, tma=True)
    persistent = TileConfig(128, 128, 128, 8, 3, tma=True, persistent=True)
    # sm_90 cubins (docs/kernel_compile.md): 230,448 B and 263,216 B under Triton 3.6
    assert tuning.shared_bytes("fwd", plain, 2) == 229_376
    assert tuning.shared_bytes("fwd", persistent, 2) == 229_376 + 32_768
    assert tuning.fit_shared_memory("fwd", persistent, 2, 232_448).num_stages == 2
    # warp-specialized: one more (128, d) buffer and the key-NaN term's (Triton 3.6: 198,088 B
    # at 2 stages, 264,312 B at 3: over sm_90's 232,448, so the third stage goes)
    ws = TileConfig(128, 128, 128, 4, 3, tma=True, warp_specialize=True)
    assert tuning.shared_bytes("fwd", ws, 2) == 229_376 + 32_768 + 3 * 128 * 4
    assert tuning.fit_shared_memory("fwd", ws, 2, 232_448).num_stages == 2
    assert tuning.sm_count(torch.device("cpu")) == tuning.INTERPRETER_SMS
