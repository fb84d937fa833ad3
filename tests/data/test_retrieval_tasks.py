"""The retrieval tasks as data (flashtrain/data/retrieval): every sample is exactly its length
in tokens under each kind of tokenizer, the needle sits where its depth says (0: right after
the instructions, 1: right before the question), only the filler is cut, the answers are what
the text says, samples are reproducible per index, and bad input is one line."""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "inference"))
from tokenizer_testing import write_byte_level_tokenizer, write_metaspace_tokenizer  # noqa: E402

from flashtrain.data.retrieval.registry import TASK_GROUPS, TASKS, SampleMaker, resolve_tasks  # noqa: E402
from flashtrain.data.retrieval.text import SegmentEncoder, TaskTextError  # noqa: E402
from flashtrain.data.tokenization import ByteTokenizer, HFFolderTokenizer  # noqa: E402
from flashtrain.inference.run_tokenizer import IntegerTokenizer, TextTokenizer  # noqa: E402

LENGTHS = {task: (700, 1500) for task in TASKS} | {"passkey": (160, 777), "niah_single": (260, 901)}


@pytest.fixture(scope="module")
def byte_maker():
    return SampleMaker(SegmentEncoder(ByteTokenizer()), seed=3)


@pytest.fixture(scope="module")
def bpe_maker(tmp_path_factory):
    """A byte-level BPE with a <bos> its post-processor puts first (Llama-3's kind)."""
    folder = write_byte_level_tokenizer(tmp_path_factory.mktemp("bpe"))
    return SampleMaker(SegmentEncoder(TextTokenizer(HFFolderTokenizer(str(folder)))), seed=3)


def _text(maker, ids) -> str:
    return maker.encoder.decode(ids)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("which", ["byte_maker", "bpe_maker"])
def test_every_sample_is_exactly_its_length(task, which, request):
    maker = request.getfixturevalue(which)
    for length in LENGTHS[task]:
        for depth in (0.0, 0.37, 1.0):
            for s in maker.samples(task, length, depth, range(3)):
                assert len(s.prompt) + len(s.answer_ids) == length
                assert s.prompt[: len(maker.encoder.prefix)] == maker.encoder.prefix
                assert s.answers and all(s.answers)


@pytest.mark.parametrize("task", [t for t in TASKS if t not in ("common_words", "frequent_words")])
def test_depth_0_and_1_put_the_needle_at_the_very_start_and_end(task, byte_maker):
    """The needle asked about: after the instructions (depth 0), before the question (1)."""
    enc = byte_maker.encoder
    for depth, where in ((0.0, "start"), (1.0, "end")):
        (s,) = byte_maker.samples(task, 1500, depth, [0])
        parts = _parts(task, byte_maker, 1500, depth)
        head = len(enc.prefix) + len(enc.encode(parts.head))
        question = len(enc.encode(parts.question))
        start, end = s.needle_spans[0]
        if where == "start":
            # depth-0 needles come first; another needle drawn at depth 0 too may precede it
            before = [sp for sp in s.needle_spans if sp[0] < start]
            assert start == head + sum(b - a for a, b in before)
        else:
            after = [sp for sp in s.needle_spans if sp[0] > start]
            assert end + sum(b - a for a, b in after) == len(s.prompt) - question


def _parts(task, maker, length, depth):
    """The parts the sample was assembled from (the same seeded draw)."""
    import numpy as np

    from flashtrain.data.retrieval.families import FAMILIES
    from flashtrain.data.retrieval.registry import sample_seed
    from flashtrain.data.retrieval.sample import fixed_tokens

    family = FAMILIES[task]
    seeded = depth if family.has_depth else None
    rng = np.random.default_rng(sample_seed(maker.seed, task, length, seeded, 0))
    return family.build(rng, depth if family.has_depth else 0.0, length,
                        lambda p: fixed_tokens(p, maker.encoder))  # fmt: skip


@pytest.mark.parametrize("task", TASKS)
def test_the_filler_is_cut_never_the_needles_or_the_question(task, byte_maker):
    length = LENGTHS[task][0]
    (s,) = byte_maker.samples(task, length, 0.5, [0])
    parts = _parts(task, byte_maker, length, 0.5)
    text = _text(byte_maker, s.prompt)
    assert text.startswith(parts.head) and text.endswith(parts.question)
    for needle, (a, b) in zip(parts.needles, s.needle_spans):
        assert _text(byte_maker, s.prompt[a:b]) == needle
        assert needle in text
    assert _text(byte_maker, s.answer_ids) == parts.answer


def test_the_needle_moves_with_its_depth(byte_maker):
    starts = [
        byte_maker.samples("passkey", 2000, d, [0])[0].needle_spans[0][0]
        for d in (0, 0.25, 0.5, 0.75, 1)
    ]
    assert starts == sorted(starts) and len(set(starts)) == 5
    room = 2000 - (starts[-1] - starts[0])  # the filler's share lies between depths 0 and 1
    assert abs((starts[2] - starts[0]) - (starts[-1] - starts[0]) / 2) <= 1, room


def test_the_answers_are_what_the_text_says(byte_maker):
    text = lambda s: _text(byte_maker, s.prompt)
    (s,) = byte_maker.samples("passkey", 600, 0.5, [0])
    assert f"The pass key is {s.answers[0]}." in text(s)
    (s,) = byte_maker.samples("niah_multivalue", 1500, 0.5, [0])
    word = re.search(r"numbers for (\w+) mentioned", text(s)).group(1)
    assert sorted(re.findall(rf"magic number for {word} is: (\d+)", text(s))) == sorted(s.answers)
    (s,) = byte_maker.samples("variable_tracking", 1500, 0.2, [0])
    value = re.search(r"assigned the value (\d+) in", text(s)).group(1)
    names = {re.search(rf"VAR (\w+) = {value}\.", text(s)).group(1)}
    for a, b in re.findall(r"VAR (\w+) = VAR (\w+)\.", text(s)):
        if b in names:
            names.add(a)
    assert names == set(s.answers)
    (s,) = byte_maker.samples("common_words", 3000, None, [0])
    words = re.findall(r"\d+\. (\w+)", text(s))
    counts = collections.Counter(words)
    top = [w for w, _ in counts.most_common(5)]
    assert set(top) == set(s.answers) and counts.most_common(6)[4][1] > counts.most_common(6)[5][1]
    (s,) = byte_maker.samples("frequent_words", 3000, None, [0])
    coded = text(s).split("count how often each coded word occurs.")[1].split(" Question:")[0]
    counts = collections.Counter(w for w in coded.split() if w.isalpha())
    assert [w for w, _ in counts.most_common(3)] == list(s.answers)


def test_samples_are_seeded_per_index(byte_maker):
    """Sample i is the same whichever share asks for it (a rank's); other indices differ."""
    whole = byte_maker.samples("needle", 800, 0.5, range(4))
    share = byte_maker.samples("needle", 800, 0.5, [1, 3])
    assert [s.prompt for s in share] == [whole[1].prompt, whole[3].prompt]
    assert len({tuple(s.prompt) for s in whole}) == 4
    other = SampleMaker(byte_maker.encoder, seed=4).samples("needle", 800, 0.5, [1])
    assert other[0].prompt != whole[1].prompt


def test_real_text_filler_from_the_users_files(tmp_path):
    (tmp_path / "a.txt").write_text(
        "Alice was beginning to get very tired of sitting by her sister. " * 20
    )
    maker = SampleMaker(SegmentEncoder(ByteTokenizer()), filler_files=[str(tmp_path / "*.txt")])
    (s,) = maker.samples("needle", 3000, 0.5, [0])  # longer than the file: it repeats
    assert (
        "Alice was beginning" in _text(maker, s.prompt)
        and len(s.prompt) + len(s.answer_ids) == 3000
    )
    with pytest.raises(ValueError, match="match no file"):
        SampleMaker(maker.encoder, filler_files=[str(tmp_path / "*.md")]).samples(
            "needle", 900, 0.5, [0]
        )


def test_names_and_groups():
    assert resolve_tasks("passkey,ruler,passkey") == ["passkey", *TASK_GROUPS["ruler"]]
    assert resolve_tasks(["all"]) == list(TASKS)
    with pytest.raises(
        ValueError,
        match=r"unknown retrieval task 'needles': the tasks are passkey, needle, .*ruler",
    ):
        resolve_tasks("passkey,needles")


def test_too_short_a_length_names_the_least_that_fits(byte_maker):
    with pytest.raises(
        ValueError, match=r"task passkey needs at least (\d+) tokens .* ask for \1 or more"
    ):
        byte_maker.samples("passkey", 100, 0.5, [0])
    with pytest.raises(ValueError, match="task common_words needs a list of >= 30 words"):
        byte_maker.samples("common_words", 300, None, [0])
    with pytest.raises(ValueError, match=r"a depth in \[0, 1\]"):
        byte_maker.samples("passkey", 500, 1.5, [0])


def test_a_tokenizer_that_cannot_write_the_text_is_one_line(tmp_path):
    with pytest.raises(
        TaskTextError, match="synthetic .integer token ids.; evaluate them on a run trained on text"
    ):
        SegmentEncoder(IntegerTokenizer(16))
    # a SentencePiece-style BPE that knows a few words: digits become its <unk>
    folder = write_metaspace_tokenizer(tmp_path / "sp")
    maker = SampleMaker(SegmentEncoder(TextTokenizer(HFFolderTokenizer(str(folder)))))
    with pytest.raises(
        TaskTextError, match=r"cannot encode the task text .*: it has no token for '\w'"
    ):
        maker.samples("passkey", 800, 0.5, [0])


def test_the_training_loader_scores_only_the_answers_and_resumes():
    from flashtrain.data.registry import build_data

    def data(**cfg):
        return build_data(dict(loader="retrieval", **cfg), seq_len=256, micro_batch_size=3,
                          seed=7, eval_batches=1)  # fmt: skip

    module = data()
    batch = next(module.train_batches())
    assert batch["input_ids"].shape == batch["labels"].shape == (3, 256)
    lengths = set()
    for ids, labels in zip(batch["input_ids"], batch["labels"]):
        kept = labels[labels != -100].tolist()
        real = [i for i in ids.tolist() if i != 257]  # then <pad> to the window's end
        assert ids.tolist() == real + [257] * (256 - len(real))
        # the sample's last token is no input when the sample fills the window
        text = bytes(real + ([kept[-1]] if labels[len(real) - 1] != -100 else [])).decode()
        key = re.search(r"The pass key is (\d{5})\. Remember", text).group(1)
        assert bytes(kept).decode() == " " + key  # the answer's tokens, nothing else
        assert text.endswith("The pass key is " + key)  # the sample ends with its answer
        lengths.add(len(real) + 1)
    assert len(lengths) == 3 and all(128 <= n <= 257 for n in lengths)  # lengths drawn
    state = module.state_dict()
    second = next(module.train_batches())
    resumed = data()
    resumed.load_state_dict(state)
    assert next(resumed.train_batches())["input_ids"].equal(second["input_ids"])
    val = next(iter(module.val_batches()))["input_ids"]
    assert not val.equal(batch["input_ids"]) and val.equal(
        next(iter(data().val_batches()))["input_ids"]
    )
    everything = next(data(loss_on="all").train_batches())
    real = everything["input_ids"] != 257
    scored = everything["labels"] != -100
    assert (scored[:, :-1] == real[:, 1:]).all() and scored[:, 0].all()  # every token but <pad>
    with pytest.raises(ValueError, match="task passkey needs at least"):
        build_data(
            dict(loader="retrieval"), seq_len=100, micro_batch_size=1, seed=0, eval_batches=1
        )
