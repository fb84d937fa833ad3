"""Decode-step latency against a KV cache: split-KV vs one split vs flash_attn_func vs SDPA.

python scripts/bench_decode.py --help        (the logic: flashtrain.lab.bench.decode)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.bench.decode import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
