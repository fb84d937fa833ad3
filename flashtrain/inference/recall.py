"""Does a model trained on the synthetic recall task (the default run) recall? Prompts are
recall sequences k v k v ... k of different lengths whose last key occurred earlier; the model
completes each with one greedy token (flashtrain.inference.generate, one batch), right when it
is the value that key had.

Chance (1 / num_values) is a weak baseline: a fresh key -> value table per sequence gives some
values to several keys, so "answer the value most frequent in the prompt" is right about 30% of
the time without pairing any key with its value. Two measures take that away:
    all         accuracy on all prompts, beside the modal baseline computed on the same prompts
                (the expected score of answering a most frequent value, ties split evenly)
    not_modal   accuracy on prompts whose answer is not a most frequent value of the prompt:
                the modal strategy scores 0 there, so what beats chance needs the pairing

    python -m flashtrain.inference.recall CKPT [--prompts 512] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

import numpy as np

from flashtrain.checkpoint import load_model
from flashtrain.data.synthetic import recall_sequence
from flashtrain.inference.cli_args import print_note
from flashtrain.inference.generate import generate
from flashtrain.inference.run_tokenizer import run_config


def most_frequent_values(prompt: list[int]) -> set[int]:
    """The values (odd positions) that occur most often in a prompt k v k v ... k."""
    counts = Counter(prompt[1::2])
    top = max(counts.values())
    return {value for value, n in counts.items() if n == top}


def modal_score(prompt: list[int], answer: int) -> float:
    """Expected score of answering a most frequent value of the prompt, ties drawn evenly."""
    top = most_frequent_values(prompt)
    return 1.0 / len(top) if answer in top else 0.0


def recall_prompts(count: int, max_len: int, num_keys: int, num_values: int, seed: int,
                   not_modal: bool = False):  # fmt: skip
    """(prompts, answers): `count` sequences of odd length in [max_len / 2, max_len] ending in
    a key seen before in the sequence, and that key's value; not_modal: only those whose answer
    is not a most frequent value of the prompt."""
    rng = np.random.default_rng((seed, 1) if not_modal else seed)  # the two sets differ
    prompts, answers = [], []
    while len(prompts) < count:
        pairs = int(rng.integers(max_len // 4, (max_len + 1) // 2))
        tokens = recall_sequence(rng, 2 * pairs + 1, num_keys, num_values)
        keys, last = tokens[0:-1:2], tokens[-1]
        seen = np.flatnonzero(keys == last)
        if not seen.size:
            continue
        prompt, answer = tokens.tolist(), int(tokens[2 * seen[0] + 1])
        if not_modal and answer in most_frequent_values(prompt):
            continue
        prompts.append(prompt)
        answers.append(answer)
    return prompts, answers


def _accuracy(model, prompts: list[list[int]], answers: list[int], batch: int) -> float:
    right = 0
    for start in range(0, len(prompts), batch):
        done = generate(model, prompts[start : start + batch], max_new_tokens=1)
        right += sum(out[0] == a for out, a in zip(done, answers[start : start + batch]))
    return right / len(prompts)


def recall_accuracy(model, num_keys: int, num_values: int, max_len: int, count: int = 512,
                    seed: int = 0, batch: int = 64) -> dict:  # fmt: skip
    """Greedy accuracy on `count` prompts with its chance and modal baselines on the same
    prompts, and on `count` other prompts whose answer is not a most frequent value."""
    prompts, answers = recall_prompts(count, max_len, num_keys, num_values, seed)
    hard, hard_answers = recall_prompts(count, max_len, num_keys, num_values, seed, True)
    return dict(
        accuracy=_accuracy(model, prompts, answers, batch),
        chance=1.0 / num_values,
        modal_baseline=float(np.mean([modal_score(p, a) for p, a in zip(prompts, answers)])),
        prompts=count,
        prompt_lengths=[min(map(len, prompts)), max(map(len, prompts))],
        not_modal_accuracy=_accuracy(model, hard, hard_answers, batch),
        not_modal_prompts=count,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--prompts", type=int, default=512, help="per prompt set")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    model, info = load_model(args.checkpoint, on_note=print_note)
    config = run_config(info)
    data = config.data
    if data.loader != "synthetic":
        print(f"error: {info.path} was trained on {data.loader} data, not synthetic recall",
              file=sys.stderr)  # fmt: skip
        return 2
    result = recall_accuracy(model, data.num_keys, data.num_values,
                             int(config.seq_len), args.prompts, args.seed)  # fmt: skip
    print(json.dumps({**info.facts(), **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
