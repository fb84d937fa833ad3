"""Scoring the retrieval tasks (flashtrain/tasks): planted answerers give 100%, 0% and the
heatmap they imply; the grid's per-rank shares add up to the whole; the likelihood and the
generation scores are what greedy decoding does; the report holds the grid and draws it."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from flashtrain.data.retrieval.registry import SampleMaker
from flashtrain.data.retrieval.sample import RetrievalSample
from flashtrain.data.retrieval.text import SegmentEncoder
from flashtrain.data.tokenization import ByteTokenizer
from flashtrain.inference.generate import generate
from flashtrain.inference.task_answers import GeneratingAnswerer
from flashtrain.models import build_model
from flashtrain.tasks import report
from flashtrain.tasks.grid import GridSpec, grid_tokens, parse_depths, parse_lengths, run_grid
from flashtrain.tasks.scoring import LikelihoodAnswerer, SampleScore, match_score

ENCODER = SegmentEncoder(ByteTokenizer())
DEPTHS = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]


class AlwaysRight:
    """Answers with the reference text itself, scored as generated text is."""

    def answer(self, samples):
        return [
            SampleScore(match_score(" " + ", ".join(s.answers) + ".", s.answers)) for s in samples
        ]


class AlwaysWrong:
    """Answers with each reference short of its last character."""

    def answer(self, samples):
        return [
            SampleScore(match_score(" " + ", ".join(a[:-1] for a in s.answers), s.answers))
            for s in samples
        ]


class FirstHalf:
    """Right only when the needle asked about lies in the first half of the prompt."""

    def answer(self, samples):
        return [SampleScore(float(s.needle_spans[0][0] < len(s.prompt) / 2)) for s in samples]


def _grid(answerer, tasks=("passkey", "niah_multivalue", "common_words"), samples=3):
    spec = GridSpec(list(tasks), [1024, 2048], DEPTHS, samples)
    return spec, run_grid(spec, SampleMaker(ENCODER, seed=1), answerer)


def test_planted_answers_score_100_and_0_percent():
    for answerer, expected in ((AlwaysRight(), 1.0), (AlwaysWrong(), 0.0)):
        spec, cells = _grid(answerer)
        assert len(cells) == len(spec.cells()) == 2 * (6 + 6 + 1)
        assert all(c.samples == 3 and c.accuracy == expected for c in cells)


def test_right_in_the_first_half_only_gives_that_heatmap(tmp_path):
    spec, cells = _grid(FirstHalf(), tasks=("passkey", "needle"))
    facts = dict(run="planted", step=7, checkpoint="none", commit="0" * 12, trained_seq_len=1024)
    rep = report.payload(facts, dict(score="likelihood", samples=3, seed=1), cells)
    for task in ("passkey", "needle"):
        grid = rep["tasks"][task]["accuracy"]  # [length][depth]
        assert grid == [[1.0, 1.0, 1.0, 0.0, 0.0, 0.0]] * 2
        assert rep["tasks"][task]["by_length"] == [0.5, 0.5]
    paths = report.write(rep, tmp_path / "out")
    assert [p.name for p in paths] == list(report.FILES)
    assert json.loads(paths[0].read_text())["tasks"]["passkey"]["accuracy"] == grid
    md = paths[1].read_text()
    assert "| 1k | 100 | 100 | 100 | 0 | 0 | 0 | 50 |" in md
    from matplotlib.image import imread

    assert imread(paths[2]).shape[0] > 200 and imread(paths[3]).shape[1] > 200


def test_rank_shares_add_up_to_the_whole_cell():
    """Each rank scores samples rank, rank + world, ...; the reduced sums are the cell's."""
    spec = GridSpec(["passkey", "frequent_words"], [1024], [0.0, 1.0], 5)
    maker = SampleMaker(ENCODER, seed=2)
    whole = run_grid(spec, maker, FirstHalf())
    other = run_grid(spec, maker, FirstHalf(), rank=1, world_size=2)
    flat = [v for c in other for v in (c.samples, c.correct, c.logprob, c.answer_tokens)]
    reduce = lambda mine: [a + b for a, b in zip(mine, flat)]
    shared = run_grid(spec, maker, FirstHalf(), rank=0, world_size=2, reduce=reduce)
    assert [c.samples for c in other] == [2, 2, 2] and [c.samples for c in shared] == [5, 5, 5]
    assert [(c.samples, c.correct) for c in shared] == [(c.samples, c.correct) for c in whole]


def test_match_score_is_rulers_string_match():
    assert match_score(" 12345.", ("12345",)) == 1.0
    assert match_score(" 123451234", ("12345",)) == 1.0  # went on past the key: still written
    assert match_score(" 1234", ("12345",)) == 0.0
    assert match_score(" a1 and B2", ("A1", "B2", "C3", "D4")) == 0.5


def test_lengths_and_depths_spellings():
    assert parse_lengths("1k,4k,16k") == [1024, 4096, 16384] and parse_lengths([300, "2k"]) == [
        300,
        2048,
    ]
    assert parse_depths("0:1:11")[:3] == [0.0, 0.1, 0.2] and len(parse_depths("0:1:11")) == 11
    assert parse_depths("0,0.5,1") == [0.0, 0.5, 1.0]
    for bad, match in (("4q", "not a token count"), ("", "no length")):
        with pytest.raises(ValueError, match=match):
            parse_lengths(bad)
    for bad in ("0:1", "0:2:3", "x", "-0.5"):
        with pytest.raises(ValueError, match="depths"):
            parse_depths(bad)
    spec = GridSpec(["passkey", "common_words"], [1024, 2048], [0.0, 1.0], 3)
    assert grid_tokens(spec) == 3 * (2 * 1024 + 2 * 2048 + 1024 + 2048)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
               max_seq_len=1024, vocab_size=258, rope_theta=10000.0)  # fmt: skip
    model = build_model(cfg, "flash").eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)  # a next token that depends on the context
    return model


def _planted(sample: RetrievalSample, answer_ids: list[int], answers: tuple[str, ...]):
    return RetrievalSample(sample.task, sample.length, sample.depth, sample.prompt, answer_ids,
                           answers, sample.needle_spans)  # fmt: skip


def test_likelihood_scores_what_greedy_decoding_produces(tiny, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    samples = SampleMaker(ENCODER, seed=5).samples("passkey", 300, 0.5, range(3))
    greedy = generate(tiny, [s.prompt for s in samples], 6)
    right = [_planted(s, g, ("x",)) for s, g in zip(samples, greedy)]
    wrong = [_planted(s, [*g[:5], (g[5] + 1) % 256], ("x",)) for s, g in zip(samples, greedy)]
    scores = LikelihoodAnswerer(tiny, batch_size=2).answer(right + wrong)
    assert [s.correct for s in scores] == [1.0] * 3 + [0.0] * 3
    # the log-probability is the float64 reference's
    ref = build_model(tiny.config, "reference").double().eval()
    ref.load_state_dict(tiny.state_dict())
    s = right[0]
    ids = torch.tensor([s.prompt + s.answer_ids])
    with torch.no_grad():
        logp = torch.log_softmax(ref.logits(ids[:, :-1]), dim=-1)[0]
    expected = sum(logp[len(s.prompt) - 1 + i, t].item() for i, t in enumerate(s.answer_ids))
    assert math.isclose(scores[0].logprob, expected, rel_tol=1e-4, abs_tol=1e-4)
    assert scores[0].answer_tokens == 6


def test_generation_scores_the_decoded_text(tiny, monkeypatch):
    """The generated continuation, decoded after its prompt, holds the planted answer or not."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    samples = SampleMaker(ENCODER, seed=6).samples("passkey", 300, 0.5, range(2))
    greedy = generate(tiny, [s.prompt for s in samples], 6)
    texts = [ENCODER.decode(g) for g in greedy]
    words = [next(iter(re.findall("[0-9A-Za-z]+", t)), None) for t in texts]
    planted = [_planted(s, g, (w,)) for s, g, w in zip(samples, greedy, words) if w]
    assert planted, texts  # the seed's model writes a word somewhere in six bytes
    answerer = GeneratingAnswerer(tiny, ENCODER, batch_size=2)
    assert [s.correct for s in answerer.answer(planted)] == [1.0] * len(planted)
    missing = [_planted(s, s.answer_ids, ("qqqqqqqq",)) for s in planted]
    assert [s.correct for s in answerer.answer(missing)] == [0.0] * len(planted)
