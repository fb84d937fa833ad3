"""model.init_from=hf:PATH_OR_ID: training starts from a transformers checkpoint."""

from __future__ import annotations

import pytest
import torch
from hf_testing import TINY_RUN, run_train, step_losses, tiny_bert_mlm
from hub_testing import use_hub_cache

from flashtrain.checkpoint import initial_weights
from flashtrain.models import build_model
from flashtrain.models.positions import resize_positions


def initialised(cfg: dict, attention="reference"):
    """The model `cfg` builds, given its initial weights (model.init_from's) as the trainer
    does."""
    model = build_model(cfg, attention)
    initial_weights(model, model.config.init_from)
    return model


FEW_STEPS = [*TINY_RUN, "trainer.max_steps=3", "trainer.ckpt_interval=0", "trainer.eval_interval=0"]


@pytest.mark.slow  # ~48 s on 2 busy cores: left out of the normal suite (10 minutes)
def test_training_from_the_exported_folder_starts_from_the_checkpoints_loss(
    trained, exported, tmp_path
):
    """The same first losses as starting from the flashtrain checkpoint itself (init_from of its
    model file), and not those of a fresh model."""
    ckpt_file = trained / "checkpoints" / "step_000006" / "model_optim.pt"
    runs = {}
    for name, init in (("hf", f"hf:{exported}"), ("torch", str(ckpt_file))):
        res = run_train([*FEW_STEPS, f"model.init_from={init}", f"hydra.run.dir={name}"], tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        runs[name] = step_losses(tmp_path / name)
    assert len(runs["hf"]) == 3
    for step in runs["hf"]:
        assert abs(runs["hf"][step] - runs["torch"][step]) < 1e-5, (runs["hf"], runs["torch"])
    # the trained run's first loss: a fresh model's on the same first batch
    fresh = step_losses(trained)[1]
    assert abs(runs["hf"][1] - fresh) > 0.05, (runs["hf"][1], fresh)


def test_longer_context_interpolates_positions(exported):
    from safetensors.torch import load_file

    wpe = load_file(str(exported / "model.safetensors"))["transformer.wpe.weight"]  # (64, C)
    cfg = dict(arch="gpt2", n_layer=2, n_head=2, d_model=64, vocab_size=16, max_seq_len=128)
    model = initialised({**cfg, "init_from": f"hf:{exported}"}, {"impl": "reference"})
    assert torch.equal(model.wpe.weight.detach(), resize_positions(wpe, 128, "interpolate"))
    copied = initialised(
        {**cfg, "init_from": f"hf:{exported}", "init_positions": "copy"}, "reference"
    )
    assert torch.equal(copied.wpe.weight.detach()[64:], wpe)


def test_shorter_context_takes_the_first_positions(exported):
    from safetensors.torch import load_file

    wpe = load_file(str(exported / "model.safetensors"))["transformer.wpe.weight"]  # (64, C)
    cfg = dict(arch="gpt2", n_layer=2, n_head=2, d_model=64, vocab_size=16, max_seq_len=24)
    model = initialised({**cfg, "init_from": f"hf:{exported}"}, {"impl": "reference"})
    assert torch.equal(model.wpe.weight.detach(), wpe[:24])


def test_architecture_mismatch_is_refused_naming_the_field(exported, tmp_path):
    cfg = dict(arch="gpt2", n_layer=2, n_head=2, d_model=64, vocab_size=16, max_seq_len=64)
    for field, value, theirs in (("n_layer", 3, "n_layer=2"), ("d_model", 32, "n_embd=64"),
                                 ("vocab_size", 20, "vocab_size=16"),
                                 ("activation", "gelu", "activation_function='gelu_new'")):  # fmt: skip
        with pytest.raises(
            ValueError,
            match=rf"model.{field}={value!r} but the Hugging Face checkpoint hf:.* has {theirs}",
        ):
            initialised({**cfg, field: value, "init_from": f"hf:{exported}"}, "reference")
    with pytest.raises(
        ValueError, match="model.arch=bert but the Hugging Face checkpoint .* model_type='gpt2'"
    ):
        initialised(dict(arch="bert", n_layer=2, n_head=2, d_model=64, vocab_size=16,
                         init_from=f"hf:{exported}"), "reference")  # fmt: skip
    with pytest.raises(FileNotFoundError, match="no such folder"):
        initialised({**cfg, "init_from": f"hf:{tmp_path}/absent"}, "reference")


def test_offline_and_missing_hub_id_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    use_hub_cache(monkeypatch, tmp_path / "hub")
    cfg = dict(arch="gpt2", n_layer=2, n_head=2, d_model=64, vocab_size=16, max_seq_len=64)
    with pytest.raises(FileNotFoundError) as err:
        initialised({**cfg, "init_from": "hf:openai-community/gpt2"}, "reference")
    message = str(err.value)
    assert "'openai-community/gpt2' is not in the cache" in message
    assert "HF_HUB_OFFLINE=1 forbids downloading it" in message and str(tmp_path / "hub") in message
    assert "(`hf download openai-community/gpt2`;" in message  # huggingface_hub >= 1.0: `hf` only


def test_classifier_starts_from_a_masked_lm_checkpoint(tmp_path):
    """Fine-tuning a pretrained BERT for classification: the encoder from the checkpoint, the
    classifier (and the pooler an MLM model lacks) freshly initialised."""
    hf = tiny_bert_mlm().float()
    hf.save_pretrained(tmp_path / "mlm")
    cfg = dict(arch="bert", n_layer=2, n_head=2, d_model=32, d_ff=48, max_seq_len=40, vocab_size=53,
               head="classification", num_classes=4)  # fmt: skip
    torch.manual_seed(0)
    fresh = build_model(cfg, "reference")
    torch.manual_seed(0)
    model = initialised({**cfg, "init_from": f"hf:{tmp_path / 'mlm'}"}, "reference")
    attn = hf.bert.encoder.layer[1].attention.self
    want = torch.cat([attn.query.weight, attn.key.weight, attn.value.weight])
    assert torch.equal(model.blocks[1].attn.c_attn.weight.detach(), want.detach())
    assert torch.equal(model.classifier.weight, fresh.classifier.weight)
    assert torch.equal(model.pooler.weight, fresh.pooler.weight)


def test_a_dry_run_checks_the_source_without_reading_weights(exported, tmp_path, monkeypatch):
    """trainer.max_steps=0 finds the source and fits it to the model (its config.json alone); a
    hub id that is neither cached nor reachable offline is one line naming what to do."""
    from config_testing import compose

    from flashtrain.train import ConfigError, run

    dry = [*TINY_RUN, "trainer.max_steps=0"]
    out = run(compose([*dry, f"model.init_from=hf:{exported}"]), tmp_path / "found")
    assert out["dry_run"] and not (tmp_path / "found").exists()
    with pytest.raises(ConfigError, match="model.init_from=hf:.*model.arch=llama"):
        run(compose([*dry, "model=llama-tiny", f"model.init_from=hf:{exported}"]), tmp_path / "l")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    use_hub_cache(monkeypatch, tmp_path / "empty-cache")
    with pytest.raises(ConfigError, match="not in the cache .* HF_HUB_OFFLINE=1 .* local folder"):
        run(compose([*dry, "model.init_from=hf:nobody/no-such-model"]), tmp_path / "missing")
