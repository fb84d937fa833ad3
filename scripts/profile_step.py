"""Where a training step's time goes (torch.profiler buckets).

python scripts/profile_step.py --help        (the logic: flashtrain.lab.bench.profile_step)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.bench.profile_step import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
