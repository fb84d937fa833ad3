"""Prepare a data config's caches (tokenize a corpus, generate Pathfinder images).

python scripts/prepare_data.py --help        (the logic: flashtrain.lab.prepare_data)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.prepare_data import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
