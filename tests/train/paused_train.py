"""train.py that, in a Slurm job's first start, waits before one step until it is asked to stop.

tests/train/test_slurm.py runs it in place of train.py (FLASHTRAIN_TRAIN_PY): a tiny run trains
its steps in a second or two, so a test could not otherwise act between two checkpoints and the
end. Before the step after PAUSE_AFTER_STEP it writes PAUSE_MARKER and waits until the rank's
PreemptionHandler has a request (SIGTERM or SIGUSR1); then the step runs as usual and the run
stops after it. A requeued start (SLURM_RESTART_COUNT > 0) does not wait. The training itself
is train.py's, unchanged.
"""

import os
import runpy
import sys
import time
from pathlib import Path

import flashtrain.train.trainer as trainer_module

TRAIN_PY = Path(__file__).resolve().parents[2] / "train.py"
PAUSE_AFTER_STEP = int(os.environ["PAUSE_AFTER_STEP"])
PAUSE_MARKER = Path(os.environ["PAUSE_MARKER"])

train_step = trainer_module.Trainer._train_step


def paused_train_step(self, preempt):
    if self.step == PAUSE_AFTER_STEP and int(os.environ.get("SLURM_RESTART_COUNT") or 0) == 0:
        PAUSE_MARKER.write_text(f"rank {os.environ.get('RANK', '0')} waits after step {self.step}")
        while not preempt.requested:
            time.sleep(0.05)
    return train_step(self, preempt)


trainer_module.Trainer._train_step = paused_train_step
sys.argv = [str(TRAIN_PY), *sys.argv[1:]]
runpy.run_path(str(TRAIN_PY), run_name="__main__")
