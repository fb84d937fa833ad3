"""Long-context layers by context-parallel mode: one rank's tokens/s and memory on one GPU.

python scripts/bench_long_context.py --help        (the logic: flashtrain.lab.bench.long_context)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.bench.long_context import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
