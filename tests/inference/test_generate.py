"""Generation with the KV cache: the same tokens as recomputing the whole sequence every step,
on both CPU attention routes; sampling options; the command line on a trained checkpoint."""

import importlib
import io

import pytest
import torch
from inference_testing import tiny_llama

from flashtrain.inference import Sampling, generate
from flashtrain.inference.generate import next_tokens
from flashtrain.inference.generate_cli import main
from flashtrain.models import build_model

ROUTES = ("triton", "torch")
GREEDY = Sampling(temperature=0.0)


@pytest.fixture(params=ROUTES)
def route(request, monkeypatch):
    if request.param == "triton" and torch.cuda.is_available():
        pytest.skip("the interpreter route is a CPU route")
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", request.param)
    return request.param


def _tiny_gpt2(position: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, max_seq_len=32, vocab_size=23,
               position=position)  # fmt: skip
    model = build_model(cfg, "flash").eval()
    with torch.no_grad():  # GPT-2's init leaves a tiny model's next token a function of the
        for param in model.parameters():  # last one alone; larger matrices make it
            if param.dim() == 2:  # use the context
                param.normal_(0.0, 0.3)
    return model


def _recompute_greedy(model, prompt: list[int], steps: int) -> list[int]:
    """The reference: the whole sequence through the model at every step, no cache."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = model.logits(torch.tensor([seq]))[0, -1]
            seq.append(int(logits.argmax()))
    return seq[len(prompt) :]


@pytest.mark.parametrize("position", ["learned", "rotary"])
def test_greedy_with_the_cache_equals_recomputing_everything(route, position):
    model = _tiny_gpt2(position, seed=1 if position == "learned" else 2)
    prompts = [[1, 5, 7], [3, 3, 9, 12, 4, 8, 2], [11]]  # different lengths in one batch
    got = generate(model, prompts, max_new_tokens=6, sampling=Sampling(temperature=0.0))
    want = [_recompute_greedy(model, p, 6) for p in prompts]
    assert got == want
    assert len({tuple(t) for t in got}) > 1  # a test that distinguishes the prompts


def test_greedy_with_the_cache_equals_recomputing_everything_on_a_llama(route):
    """GQA, a sliding window shorter than the prompts and the sequences, attention and final
    softcaps: the cache must keep the window (no key older than 5 tokens) and the softcap."""
    model = tiny_llama(seed=3)
    prompts = [[1, 5, 7, 2, 9, 4, 13], [3, 3, 9], [11]]
    got = generate(model, prompts, max_new_tokens=8)
    want = [_recompute_greedy(model, p, 8) for p in prompts]
    assert got == want
    assert len({tuple(t) for t in got}) > 1


def _generate_seeing_logits(monkeypatch, model, prompts, steps, sampling=GREEDY, seed=None):
    """generate(...) and the (B, V) logits the sampler was handed at each step."""
    # the module (flashtrain.inference exports the function under the same name)
    gen = importlib.import_module("flashtrain.inference.generate")
    seen, original = [], gen.next_tokens

    def spy(logits, sampling, generator):
        seen.append(logits.clone())
        return original(logits, sampling, generator)

    monkeypatch.setattr(gen, "next_tokens", spy)
    return generate(model, prompts, steps, sampling, seed=seed), seen


def _assert_step_logits_are_the_models(model, prompts, new, seen):
    """Step t's logits for sequence b == model.logits of prompt b + its first t new tokens."""
    with torch.no_grad():
        for step, logits in enumerate(seen):
            for b, prompt in enumerate(prompts):
                want = model.logits(torch.tensor([prompt + new[b][:step]]))[0, -1]  # (V,)
                torch.testing.assert_close(logits[b], want.float(), atol=1e-5, rtol=0)


def test_cache_equals_recomputing_on_a_trained_checkpoint(route, recall_run, monkeypatch):
    """On the session's checkpoint of a short `python train.py` (GPT-2, recall data): the same
    greedy tokens, and the same logits at every step (a model trained for 6 steps barely uses its
    context, so the tokens alone would not notice a broken cache; its logits do)."""
    from flashtrain.checkpoint import load_model

    model, _ = load_model(recall_run)
    prompts = [[3, 11, 5, 12, 3, 11, 0], [1, 9], [7, 14, 2, 8, 6, 13, 7, 14, 6]]
    got, seen = _generate_seeing_logits(monkeypatch, model, prompts, 6)
    assert got == [_recompute_greedy(model, p, 6) for p in prompts]
    _assert_step_logits_are_the_models(model, prompts, got, seen)


def test_sampling_draws_from_the_models_own_logits(monkeypatch):
    """What the sampler is given at each step is the model's logits for the last position
    (with the Llama family's final softcap), not the raw head product."""
    model = tiny_llama(seed=5)
    prompts = [[2, 7, 1, 8, 2, 8]]
    new, seen = _generate_seeing_logits(monkeypatch, model, prompts, 3, Sampling(1.0), seed=0)
    _assert_step_logits_are_the_models(model, prompts, new, seen)


def test_stop_token_ends_a_sequence_early():
    model = _tiny_gpt2("learned")
    free = generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=5)
    stop = free[0][1]
    stopped = generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=5, stop_id=stop)
    assert stopped[0] == free[0][: free[0].index(stop) + 1]
    assert len(stopped[1]) <= 5


def test_sampling_is_repeatable_and_its_filters_work():
    model = _tiny_gpt2("rotary")
    hot = Sampling(temperature=1.5)
    a = generate(model, [[1, 2], [3]], 8, hot, seed=7)
    assert a == generate(model, [[1, 2], [3]], 8, hot, seed=7)
    assert a != generate(model, [[1, 2], [3]], 8, hot, seed=8)
    greedy = generate(model, [[1, 2], [3]], 8)
    assert generate(model, [[1, 2], [3]], 8, Sampling(temperature=2.0, top_k=1), seed=1) == greedy
    assert (
        generate(model, [[1, 2], [3]], 8, Sampling(temperature=2.0, top_p=1e-6), seed=1) == greedy
    )


def test_top_k_and_top_p_keep_only_the_allowed_tokens():
    logits = torch.tensor([[0.0, 3.0, 2.0, -1.0, 2.9]]).repeat(400, 1)
    gen = torch.Generator().manual_seed(0)
    drawn = set(next_tokens(logits, Sampling(1.0, top_k=2), gen).tolist())
    assert drawn == {1, 4}
    probs = torch.softmax(logits[0], -1)  # top_p just above p(1): tokens 1 and 4
    drawn = set(next_tokens(logits, Sampling(1.0, top_p=float(probs[1]) + 1e-3), gen).tolist())
    assert drawn == {1, 4}


def test_bad_requests_are_value_errors():
    model = _tiny_gpt2("learned")
    with pytest.raises(ValueError, match="learned positions"):
        generate(model, [[1] * 30], max_new_tokens=5)
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [[]], max_new_tokens=5)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0.0)


def test_generate_command_on_a_trained_checkpoint(recall_run):
    out = io.StringIO()
    assert main([str(recall_run), "--prompt", "3 11 5 12 3", "--temperature", "0",
                 "--max-new-tokens", "4"], out=out) == 0  # fmt: skip
    words = out.getvalue().split()
    assert words[:5] == ["3", "11", "5", "12", "3"] and len(words) == 9
    out = io.StringIO()
    assert main([str(recall_run / "checkpoints"), "--prompt", "1 2", "--prompt", "4 5 6 7",
                 "--max-new-tokens", "3", "--seed", "0"], out=out) == 0  # fmt: skip
    lines = out.getvalue().splitlines()
    assert [len(line.split()) for line in lines] == [5, 7]


def test_generate_command_refuses_bad_prompts(recall_run, capsys):
    assert main([str(recall_run), "--prompt", "hello"]) == 2
    assert "token ids separated by spaces" in capsys.readouterr().err


def test_streaming_holds_back_an_incomplete_utf8_character():
    """Byte-level tokens arrive one UTF-8 byte at a time: a 2-, 3- or 4-byte character is printed
    once, whole, never as U+FFFD; bytes that never make a character are printed at the end."""
    from flashtrain.data.tokenization import ByteTokenizer
    from flashtrain.inference.generate_cli import Streamer
    from flashtrain.inference.run_tokenizer import TextTokenizer

    tokenizer = TextTokenizer(ByteTokenizer())
    text = "héllo → 🙂 ok"
    out = io.StringIO()
    stream = Streamer(tokenizer, out, prompt=[])
    printed = []
    for token in tokenizer.encode(text):
        stream([token])
        printed.append(out.getvalue())
    stream.finish()
    assert out.getvalue() == text
    assert all("\ufffd" not in p and text.startswith(p) for p in printed)
    assert printed[1] == "h" and printed[2] == "hé"  # é is 2 bytes: held back after the first
    out = io.StringIO()
    stream = Streamer(tokenizer, out, prompt=[])
    for token in [*b"ab", 0xE2, 0x82]:  # a 3-byte character cut short
        stream([token])
    assert out.getvalue() == "ab"
    stream.finish()
    assert out.getvalue() == "ab\ufffd"


def test_cache_keeps_a_contexts_window_and_softcap():
    """A layer whose context carries a sliding window and a soft-cap (the Llama family's) decodes
    with them: prefill then one token at a time equals flash_attn_func on the whole sequence."""
    from types import SimpleNamespace

    from flashtrain.attention import flash_attn_func
    from flashtrain.inference.kv_cache import KVCache

    torch.manual_seed(4)
    ctx = SimpleNamespace(window_size=(3, 0), softcap=2.0)
    q, k, v = torch.randn(2, 9, 4, 16), torch.randn(2, 9, 2, 16), torch.randn(2, 9, 2, 16)

    def layer_attention(q, k, v, ctx, dropout_p):
        return flash_attn_func(
            q, k, v, causal=True, window_size=ctx.window_size, softcap=ctx.softcap
        )

    want = layer_attention(q, k, v, ctx, 0.0)
    cache = KVCache(batch=2, max_len=12)
    cache.layers = [None]
    pieces = [cache.attend(0, q[:, :5], k[:, :5], v[:, :5], ctx, layer_attention)]
    cache.finish_prefill(torch.tensor([5, 5]))
    for t in range(5, 9):
        pieces.append(cache.attend(0, q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], ctx, None))
        cache.advance()
    torch.testing.assert_close(torch.cat(pieces, dim=1), want, atol=2e-5, rtol=0)
