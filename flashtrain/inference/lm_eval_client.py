"""flashtrain checkpoints as an lm-evaluation-harness model type, `flashtrain`:

    from flashtrain.inference import lm_eval_client
    lm_eval_client.register()   # then: lm_eval --model flashtrain --model_args pretrained=RUN
    lm = lm_eval_client.FlashtrainLM(pretrained="outputs/RUN", batch_size=8)

The model loads as generate and evaluate load it (load_model, the run's own tokenizer: no
export). Text is encoded as lm-eval's Hugging Face backend does (its `_encode_pair`) with no
special tokens, an empty context and each rolling window start with <eos>, and requests too long
for the model lose tokens from the left. Generation is greedy only, through the KV-cache decode
path. lm-eval is optional: only scripts/lm_eval.py and the tests import this module, and
registering is asked for (register()), never done on import.
"""

from __future__ import annotations

import argparse
import json

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import normalize_gen_kwargs
    from lm_eval.utils import (
        get_rolling_token_windows,
        make_disjoint_window,
        simple_parse_args_string,
    )
except ImportError:
    raise ImportError(
        "the lm-evaluation-harness is not installed: pip install -e '.[lm_eval]'"
    ) from None
from tqdm import tqdm

from flashtrain.checkpoint import CheckpointError, load_model
from flashtrain.data.tokenization import HFFolderTokenizer
from flashtrain.inference import cli_args
from flashtrain.inference.generate import Sampling, generate
from flashtrain.inference.run_tokenizer import (
    IntegerTokenizer,
    decode_continuation,
    run_config,
    run_tokenizer,
)
from flashtrain.models.decoder import position_limit, require_decoder
from flashtrain.models.likelihood import continuation_scores

MODEL_ARGS = ("pretrained", "device", "batch_size", "max_length")


class FlashtrainModelError(ValueError):
    """Bad model_args, a run lm-eval cannot score, or a request this model cannot answer."""


def register() -> None:
    """Registers FlashtrainLM as lm-eval's model type `flashtrain` (again: nothing changes)."""
    register_model("flashtrain")(FlashtrainLM)


class FlashtrainLM(LM):
    """A trained flashtrain decoder and its run's tokenizer, answering lm-eval's requests."""

    def __init__(self, pretrained=None, device=None, batch_size=1, max_length=None,
                 max_batch_size=None, **unknown):  # fmt: skip
        # max_batch_size: lm-eval passes it for batch_size=auto, which is refused below
        super().__init__()
        if unknown:
            raise FlashtrainModelError(
                f"unknown model_args {', '.join(sorted(unknown))}; allowed: {', '.join(MODEL_ARGS)}"
            )
        if not pretrained:
            raise FlashtrainModelError(
                "model_args needs pretrained=<checkpoint, checkpoints folder or run directory>"
            )
        self.batch_size = _positive_int("batch_size", batch_size)
        try:
            self._device = cli_args.device(str(device or cli_args.default_device()))
            self.model, info = load_model(str(pretrained), device=self._device)
            require_decoder(self.model, info.source)
            self.tokenizer = run_tokenizer(run_config(info).data, checkpoint=info)
        except (ValueError, CheckpointError, FileNotFoundError, argparse.ArgumentTypeError) as e:
            raise FlashtrainModelError(str(e)) from None
        if isinstance(self.tokenizer, IntegerTokenizer):
            raise FlashtrainModelError(
                f"{info.source} was trained on synthetic token ids, which no text encodes to: "
                "lm-eval needs a run trained on a text corpus"
            )
        if self.tokenizer.eos_id is None:
            raise FlashtrainModelError(
                f"the run's tokenizer {self.tokenizer.name} has no <eos>, which lm-eval needs "
                "to start an empty context: name one with data.eos_token"
            )
        self._max_length = self._usable_length(max_length, run_config(info).model.max_seq_len)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """model_args' own keys win over lm-eval's --device and --batch_size, which its command
        line always passes (defaults cuda:0 and 1)."""
        given = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(**{**given, **arg_dict})

    def _usable_length(self, asked, trained: int) -> int:
        """max_length=, within a learned position table; by default the table's length, or the
        length the run trained at for rotary positions (which have no table)."""
        limit = position_limit(self.model)
        if asked is None:
            return limit if limit is not None else int(trained)
        asked = _positive_int("max_length", asked)
        if limit is not None and asked > limit:
            raise FlashtrainModelError(
                f"max_length={asked} is beyond the model's {limit} learned positions: at most {limit}"
            )
        return asked

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name

    def encode(self, text: str) -> list[int]:
        """The ids of `text` with no special tokens (an hf: folder's own would add a <bos>)."""
        inner = self.tokenizer.inner
        if isinstance(inner, HFFolderTokenizer):
            return inner.backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text)

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids) as lm-eval's causal backends split them: the
        context's trailing whitespace belongs to the continuation, and the continuation is what
        encoding both together adds (a BPE may merge across the boundary)."""
        if not context:
            ids, eos = self.encode(continuation), self.eot_token_id
            # as lm-eval's: <eos> stands for the context, unless the text already starts with it
            return (ids[:1], ids[1:]) if ids[:1] == [eos] else ([eos], ids)
        stripped = context.rstrip()
        continuation = context[len(stripped) :] + continuation
        whole, context_ids = self.encode(stripped + continuation), self.encode(stripped)
        return context_ids, whole[len(context_ids) :]

    def _fitted(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """The pair cut from the left to max_length positions (context + continuation - 1)."""
        if len(continuation) > self.max_length:
            raise FlashtrainModelError(
                f"a continuation of {len(continuation)} tokens is longer than the model's "
                f"max_length {self.max_length}: no context would fit before it"
            )
        return context[-(self.max_length + 1 - len(continuation)) :], continuation

    def _scores(self, pairs, disable_tqdm: bool, what: str):
        pairs = [self._fitted(c, k) for c, k in pairs]
        with tqdm(total=len(pairs), disable=disable_tqdm, desc=f"flashtrain {what}") as bar:
            try:
                return continuation_scores(
                    self.model, [c for c, _ in pairs], [k for _, k in pairs],
                    batch_size=self.batch_size, on_batch=bar.update,
                )  # fmt: skip
            except ValueError as e:  # an empty continuation: which request, and why
                raise FlashtrainModelError(f"{what} requests: {e}") from None

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self.encode_pair(*request.args) for request in requests]
        return [(s.logprob, s.greedy) for s in self._scores(pairs, disable_tqdm, "loglikelihood")]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood over lm-eval's disjoint windows of max_length tokens."""
        windows, owners = [], []
        for i, request in enumerate(requests):
            for window in get_rolling_token_windows(
                token_list=self.encode(request.args[0]), prefix_token=self.eot_token_id,
                max_seq_len=self.max_length, context_len=1,
            ):  # fmt: skip
                windows.append(make_disjoint_window(window))
                owners.append(i)
        totals = [0.0] * len(requests)
        for i, score in zip(owners, self._scores(windows, disable_tqdm, "rolling")):
            totals[i] += score.logprob
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, batched among requests of equal gen_kwargs, longest first,
        each cut at its first stop string."""
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            settings = json.dumps(request.args[1], sort_keys=True, default=str)
            groups.setdefault(settings, []).append(i)
        texts: list[str] = [""] * len(requests)
        with tqdm(total=len(requests), disable=disable_tqdm, desc="flashtrain generate") as bar:
            for indices in groups.values():
                until, max_new = self._greedy_settings(requests[indices[0]].args[1])
                prompts = {i: self._prompt(requests[i].args[0], max_new) for i in indices}
                order = sorted(indices, key=lambda i: -len(prompts[i]))
                for start in range(0, len(order), self.batch_size):
                    rows = order[start : start + self.batch_size]
                    new = self._greedy([prompts[i] for i in rows], max_new)
                    for i, ids in zip(rows, new):
                        texts[i] = _cut(decode_continuation(self.tokenizer, prompts[i], ids), until)
                    bar.update(len(rows))
        return texts

    def _greedy_settings(self, gen_kwargs: dict) -> tuple[list[str], int]:
        """(stop strings, max new tokens) of a request's gen_kwargs, as lm-eval reads them."""
        kwargs = normalize_gen_kwargs(gen_kwargs, default_max_gen_toks=256)
        if kwargs["do_sample"]:
            raise FlashtrainModelError(
                f"gen_kwargs {gen_kwargs} ask for sampling; the flashtrain model decodes "
                "greedily only: do_sample false, temperature 0"
            )
        if not 1 <= kwargs["max_gen_toks"] < self.max_length:
            raise FlashtrainModelError(
                f"max_gen_toks={kwargs['max_gen_toks']}: allowed 1..{self.max_length - 1} "
                f"(the model's max_length {self.max_length} minus at least one prompt token)"
            )
        return [s for s in kwargs["until"] if s], kwargs["max_gen_toks"]

    def _greedy(self, prompts: list[list[int]], max_new: int) -> list[list[int]]:
        try:
            return generate(self.model, prompts, max_new, Sampling(temperature=0.0),
                            stop_id=self.eot_token_id)  # fmt: skip
        except ValueError as e:  # the KV cache does not fit the device's memory
            raise FlashtrainModelError(f"generate_until: {e}") from None

    def _prompt(self, context: str, max_new: int) -> list[int]:
        """The context's ids cut from the left so that they and max_new tokens fit max_length;
        an empty one is <eos> (generation needs a token to start from)."""
        return self.encode(context)[-(self.max_length - max_new) :] or [self.eot_token_id]


def _cut(text: str, until: list[str]) -> str:
    """text up to its first stop string."""
    for stop in until:
        text = text.split(stop)[0]
    return text


def _positive_int(name: str, value) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or str(number) != str(value).strip():
        raise FlashtrainModelError(f"{name}={value!r}: allowed a whole number >= 1")
    return number
