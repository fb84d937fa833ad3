"""Bad input to scripts/generate.py and scripts/evaluate.py: exit 2 and one line on stderr that
names the bad value and what is allowed, never a traceback; generate checks everything before it
prints the first character of the streamed prompt."""

from __future__ import annotations

import io
import math
import re

import pytest
import torch
from inference_testing import tiny_llama
from tokenizer_testing import hf_data, saved_run, saved_text_run, write_metaspace_tokenizer

from flashtrain.checkpoint import load_model
from flashtrain.inference import Sampling, evaluate_cli, generate, generate_cli, kv_cache
from flashtrain.inference.evaluate import evaluate_length
from flashtrain.inference.generate import next_tokens
from flashtrain.lab.checkout import CONFIGS
from flashtrain.models import build_model

SYNTHETIC = dict(loader="synthetic", num_keys=8, num_values=8, vocab_size=16)


def _saved_run(run_dir, model) -> str:
    """A run of `model` (random weights) on synthetic data, one checkpoint, without training."""
    return saved_run(run_dir, model, SYNTHETIC)


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory) -> str:
    torch.manual_seed(0)
    cfg = dict(arch="bert", n_layer=1, n_head=2, d_model=16, d_ff=32, max_seq_len=32,
               vocab_size=16)  # fmt: skip
    return _saved_run(tmp_path_factory.mktemp("bert"), build_model(cfg, "flash"))


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory) -> str:
    """A GPT-2 with 64 learned positions (the trained fixtures' shape, without their training
    runs: this file may run on a worker that has not made them)."""
    torch.manual_seed(0)
    cfg = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, max_seq_len=64, vocab_size=16)
    return _saved_run(tmp_path_factory.mktemp("gpt2"), build_model(cfg, "flash"))


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> str:
    """A rotary decoder (no position table): generation length bounded by memory alone."""
    return _saved_run(tmp_path_factory.mktemp("llama"), tiny_llama(vocab_size=16))


def _exit_code(main, argv, **kw) -> int:
    """main(argv)'s exit code: what it returns, or argparse's SystemExit."""
    try:
        return main(argv, **kw)
    except SystemExit as e:
        return e.code


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


def _generate(argv, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, the one stderr line) of scripts/generate.py argv."""
    out = io.StringIO()
    code = _exit_code(generate_cli.main, argv, out=out)
    return code, out.getvalue(), _one_line(capsys) if code else capsys.readouterr().err


# ---- generate ----------------------------------------------------------------------------------


def test_generate_and_evaluate_refuse_an_encoder(bert_run, capsys):
    code, out, err = _generate([bert_run, "--prompt", "1 2 3"], capsys)
    assert (code, out) == (2, "")
    assert "Bert" in err and "model.arch=bert" in err and "gpt2" in err and "llama" in err
    assert _exit_code(evaluate_cli.main, [bert_run, "--seq-len", "8", "--no-progress"]) == 2
    assert "model.arch=bert" in _one_line(capsys)


def _truncate(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    "name, breaks, says",
    [
        ("tokenizer.json", _truncate, "(EOF while parsing"),  # was a traceback, exit 1
        ("tokenizer_config.json", lambda p: p.write_text('{"bos_token": '), "(not JSON: "),
        ("tokenizer.json", lambda p: p.write_text(""), "(it is empty)"),
    ],
)
def test_generate_and_evaluate_name_a_tokenizer_file_that_cannot_be_read(
    tmp_path, capsys, name, breaks, says
):
    """The run's hf: tokenizer folder, damaged after training: exit 2, the file and what to do
    (was json's "Expecting value: line 1 column 14" alone, naming no file)."""
    folder = write_metaspace_tokenizer(tmp_path / "tok")
    run = saved_text_run(tmp_path / "run", hf_data(folder))
    breaks(folder / name)
    code, out, err = _generate([run, "--prompt", "alpha"], capsys)
    assert (code, out) == (2, "")
    assert _exit_code(evaluate_cli.main, [run, "--seq-len", "8", "--no-progress"]) == 2
    for line in (err, _one_line(capsys)):
        assert f"tokenizer file {folder / name} cannot be read {says}" in line, line
        assert "fix it, or copy or download the tokenizer's files again" in line, line


def test_generate_checks_the_length_before_it_prints_the_prompt(gpt2_run, capsys):
    """The run's GPT-2 has 64 learned positions: refused before one character is printed."""
    code, out, err = _generate([gpt2_run, "--prompt", "3 11 5", "--max-new-tokens", "100"],
                               capsys)  # fmt: skip
    assert (code, out) == (2, "")
    assert "64 learned positions" in err and "--max-new-tokens" in err and "at most 62" in err


def test_generate_refuses_a_kv_cache_larger_than_memory(llama_run, capsys):
    code, out, err = _generate([llama_run, "--prompt", "1 2 3", "--max-new-tokens", str(10**13)],
                               capsys)  # fmt: skip
    assert (code, out) == (2, "")
    assert str(10**13) in err and "GiB" in err and "KV cache" in err
    fits = int(re.search(r"at most ([0-9]+)", err).group(1))
    model, _ = load_model(llama_run)
    assert 0 < fits < 10**13
    assert kv_cache.kv_cache_bytes(model, 1, 3 + fits) < kv_cache.kv_cache_bytes(
        model, 1, 3 + 10**13
    )


def test_kv_cache_bytes_is_what_the_cache_allocates():
    model = tiny_llama(vocab_size=16)  # GQA: 2 K/V heads of 4 query heads
    cache = kv_cache.KVCache(batch=3, max_len=20)
    with torch.no_grad(), cache.attached(model):
        model.hidden_states(torch.zeros(3, 5, dtype=torch.long))  # the prefill allocates
    allocated = sum(t.nbytes for layer in cache.layers for t in layer)
    assert allocated == kv_cache.kv_cache_bytes(model, 3, 20) == 2 * 2 * 3 * 2 * 20 * 8 * 4


@pytest.mark.parametrize("device", ["cuda", "cuda:7", "nonsense"])
def test_generate_and_evaluate_refuse_an_unavailable_device(gpt2_run, capsys, device):
    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has that device")
    code, out, err = _generate([gpt2_run, "--prompt", "1 2", "--device", device], capsys)
    assert (code, out) == (2, "")
    assert "--device" in err and repr(device) in err and "cpu" in err
    argv = [gpt2_run, "--seq-len", "8", "--device", device, "--no-progress"]
    assert _exit_code(evaluate_cli.main, argv) == 2
    assert repr(device) in _one_line(capsys)


def test_a_tiny_temperature_samples_the_top_token():
    """logits / 1e-300 overflow float32 (inf - inf = nan in the softmax): scaled after the
    max is taken away, in float64, a tiny temperature is greedy in all but name."""
    logits = torch.tensor([[0.5, 3.0, 2.9, -1.0], [7.0, -2.0, 6.5, 1.0]])
    for temperature in (1e-300, 5e-324, 1e-40):
        drawn = next_tokens(logits, Sampling(temperature), torch.Generator().manual_seed(0))
        assert drawn.tolist() == [1, 0]


def test_generate_command_with_a_tiny_temperature_is_greedy(llama_run, capsys):
    greedy, tiny = io.StringIO(), io.StringIO()
    argv = [llama_run, "--prompt", "1 2 3", "--max-new-tokens", "4"]
    assert generate_cli.main([*argv, "--temperature", "0"], out=greedy) == 0
    assert generate_cli.main([*argv, "--temperature", "1e-300", "--seed", "1"], out=tiny) == 0
    assert tiny.getvalue() == greedy.getvalue()


@pytest.mark.parametrize(
    "option, value, allowed",
    [("--temperature", "-1", "0 = greedy"), ("--temperature", "nan", "0 = greedy"),
     ("--top-p", "0", "(0, 1]"), ("--top-k", "-3", ">= 0"), ("--max-new-tokens", "0", ">= 1"),
     ("--max-new-tokens", "1e6", "an integer >= 1")],
)  # fmt: skip
def test_generate_refuses_bad_sampling_options(gpt2_run, capsys, option, value, allowed):
    code, out, err = _generate([gpt2_run, "--prompt", "1 2", option, value], capsys)
    assert (code, out) == (2, "")
    assert option in err and value in err and allowed in err


def test_generate_api_checks_before_it_allocates():
    model = tiny_llama(vocab_size=16)
    with pytest.raises(ValueError, match="KV cache"):
        generate(model, [[1, 2]], max_new_tokens=10**13)


# ---- evaluate ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, named, allowed",
    [(["--stride", "-5"], "-5", ">= 1"), (["--stride", "0"], "0", ">= 1"),
     (["--batch-size", "0"], "0", ">= 1"), (["--batches", "0"], "0", ">= 1"),
     (["--tokens", "-1"], "-1", ">= 1"), (["--buckets", "0"], "0", ">= 1"),
     (["--seq-len", "1e8"], "1e8", "an integer >= 2"), (["--seq-len", "1"], "1", ">= 2")],
)  # fmt: skip
def test_evaluate_refuses_bad_numbers(gpt2_run, capsys, args, named, allowed):
    argv = [gpt2_run, "--seq-len", "16", *args, "--no-progress"]
    assert _exit_code(evaluate_cli.main, argv) == 2
    err = _one_line(capsys)
    assert args[0] in err and named in err and allowed in err


def test_evaluate_refuses_a_length_larger_than_memory(gpt2_run, capsys):
    """10^8 positions of the tiny GPT-2 in batches of 8 need terabytes: refused with the figure
    and the longest length that fits, before a position table of that length is built."""
    argv = [gpt2_run, "--seq-len", "16", str(10**8), "--no-progress"]
    assert _exit_code(evaluate_cli.main, argv) == 2
    err = _one_line(capsys)
    assert f"--seq-len {10**8}" in err and "GiB" in err and "--batch-size 8" in err
    fits = int(re.search(r"at most ([0-9]+)", err).group(1))
    assert 16 < fits < 10**8


def test_evaluate_refuses_an_out_that_is_a_file(gpt2_run, tmp_path, capsys):
    target = tmp_path / "results.json"
    target.write_text("{}")
    argv = [gpt2_run, "--seq-len", "8", "--batches", "1", "--out", str(target),
            "--no-progress"]  # fmt: skip
    assert _exit_code(evaluate_cli.main, argv) == 2
    err = _one_line(capsys)
    assert str(target) in err and "folder" in err
    assert target.read_text() == "{}"
    inside = target / "eval"  # a folder under a file cannot be made either
    assert _exit_code(evaluate_cli.main, [*argv[:-2], str(inside), "--no-progress"]) == 2
    assert str(target) in _one_line(capsys)


@pytest.mark.parametrize(
    "data, named, allowed",
    [(["nonesuch"], "'nonesuch'", "synthetic"),
     (["synthetic", "num_kees=4"], "'num_kees'", "num_keys"),
     (["synthetic", "num_keys"], "'num_keys'", "KEY=VALUE"),
     (["synthetic", "num_keys=four"], "'num_keys'", "four")],
)  # fmt: skip
def test_evaluate_refuses_unknown_data_and_keys(gpt2_run, capsys, data, named, allowed):
    argv = [gpt2_run, "--seq-len", "8", "--data", *data, "--no-progress"]
    assert _exit_code(evaluate_cli.main, argv, configs=CONFIGS) == 2
    err = _one_line(capsys)
    assert named in err and allowed in err


def test_evaluate_accepts_the_least_allowed_numbers(gpt2_run):
    """The checks refuse only what is wrong: the least of each number parses and evaluates."""
    argv = [gpt2_run, "--seq-len", "2", "--stride", "1", "--batch-size", "1", "--batches", "1",
            "--buckets", "1"]  # fmt: skip
    args = evaluate_cli._parser(None).parse_args(argv)
    assert (args.seq_len, args.stride, args.batch_size, args.batches, args.buckets) == (
        [2],
        1,
        1,
        1,
        1,
    )
    model, info = load_model(gpt2_run)
    result = evaluate_length(model, SYNTHETIC, 2, batch_size=1, max_batches=1, buckets=1)
    assert result.tokens > 0 and math.isfinite(result.loss)
