"""Export a checkpoint as a folder transformers' from_pretrained loads (flashtrain.checkpoint.export_cli):

python scripts/export_hf.py outputs/2026-01-01/12-00-00 my-model
python scripts/export_hf.py RUN/checkpoints/step_002000 my-model --dtype bfloat16
"""

import sys

from flashtrain.checkpoint.export_cli import main

if __name__ == "__main__":
    sys.exit(main())
