"""Does a model trained on the synthetic recall task (the default run) recall? Prompts are
recall sequences k v k v ... k of different lengths whose last key occurred earlier; the model
completes each with one greedy token (flashtrain.inference.generate, one batch), right when it
is the value that key had. Chance is 1 / num_values; a perfect recaller scores 1.

    python -m flashtrain.inference.recall CKPT [--prompts 512] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from flashtrain.data.synthetic import recall_sequence
from flashtrain.inference.checkpoint import load_for_inference
from flashtrain.inference.generate import generate


def recall_prompts(count: int, max_len: int, num_keys: int, num_values: int, seed: int):
    """(prompts, answers): `count` sequences of odd length in [max_len / 2, max_len] ending in
    a key seen before in the sequence, and that key's value."""
    rng = np.random.default_rng(seed)
    prompts, answers = [], []
    while len(prompts) < count:
        pairs = int(rng.integers(max_len // 4, (max_len + 1) // 2))
        tokens = recall_sequence(rng, 2 * pairs + 1, num_keys, num_values)
        keys, last = tokens[0:-1:2], tokens[-1]
        seen = np.flatnonzero(keys == last)
        if seen.size:
            prompts.append(tokens.tolist())
            answers.append(int(tokens[2 * seen[0] + 1]))
    return prompts, answers


def recall_accuracy(model, num_keys: int, num_values: int, max_len: int, count: int = 512,
                    seed: int = 0, batch: int = 64) -> dict:  # fmt: skip
    """Share of prompts completed with the right value, with chance and the prompt count."""
    prompts, answers = recall_prompts(count, max_len, num_keys, num_values, seed)
    right = 0
    for start in range(0, count, batch):
        done = generate(model, prompts[start : start + batch], max_new_tokens=1)
        right += sum(out[0] == a for out, a in zip(done, answers[start : start + batch]))
    return dict(accuracy=right / count, chance=1.0 / num_values, prompts=count,
                prompt_lengths=[min(map(len, prompts)), max(map(len, prompts))])  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    loaded = load_for_inference(args.checkpoint)
    data = loaded.config.data
    if data.loader != "synthetic":
        print(f"error: {loaded.path} was trained on {data.loader} data, not synthetic recall",
              file=sys.stderr)  # fmt: skip
        return 2
    result = recall_accuracy(loaded.model, data.num_keys, data.num_values,
                             int(loaded.config.seq_len), args.prompts, args.seed)  # fmt: skip
    print(json.dumps({**loaded.facts(), **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
