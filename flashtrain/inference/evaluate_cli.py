"""`python scripts/evaluate.py CKPT --seq-len N [N ...] [--data NAME [KEY=VALUE ...]]
[--stride S] [--batches K] [--out DIR]`: perplexity and loss by token position of a checkpoint
at each context length (flashtrain.inference.evaluate), written as eval.json, eval.md and
loss_by_position.png (default folder: <run>/eval/step_NNNNNN). Lengths are token counts, 4k =
4096.

With --tasks (passkey, needle, ruler, ...), the long-context retrieval tasks at those lengths
and --depths instead (flashtrain.inference.retrieval_cli): retrieval.md, .json, the heatmap and
the curves by length, in the same folder.

--data defaults to the run's own data config; otherwise a config of the configs folder's data/
group with overrides of its keys, e.g. `--data text_files data_files='corpus/*.txt'` or `--data
pysrc`; its tokenizer must be the run's. The configs folder is --configs, by default the one
the caller names (scripts/evaluate.py: the checkout's configs/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf

from flashtrain.checkpoint import load_model
from flashtrain.checkpoint.manifest import CheckpointError
from flashtrain.data.registry import data_config
from flashtrain.inference import evaluate_output, retrieval_cli
from flashtrain.inference.cli_args import (
    OneLineParser,
    default_device,
    device,
    integer,
    print_note,
    token_count,
)
from flashtrain.inference.evaluate import check_evaluation_fits, evaluate_length
from flashtrain.inference.run_tokenizer import run_config, run_tokenizer
from flashtrain.models.decoder import position_limit, require_decoder
from flashtrain.no_space import as_no_space_error
from flashtrain.train.config import masks_documents
from flashtrain.train.entry import EXIT_NO_SPACE


def _parser(configs: Path | None) -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a checkpoint, a checkpoints folder or a run directory")
    p.add_argument("--seq-len", type=token_count(2, "a context length"), nargs="+",
                   required=True, help="context lengths, e.g. 1024 4k (refused beyond the memory free)")  # fmt: skip
    p.add_argument("--data", nargs="+", metavar=("NAME", "KEY=VALUE"),
                   help="a configs/data/ config and overrides (default: the run's data)")  # fmt: skip
    p.add_argument("--configs", type=Path, default=configs,
                   help=f"the configs folder --data composes from (default: {configs})")  # fmt: skip
    p.add_argument("--stride", type=integer(1, "tokens between sliding windows"), default=None,
                   help="sliding windows this far apart (token corpora); default: non-overlapping")  # fmt: skip
    p.add_argument("--batches", type=integer(1, "batches per length"), default=None,
                   help="at most this many batches per length (default: the whole split; 8 for synthetic)")  # fmt: skip
    p.add_argument(
        "--tokens",
        type=integer(1, "tokens per length"),
        default=None,
        help="about this many tokens per length, the same leading span of the split "
        "at every length (so lengths compare on the same text); instead of --batches",
    )
    p.add_argument("--batch-size", type=integer(1, "windows per batch"), default=8)
    p.add_argument("--buckets", type=integer(1, "position buckets"), default=16,
                   help="position buckets (log-spaced)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None,
                   help="the folder of the results (default: <run>/eval/step_NNNNNN)")  # fmt: skip
    p.add_argument("--device", type=device, default=default_device(), help="cpu, cuda, cuda:N")
    p.add_argument("--no-progress", action="store_true")
    retrieval_cli.add_arguments(p.add_argument_group("retrieval tasks (--tasks)"))
    return p


def composed_data_config(configs: Path | None, name: str, overrides: list[str]):
    """<configs>/data/<name>.yaml with KEY=VALUE overrides, composed as train.py composes it."""
    from hydra import compose, initialize_config_dir

    from flashtrain.train import register_schemas

    if configs is None or not (Path(configs) / "train.yaml").is_file():
        raise ValueError(
            f"--data composes a config of a configs folder (train.yaml and data/), and "
            f"{configs or 'none'} is not one: give --configs DIR (scripts/evaluate.py passes the "
            "checkout's configs/)"
        )
    names = sorted(p.stem for p in (Path(configs) / "data").glob("*.yaml"))
    if name not in names:
        raise ValueError(
            f"--data {name!r} is no config of {configs}/data: one of {', '.join(names)}"
        )
    bad = next((kv for kv in overrides if "=" not in kv or kv.startswith("=")), None)
    if bad is not None:
        raise ValueError(
            f"--data {name}: {bad!r} is no override: give KEY=VALUE (a key of its config)"
        )
    register_schemas()
    with initialize_config_dir(str(Path(configs).resolve()), version_base="1.3"):
        try:
            cfg = compose("train", overrides=[f"data={name}", *(f"data.{kv}" for kv in overrides)])
        except HydraException as e:
            default = compose("train", [f"data={name}"])
            raise ValueError(_override_error(name, overrides, e, default)) from e
    return OmegaConf.to_container(cfg.data, resolve=True)


def _override_error(name: str, overrides: list[str], error: Exception, default) -> str:
    """One line for an override Hydra refused: the unknown key and the keys there are, or the
    value and why (Hydra's first line, its cause's message)."""
    keys = sorted(default.data.keys())
    for kv in overrides:
        key = kv.split("=", 1)[0]
        if key.lstrip("+~").split(".")[0] not in keys:
            return f"--data {name}: unknown key {key!r}; its keys: {', '.join(keys)}"
    cause = error.__cause__ or error
    reason = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    bad = next((kv for kv in overrides if f"data.{kv}" in str(error)), None)
    if bad is None:
        return f"--data {name} {' '.join(overrides)}: {reason}"
    key, value = bad.split("=", 1)
    return f"--data {name}: cannot set {key!r} to {value!r}: {reason}"


def with_trained_masking(data: dict, overrides: list[str], run_data) -> dict:
    """--data's windows cut at document ends as the run's training batches were (the run's
    data.document_masking, as in effect), unless an override sets it: the other config's
    default would score a model trained across documents inside them, or the reverse."""
    keys = {kv.split("=", 1)[0].lstrip("+~") for kv in overrides}
    if "document_masking" not in data or "document_masking" in keys:
        return data
    return {**data, "document_masking": masks_documents(data_config(run_data))}


def check_same_tokenizer(run, data) -> None:
    """Token ids mean something only under the tokenizer that made them: refuse data tokenized
    otherwise than the run's (an id past the model's vocabulary, or silently other text)."""
    if (run.name, run.vocab_size) != (data.name, data.vocab_size):
        raise ValueError(
            f"--data is tokenized by {data.name!r} ({data.vocab_size} ids) but the checkpoint's "
            f"run by {run.name!r} ({run.vocab_size} ids): evaluate data with the run's tokenizer"
        )


def _progress(disabled: bool):
    if disabled:
        return None
    from tqdm import tqdm

    return lambda **kw: tqdm(unit="batch", file=sys.stderr, **kw)


def run(args) -> list[Path]:
    """Everything that can be checked before evaluating is: the options, the data, the output
    folder and each length's memory; then the lengths are evaluated and the files written."""
    if args.tokens is not None and args.batches is not None:
        raise ValueError("--tokens and --batches both size the evaluation: give one")
    if args.tasks and args.data:
        raise ValueError(
            "--data names text to score perplexity on; --tasks writes its own: give one"
        )
    if args.out is not None:
        evaluate_output.check_folder(args.out)
    if args.data:
        data = composed_data_config(args.configs, args.data[0], args.data[1:])
    trained_model, info = load_model(args.checkpoint, device=args.device, on_note=print_note)
    require_decoder(trained_model, info.source)
    out = args.out or info.path.parent.parent / "eval" / info.path.name
    if args.out is None:
        evaluate_output.check_folder(out)
    config = run_config(info)
    if args.tasks:
        return retrieval_cli.run_tasks(
            args, trained_model, info, config, run_tokenizer(config.data, checkpoint=info), out
        )
    if args.data:
        data = with_trained_masking(data, args.data[1:], config.data)
    else:
        data = OmegaConf.to_container(config.data, resolve=True)
    cfg = data_config(data)
    # the run's own data: checked against the tokenizer its weights were trained with
    tokenizer = run_tokenizer(data, checkpoint=None if args.data else info)
    if args.data:
        check_same_tokenizer(run_tokenizer(config.data, checkpoint=info), tokenizer)
    trained = int(config.model.max_seq_len)
    bits_per_byte = tokenizer.name.startswith("byte")
    for seq_len in args.seq_len:  # all of them before the first is evaluated
        check_evaluation_fits(trained_model, seq_len, args.batch_size, args.device)
    models = {None: trained_model}
    results = []
    for seq_len in args.seq_len:
        model, notes = trained_model, []
        limit = position_limit(trained_model)
        if limit is not None and seq_len > limit:
            mode = config.model.get("init_positions", "interpolate")
            if seq_len not in models:
                models[seq_len], _ = load_model(
                    info.path, device=args.device, max_seq_len=seq_len, position_mode=mode
                )
            model, notes = models[seq_len], [f"learned positions {mode}d from {limit}"]
        elif seq_len > trained:
            notes = [f"beyond the trained {trained} tokens"]
        batches = args.batches
        if args.tokens is not None:  # windows of seq_len (or stride) new tokens each
            step = args.stride if args.stride and args.stride < seq_len else seq_len
            batches = max(1, -(-args.tokens // (args.batch_size * step)))
        result = evaluate_length(
            model, data, seq_len, stride=args.stride, batch_size=args.batch_size,
            max_batches=batches, seed=int(config.seed), buckets=args.buckets,
            progress=_progress(args.no_progress),
            special_ids=tokenizer.special_ids if bits_per_byte else (),
        )  # fmt: skip
        result.notes += notes
        results.append(result)
    facts = {**info.facts(), "trained_seq_len": trained}
    data_facts = dict(name=cfg.name, loader=cfg.loader, split="validation")
    report = evaluate_output.payload(facts, data_facts, results, bits_per_byte)
    return evaluate_output.write(report, out)


def main(argv=None, configs: Path | None = None) -> int:
    """configs: the folder --data composes from unless --configs says otherwise (the library
    does not know where a checkout keeps it; scripts/evaluate.py passes the checkout's)."""
    args = _parser(configs).parse_args(argv)
    try:
        paths = run(args)
    except (ValueError, CheckpointError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a full disk or quota (the report, --data's token cache): one line
        no_space = as_no_space_error(e, "then run it again")
        if no_space is None:
            raise
        print(f"error: {no_space}", file=sys.stderr)
        return EXIT_NO_SPACE
    print(paths[1].read_text())
    for path in paths:
        print(f"wrote {path}")
    return 0
