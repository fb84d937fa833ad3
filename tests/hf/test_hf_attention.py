"""attn_implementation="flashtrain": transformers models on flashtrain's attention ops equal
attn_implementation="eager", forward and backward, on both CPU routes (the Triton kernels under
the interpreter, and the PyTorch path)."""

from __future__ import annotations

import copy
import functools
import importlib.util
import os

import pytest
import torch
from hf_testing import transformers

import flashtrain.hf.attention as hf_attention
from flashtrain.attention import flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.reference import attention_reference
from flashtrain.hf.attention import register
from flashtrain.hf.padded_varlen import padded_as_varlen


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


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_output_attentions_gives_none_as_sdpa_does(arch, monkeypatch, caplog):
    """transformers' fused backends compute no probabilities and return None for them (sdpa
    warns once when the flag reaches it): the same outputs, no attentions, one warning naming
    "eager". Llama passes the flag to the attention function; GPT-2 pops it and records what
    its layers return (transformers' output hooks). transformers' own statement of it is
    test_eager_matches_sdpa_inference's fp32_pad_left_output_attentions case."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    monkeypatch.setattr(hf_attention, "_warned_attentions", False)  # warned once per process
    register()
    config = (
        transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=2, vocab_size=41)
        if arch == "llama"
        else transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=41)
    )  # fmt: skip
    ours, eager = twins(config)
    sdpa = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation="sdpa"
    )
    sdpa.load_state_dict(eager.state_dict())
    ids, mask, _ = padded_batch(41, left=True)
    with torch.no_grad(), caplog.at_level("WARNING", logger="flashtrain.hf"):
        got = ours(ids, attention_mask=mask, output_attentions=True)
        again = ours(ids, attention_mask=mask, output_attentions=True)
        want = eager(ids, attention_mask=mask).logits
        from_sdpa = sdpa.eval()(ids, attention_mask=mask, output_attentions=True)
    real = mask.bool()
    torch.testing.assert_close(got.logits[real], want[real], atol=2e-5, rtol=1e-4)
    # no probabilities, in sdpa's form of saying so (5.x: an empty tuple, 5.0 also None / Nones)
    assert got.attentions == from_sdpa.attentions
    assert all(a is None for a in got.attentions or ())
    assert torch.equal(again.logits, got.logits)
    warnings = [r.getMessage() for r in caplog.records if r.name == "flashtrain.hf"]
    if arch == "gpt2" and importlib.util.find_spec("transformers.utils.output_capturing") is None:
        assert warnings == []  # 5.0 has no recorder: its GPT-2 keeps the flag from every backend
        return
    assert len(warnings) == 1, warnings
    assert "does not support output_attentions=True" in warnings[0]
    assert 'use attn_implementation="eager"' in warnings[0]


def _varlen_run(q, k, v, cu_q, cu_k, max_q, max_k, causal):
    """padded_as_varlen's run on flashtrain's op directly: (B, T, H, D) in, (B, Tq, H, D) out."""
    out = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k,
                                 max_q, max_k, causal=causal)  # fmt: skip
    return out.view(q.shape)


@pytest.mark.parametrize(
    "kernels, causal, padded_queries_attend",
    # the BERT tests below run the attending layout on the Triton route too
    [("torch", True, False), ("torch", False, False), ("torch", False, True),
     ("triton", True, False)],
)  # fmt: skip
def test_the_padded_layout_is_masked_attention(kernels, causal, padded_queries_attend, monkeypatch):
    """padded_varlen.py against masked attention by the definition (float64), forward and
    backward: the real queries attend the real keys (causal in the tokens' own positions, the
    queries being the last ones, as when decoding against a cache); a padded query attends the
    real keys with padded_queries_attend (what eager computes in a bidirectional layer) and
    nothing (0) without. Padding at the left, the right, inside a row, and a row without any."""
    if kernels == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton route on CPU tensors needs TRITON_INTERPRET=1")
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", kernels)
    g = torch.Generator().manual_seed(9)
    real = torch.ones(4, 10, dtype=torch.bool)
    real[0, :3] = False
    real[1, 7:] = False
    real[2, 2:5] = False
    for q_len in (10, 3):
        q = torch.randn(4, q_len, 2, 8, generator=g, requires_grad=True)
        k, v = (torch.randn(4, 10, 1, 8, generator=g, requires_grad=True) for _ in range(2))
        run = functools.partial(_varlen_run, causal=causal)
        out = padded_as_varlen(q, k, v, real, run, padded_queries_attend=padded_queries_attend)
        real_q = real[:, -q_len:]
        seen = real[:, None, None, :] & (
            True if padded_queries_attend else real_q[:, None, :, None]
        )
        want, _ = attention_reference(*(x.double() for x in (q, k, v)), causal=causal,
                                      element_mask=seen)  # fmt: skip
        torch.testing.assert_close(out, want.float(), atol=1e-5, rtol=1e-5)
        if not padded_queries_attend:
            assert torch.equal(out[~real_q], torch.zeros_like(out[~real_q]))
        dout = torch.randn(out.shape, generator=g)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        want_grads = torch.autograd.grad(want, (q, k, v), dout.double())
        for got, expected in zip(grads, want_grads):
            torch.testing.assert_close(got, expected.float(), atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("left", [True, False], ids=["left", "right"])
def test_bert_encoder_with_padding(route, varlen_calls, left):
    """Bidirectional with a padding mask: every output equals eager's, at the padded positions
    too (eager's additive mask hides the padded keys from every query row, so a padded query
    attends the real keys; transformers' equivalence tests compare those rows); one varlen call
    per layer over every query, the padded keys in sequences of their own that no query sees."""
    config = transformers.BertConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=2, vocab_size=41, max_position_embeddings=32)  # fmt: skip
    torch.manual_seed(6)
    bert = transformers.AutoModelForMaskedLM.from_config
    ours = bert(copy.deepcopy(config), attn_implementation="flashtrain").eval()
    eager = bert(copy.deepcopy(config), attn_implementation="eager").eval()
    eager.load_state_dict(ours.state_dict())
    ids, mask, _ = padded_batch(41, left=left)
    labels = ids.masked_fill(mask == 0, -100)
    assert_twins_agree(ours, eager, ids, mask, labels)
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        want = eager(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    for layer, (a, b) in enumerate(zip(got.hidden_states, want.hidden_states)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=f"hidden state {layer}")
    torch.testing.assert_close(got.logits, want.logits, atol=2e-5, rtol=1e-4)
    assert varlen_calls == [ids.numel()] * 4  # two forwards of two layers (and the backward)


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


@pytest.mark.parametrize(
    "arch",
    [
        "llama",
        "bert",
        pytest.param("gpt2", marks=pytest.mark.slow),  # ~4 s on 2 busy cores: causal, as llama
    ],
)
def test_a_padded_batch_compiles_whole(arch, monkeypatch):
    """torch.compile(fullgraph=True) of a model on a padded batch: one graph, no break (the
    padding mask takes the static layout, padded_varlen.py, instead of the unpad's
    data-dependent shapes), with eager flashtrain's outputs and gradients at every position.
    transformers' own statements of it: test_sdpa_can_compile_dynamic and
    test_torch_compile_for_training, with a padded attention_mask."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    register()
    if arch == "bert":
        config = transformers.BertConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=2, vocab_size=41,
                                         max_position_embeddings=32)  # fmt: skip
        torch.manual_seed(6)
        ours = transformers.AutoModelForMaskedLM.from_config(
            config, attn_implementation="flashtrain"
        ).eval()
    else:
        config = (
            transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=41)
            if arch == "llama"
            else transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32,
                                         vocab_size=41)
        )  # fmt: skip
        ours, _ = twins(config)
    ids, mask, _ = padded_batch(41, left=True)
    mask[1, 8:] = 0  # right padding in the same batch
    probe = torch.randn(*ids.shape, config.vocab_size, generator=torch.Generator().manual_seed(2))

    def outputs_and_grads(model):
        """Logits at every position, and the gradients of a sum over all of them (padded rows
        included; a loss inside the model would add transformers' own logging to the graph)."""
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask).logits
        (logits * probe).sum().backward()
        grads = {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in model.named_parameters()}
        return logits.detach(), grads

    want_logits, want_grads = outputs_and_grads(ours)
    torch._dynamo.reset()
    counter = CompileCounter()  # counts the graphs and runs them as traced
    compiled = torch.compile(ours, fullgraph=True, backend=counter)  # a break raises
    try:
        logits, grads = outputs_and_grads(compiled)
    finally:
        torch._dynamo.reset()
    assert counter.frame_count == 1
    assert sorted(grads) == sorted(want_grads)
    torch.testing.assert_close(logits, want_logits, atol=2e-5, rtol=1e-4)
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], atol=2e-5, rtol=1e-3, msg=name)


def test_a_transformers_without_the_paged_decoding_slots(monkeypatch):
    """transformers before 5.19 has no _process_with_kvcache_kwargs_fn (5.0 no
    _flash_with_kvcache_fn either): the integration fills the slots that exist and installs as
    on a newer one (run for real with transformers 5.0 and 5.18; this pins the feature
    detection, on this transformers with those slots taken away until the test ends: its own
    wrapper reads them, so no model runs here)."""
    import transformers.modeling_flash_attention_utils as fa

    for slot in ("_process_with_kvcache_kwargs_fn", "_flash_with_kvcache_fn"):
        monkeypatch.delattr(fa, slot, raising=False)  # 5.0 has neither
    monkeypatch.setattr(fa, "_loaded_implementation", None)  # installs again
    monkeypatch.setattr(fa, "_flash_varlen_fn", None)
    assert register() == "flashtrain"
    assert fa._loaded_implementation == "flashtrain"
    assert fa._flash_fn is flash_attn_func and fa._flash_varlen_fn is flash_attn_varlen_func
    assert not hasattr(fa, "_process_with_kvcache_kwargs_fn")
    assert not hasattr(fa, "_flash_with_kvcache_fn")
