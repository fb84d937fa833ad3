"""`python scripts/export_hf.py CKPT OUT_DIR [options]`: the command line of flashtrain.checkpoint.export_hf.

CKPT: a run directory, its checkpoints folder (the newest intact checkpoint; a damaged newer
one is passed over with a line naming it) or a step_NNNNNN folder; single-process and sharded
(FSDP2 / DCP) checkpoints alike. OUT_DIR must lie outside the run and not be a symbolic link;
--overwrite replaces only a previous export (a folder holding flashtrain_export.json) or an
empty folder. An export claims OUT_DIR while it writes (the hidden .NAME.lock beside it): a
second export of the same OUT_DIR is refused, --overwrite or not, and nothing that appears at
OUT_DIR meanwhile is replaced. Exit 2, with one line saying what to do, on bad input (a missing
or damaged checkpoint, a model with no transformers equivalent, an OUT_DIR in the run, existing,
being written by another export or appeared meanwhile, tokenizer files other than the ones the
run trained with) and on an OUT_DIR that cannot be written (permissions, a read-only file
system, a full disk: the partial export is removed).
"""

from __future__ import annotations

import argparse
import sys

from flashtrain.checkpoint.export_folder import OutDirNotWritable
from flashtrain.checkpoint.export_hf import DTYPES, export_checkpoint
from flashtrain.checkpoint.manifest import CheckpointError

# bad input, or an OUT_DIR that another export holds or the file system refuses: one line, exit 2
REFUSALS = (
    CheckpointError, ValueError, FileNotFoundError, FileExistsError, ImportError, OutDirNotWritable
)  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("checkpoint", help="a run directory, a checkpoints folder or a checkpoint")
    p.add_argument("out_dir")
    p.add_argument("--max-shard-size", default="5GB", help="safetensors shard size (default 5GB)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: as saved")
    p.add_argument("--no-tokenizer", action="store_true", help="do not write tokenizer files")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export at OUT_DIR")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        out = export_checkpoint(
            args.checkpoint,
            args.out_dir,
            max_shard_size=args.max_shard_size,
            dtype=args.dtype,
            tokenizer=not args.no_tokenizer,
            overwrite=args.overwrite,
            on_note=lambda line: print(f"export_hf: {line}", file=sys.stderr),
        )
    except REFUSALS as e:
        print(f"export_hf: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(f"exported {args.checkpoint} -> {out}")
    return 0
