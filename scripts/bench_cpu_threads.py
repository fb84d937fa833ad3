"""CPU intra-op threads benchmark: step time with 1 thread, every core and the automatic choice.

python scripts/bench_cpu_threads.py --out DIR [--quick]   (the logic: flashtrain.lab.bench.cpu_threads)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.bench.cpu_threads import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
