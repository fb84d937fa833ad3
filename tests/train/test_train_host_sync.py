"""A training step waits for the device once: the one copy in `host_values`. Everything else the
host needs (target counts) comes from the host; losses, weights, the stop vote and the non-finite
check stay on the device until that copy.

On CPU nothing is a real sync, so the test watches every way flashtrain code reads a tensor's
value into Python (.item(), .tolist(), bool/int/float of a tensor) during a step; on CUDA,
torch.cuda.set_sync_debug_mode reports the real synchronisations.
"""

from __future__ import annotations

import linecache
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch
from config_testing import compose
from train_testing import TINY

import flashtrain
import flashtrain.train.step as step_module
import flashtrain.train.trainer as trainer_module
from flashtrain.train import run

PACKAGE = str(Path(flashtrain.__file__).resolve().parent)
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
THE_COPY = "step.py:host_values: return values.tolist()"
# Reads that are not device syncs, made on CPU tensors only: the PyTorch CPU attention route
# takes the dropout seed as an int (the CUDA route hands the kernels the device tensor) and
# walks packed sequences by their cu_seqlens bounds (the CUDA route's kernels read them), the
# loss checks the labels' range and the varlen op the cu_seqlens prefix sums (on a GPU both
# only with FLASHTRAIN_CHECK_INPUTS=1: attention/validation.py values_checked), and the CPU
# fast path checks K/V are finite before taking ATen's causal kernel (it returns at once for a
# tensor not on the CPU).
CPU_ROUTE_ONLY = ("int(seed)", "torch_varlen.py:_sequences")
CPU_VALUE_CHECKS = (
    "loss.py:_check_head_inputs",
    "cpu_flash.py:eligible",
    "validation.py:check_cu_seqlens",
)


def _tiny(tmp_path, *extra):
    return compose(TINY + ["trainer.eval_interval=0", "trainer.ckpt_interval=0", *extra])


class _HostReadWatch:
    """Records (caller file:line, method) for each host read by flashtrain code on the main
    thread while `active` is set (the prefetch thread's host-side counting is not a sync)."""

    def __init__(self) -> None:
        self.active = False
        self.reads: list[str] = []

    def wrap(self, name, original):
        def watched(tensor, *args, **kwargs):
            if self.active and threading.current_thread() is threading.main_thread():
                frame = sys._getframe(1)
                code = frame.f_code
                if str(Path(code.co_filename).resolve()).startswith(PACKAGE):
                    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
                    self.reads.append(f"{Path(code.co_filename).name}:{code.co_name}: {line}")
            return original(tensor, *args, **kwargs)

        return watched


# A tiny Llama on packed documents (pysrc bytes, <eos> after each file, varlen attention with
# positions restarting per document: the batch carries position_ids and the host's max_seqlen).
LLAMA_DOCUMENTS = [
    "model=llama-tiny",
    "model.n_layer=1",
    "model.d_model=64",
    "model.d_ff=96",
    "data=pysrc",
    "data.pysrc_under=json",  # a few files: the whole library takes ~11 s to read
    "data.val_fraction=0.3",
    "data.document_masking=true",
]
DYNAMIC_ROPE = [
    "model.rope_scaling.type=dynamic",
    "model.rope_scaling.factor=2",
    "model.rope_scaling.original_max_seq_len=16",  # active: documents run longer than 16
]


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param((), id="gpt2"),
        pytest.param(LLAMA_DOCUMENTS, id="llama-documents"),
        pytest.param(LLAMA_DOCUMENTS + DYNAMIC_ROPE, id="llama-documents-dynamic-rope"),
    ],
)
def test_a_step_reads_device_values_once(tmp_path, monkeypatch, extra):
    if extra:
        extra = [*extra, f"data.cache_dir={tmp_path / 'cache'}"]
    watch = _HostReadWatch()
    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, watch.wrap(name, getattr(torch.Tensor, name)))
    copies = []
    host_values = step_module.host_values
    monkeypatch.setattr(
        step_module, "host_values", lambda values: copies.append(1) or host_values(values)
    )
    train_step = trainer_module.Trainer._train_step

    def watched_step(self, preempt):
        watch.active = True
        try:
            return train_step(self, preempt)
        finally:
            watch.active = False

    monkeypatch.setattr(trainer_module.Trainer, "_train_step", watched_step)
    out = run(_tiny(tmp_path, "trainer.max_steps=3", *extra), tmp_path / "run")
    assert out["step"] == 3
    assert len(copies) == 3  # one per step
    reads = [
        r
        for r in watch.reads
        if not any(ok in r for ok in CPU_ROUTE_ONLY) and not r.startswith(CPU_VALUE_CHECKS)
    ]
    assert reads == [THE_COPY] * 3, watch.reads


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_step_synchronises_once(tmp_path, monkeypatch):
    """torch's own sync detector: one synchronising call per step (the host_values copy)."""
    train_step = trainer_module.Trainer._train_step
    syncs_per_step = []

    def watched_step(self, preempt):
        if self.step == 0:  # the first step compiles kernels and warms the allocator
            return train_step(self, preempt)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return train_step(self, preempt)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                syncs = [w for w in caught if "synchroniz" in str(w.message)]
                syncs_per_step.append(len(syncs))

    monkeypatch.setattr(trainer_module.Trainer, "_train_step", watched_step)
    run(_tiny(tmp_path, "trainer.max_steps=4", "trainer.device=cuda"), tmp_path / "run")
    assert syncs_per_step == [1, 1, 1], syncs_per_step
