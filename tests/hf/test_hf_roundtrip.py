"""transformers -> from_hf -> to_hf: the same state dict, and the same function (float64)."""

from __future__ import annotations

import json

import pytest
import torch
from hf_testing import (
    assert_same_state,
    rel_err,
    tiny_bert_classifier,
    tiny_bert_mlm,
    tiny_gpt2,
    transformers,
)

from flashtrain.hf import from_hf, to_hf
from flashtrain.models import build_model
from flashtrain.models.positions import resize_positions

# the reference attention computes in the inputs' dtype: float64 end to end
REF = {"impl": "reference"}


def padded_ids(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (2, 23), generator=g)
    mask = torch.ones(2, 23, dtype=torch.long)
    mask[1, 15:] = 0
    return ids, mask


@pytest.mark.parametrize("pad_vocab_multiple", [1, 16])
def test_gpt2_round_trip(pad_vocab_multiple):
    hf = tiny_gpt2()
    model = from_hf(hf, attention=REF, pad_vocab_multiple=pad_vocab_multiple).eval()
    assert model.wte.weight.shape[0] == (61 if pad_vocab_multiple == 1 else 64)
    assert model.wte.weight.dtype == torch.float64
    back = to_hf(model)
    assert isinstance(back, transformers.GPT2LMHeadModel)
    assert_same_state(back.state_dict(), hf.state_dict())
    assert back.lm_head.weight.data_ptr() == back.transformer.wte.weight.data_ptr()  # tied
    ids, _ = padded_ids(61)
    with torch.no_grad():
        want = hf(ids).logits
        got = model.logits(ids)
        again = back(ids).logits
    assert rel_err(got, want) < 1e-12
    assert rel_err(again, want) < 1e-13  # the same weights (its default attention: sdpa)


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "gelu_pytorch_tanh"])
def test_bert_mlm_round_trip(hidden_act):
    """The MLM head's transform applies hidden_act too (as the original BERT's does)."""
    hf = tiny_bert_mlm(hidden_act=hidden_act)
    model = from_hf(hf, attention=REF, pad_vocab_multiple=8).eval()
    assert model.config.head == "mlm" and model.mlm_bias.shape[0] == 56
    back = to_hf(model)
    assert isinstance(back, transformers.BertForMaskedLM)
    assert_same_state(back.state_dict(), hf.state_dict())
    ids, mask = padded_ids(53)
    types = torch.zeros_like(ids)
    types[:, 12:] = 1
    labels = torch.full_like(ids, -100)
    labels[0, [2, 7, 20]] = ids[0, [2, 7, 20]]
    labels[1, [0, 14]] = ids[1, [0, 14]]
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
        out = model(input_ids=ids, labels=labels, attention_mask=mask, token_type_ids=types)
        # the full logits at the real tokens: flashtrain's MLM head by hand
        h = model.encode(ids, mask, types)
        h = model.mlm_ln(model.mlm_act(model.mlm_dense(h)))
        logits = h @ model.word_embeddings.weight[:53].T + model.mlm_bias[:53]
    real = mask.bool()
    assert rel_err(logits[real], ref.logits[real]) < 1e-12
    assert abs(out.loss.item() - ref.loss.item()) < 1e-6 * ref.loss.item()  # loss is float32


def test_bert_classification_round_trip():
    hf = tiny_bert_classifier(num_labels=3)
    model = from_hf(hf, attention=REF).eval()
    assert model.config.head == "classification" and model.config.num_classes == 3
    back = to_hf(model)
    assert isinstance(back, transformers.BertForSequenceClassification)
    assert_same_state(back.state_dict(), hf.state_dict())
    ids, mask = padded_ids(53, seed=1)
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        got = model(input_ids=ids, labels=labels, attention_mask=mask).logits
    assert rel_err(got, want) < 1e-12


def test_hub_style_gpt2_folder(tmp_path):
    """A folder as openai-community/gpt2 ships it: GPT2Model keys (no "transformer." prefix),
    causal-mask buffers, no lm_head; read through config.json + model.safetensors."""
    from safetensors.torch import save_file

    hf = tiny_gpt2(seed=3)
    state = {k: v.contiguous() for k, v in hf.transformer.state_dict().items()}
    state["h.0.attn.bias"] = torch.ones(1, 1, 40, 40).tril()
    save_file(state, str(tmp_path / "model.safetensors"))
    config = hf.config.to_dict()
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = from_hf(str(tmp_path), attention=REF)
    assert_same_state(to_hf(model).state_dict(), hf.state_dict())


def test_sharded_safetensors_folder(tmp_path):
    hf = tiny_gpt2(seed=4)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    model = from_hf(str(tmp_path), attention=REF)
    assert_same_state(to_hf(model).state_dict(), hf.state_dict())


def test_refusals():
    classifier = build_model(
        dict(arch="classifier", n_layer=1, n_head=2, d_model=32, d_ff=64, max_seq_len=64),
        REF,
    )
    with pytest.raises(
        ValueError, match="Path-X sequence classifier .* no transformers equivalent"
    ):
        to_hf(classifier)
    rotary = build_model(dict(arch="gpt2", n_layer=1, n_head=2, d_model=32, vocab_size=50,
                              max_seq_len=16, position="rotary"), REF)  # fmt: skip
    with pytest.raises(ValueError, match="position=rotary has no transformers equivalent"):
        to_hf(rotary)
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx=True"):
        from_hf(tiny_gpt2(scale_attn_by_inverse_layer_idx=True), attention=REF)
    with pytest.raises(ValueError, match="activation_function='relu'"):
        from_hf(tiny_gpt2(activation_function="relu"), attention=REF)
    with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
        from_hf(tiny_bert_mlm(position_embedding_type="relative_key"), attention=REF)
    untied = tiny_gpt2()
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach() + 1)
    with pytest.raises(ValueError, match="lm_head.weight differs .* untied output head"):
        from_hf(untied, attention=REF)
    with pytest.raises(ValueError, match="model_type='t5'.*allowed: gpt2, bert"):
        from_hf(transformers.T5ForConditionalGeneration(transformers.T5Config(
            d_model=16, d_ff=32, num_layers=1, num_heads=2, vocab_size=20, d_kv=8)))  # fmt: skip


def test_hub_style_bert_folder(tmp_path):
    """A folder as google-bert/bert-base-uncased ships it (BertForPreTraining): LayerNorm
    gamma / beta, an int64 position_ids buffer first, a pooler and the next-sentence head an
    MLM model does not use."""
    from safetensors.torch import save_file

    hf = tiny_bert_mlm(seed=5)
    state = {"bert.embeddings.position_ids": torch.arange(40)[None]}
    for key, value in hf.state_dict().items():
        state[
            key.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                "LayerNorm.bias", "LayerNorm.beta"
            )
        ] = value
    state["bert.pooler.dense.weight"] = torch.randn(32, 32, dtype=torch.float64)
    state["bert.pooler.dense.bias"] = torch.randn(32, dtype=torch.float64)
    state["cls.seq_relationship.weight"] = torch.randn(2, 32, dtype=torch.float64)
    del state["cls.predictions.decoder.weight"], state["cls.predictions.decoder.bias"]  # tied
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    config = hf.config.to_dict() | {"architectures": ["BertForPreTraining"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = from_hf(str(tmp_path), attention=REF)
    assert model.config.head == "mlm" and model.word_embeddings.weight.dtype == torch.float64
    assert_same_state(to_hf(model).state_dict(), hf.state_dict())


def test_from_hf_at_another_context():
    hf = tiny_gpt2(seed=6)  # 40 positions
    wpe = hf.transformer.wpe.weight.detach()
    short = from_hf(hf, attention=REF, max_seq_len=24)
    assert torch.equal(short.wpe.weight.detach(), wpe[:24])
    long = from_hf(hf, attention=REF, max_seq_len=80)
    torch.testing.assert_close(long.wpe.weight.detach(), resize_positions(wpe, 80, "interpolate"))
