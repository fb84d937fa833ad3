"""`python scripts/evaluate.py CKPT --seq-len N [N ...] [--data NAME [KEY=VALUE ...]]
[--stride S] [--batches K] [--out DIR]`: perplexity and loss by token position of a checkpoint
at each context length (flashtrain.inference.evaluate), written as eval.json, eval.md and
loss_by_position.png (default folder: <run>/eval/step_NNNNNN).

--data defaults to the run's own data config; otherwise a config of the configs folder's data/
group with overrides of its keys, e.g. `--data text_files data_files='corpus/*.txt'` or `--data
pysrc`; its tokenizer must be the run's. The configs folder is --configs, by default the one
the caller names (scripts/evaluate.py: the checkout's configs/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from flashtrain.checkpoint import load_model
from flashtrain.checkpoint.manifest import CheckpointError
from flashtrain.data.registry import data_config
from flashtrain.inference import evaluate_output
from flashtrain.inference.evaluate import evaluate_length
from flashtrain.inference.generate import position_limit
from flashtrain.inference.run_tokenizer import run_config, run_tokenizer


def _parser(configs: Path | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("checkpoint", help="a checkpoint, a checkpoints folder or a run directory")
    p.add_argument("--seq-len", type=int, nargs="+", required=True, help="context lengths")
    p.add_argument("--data", nargs="+", metavar=("NAME", "KEY=VALUE"),
                   help="a configs/data/ config and overrides (default: the run's data)")  # fmt: skip
    p.add_argument("--configs", type=Path, default=configs,
                   help=f"the configs folder --data composes from (default: {configs})")  # fmt: skip
    p.add_argument("--stride", type=int, default=None,
                   help="sliding windows this far apart (token corpora); default: non-overlapping")  # fmt: skip
    p.add_argument("--batches", type=int, default=None,
                   help="at most this many batches per length (default: the whole split; 8 for synthetic)")  # fmt: skip
    p.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="about this many tokens per length, the same leading span of the split "
        "at every length (so lengths compare on the same text); instead of --batches",
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--buckets", type=int, default=16, help="position buckets (log-spaced)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-progress", action="store_true")
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
    register_schemas()
    with initialize_config_dir(str(Path(configs).resolve()), version_base="1.3"):
        cfg = compose("train", overrides=[f"data={name}", *(f"data.{kv}" for kv in overrides)])
    return OmegaConf.to_container(cfg.data, resolve=True)


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
    if args.tokens is not None and args.batches is not None:
        raise ValueError("--tokens and --batches both size the evaluation: give one")
    trained_model, info = load_model(args.checkpoint, device=args.device)
    config = run_config(info)
    if args.data:
        data = composed_data_config(args.configs, args.data[0], args.data[1:])
    else:
        data = OmegaConf.to_container(config.data, resolve=True)
    cfg = data_config(data)
    tokenizer = run_tokenizer(data)
    if args.data:
        check_same_tokenizer(run_tokenizer(config.data), tokenizer)
    trained = int(config.model.max_seq_len)
    bits_per_byte = tokenizer.name.startswith("byte")
    models = {None: trained_model}
    results = []
    for seq_len in args.seq_len:
        if seq_len < 2:
            raise ValueError(f"--seq-len values must be >= 2, got {seq_len}")
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
    out = args.out or info.path.parent.parent / "eval" / info.path.name
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
    print(paths[1].read_text())
    for path in paths:
        print(f"wrote {path}")
    return 0
