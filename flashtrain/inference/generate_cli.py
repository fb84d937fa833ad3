"""`python scripts/generate.py CKPT --prompt "..." [--prompt "..."] [options]`: the command line of
flashtrain.inference.generate. One prompt streams its tokens to stdout as they come; several
(different lengths, one batch) are printed each on its own line once all are done."""

from __future__ import annotations

import argparse
import sys

import torch

from flashtrain.inference.checkpoint import load_for_inference
from flashtrain.inference.generate import Sampling, generate
from flashtrain.train.checkpoint_manifest import CheckpointError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("checkpoint", help="a checkpoint, a checkpoints folder or a run directory")
    p.add_argument("--prompt", action="append", required=True,
                   help="text to continue (repeat for a batch); token ids for synthetic data")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--seed", type=int, default=None, help="repeatable sampling")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p


class _Streamer:
    """Prints the text one sequence gains each step (decoding all its tokens so far, so a
    multi-byte character appears once it is complete)."""

    def __init__(self, tokenizer, out):
        self.tokenizer, self.out, self.ids, self.shown = tokenizer, out, [], ""

    def __call__(self, tokens):
        if tokens[0] is None:
            return
        self.ids.append(tokens[0])
        text = self.tokenizer.decode(self.ids)
        self.out.write(text[len(self.shown) :])
        self.out.flush()
        self.shown = text


def main(argv=None, out=sys.stdout) -> int:
    args = _parser().parse_args(argv)
    try:
        sampling = Sampling(args.temperature, args.top_k, args.top_p)
        loaded = load_for_inference(args.checkpoint, args.device)
        tokenizer = loaded.tokenizer
        prompts = [tokenizer.encode(p) for p in args.prompt]
    except (ValueError, CheckpointError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stream = _Streamer(tokenizer, out) if len(prompts) == 1 else None
    if stream is not None:
        out.write(args.prompt[0])
    try:
        new = generate(loaded.model, prompts, args.max_new_tokens, sampling, seed=args.seed,
                       stop_id=tokenizer.eos_id, on_step=stream)  # fmt: skip
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if stream is not None:
        out.write("\n")
    else:
        for text, ids in zip(args.prompt, new):
            out.write(f"{text}{tokenizer.decode(ids)}\n")
    return 0
