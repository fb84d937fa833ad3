"""BERT: padding never matters, post-LayerNorm, the MLM head, the classification head."""

import pytest
import torch
import torch.nn.functional as F
from model_testing import TINY_BERT

from flashtrain.models import Bert, build_model

IMPLS = [
    pytest.param(("flash", "triton"), id="flash-kernels"),
    pytest.param(("flash", "torch"), id="flash-torch"),
    pytest.param(("sdpa", "auto"), id="sdpa"),
    pytest.param(("reference", "auto"), id="reference"),
]


def make_bert(impl, route, monkeypatch, **overrides) -> Bert:
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", route)
    torch.manual_seed(0)
    model = build_model({**TINY_BERT, **overrides}, {"impl": impl})
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3 / p.shape[-1] ** 0.5)
    return model.eval()


def padded_batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 97, (2, 48), generator=g)
    mask = torch.ones(2, 48, dtype=torch.long)
    mask[0, 30:] = 0
    labels = torch.full((2, 48), -100)
    labels[0, [1, 5, 29]] = ids[0, [1, 5, 29]]
    labels[1, [0, 40, 47]] = 3
    return ids, mask, labels


@pytest.mark.parametrize("impl", IMPLS)
def test_padded_positions_never_change_any_output(impl, monkeypatch):
    model = make_bert(*impl, monkeypatch)
    ids, mask, labels = padded_batch()
    other = ids.clone()
    other[0, 30:] = (other[0, 30:] * 7 + 1) % 97  # different tokens under the padding
    types = torch.zeros_like(ids)
    other_types = types.clone()
    other_types[0, 30:] = 1
    with torch.no_grad():
        h = model.encode(ids, mask, types)
        h2 = model.encode(other, mask, other_types)
        loss = model(input_ids=ids, labels=labels, attention_mask=mask).loss
        loss2 = model(input_ids=other, labels=labels, attention_mask=mask).loss
        # the padded sequence alone, without padding, gives the same hidden states
        alone = model.encode(ids[:1, :30], None, types[:1, :30])
        no_mask = model.encode(ids, None, types)
    assert torch.equal(h, h2) and torch.equal(loss, loss2)
    assert h[0, 30:].abs().max() == 0  # zero at padding
    torch.testing.assert_close(h[0, :30], alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h[1], no_mask[1], rtol=1e-5, atol=1e-5)
    # and the mask is not a no-op: without it, the padded tokens do reach the real ones
    assert (no_mask[0, :30] - h[0, :30]).abs().max() > 1e-3


def test_flash_packs_padded_batches_once(monkeypatch):
    """With flash, the blocks run on the real tokens only, (N, C): no compute on padding."""
    model = make_bert("flash", "torch", monkeypatch)
    seen = []
    for block in model.blocks:
        block.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    ids, mask, labels = padded_batch()
    model(input_ids=ids, labels=labels, attention_mask=mask)
    assert seen == [(30 + 48, 64)] * 2
    seen.clear()
    model(input_ids=ids, labels=labels, attention_mask=torch.ones_like(mask))  # nothing to pack
    assert seen == [(2, 48, 64)] * 2
    sdpa = make_bert("sdpa", "auto", monkeypatch)
    sdpa.blocks[0].register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    seen.clear()
    sdpa(input_ids=ids, labels=labels, attention_mask=mask)
    assert seen == [(2, 48, 64)]


def test_post_layernorm_blocks(monkeypatch):
    model = make_bert("sdpa", "auto", monkeypatch)
    assert all(not b.pre_norm for b in model.blocks)
    ids, mask, _ = padded_batch()
    with torch.no_grad():
        h = model.encode(ids)
    # post-LN: each output row is a LayerNorm output: mean ~ beta, std ~ gamma (here 0 and 1)
    torch.testing.assert_close(h.mean(-1), torch.zeros(2, 48), atol=1e-5, rtol=0)
    torch.testing.assert_close(h.std(-1, unbiased=False), torch.ones(2, 48), atol=1e-3, rtol=0)


def test_mlm_loss_counts_and_tied_decoder(monkeypatch):
    model = make_bert("sdpa", "auto", monkeypatch)
    ids, mask, labels = padded_batch()
    out = model(input_ids=ids, labels=labels, attention_mask=mask)
    assert out.num_targets.item() == 6 and out.logits is None
    with torch.no_grad():
        h = model.encode(ids, mask)[labels != -100]
        h = model.mlm_ln(F.gelu(model.mlm_dense(h)))
        logits = h @ model.word_embeddings.weight.T + model.mlm_bias
        y = labels[labels != -100]
    torch.testing.assert_close(out.loss, F.cross_entropy(logits, y), rtol=1e-5, atol=1e-6)
    assert out.correct.item() == (logits.argmax(-1) == y).sum().item()
    assert not hasattr(model, "decoder")  # the decoder is the word embedding
    out.loss.backward()
    assert model.word_embeddings.weight.grad[y].abs().sum() > 0


def test_classification_head(monkeypatch):
    model = make_bert("sdpa", "auto", monkeypatch, head="classification", num_classes=3)
    ids, mask, _ = padded_batch()
    labels = torch.tensor([2, 0])
    out = model(input_ids=ids, labels=labels, attention_mask=mask)
    assert out.logits.shape == (2, 3)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    assert out.num_targets.item() == 2
    assert out.correct.item() == (out.logits.argmax(-1) == labels).sum().item()
    with torch.no_grad():
        pooled = torch.tanh(model.pooler(model.encode(ids, mask)[:, 0]))
        torch.testing.assert_close(out.logits, model.classifier(pooled))
    ignored = model(input_ids=ids, labels=torch.tensor([2, -100]), attention_mask=mask)
    assert ignored.num_targets.item() == 1
    torch.testing.assert_close(ignored.loss, F.cross_entropy(out.logits[:1], labels[:1]))


def test_blocksparse_refuses_padding_it_cannot_mask(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    model = build_model(TINY_BERT, {"impl": "blocksparse", "pattern": "local", "block_size": 64})
    ids, mask, labels = padded_batch()
    with pytest.raises(ValueError, match="no key-padding mask"):
        model(input_ids=ids, labels=labels, attention_mask=mask)
