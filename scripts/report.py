"""Write experiment reports (markdown and plots) from run folders.

python scripts/report.py --help        (the logic: flashtrain.lab.reports.build)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, installed or not

from flashtrain.lab.reports.build import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
