"""Attention kernel speed and memory vs PyTorch SDPA and FlexAttention.

python scripts/bench_attention.py --help        (the logic: flashtrain.lab.bench.attention)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.bench.attention import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
