"""The launch contract (flashtrain/lab/launch_contract.py): what a real CUDA launch enforces,
checked without a GPU. Before issue 29's fix the first GPU backward raised "no allocator was
set" (Triton's scratch allocator lives in a ContextVar; autograd's CUDA backward runs on its own
thread) and a packed batch of 2,048 documents x 32 heads put 65,536 programs on a grid's y axis:
the subprocess tests below report both on that code (checked against 1346b3a)."""

import contextvars
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashtrain.lab import launch_contract
from flashtrain.lab.launch_contract import Contract, in_fresh_thread

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory):
    """One compile cache for this file's runs: they share the bf16 d64 kernels."""
    return tmp_path_factory.mktemp("triton-cache")


def _contract(cache_dir, *args) -> tuple[list[dict], list[str]]:
    """scripts/kernel_compile.py --contract ARGS in a subprocess (the stand-in driver replaces
    Triton's for the whole process) compiling into cache_dir: its launches and violations."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO),
               TRITON_DEFAULT_FP_FUSION="1")  # fmt: skip
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "kernel_compile.py"),
                          "--contract", *args], env=env, cwd=cache_dir, capture_output=True,
                         text=True, timeout=3000)  # fmt: skip
    lines = run.stdout.splitlines()
    launches = [json.loads(line) for line in lines if line.startswith("{")]
    violations = [line for line in lines if line.startswith("VIOLATION")]
    assert run.returncode == (1 if violations else 0), run.stderr[-4000:]
    return launches, violations


def test_backward_launches_in_a_fresh_thread_find_the_scratch_allocator(triton_cache):
    """bf16 d64 causal, both backward modes and grouped-query, and flash_attn_func under
    torch.compile with its backward through autograd (~40 s): every backward kernel needs global
    scratch on sm_90 and launches from a thread that set nothing."""
    only = ("--only", "bf16 d64 causal dense", "--only", "torch.compile")
    launches, violations = _contract(triton_cache, "defaults", "compiled", *only)
    assert violations == []
    backward = [x for x in launches if x["thread"] == "backward"]
    assert {x["kernel"] for x in backward} >= {
        "flash_backward_dkdv_kernel", "flash_backward_dq_kernel"}  # fmt: skip
    assert any(x["scratch"] > 0 for x in backward)  # else the check would prove nothing
    assert all(x["thread"] == "MainThread" for x in launches if x not in backward)
    compiled = [x for x in launches if x["launch"].startswith("torch.compile")]
    assert any(x["thread"] == "backward" and x["scratch"] > 0 for x in compiled)


@pytest.mark.slow
def test_loss_and_model_views_keep_the_contract(tmp_path):
    """The fused loss (backward in a fresh thread) and q/k/v as views of a fused projection with
    descriptors forced on, aligned or not (~50 s; also in the whole run below)."""
    launches, violations = _contract(tmp_path, "loss", "models")
    assert violations == []
    kernels = {x["kernel"] for x in launches}
    assert {
        "xent_forward_kernel",
        "xent_grad_weight_kernel",
        "flash_backward_dkdv_kernel",
    } <= kernels


def test_grids_fit_at_the_presets_and_suite_shapes(triton_cache):
    """Every preset's and the GPU suite's shapes, and each LM preset's tokens as 16-token
    documents (no compile, ~20 s)."""
    launches, violations = _contract(triton_cache, "shapes")
    assert violations == []
    names = {x["launch"] for x in launches}
    assert {"shape llama/8b-128k", "shape llama/1b-32k 16-token documents"} <= names
    # the packed documents' backward really puts thousands of sequences on one axis
    packed = [x for x in launches if x["launch"] == "shape llama/1b-32k 16-token documents"]
    assert max(max(x["grid"]) for x in packed) >= 2048


@pytest.mark.slow
def test_every_launch_keeps_the_contract(tmp_path):
    """Every set, every default and feature launch compiled to a cubin (many minutes)."""
    launches, violations = _contract(tmp_path, "all")
    assert violations == []
    assert len({x["launch"] for x in launches}) > 60


# ---- the checker itself, without compiling ------------------------------------------------------


def test_a_fresh_thread_sees_nothing_its_caller_set():
    probe = contextvars.ContextVar("probe", default="unset")
    probe.set("caller")
    seen = []
    in_fresh_thread(lambda: seen.append(probe.get()))
    assert seen == ["unset"]

    def fail():
        raise ValueError("raised there")

    with pytest.raises(ValueError, match="raised there"):  # the caller sees the thread's error
        in_fresh_thread(fail)


class _Kernel:  # what Contract reads of a compiled kernel
    def __init__(self, scratch, shared=1024):
        self.metadata = type("Meta", (), dict(global_scratch_size=scratch, shared=shared,
                                              num_warps=4))()  # fmt: skip
        self.asm = {}


class _Fn:
    __name__ = "a_kernel"
    arg_names = ["Q", "K", "DQ_ACC", "n"]


def _launch(contract, grid=(1, 1, 1), args=(), kernel=None, **kwargs):
    contract.tag = "probe"
    return contract.on_launch(_Fn(), grid, args, kwargs, lambda: kernel)


def test_the_checker_reports_each_broken_rule():
    import triton

    contract = Contract(arch=90)
    _launch(contract, grid=(1, 65_536, 1))
    _launch(contract, grid=lambda meta: (2**31, 1, 1))
    _launch(contract, kernel=_Kernel(scratch=0, shared=232_449))
    aligned = torch.empty(2, 8, 4, 64, dtype=torch.bfloat16)
    unaligned = torch.empty(2, 8, 4, 37, dtype=torch.bfloat16)
    _launch(contract, args=(unaligned, aligned, aligned, 1), TMA=True)
    _launch(contract, args=(unaligned, aligned, aligned, 1), DQ_TMA=True)  # only DQ_ACC: fine
    _launch(contract, args=(aligned, aligned, unaligned, 1), DQ_TMA=True)
    v = contract.violations
    assert len(v) == 5, v
    assert "y = 65,536 > 65,535" in v[0] and "x = 2,147,483,648" in v[1]
    assert "232,449 B of shared memory > 232,448" in v[2]
    assert "'Q'" in v[3] and "'DQ_ACC'" in v[4]

    context = contextvars.Context()  # no allocator set in it: Triton's NullAllocator
    context.run(_launch, contract, kernel=_Kernel(scratch=896))
    assert "needs 896 B of global scratch" in contract.violations[-1]

    def with_allocator():
        triton.set_allocator(lambda size, alignment, stream: None)
        _launch(contract, kernel=_Kernel(scratch=896))

    contextvars.Context().run(with_allocator)
    assert len(contract.violations) == 6


def test_every_set_is_listed_in_the_module_doc():
    assert all(f"    {name}" in launch_contract.__doc__ for name in launch_contract.LAUNCH_SETS)
