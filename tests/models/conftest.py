"""tests/models: run on one CPU thread.

The model tests use tiny shapes, which gain nothing from more threads, and OpenMP's spinning worker
threads make each small op up to 50x slower when the machine's cores are shared with other processes.
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
