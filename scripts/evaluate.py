"""Perplexity and loss by token position of a checkpoint at several context lengths
(flashtrain.inference.evaluate_cli; --data composes from this checkout's configs/):

    python scripts/evaluate.py outputs/2026-01-01/12-00-00 --seq-len 128 256 512
    python scripts/evaluate.py RUN --data pysrc --seq-len 1024 --stride 256 --out eval/pysrc
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.inference.evaluate_cli import main  # noqa: E402
from flashtrain.lab.checkout import CONFIGS  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(configs=CONFIGS))
