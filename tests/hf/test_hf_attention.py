"""attn_implementation="flashtrain": transformers models on flashtrain's attention ops equal
attn_implementation="eager", forward and backward, on both CPU routes (the Triton kernels under
the interpreter, and the PyTorch path)."""

from __future__ import annotations

import copy
import functools
import os

import pytest
import torch
from hf_testing import transformers

import flashtrain.hf.attention as hf_attention
from flashtrain.hf.attention import register


@pytest.fixture(params=["triton", "torch"])
def route(request, monkeypatch):
    if request.param == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton route on CPU tensors needs TRITON_INTERPRET=1")
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", request.param)
    register()
    return request.param


@pytest.fixture
def varlen_calls(monkeypatch):
    """The token counts flash_attn_varlen_func was called with (q rows)."""
    calls = []
    real = hf_attention.flash_attn_varlen_func

    @functools.wraps(real)  # transformers reads the signature for the keywords to pass
    def counting(q, *args, **kwargs):
        calls.append(q.shape[0])
        return real(q, *args, **kwargs)

    monkeypatch.setattr(hf_attention, "flash_attn_varlen_func", counting)
    return calls


def twins(config, seed=0):
    """The same random model twice: attn_implementation flashtrain and eager."""
    torch.manual_seed(seed)
    ours = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation="flashtrain"
    )
    eager = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation="eager"
    )
    with torch.no_grad():
        for p in ours.parameters():  # larger than the init, so attention is far from uniform
            p.normal_(0, 0.3) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    eager.load_state_dict(ours.state_dict())
    assert ours.config._attn_implementation == "flashtrain"
    assert eager.config._attn_implementation == "eager"
    return ours.eval(), eager.eval()  # no dropout (gradients flow all the same)


def padded_batch(vocab, left: bool):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    if left:
        mask[0, :4] = 0
        mask[2, :1] = 0
    else:
        mask[0, 7:] = 0
        mask[2, 10:] = 0
    # a label counts when its token and the one predicting it (the previous) are real: the
    # outputs at padded positions are unspecified (zero here, whatever eager makes of them)
    predicted_by_real = torch.cat([torch.zeros(3, 1, dtype=torch.bool), mask[:, :-1].bool()], 1)
    labels = ids.masked_fill(~(mask.bool() & predicted_by_real), -100)
    return ids, mask, labels


def forward_backward(model, ids, mask, labels):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def assert_twins_agree(ours, eager, ids, mask, labels, atol=2e-5):
    logits, loss, grads = forward_backward(ours, ids, mask, labels)
    want_logits, want_loss, want_grads = forward_backward(eager, ids, mask, labels)
    real = mask.bool() if mask is not None else torch.ones(ids.shape, dtype=torch.bool)
    torch.testing.assert_close(logits[real], want_logits[real], atol=atol, rtol=1e-4)
    torch.testing.assert_close(loss, want_loss, atol=atol, rtol=1e-5)
    assert sorted(grads) == sorted(want_grads)
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], atol=atol, rtol=1e-3, msg=name)


def test_llama_gqa_with_left_padding(route, varlen_calls):
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=41, max_position_embeddings=64,
    )  # fmt: skip
    ours, eager = twins(config)
    ids, mask, labels = padded_batch(41, left=True)
    assert_twins_agree(ours, eager, ids, mask, labels)
    # every layer ran on the real tokens only, packed (forward and the recompute-free backward)
    assert varlen_calls == [int(mask.sum())] * 2
    varlen_calls.clear()
    assert_twins_agree(ours, eager, ids, None, ids)  # no padding: the dense op
    assert varlen_calls == []


def test_gpt2_with_right_padding(route, varlen_calls):
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=41)
    ours, eager = twins(config, seed=1)
    ids, mask, labels = padded_batch(41, left=False)
    assert_twins_agree(ours, eager, ids, mask, labels)
    assert varlen_calls == [int(mask.sum())] * 2


def test_sliding_window_and_softcap_from_the_config(route):
    """Gemma 2: softcapped scores, sliding-window layers alternating with global ones."""
    config = transformers.Gemma2Config(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, vocab_size=41, sliding_window=4,
        attn_logit_softcapping=5.0, query_pre_attn_scalar=16,
    )  # fmt: skip
    ours, eager = twins(config, seed=2)
    assert ours.config.layer_types == ["sliding_attention", "full_attention"]
    ids, mask, labels = padded_batch(41, left=True)
    assert_twins_agree(ours, eager, ids, mask, labels)
    # the window and the cap matter here: without them the outputs differ
    plain = copy.deepcopy(config)
    plain.sliding_window, plain.attn_logit_softcapping = 64, None
    other, _ = twins(plain, seed=2)
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask).logits
        b = other(input_ids=ids, attention_mask=mask).logits
    assert (a - b)[mask.bool()].abs().max() > 1e-3


def test_dropout_in_training_only(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    register()
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=32, vocab_size=41,
                                     attn_pdrop=0.5, resid_pdrop=0.0, embd_pdrop=0.0)  # fmt: skip
    ours, eager = twins(config)
    ids = torch.randint(0, 41, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, eager(ids).logits, atol=2e-5, rtol=1e-4)
        ours.train()
        torch.manual_seed(5)
        a = ours(ids).logits
        torch.manual_seed(5)
        b = ours(ids).logits
        c = ours(ids).logits
    assert torch.equal(a, b) and (a - c).abs().max() > 1e-3
    assert (a - eager(ids).logits).abs().max() > 1e-3


def test_what_the_kernels_cannot_honour(monkeypatch, caplog):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    monkeypatch.setattr(hf_attention, "_warned_fallback", False)  # warned once per process
    register()
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=2, vocab_size=41)  # fmt: skip
    ours, eager = twins(config)
    ids = torch.randint(0, 41, (2, 6))
    refused = 'output_attentions=True needs attn_implementation="eager"'
    with pytest.raises(ValueError, match=refused):
        ours(ids, output_attentions=True)  # Llama passes the flag to the attention function
    # GPT-2 pops it and records what its attention layers return (transformers' output hooks)
    gpt2, _ = twins(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=32,
                                            vocab_size=41))  # fmt: skip
    with pytest.raises(ValueError, match=refused):
        gpt2(ids, output_attentions=True)
    # an arbitrary 4-D float mask (a bias): SDPA, with a warning, equal to eager
    bias = torch.randn(2, 1, 6, 6).tril() + torch.full((6, 6), float("-inf")).triu(1)
    with torch.no_grad(), caplog.at_level("WARNING", logger="flashtrain.hf"):
        got = ours(ids, attention_mask=bias).logits
        want = eager(ids, attention_mask=bias).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    warnings = [r.getMessage() for r in caplog.records if r.name == "flashtrain.hf"]
    assert len(warnings) == 1 and "a 4-D attention mask" in warnings[0]
    assert "runs on PyTorch SDPA instead of flashtrain's kernels" in warnings[0]
    gemma = transformers.Gemma2Config(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                      vocab_size=41, attn_logit_softcapping=5.0)  # fmt: skip
    capped, _ = twins(gemma)
    with pytest.raises(ValueError, match="softcap rules out the SDPA fallback"):
        capped(ids, attention_mask=bias)


def test_packed_documents_attend_only_within_themselves(route, varlen_calls):
    """position_ids restarting at 0 (a flattening collator's packed batch): one varlen call per
    layer over all the tokens, each document equal to itself run alone (eager)."""
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=41)  # fmt: skip
    ours, eager = twins(config, seed=3)
    g = torch.Generator().manual_seed(4)
    docs = [torch.randint(0, 41, (1, n), generator=g) for n in (5, 9, 3)]
    packed = torch.cat(docs, dim=1)  # (1, 17)
    positions = torch.cat([torch.arange(d.shape[1]) for d in docs])[None]
    with torch.no_grad():
        got = ours(input_ids=packed, position_ids=positions).logits
        want = torch.cat([eager(input_ids=d).logits for d in docs], dim=1)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert varlen_calls == [17] * 2


def test_bert_encoder_with_padding(route, varlen_calls):
    """Bidirectional (no causal mask) with a padding mask: the varlen op over the real tokens."""
    config = transformers.BertConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=2, vocab_size=41, max_position_embeddings=32)  # fmt: skip
    torch.manual_seed(6)
    bert = transformers.AutoModelForMaskedLM.from_config
    ours = bert(copy.deepcopy(config), attn_implementation="flashtrain").eval()
    eager = bert(copy.deepcopy(config), attn_implementation="eager").eval()
    eager.load_state_dict(ours.state_dict())
    ids, mask, _ = padded_batch(41, left=False)
    labels = ids.masked_fill(mask == 0, -100)
    assert_twins_agree(ours, eager, ids, mask, labels)
    assert varlen_calls == [int(mask.sum())] * 2


def test_from_pretrained_with_flashtrain_attention(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    import flashtrain.hf

    assert flashtrain.hf.register() == "flashtrain"
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=32, vocab_size=41)
    ours, eager = twins(config, seed=7)
    ours.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="flashtrain"
    )
    assert loaded.config._attn_implementation == "flashtrain"
    ids = torch.randint(0, 41, (2, 12), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, eager(ids).logits, atol=2e-5, rtol=1e-4)
