"""`python scripts/generate.py CKPT --prompt "..." [--prompt "..."] [options]`: the command line of
flashtrain.inference.generate. Only a single prompt streams: its text goes to stdout as the
tokens come (a multi-byte character once it is complete). Several prompts (different lengths,
one batch) are printed each on its own line, prompt then continuation, once all are done:
interleaved pieces of several texts on one stdout would not read as text. Either way the new
text is the new ids decoded after their prompt's (a SentencePiece tokenizer's first new word
keeps its space): run_tokenizer.decode_continuation.

Everything is checked before the first character is printed (options, device, checkpoint,
prompts, positions, the KV cache's memory): a refusal is one line on stderr and exit 2, with
nothing on stdout."""

from __future__ import annotations

import argparse
import sys

from flashtrain.checkpoint import load_model
from flashtrain.checkpoint.manifest import CheckpointError
from flashtrain.inference.cli_args import (
    OneLineParser,
    default_device,
    device,
    integer,
    number,
    print_note,
)
from flashtrain.inference.generate import Sampling, check_generation, generate
from flashtrain.inference.run_tokenizer import (
    continuation,
    decode_continuation,
    run_config,
    run_tokenizer,
)
from flashtrain.models.decoder import position_limit, require_decoder


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a checkpoint, a checkpoints folder or a run directory")
    p.add_argument("--prompt", action="append", required=True,
                   help="text to continue; token ids for synthetic data. Repeat for a batch "
                   "(a batch prints each text once all are done; one prompt streams)")  # fmt: skip
    p.add_argument("--max-new-tokens", type=integer(1), default=64,
                   help="refused beyond a learned position table or the KV cache's memory")  # fmt: skip
    p.add_argument("--temperature", type=number(">= 0 (0 = greedy)", lambda t: t >= 0),
                   default=1.0, help="0 = greedy; a tiny one samples the top tokens")  # fmt: skip
    p.add_argument("--top-k", type=integer(0, "0 = off"), default=0, help="0 = off")
    p.add_argument("--top-p", type=number("in (0, 1] (1 = off)", lambda p: 0 < p <= 1),
                   default=1.0, help="1 = off")  # fmt: skip
    p.add_argument("--seed", type=int, default=None, help="repeatable sampling")
    p.add_argument("--device", type=device, default=default_device(), help="cpu, cuda, cuda:N")
    return p


class Streamer:
    """Prints the text one sequence gains each step after its prompt. It decodes the prompt and
    all the new tokens so far together (decode_continuation: a SentencePiece-style tokenizer's
    first new word keeps its leading space) and holds back a trailing U+FFFD: with a byte-level
    tokenizer a multi-byte character arrives over several tokens, and its incomplete UTF-8 tail
    decodes as U+FFFD until it is complete. finish() prints what is still held back (bytes that
    never made a character)."""

    def __init__(self, tokenizer, out, prompt: list[int]):
        self.tokenizer, self.out, self.prompt, self.ids, self.shown = tokenizer, out, prompt, [], ""
        self.head = tokenizer.decode(prompt)  # once: the prompt's ids do not change

    def _new_text(self) -> str:
        return continuation(self.tokenizer.decode([*self.prompt, *self.ids]), self.head)

    def _write(self, text: str) -> None:
        # a tokenizer whose decoding of more ids is not an extension of what was shown (none of
        # the project's) gets its new characters from the same offset
        self.out.write(text[len(self.shown) :])
        self.out.flush()
        self.shown = text

    def __call__(self, tokens) -> None:
        if tokens[0] is None:
            return
        self.ids.append(tokens[0])
        text = self._new_text().rstrip("\ufffd")
        if len(text) > len(self.shown):
            self._write(text)

    def finish(self) -> None:
        self._write(self._new_text())


def _beyond_training_note(model, prompts, max_new_tokens: int) -> str | None:
    """Rotary positions have no table to run out of: past the length the model was trained at
    they extrapolate, which it never saw (the text usually degrades). Said, not refused."""
    total = max(map(len, prompts)) + max_new_tokens - 1
    trained = model.config.max_seq_len
    if position_limit(model) is None and total > trained:
        return (
            f"note: the longest prompt + --max-new-tokens - 1 = {total} positions, beyond the "
            f"{trained} the model was trained at: its rotary positions extrapolate there (the "
            "text usually degrades)"
        )
    return None


def main(argv=None, out=sys.stdout) -> int:
    args = _parser().parse_args(argv)  # numbers, sampling options and the device checked here
    try:  # everything else before the first character is printed
        sampling = Sampling(args.temperature, args.top_k, args.top_p)
        model, info = load_model(args.checkpoint, device=args.device, on_note=print_note)
        require_decoder(model, info.source)
        tokenizer = run_tokenizer(run_config(info).data, checkpoint=info)
        prompts = [tokenizer.encode(p) for p in args.prompt]
        check_generation(model, prompts, args.max_new_tokens, option="--max-new-tokens")
    except (ValueError, CheckpointError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    note = _beyond_training_note(model, prompts, args.max_new_tokens)
    if note:
        print(note, file=sys.stderr)
    stream = Streamer(tokenizer, out, prompts[0]) if len(prompts) == 1 else None
    if stream is not None:
        out.write(args.prompt[0])
    try:
        new = generate(model, prompts, args.max_new_tokens, sampling, seed=args.seed,
                       stop_id=tokenizer.eos_id, on_step=stream)  # fmt: skip
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if stream is not None:
        stream.finish()
        out.write("\n")
    else:
        for text, prompt, ids in zip(args.prompt, prompts, new):
            out.write(f"{text}{decode_continuation(tokenizer, prompt, ids)}\n")
    return 0
