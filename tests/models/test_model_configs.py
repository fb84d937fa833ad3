"""Model and attention configs: parameter counts of the original architectures, every preset builds,
and bad configs fail with errors that say what is allowed."""

import pytest
import torch
from config_testing import CONFIGS, group_options
from model_testing import TINY_CLASSIFIER, TINY_GPT2, load_attention_config, load_model_config
from omegaconf import OmegaConf

from flashtrain.lab.bench.flops import attention_flops
from flashtrain.models import (
    ATTENTION_IMPLS,
    GPT2,
    Bert,
    SequenceClassifier,
    build_model,
    model_config,
)
from flashtrain.typed_config import ConfigError


def gpt2_params(n_layer, d, vocab=50257, positions=1024):
    """GPT-2 by hand: embeddings + per layer (qkv, proj, fc, proj with biases, 2 LayerNorms) + ln_f."""
    per_layer = (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d) + 4 * d
    return vocab * d + positions * d + n_layer * per_layer + 2 * d


def build_meta(name, seq_len, vocab, num_classes=None, attention="sdpa"):
    cfg = load_model_config(name, seq_len, vocab, num_classes)
    with torch.device("meta"):
        return build_model(cfg, load_attention_config(attention))


def test_gpt2_small_has_124439808_parameters():
    model = build_meta("gpt2", 1024, 50257)
    assert isinstance(model, GPT2)
    assert model.num_parameters() == 124_439_808
    assert model.num_parameters() == gpt2_params(12, 768)
    # tied head: the embedding is the only (vocab, C) matrix
    assert sum(p.shape[0] == 50257 for p in model.parameters()) == 1


@pytest.mark.parametrize(
    "name, n_layer, d, expected",
    [
        ("gpt2-medium", 24, 1024, 354_823_168),
        ("gpt2-large", 36, 1280, 774_030_080),
        ("gpt2-xl", 48, 1600, 1_557_611_200),
    ],
)
def test_gpt2_family_parameter_counts(name, n_layer, d, expected):
    model = build_meta(name, 1024, 50257)
    assert model.num_parameters() == expected == gpt2_params(n_layer, d)


def test_bert_base_is_110m_and_bert_large_340m():
    base = build_meta("bert-base", 512, 30522)
    assert isinstance(base, Bert)
    n = base.num_parameters()
    assert abs(n - 110e6) / 110e6 < 0.005, n
    assert n == 109_514_298  # = Hugging Face BertForMaskedLM(bert-base-uncased)
    large = build_meta("bert-large", 512, 30522)
    assert large.num_parameters() == 335_174_458
    assert abs(large.num_parameters() - 340e6) / 340e6 < 0.015


def test_positions_follow_seq_len_16k_and_64k():
    for seq_len in (16384, 65536):
        model = build_meta("gpt2", seq_len, 50257)
        assert model.wpe.weight.shape == (seq_len, 768)
        assert model.num_parameters() == gpt2_params(12, 768, positions=seq_len)


def test_padding_the_vocab_to_64():
    cfg = load_model_config("gpt2", 1024, 50257)
    cfg.pad_vocab_multiple = 64
    with torch.device("meta"):
        model = build_model(cfg, {"impl": "sdpa"})
    assert model.wte.weight.shape[0] == 50304
    assert model.num_parameters() == 124_439_808 + (50304 - 50257) * 768


@pytest.mark.parametrize("name", group_options("model"))
@pytest.mark.parametrize("attention", ["flash", "sdpa", "reference"])
def test_every_model_config_builds(name, attention):
    cfg = load_model_config(name, 4096, 256, num_classes=2)
    assert cfg.max_seq_len == 4096  # ${seq_len}
    with torch.device("meta"):
        model = build_model(cfg, load_attention_config(attention))
    assert model.attn_op.impl == attention
    assert isinstance(model.blocks, torch.nn.ModuleList) and len(model.blocks) == cfg.n_layer
    assert model.num_parameters() > 0
    assert model.estimate_flops_per_token(4096) > 6 * model.num_parameters(non_embedding=True)


def base_arch(name: str) -> str:
    return load_model_config(name, 1024, 256).arch


def test_model_files_hold_only_what_differs():
    """A base file per architecture puts the run's context and vocabulary on its schema; a size
    file names its base and only the sizes that differ from it."""
    for name in group_options("model"):
        raw = OmegaConf.to_container(OmegaConf.load(CONFIGS / "model" / f"{name}.yaml"))
        base = raw.pop("defaults")[0]
        if base.startswith("/schema/model/"):
            assert raw["max_seq_len"] == "${seq_len}" and "${data." in raw["vocab_size"], name
            continue
        assert base in group_options("model"), name
        sizes = {"n_layer", "n_head", "d_model", "d_ff"}
        if base_arch(name) == "llama":  # a Llama's shape also names its K/V heads, RoPE, tying
            sizes |= {"n_kv_head", "rope_theta", "tie_embeddings"}
        assert set(raw) <= sizes, name
        base_cfg = load_model_config(base, 1024, 256)
        assert all(raw[k] != base_cfg[k] for k in raw), name


def test_attention_configs_name_their_impl():
    assert group_options("attention") == sorted(ATTENTION_IMPLS)
    for name in group_options("attention"):
        assert load_attention_config(name).impl == name


def test_pathx_classifier_config():
    cfg = load_model_config("pathx-classifier", 128 * 128, 256, num_classes=2)
    with torch.device("meta"):
        model = build_model(cfg, {"impl": "sdpa"})
    assert isinstance(model, SequenceClassifier)
    assert model.pos_row.weight.shape == (128, 128) and model.pos_col.weight.shape == (128, 128)
    assert model.tok_emb.weight.shape[0] == 256 and model.head.out_features == 2


def test_flops_per_token_is_6n_plus_attention():
    model = build_meta("gpt2", 1024, 50257)
    n = 124_439_808 - 1024 * 768  # positions are lookups, the tied embedding is the head's matmul
    assert model.num_parameters(non_embedding=True) == n
    # attention as FlashAttention counts it: 4 * S * S * D a head forward, halved for causal,
    # the backward 2.5x: per token and layer 14 * d_model * S / 2
    attention = attention_flops(1, 12, 1024, 1024, 64, causal=True, mode="fwd_bwd") / 1024 * 12
    assert attention == 14 * 12 * 768 * 1024 / 2
    assert model.estimate_flops_per_token(1024) == 6 * n + attention
    assert model.estimate_flops_per_token(2048) - model.estimate_flops_per_token(1024) == attention
    bert = build_meta("bert-base", 1024, 30522)  # no causal mask: every key
    assert bert.estimate_flops_per_token(1024) - 6 * bert.num_parameters(non_embedding=True) == (
        14 * 12 * 768 * 1024
    )


# ---- bad configs -----------------------------------------------------------------------------


def test_unknown_arch_lists_the_allowed():
    with pytest.raises(
        ValueError, match=r"model.arch='t5'; allowed: gpt2, bert, classifier, llama"
    ):
        build_model({**TINY_GPT2, "arch": "t5"}, {"impl": "sdpa"})


def test_unknown_attention_impl_lists_the_allowed():
    with pytest.raises(ValueError, match=r"'xformers'.*flash, blocksparse, sdpa, reference"):
        build_model(TINY_GPT2, {"impl": "xformers"})


def test_unknown_blocksparse_pattern_lists_the_allowed():
    with pytest.raises(ValueError, match=r"'diagonal'.*butterfly, local, global_local, bigbird"):
        build_model(TINY_GPT2, {"impl": "blocksparse", "pattern": "diagonal"})
    with pytest.raises(ValueError, match=r"block_size=96.*64, 128"):
        build_model(TINY_GPT2, {"impl": "blocksparse", "pattern": "local", "block_size": 96})


def test_blocksparse_config_builds_and_runs(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    cfg = {**TINY_GPT2, "max_seq_len": 512}
    model = build_model(cfg, load_attention_config("blocksparse"))  # butterfly, block 128
    assert model.attn_op.impl == "blocksparse"
    assert model.attn_op.density(512, heads=2) < 1.0  # 4 blocks: really sparse
    ids = torch.randint(0, 97, (1, 512), generator=torch.Generator().manual_seed(0))
    out = model(input_ids=ids, labels=ids)
    assert torch.isfinite(out.loss) and out.num_targets.item() == 512
    out.loss.backward()
    assert model.blocks[0].attn.c_attn.weight.grad.abs().max() > 0


def test_heads_must_divide_width():
    with pytest.raises(
        ValueError, match=r"n_head=5 does not divide model.d_model=64.*\[1, 2, 4, 8"
    ):
        build_model({**TINY_GPT2, "n_head": 5}, {"impl": "sdpa"})


def test_kernel_head_dim_rule_is_checked_at_build():
    with pytest.raises(ValueError, match="multiple of 8"):
        build_model({**TINY_GPT2, "d_model": 60, "n_head": 5}, {"impl": "flash"})
    build_model({**TINY_GPT2, "d_model": 60, "n_head": 5}, {"impl": "sdpa"})  # fine without kernel


def test_seq_len_beyond_the_positional_table():
    model = build_model(TINY_GPT2, {"impl": "sdpa"})
    ids = torch.zeros(1, 65, dtype=torch.long)
    with pytest.raises(ValueError, match=r"sequence length 65 exceeds .*max_seq_len=64.*<= 64"):
        model(input_ids=ids, labels=ids)
    bert = build_model({**TINY_GPT2, "arch": "bert"}, {"impl": "sdpa"})
    with pytest.raises(ValueError, match="sequence length 65 exceeds"):
        bert(input_ids=ids, labels=ids)


def test_unknown_keys_and_bad_values():
    with pytest.raises(
        ConfigError, match=r"unknown key 'model.n_layers'.*\(GPT2Config\): arch, n_layer"
    ):
        build_model({**TINY_GPT2, "n_layers": 3}, {"impl": "sdpa"})
    with pytest.raises(ConfigError, match=r"unknown key 'attention.window'.*: impl, backend$"):
        build_model(TINY_GPT2, {"impl": "sdpa", "window": 3})
    with pytest.raises(ConfigError, match=r"unknown key 'attention.pattern'"):
        build_model(TINY_GPT2, {"impl": "flash", "pattern": "local"})  # blocksparse's key
    with pytest.raises(ConfigError, match=r"model.n_layer: Value 'two' .* Integer"):
        model_config({**TINY_GPT2, "n_layer": "two"})
    with pytest.raises(ValueError, match="recompute='some'; allowed: none, all, every_k"):
        build_model({**TINY_GPT2, "recompute": "some"}, {"impl": "sdpa"})
    with pytest.raises(ValueError, match="recompute_every"):
        build_model({**TINY_GPT2, "recompute": "every_k", "recompute_every": 0}, "sdpa")
    with pytest.raises(ValueError, match="position='alibi'; allowed: learned, rotary"):
        build_model({**TINY_GPT2, "position": "alibi"}, {"impl": "sdpa"})
    with pytest.raises(ValueError, match="head='nsp'; allowed: mlm, classification"):
        build_model({**TINY_GPT2, "arch": "bert", "head": "nsp"}, {"impl": "sdpa"})
    with pytest.raises(ValueError, match="num_classes >= 2"):
        build_model({**TINY_GPT2, "arch": "bert", "head": "classification"}, {"impl": "sdpa"})
    with pytest.raises(ValueError, match=r"image_size\*\*2, got 60.*49 \(7x7\) or 64 \(8x8\)"):
        build_model({**TINY_CLASSIFIER, "max_seq_len": 60}, {"impl": "sdpa"})
    with pytest.raises(ValueError, match="pooling='max'; allowed: mean, cls"):
        build_model({**TINY_CLASSIFIER, "pooling": "max"}, {"impl": "sdpa"})


def test_sdpa_backend_pins_one_kernel_and_refuses_an_unknown_one():
    """attention.backend=math runs PyTorch's math kernel alone (the result agrees with auto's);
    a backend with no kernel for the call is PyTorch's error, never a silent fallback."""
    from flashtrain.models.attention_layers import AttentionContext, build_attention

    q, k, v = (torch.randn(2, 7, 2, 8, dtype=torch.float64) for _ in range(3))  # (B, T, H, D)
    ctx = AttentionContext(causal=True)
    auto = build_attention({"impl": "sdpa"})(q, k, v, ctx)
    math = build_attention({"impl": "sdpa", "backend": "math"})
    torch.testing.assert_close(math(q, k, v, ctx), auto)
    assert "backend=math" in repr(math)
    with pytest.raises(ConfigError, match=r"attention.backend='fa3'; allowed: auto, flash, cudnn"):
        build_attention({"impl": "sdpa", "backend": "fa3"})
    if not torch.cuda.is_available():  # no memory-efficient kernel on a CPU
        with pytest.raises(RuntimeError, match="No viable backend"):
            build_attention({"impl": "sdpa", "backend": "efficient"})(q, k, v, ctx)
