"""The paper's long-context results in one GPU call: context length vs loss and Pathfinder
(flashtrain.lab.paper_call; docs/gpu_session.md, "The paper call"):

    python3 scripts/paper_call.py --out "$OUT" --budget-min 9       # on one GPU, ~9 minutes
    python scripts/paper_call.py --dry-run --out /tmp/paper-call     # every phase on a CPU, <1 min
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.paper_call.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
