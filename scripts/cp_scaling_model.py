"""A scaling model for context parallelism (ring attention).

python scripts/cp_scaling_model.py --help        (the logic: flashtrain.lab.bench.cp_scaling)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.bench.cp_scaling import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
