"""A checkpoint names the tokenizer it was trained with (meta.json "tokenizer": its fingerprinted
name and id count), and every load that rebuilds the tokenizer from data.tokenizer_path (generate
and evaluate through run_tokenizer, export) refuses vocabulary files that are not those: one of
the same size would give other text silently, one of another size an IndexError."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from config_testing import compose

from flashtrain.checkpoint import CheckpointError, load_model
from flashtrain.inference.run_tokenizer import run_config, run_tokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = "the quick brown fox jumps over lazy dog line of a".split() + list("0123456789")
VOCAB = SPECIALS + WORDS


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One step of a tiny GPT-2 on a WordPiece corpus, checkpointed: (run folder, vocab.txt)."""
    from flashtrain.train import run

    root = tmp_path_factory.mktemp("tokenizer_binding")
    corpus, vocab = root / "corpus.txt", root / "vocab.txt"
    corpus.write_text(
        "".join(f"the quick brown fox {i % 10} jumps over a lazy dog\n" for i in range(40))
    )
    vocab.write_text("\n".join(VOCAB) + "\n")
    overrides = ["model=gpt2-tiny", "model.n_layer=1", "model.n_head=2", "model.d_model=16",
                 "seq_len=16", "micro_batch_size=2", "global_batch_size=2", "logger=none",
                 "trainer.progress=none", "trainer.max_steps=1", "trainer.ckpt_interval=1",
                 "trainer.eval_interval=0", "trainer.eval_at_end=false", "data=text_files",
                 f"data.data_files={corpus}", "data.sample_by=line", "data.val_fraction=0.25",
                 "data.tokenizer=wordpiece", f"data.tokenizer_path={vocab}",
                 f"data.vocab_size={len(VOCAB)}", "data.eos_policy=none",
                 f"data.cache_dir={root / 'cache'}"]  # fmt: skip
    before = os.environ.get("FLASHTRAIN_CPU_ATTENTION")
    os.environ["FLASHTRAIN_CPU_ATTENTION"] = "torch"  # the trainer, not the kernels, is tested
    try:
        run(compose(overrides), root / "run")
    finally:
        if before is None:
            del os.environ["FLASHTRAIN_CPU_ATTENTION"]
        else:
            os.environ["FLASHTRAIN_CPU_ATTENTION"] = before
    return root / "run", vocab


@pytest.fixture
def vocab(trained):
    """The run's vocab.txt, put back as trained after each test that replaces it."""
    _, path = trained
    original = path.read_text()
    yield path
    path.write_text(original)


def _meta(run: Path) -> dict:
    return json.loads((run / "checkpoints" / "step_000001" / "meta.json").read_text())


# the same ids in another order (same size, other text), and one word more (another size)
SWAPS = {"same size": SPECIALS + WORDS[::-1], "other size": VOCAB + ["cat"]}


def test_the_checkpoint_records_the_tokenizer_it_was_trained_with(trained, vocab):
    run, _ = trained
    recorded = _meta(run)["tokenizer"]
    assert recorded["vocab_size"] == len(VOCAB)
    assert recorded["name"].startswith("wordpiece-uncased-")
    model, info = load_model(run)
    tok = run_tokenizer(run_config(info).data, checkpoint=info)
    assert tok.name == recorded["name"]
    assert tok.decode(tok.encode("the quick fox")) == "the quick fox"


@pytest.mark.parametrize("swap", SWAPS)
def test_generate_refuses_vocabulary_files_replaced_after_training(trained, vocab, swap):
    run, _ = trained
    recorded = _meta(run)["tokenizer"]["name"]
    vocab.write_text("\n".join(SWAPS[swap]) + "\n")
    _, info = load_model(run)
    with pytest.raises(CheckpointError) as refused:
        run_tokenizer(run_config(info).data, checkpoint=info)  # generate's and evaluate's load
    message = str(refused.value)
    assert len(message.splitlines()) == 1, message
    assert recorded in message and "wordpiece-uncased-" in message.replace(recorded, "")
    assert str(vocab) in message


def test_the_generate_and_evaluate_commands_refuse_a_replaced_vocabulary(trained, vocab, capsys):
    from flashtrain.inference.evaluate_cli import main as evaluate
    from flashtrain.inference.generate_cli import main as generate

    run, _ = trained
    vocab.write_text("\n".join(SWAPS["same size"]) + "\n")
    assert generate([str(run), "--prompt", "the quick", "--max-new-tokens", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the prompt is printed
    assert _meta(run)["tokenizer"]["name"] in captured.err and str(vocab) in captured.err
    assert evaluate([str(run), "--seq-len", "16", "--batches", "1"]) == 2
    assert _meta(run)["tokenizer"]["name"] in capsys.readouterr().err


@pytest.mark.parametrize("swap", SWAPS)
def test_export_refuses_vocabulary_files_replaced_after_training(trained, vocab, swap, tmp_path):
    pytest.importorskip("transformers")
    from flashtrain.checkpoint.export_hf import export_checkpoint

    run, _ = trained
    vocab.write_text("\n".join(SWAPS[swap]) + "\n")
    with pytest.raises(CheckpointError, match=f"{_meta(run)['tokenizer']['name']}.*{vocab}"):
        export_checkpoint(run, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-written
    out = export_checkpoint(run, tmp_path / "out", tokenizer=False)  # the way out it names
    assert not (out / "tokenizer.json").exists()


def test_a_checkpoint_without_the_record_still_loads_and_its_id_count_is_checked(
    trained, vocab, tmp_path
):
    """Checkpoints written before the record: the same vocabulary loads as before; one whose id
    count differs from the run's data.vocab_size is refused (it would index past the table)."""
    run, _ = trained
    old = Path(shutil.copytree(run, tmp_path / "old"))
    meta_file = old / "checkpoints" / "step_000001" / "meta.json"
    meta = json.loads(meta_file.read_text())
    del meta["tokenizer"]
    meta_file.write_text(json.dumps(meta))
    _, info = load_model(old)
    assert run_tokenizer(run_config(info).data, checkpoint=info).vocab_size == len(VOCAB)
    vocab.write_text("\n".join(SWAPS["other size"]) + "\n")
    with pytest.raises(
        CheckpointError, match=f"data.vocab_size={len(VOCAB)} .*\\({len(VOCAB) + 1} ids"
    ):
        run_tokenizer(run_config(info).data, checkpoint=info)
