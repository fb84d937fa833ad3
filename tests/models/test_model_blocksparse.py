"""attention=blocksparse: each named pattern, inside a causal GPT-2, gives the loss and gradients of
the reference attention restricted to the layout's element mask; FLOPs scale with density."""

import pytest
import torch
from model_testing import TINY_GPT2, grads, load_attention_config

from flashtrain.attention import sparsity
from flashtrain.attention.reference import attention_reference, expand_block_mask
from flashtrain.models import build_model

SEQ = 256  # 4 blocks of 64
CFG = {**TINY_GPT2, "max_seq_len": SEQ}
PATTERN_ARGS = {
    "butterfly": {},
    "local": {"window_blocks": 0},
    "global_local": {"num_global": 1, "window_blocks": 0},
    "bigbird": {"num_global": 0, "window_blocks": 0, "num_random": 1, "seed": 3},
    "strided": {"stride": 2},
}


def run(impl_cfg, ids, element_mask=None):
    torch.manual_seed(0)
    model = build_model(CFG, impl_cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3 / p.shape[-1] ** 0.5)
    if element_mask is not None:  # the reference, restricted to the block layout's elements
        model.attn_op.forward = lambda q, k, v, ctx, dropout_p=0.0: attention_reference(
            q, k, v, causal=ctx.causal, element_mask=element_mask
        )[0]
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return model, out.loss.detach(), grads(model)


def check_against_reference(pattern, block_size, seq_ids):
    cfg = {
        "impl": "blocksparse",
        "pattern": pattern,
        "block_size": block_size,
        "pattern_args": PATTERN_ARGS[pattern],
    }
    model, loss, got = run(cfg, seq_ids)
    layout = model.attn_op.layout(seq_ids.shape[1], 2)
    assert layout.density < 1.0, layout  # really sparse
    elem = expand_block_mask(layout.block_mask, block_size, seq_ids.shape[1], seq_ids.shape[1])
    _, ref_loss, want = run({"impl": "reference"}, seq_ids, element_mask=elem)
    _, dense_loss, _ = run({"impl": "reference"}, seq_ids)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert abs(loss - dense_loss) > 1e-4  # the sparsity is visible
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=2e-6, msg=name)
    return model, layout


@pytest.mark.parametrize("pattern", sorted(sparsity.PATTERNS))
def test_pattern_matches_reference_with_its_mask(pattern, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    ids = torch.randint(0, 97, (1, SEQ), generator=torch.Generator().manual_seed(1))
    model, layout = check_against_reference(pattern, 64, ids)
    dense = build_model(CFG, {"impl": "sdpa"})
    attn_term = 14 * 2 * 64 * SEQ / 2  # causal: half the keys
    assert model.estimate_flops_per_token(SEQ) == pytest.approx(
        dense.estimate_flops_per_token(SEQ) - attn_term * (1 - layout.density)
    )


def test_kernels_through_the_interpreter(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "triton")
    ids = torch.randint(0, 97, (1, 128), generator=torch.Generator().manual_seed(2))
    check_against_reference("local", 64, ids)


def test_default_config_and_bad_pattern_args(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    model = build_model(CFG, load_attention_config("blocksparse"))  # butterfly, block 128
    assert "butterfly" in repr(model.attn_op)
    ids = torch.zeros(1, SEQ, dtype=torch.long)
    bad = build_model(
        CFG,
        {"impl": "blocksparse", "pattern": "local", "block_size": 64, "pattern_args": {"w": 2}},
    )
    with pytest.raises(ValueError, match=r"pattern 'local' rejected.*\['window_blocks'\]"):
        bad(input_ids=ids, labels=ids)
    reserved = build_model(
        CFG, {"impl": "blocksparse", "pattern": "local", "pattern_args": {"heads": 4}}
    )
    with pytest.raises(ValueError, match=r"must not set \['heads'\]"):
        reserved(input_ids=ids, labels=ids)
