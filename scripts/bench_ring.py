"""Ring attention (context parallelism) benchmark: per-rank memory and time.

python scripts/bench_ring.py --help        (the logic: flashtrain.lab.bench.ring)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.bench.ring import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
