"""The lm-eval model type `flashtrain` gives what lm-eval's own Hugging Face backend gives on the
same weights exported to transformers: a tiny GPT-2 trained a few steps on a text corpus with a
byte-level BPE of its own (a byte run exports no tokenizer files for HF to load), scored on
three local tasks (multiple choice with an empty and an over-long context, rolling perplexity
over several windows, greedy generation), metric by metric and sample by sample."""

from __future__ import annotations

import importlib
import json
import os
import runpy
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from inference_testing import REPO, train
from tokenizer_testing import saved_run

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the tasks read local files only

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.tasks import TaskManager  # noqa: E402

from flashtrain.checkpoint.export_hf import export_checkpoint  # noqa: E402
from flashtrain.inference import lm_eval_client  # noqa: E402
from flashtrain.inference.lm_eval_client import FlashtrainLM, FlashtrainModelError  # noqa: E402
from flashtrain.models import build_model  # noqa: E402

EOT = "<|endoftext|>"
TASKS = ["ft_choice", "ft_rolling", "ft_generate"]
DIGITS = " ".join(str(i) for i in range(90))  # more tokens than the model's 64 positions
LINES = [
    f"line {i}: the quick brown fox {i % 7} jumps over the lazy dog {i % 5}." for i in range(400)
]


def _bpe(path, lines):
    """A GPT-2-style byte-level BPE of the corpus, <|endoftext|> its one special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(lines, trainer)
    tok.save(str(path))
    return tok.get_vocab_size()


def _task(folder, name: str, docs: list[dict], **settings) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    config = dict(task=name, dataset_path="json", test_split="test",
                  dataset_kwargs={"data_files": {"test": str(data)}}, **settings)  # fmt: skip
    (folder / f"{name}.yaml").write_text(json.dumps(config))  # JSON is YAML


def _write_tasks(folder) -> None:
    folder.mkdir()
    questions = ["line 3: the quick brown", "", "the lazy dog ", DIGITS, "jumps over the"]
    _task(folder, "ft_choice", [dict(q=q, choices=["fox", "dog", "line 7"], answer=i % 3)
                                for i, q in enumerate(questions)],
          output_type="multiple_choice", doc_to_text="{{q}}", doc_to_choice="choices",
          doc_to_target="answer", metric_list=[{"metric": "acc"}])  # fmt: skip
    texts = [" ".join(LINES[i : i + 4]) for i in (0, 10)] + ["fox", DIGITS]
    _task(folder, "ft_rolling", [dict(text=t) for t in texts],
          output_type="loglikelihood_rolling", doc_to_text="", doc_to_target="{{text}}",
          metric_list=[{"metric": "word_perplexity"}, {"metric": "byte_perplexity"}])  # fmt: skip
    prompts = ["line 12: the quick", "the lazy", DIGITS, "line 4: the quick brown fox 4 jumps"]
    _task(folder, "ft_generate", [dict(p=p, t=" brown fox") for p in prompts],
          output_type="generate_until", doc_to_text="{{p}}", doc_to_target="{{t}}",
          generation_kwargs={"until": ["."], "max_gen_toks": 12, "do_sample": False},
          metric_list=[{"metric": "exact_match"}])  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run directory, its transformers export, the tasks folder)."""
    root = tmp_path_factory.mktemp("lm_eval")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n")
    vocab = _bpe(root / "tokenizer.json", LINES)
    run = train(
        root / "run", "data=text_files", f"data.data_files={corpus}", "data.sample_by=line",
        "data.val_fraction=0.2", f"data.cache_dir={root / 'cache'}", "data.tokenizer=gpt2",
        f"data.tokenizer_path={root / 'tokenizer.json'}", f"data.vocab_size={vocab}",
    )  # fmt: skip
    exported = export_checkpoint(run, root / "hf")
    _write_tasks(root / "tasks")
    return run, exported, root / "tasks"


def _evaluate(model, tasks, **kwargs):
    return lm_eval.simple_evaluate(model=model, tasks=TASKS, task_manager=TaskManager(include_path=str(tasks)),
                                   log_samples=True, **kwargs)  # fmt: skip


def _responses(result, task) -> list:
    samples = sorted(result["samples"][task], key=lambda s: s["doc_id"])
    return [s["filtered_resps"] for s in samples]


def _close(ours, theirs) -> bool:
    """Equal structures; numbers within 1e-4 relative, texts and booleans exactly."""
    if isinstance(ours, (list, tuple)):
        return len(ours) == len(theirs) and all(map(_close, ours, theirs))
    if isinstance(ours, float):
        return ours == pytest.approx(float(theirs), rel=1e-4)
    return ours == theirs


def test_the_same_as_lm_evals_hugging_face_backend(trained):
    run, exported, tasks = trained
    lm = FlashtrainLM(pretrained=str(run), device="cpu", batch_size=3)
    assert len(lm.encode(DIGITS)) > lm.max_length == 64  # some requests are cut from the left
    ours = _evaluate(lm, tasks)
    # batch_size 1: HF's left-padded generation batches would shift GPT-2's positions
    theirs = _evaluate("hf", tasks, model_args=f"pretrained={exported},dtype=float32", batch_size=1,
                       device="cpu")  # fmt: skip
    for task in TASKS:
        metrics = {k: v for k, v in ours["results"][task].items() if "," in k and "stderr" not in k}
        assert metrics, task
        assert all(_close(v, theirs["results"][task][k]) for k, v in metrics.items()), task
        assert _close(_responses(ours, task), _responses(theirs, task)), task
    assert 1 < ours["results"]["ft_rolling"]["word_perplexity,none"] < float("inf")


def test_the_command_line(trained, monkeypatch, capsys):
    """Once as a program; its refusal in this process (lm-eval's start-up costs seconds)."""
    run, _, tasks = trained
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    argv = [str(REPO / "scripts" / "lm_eval.py"), "--model", "flashtrain", "--model_args",
            f"pretrained={run},device=cpu", "--tasks", "ft_choice", "--include_path", str(tasks),
            "--limit", "4", "--batch_size", "2"]  # fmt: skip
    done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "ft_choice" in done.stdout and "acc" in done.stdout
    monkeypatch.setattr(sys, "argv", [*argv[:4], "device=cpu", *argv[5:]])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the checkout first
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(argv[0], run_name="__main__")
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: model_args needs pretrained=<checkpoint, checkpoints folder or run directory>"
    )


def _saved(tmp_path, cfg: dict, data: dict) -> str:
    torch.manual_seed(0)
    return saved_run(tmp_path / cfg["arch"], build_model(cfg, "flash"), data)


def test_refusals(tmp_path, trained):
    run, _, _ = trained
    with pytest.raises(FlashtrainModelError, match=r"^model_args needs pretrained=<checkpoint"):
        FlashtrainLM.create_from_arg_string("device=cpu")
    with pytest.raises(
        FlashtrainModelError, match=r"unknown model_args dtype; allowed: pretrained"
    ):
        FlashtrainLM.create_from_arg_string(f"pretrained={run},dtype=float32")
    with pytest.raises(FlashtrainModelError, match=r"batch_size='auto': allowed a whole number"):
        FlashtrainLM.create_from_arg_string(f"pretrained={run}", {"batch_size": "auto"})
    with pytest.raises(FlashtrainModelError, match=r"max_length=65 is beyond the model's 64"):
        FlashtrainLM(pretrained=run, device="cpu", max_length=65)
    synthetic = dict(loader="synthetic", num_keys=8, num_values=8, vocab_size=16)
    gpt2 = dict(arch="gpt2", n_layer=1, n_head=2, d_model=16, max_seq_len=32, vocab_size=16)
    with pytest.raises(FlashtrainModelError, match=r"trained on synthetic token ids"):
        FlashtrainLM(pretrained=_saved(tmp_path, gpt2, synthetic), device="cpu")
    bert = dict(
        arch="bert", n_layer=1, n_head=2, d_model=16, d_ff=32, max_seq_len=32, vocab_size=16
    )
    with pytest.raises(FlashtrainModelError, match=r"holds a BertModel|not a decoder"):
        FlashtrainLM(pretrained=_saved(tmp_path, bert, synthetic), device="cpu")
    lm = FlashtrainLM(pretrained=run, device="cpu")
    sampled = SimpleNamespace(
        args=("line", {"until": ["."], "do_sample": True, "temperature": 0.7})
    )
    with pytest.raises(FlashtrainModelError, match=r"decodes greedily only"):
        lm.generate_until([sampled])
    too_many = SimpleNamespace(args=("line", {"until": ["."], "max_gen_toks": 64}))
    with pytest.raises(FlashtrainModelError, match=r"max_gen_toks=64: allowed 1\.\.63"):
        lm.generate_until([too_many])


def test_registered_on_request_only(monkeypatch):
    """Importing flashtrain registers nothing and imports no lm-eval; register() twice is one
    registration; without lm-eval the client says what to install."""
    probe = ("import sys, flashtrain.inference.generate_cli, flashtrain.models.likelihood; "
             "print(any(m.startswith('lm_eval') or m.endswith('lm_eval_client') for m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
    lm_eval_client.register()
    lm_eval_client.register()
    assert lm_eval.api.registry.get_model("flashtrain") is FlashtrainLM
    monkeypatch.setitem(sys.modules, "lm_eval.api.model", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "flashtrain.inference.lm_eval_client")
    with pytest.raises(ImportError, match=r"not installed: pip install -e '\.\[lm_eval\]'$"):
        importlib.import_module("flashtrain.inference.lm_eval_client")
