"""Export a flashtrain checkpoint as a Hugging Face transformers folder.

    python scripts/export_hf.py CHECKPOINT OUT_DIR [--max-shard-size 5GB] [--dtype bfloat16]
                                [--no-tokenizer] [--overwrite]

CHECKPOINT: a step_NNNNNN folder, or a run's checkpoints folder (its newest intact checkpoint);
single-process and sharded (FSDP2 / DCP) checkpoints alike. The logic: flashtrain/hf/export.py.
"""

from __future__ import annotations

import argparse
import sys

from flashtrain.hf.export import DTYPES, export_checkpoint
from flashtrain.train.checkpoint import CheckpointError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("checkpoint")
    p.add_argument("out_dir")
    p.add_argument("--max-shard-size", default="5GB", help="safetensors shard size (default 5GB)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: as saved")
    p.add_argument("--no-tokenizer", action="store_true", help="do not write tokenizer files")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    args = p.parse_args(argv)
    try:
        out = export_checkpoint(
            args.checkpoint,
            args.out_dir,
            max_shard_size=args.max_shard_size,
            dtype=args.dtype,
            tokenizer=not args.no_tokenizer,
            overwrite=args.overwrite,
        )
    except (CheckpointError, ValueError, FileNotFoundError, FileExistsError, ImportError) as e:
        print(f"export_hf: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(f"exported {args.checkpoint} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
