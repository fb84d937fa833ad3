"""Sample from a trained decoder with a KV cache (flashtrain.inference.generate_cli):

python scripts/generate.py outputs/2026-01-01/12-00-00 --prompt "def " --max-new-tokens 64
python scripts/generate.py RUN --prompt "3 11 5 12 3" --temperature 0     # synthetic data
"""

import sys

from flashtrain.inference.generate_cli import main

if __name__ == "__main__":
    sys.exit(main())
