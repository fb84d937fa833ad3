"""`python kill_after_checkpoint.py <train.py overrides>`: train.py, whose rank KILL_RANK kills
itself (SIGKILL: no handler, no clean-up) right after checkpoint KILL_AFTER_STEP is written, in
the first start of its job only (TORCHELASTIC_RESTART_COUNT / SLURM_RESTART_COUNT 0): a worker
lost at a known point, for the restart tests, without racing a clock. The restart runs train.py
unchanged."""

import os
import runpy
import signal
import sys
from pathlib import Path

from flashtrain.train import run_state

TRAIN_PY = Path(__file__).resolve().parents[2] / "train.py"


def _first_start() -> bool:
    return all(
        os.environ.get(v, "0") == "0" for v in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
    )


if _first_start() and os.environ.get("RANK", "0") == os.environ.get("KILL_RANK", "0"):
    kill_after = int(os.environ["KILL_AFTER_STEP"])
    save = run_state.RunCheckpoints.save

    def save_then_die(self, data_state):
        path = save(self, data_state)
        if self.state.step == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return path

    run_state.RunCheckpoints.save = save_then_die

sys.argv = [str(TRAIN_PY), *sys.argv[1:]]
runpy.run_path(str(TRAIN_PY), run_name="__main__")
