"""The whole GPU protocol in one command, results streamed into --out.

python scripts/gpu_suite.py --help        (the logic: flashtrain.lab.gpu_suite.cli)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.gpu_suite.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
