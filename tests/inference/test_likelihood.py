"""continuation_scores against the plain computation: float64 log-softmax of the whole
sequence's logits (the model's float64 copy on the reference attention), gathered at the
continuation's positions; pairs of different lengths batched together, in the pairs' order."""

from __future__ import annotations

import pytest
import torch
from inference_testing import tiny_llama

from flashtrain.models import build_model
from flashtrain.models.likelihood import continuation_scores


def _tiny_gpt2():
    torch.manual_seed(0)
    cfg = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, max_seq_len=32, vocab_size=23)
    model = build_model(cfg, "flash").eval()
    with torch.no_grad():  # larger weights: the next token depends on the context
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.3)
    return model


def _float64_reference(model):
    cfg = {k: v for k, v in vars(model.config).items() if not k.startswith("_")}
    reference = build_model(cfg, "reference")
    reference.load_state_dict(model.state_dict())
    return reference.double().eval()


def _expected(reference, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    ids = torch.tensor([[*context, *continuation]])
    with torch.no_grad():
        logits = reference.logits(ids)[0, len(context) - 1 : -1]  # the continuation's predictors
    target = torch.tensor(continuation)
    logprob = torch.log_softmax(logits, dim=-1).gather(-1, target[:, None]).sum()
    return float(logprob), bool((logits.argmax(dim=-1) == target).all())


def _greedy(reference, context: list[int], steps: int) -> list[int]:
    ids = list(context)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(reference.logits(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(context) :]


@pytest.mark.parametrize("make_model", [_tiny_gpt2, tiny_llama], ids=["gpt2", "llama"])
def test_scores_equal_the_float64_log_softmax(make_model):
    model = make_model()
    reference = _float64_reference(model)
    g = torch.Generator().manual_seed(1)
    lengths = [(7, 3), (1, 5), (13, 1), (3, 9), (9, 7)]  # odd, different totals
    contexts = [torch.randint(0, 23, (c,), generator=g).tolist() for c, _ in lengths]
    continuations = [torch.randint(0, 23, (k,), generator=g).tolist() for _, k in lengths]
    continuations[1] = _greedy(reference, contexts[1], 5)  # one that greedy decoding produces
    scores = continuation_scores(model, contexts, continuations, batch_size=2)
    for score, context, continuation in zip(scores, contexts, continuations):
        logprob, greedy = _expected(reference, context, continuation)
        assert score.logprob == pytest.approx(logprob, rel=1e-5, abs=1e-4)
        assert score.greedy == greedy
    assert scores[1].greedy and not scores[3].greedy


def test_refusals():
    model = _tiny_gpt2()  # 32 learned positions
    with pytest.raises(ValueError, match="pair 1: its context has no tokens"):
        continuation_scores(model, [[1], []], [[2], [3]])
    with pytest.raises(ValueError, match="pair 0: its continuation has no tokens"):
        continuation_scores(model, [[1]], [[]])
    with pytest.raises(ValueError, match="2 contexts but 1 continuations"):
        continuation_scores(model, [[1], [2]], [[3]])
    with pytest.raises(ValueError, match="need 33 positions, more than the model's 32"):
        continuation_scores(model, [[1] * 29], [[2] * 5])
    assert len(continuation_scores(model, [[1] * 29], [[2] * 4])) == 1  # 32 positions: fits
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        continuation_scores(model, [[1]], [[2]], batch_size=0)
