"""Test-wide setup.

On machines without CUDA the Triton kernels run through the interpreter: TRITON_INTERPRET must be
set before triton is first imported, hence here at collection time.

Nested @triton.jit calls skip the interpreter's redundant re-patching (interpreter_speed.py).
The kernel tests launch kernels without an op's route check, so the interpreter's fix for an old
triton under a new numpy (flashtrain.kernels.interpreter_compat) is applied here, or refused.

Every test runs on one intra-op thread: the test shapes are tiny and gain nothing from more, and
on a machine whose cores are shared, OpenMP's spinning worker threads make each small op many
times slower.

The garbage collector leaves alone what the session holds for good (gc_freeze.py).
"""

import os

import pytest
import torch

pytest_plugins = ["gc_freeze"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test touches the network (tokenizer downloads)
# One intra-op thread per test process (xdist runs one per core): the trainer's thread choice
# (flashtrain/train/cpu_threads.py) keeps an OMP_NUM_THREADS it finds, as _one_cpu_thread does.
os.environ.setdefault("OMP_NUM_THREADS", "1")

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    import interpreter_speed

    from flashtrain.kernels.interpreter_compat import prepare_interpreter

    prepare_interpreter()
    interpreter_speed.install()


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
