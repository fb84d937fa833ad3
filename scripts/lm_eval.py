"""lm-evaluation-harness on flashtrain checkpoints: lm-eval's own command line, with the model
type `flashtrain` registered first (flashtrain.inference.lm_eval_client; docs/lm_eval.md):

    python scripts/lm_eval.py --model flashtrain --model_args pretrained=outputs/RUN,device=cuda \
        --tasks lambada_openai --batch_size 8
    python scripts/lm_eval.py --model flashtrain --model_args pretrained=RUN --tasks my_task \
        --include_path my_tasks/ --limit 20
"""

import sys
from pathlib import Path

# This checkout in place of scripts/, whose lm_eval.py (this file) would shadow the harness.
sys.path[0] = str(Path(__file__).resolve().parents[1])

try:
    from flashtrain.inference.lm_eval_client import FlashtrainModelError, register
except ImportError as e:  # lm-eval not installed: the client says what to install
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
from lm_eval.__main__ import cli_evaluate  # noqa: E402

if __name__ == "__main__":
    register()
    try:
        cli_evaluate()
    except FlashtrainModelError as e:  # bad model_args, a run it cannot score: one line
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
