"""Perplexity and loss by token position of a checkpoint at several context lengths
(flashtrain.inference.evaluate_cli):

    python scripts/evaluate.py outputs/2026-01-01/12-00-00 --seq-len 128 256 512
    python scripts/evaluate.py RUN --data pysrc --seq-len 1024 --stride 256 --out eval/pysrc
"""

import sys

from flashtrain.inference.evaluate_cli import main

if __name__ == "__main__":
    sys.exit(main())
