"""scripts/export_hf.py (flashtrain.checkpoint.export_cli): a trained checkpoint becomes a folder
from_pretrained loads, computing flashtrain's logits; sharded (DCP) checkpoints, tokenizer files,
byte-level notes, refusals."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from hf_testing import REPO, TINY_RUN, rel_err, save_model_checkpoint, transformers

from flashtrain.checkpoint import load_model
from flashtrain.checkpoint.export_cli import main
from flashtrain.checkpoint.export_hf import export_checkpoint
from flashtrain.models import build_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flashtrain_logits(model, ids):
    with torch.no_grad():
        return model.logits(ids)


@pytest.mark.slow  # ~35 s on 2 busy cores: left out of the normal suite (10 minutes)
def test_exported_run_loads_with_from_pretrained(trained, tmp_path):
    """The run directory as CKPT (its checkpoints/ folder's newest), as README shows."""
    out = tmp_path / "exported"
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "export_hf.py"), str(trained), str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "config.json", "flashtrain_export.json", "generation_config.json",
        "model.safetensors",
    ]  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]  # no temporary folder left
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["n_positions"] == 64
    readme = (out / "README.md").read_text()
    assert "comes as token ids, with no tokenizer" in readme
    # where it came from by name, and no path of this machine
    meta = json.loads((trained / "checkpoints" / "step_000006" / "meta.json").read_text())
    commit = json.loads((trained / "run.json").read_text())["commit"]
    assert f"from run `{meta['run_name']}`, checkpoint\n`step_000006` (step 6," in readme
    assert f"flashtrain commit `{commit}`" in readme
    assert str(trained.parent) not in readme and "/tmp" not in readme and "init_from" not in readme

    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    model, info = load_model(trained / "checkpoints", attention={"impl": "reference"})
    assert info.step == 6
    ids = torch.randint(0, 16, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(ids).logits
    assert rel_err(flashtrain_logits(model, ids), want) < 1e-5
    # the trained weights, not a fresh model's
    fresh = build_model(info.meta["model_config"] | {"init_from": None}, {"impl": "reference"})
    assert rel_err(flashtrain_logits(fresh, ids), want) > 0.1


def test_sharded_checkpoint_and_sharded_safetensors(tmp_path):
    torch.manual_seed(0)
    cfg = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, max_seq_len=48, vocab_size=45,
               pad_vocab_multiple=16)  # fmt: skip
    model = build_model(cfg, {"impl": "reference"}).eval()
    ckpt = save_model_checkpoint(
        tmp_path / "ckpt", model, {"data": {"name": "synthetic"}}, sharded=True
    )
    assert (ckpt / ".metadata").is_file() and not (ckpt / "model_optim.pt").exists()
    out = export_checkpoint(ckpt, tmp_path / "out", max_shard_size="20KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert hf.transformer.wte.weight.shape == (45, 32)  # padding rows dropped
    ids = torch.randint(0, 45, (1, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert rel_err(model.logits(ids), hf(ids).logits) < 1e-5
    # --dtype: the weights stored in it
    from safetensors import safe_open

    out = export_checkpoint(ckpt, tmp_path / "out", dtype="bfloat16", overwrite=True)
    with safe_open(str(out / "model.safetensors"), "pt") as f:  # one file below 5GB
        assert f.get_tensor("transformer.wte.weight").dtype == torch.bfloat16
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def _tiny_bpe(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(["hello world, hello flash attention"] * 20, trainer)
    tok.save(str(path))
    return tok


def test_hugging_face_tokenizer_files(tmp_path):
    from flashtrain.hf.tokenizer_files import load_run_tokenizer

    bpe = _tiny_bpe(tmp_path / "tokenizer.json")
    vocab = bpe.get_vocab_size()
    data = dict(name="text_files", tokenizer="gpt2", tokenizer_path=str(tmp_path / "tokenizer.json"),
                tokenizer_name="bert-base-uncased", lowercase=True, cache_dir=str(tmp_path / "cache"),
                vocab_size=vocab)  # fmt: skip
    model = build_model(dict(arch="gpt2", n_layer=1, n_head=2, d_model=32, max_seq_len=32,
                             vocab_size=vocab), {"impl": "reference"})  # fmt: skip
    ckpt = save_model_checkpoint(tmp_path / "ckpt", model, {"data": data})
    out = export_checkpoint(ckpt, tmp_path / "out")
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    _, ours = load_run_tokenizer({"data": data})
    text = "hello flash world"
    assert hf_tok(text)["input_ids"] == ours.encode_batch([text])[0]
    eos = bpe.token_to_id("<|endoftext|>")
    assert hf_tok.eos_token_id == eos
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    assert config["eos_token_id"] == generation["eos_token_id"] == eos


def test_byte_level_bert_run(tmp_path):
    torch.manual_seed(2)
    cfg = dict(arch="bert", n_layer=1, n_head=2, d_model=32, d_ff=64, max_seq_len=32,
               vocab_size=260, dropout=0.0, attn_dropout=0.0)  # fmt: skip
    model = build_model(cfg, {"impl": "reference"}).eval()
    data = {"name": "pysrc_mlm", "tokenizer": "byte_mlm", "vocab_size": 260}
    out = export_checkpoint(
        save_model_checkpoint(tmp_path / "ckpt", model, {"data": data}), tmp_path / "out"
    )
    readme = (out / "README.md").read_text()
    assert "Byte-level run (tokenizer `byte_mlm`): no tokenizer files" in readme
    assert "pad = 256, cls = 257, sep = 258, mask = 259" in readme
    assert not (out / "tokenizer.json").exists() and not (out / "generation_config.json").exists()
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "BertForMaskedLM" and hf.config.pad_token_id == 256
    ids = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    with torch.no_grad():
        assert (
            abs(hf(input_ids=ids, labels=labels).loss - model(input_ids=ids, labels=labels).loss)
            < 1e-5
        )


def test_refusals(tmp_path, trained, capsys):
    classifier = build_model(dict(arch="classifier", n_layer=1, n_head=2, d_model=32, d_ff=64,
                                  max_seq_len=64), {"impl": "reference"})  # fmt: skip
    ckpt = save_model_checkpoint(tmp_path / "ckpt", classifier, {"data": {"name": "pathx"}})
    with pytest.raises(ValueError, match="Path-X sequence classifier"):
        export_checkpoint(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "taken").mkdir()
    assert main([str(trained / "checkpoints"), str(tmp_path / "taken")]) == 2
    assert "exists; pass overwrite=True (--overwrite)" in capsys.readouterr().err
    export_checkpoint(trained / "checkpoints", tmp_path / "taken", overwrite=True)
    assert main([str(tmp_path / "absent"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    missing = f"checkpoint {tmp_path / 'absent'} does not exist; name a step_NNNNNN folder"
    assert missing in err and "trainer.resume" not in err
    assert (tmp_path / "taken" / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "taken"]


@pytest.mark.slow
def test_export_of_a_real_fsdp2_run(tmp_path):
    """torchrun, 2 processes, trainer.strategy=fsdp: the DCP shards of both ranks exported;
    every exported tensor equals the one torch's own DCP converter reassembles."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from flashtrain.hf.gpt2 import GPT2Mapping
    from flashtrain.models import model_config

    env = dict(os.environ, FLASHTRAIN_CPU_ATTENTION="torch", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={free_port()}", str(REPO / "train.py"), *TINY_RUN,
           "trainer.max_steps=2", "trainer.ckpt_interval=2", "trainer.eval_interval=0",
           "trainer.strategy=fsdp", "hydra.run.dir=run"]  # fmt: skip
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    assert len(list(ckpt.glob("*.distcp"))) == 2
    out = export_checkpoint(ckpt, tmp_path / "out")
    dcp_to_torch_save(ckpt, tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)["model"]
    meta = json.loads((ckpt / "meta.json").read_text())
    want = GPT2Mapping().state_to_hf(whole, model_config(meta["model_config"]))
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    got = hf.state_dict()
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key


def test_missing_tokenizer_files_are_named(tmp_path):
    data = dict(name="text_files", tokenizer="wordpiece", tokenizer_path=str(tmp_path / "absent"),
                tokenizer_name="not-a-hub-tokenizer", lowercase=True, cache_dir=str(tmp_path),
                vocab_size=40)  # fmt: skip
    model = build_model(dict(arch="gpt2", n_layer=1, n_head=2, d_model=32, max_seq_len=16,
                             vocab_size=40), {"impl": "reference"})  # fmt: skip
    ckpt = save_model_checkpoint(tmp_path / "ckpt", model, {"data": data})
    with pytest.raises(
        FileNotFoundError, match="(?s)WordPiece vocab.txt not found.*--no-tokenizer"
    ):
        export_checkpoint(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    out = export_checkpoint(ckpt, tmp_path / "out", tokenizer=False)
    assert "not exported (--no-tokenizer)" in (out / "README.md").read_text()
