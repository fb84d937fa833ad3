"""LM-head loss benchmark: fused, chunked, compiled, Liger and plain cross-entropy.

python scripts/bench_loss.py --help        (the logic: flashtrain.lab.bench.loss)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.bench.loss import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
