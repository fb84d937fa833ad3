"""Generate Pathfinder images, report the rate, save a PNG grid.

python scripts/make_pathfinder.py --help        (the logic: flashtrain.lab.make_pathfinder)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.make_pathfinder import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
