"""Reproduce one of the FlashAttention paper's experiments at a chosen scale.

python scripts/reproduce.py --help        (the logic: flashtrain.lab.reproduce)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.reproduce import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
