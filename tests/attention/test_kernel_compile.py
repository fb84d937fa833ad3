"""The kernels compile for a GPU (Triton's compiler, no GPU needed): what the interpreter cannot
check, and what the compiler made of the default launches (flashtrain/lab/kernel_compile.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashtrain.lab.kernel_compile import FACT_COLUMNS as FACTS
from flashtrain.lab.kernel_compile import sass_facts

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route

REPO = Path(__file__).resolve().parents[2]
# 7 deterministic attention launches (forward, preprocess, dK/dV, dQ; the d256 one asks for the
# atomic dQ, which head_dim > 128 does not take: tuning.atomic_dq_exact), 4 with the atomic-dQ
# backward (forward, preprocess, dK/dV with dQ) and 2 dropout-mask launches
FEATURE_KERNELS = 7 * 4 + 4 * 3 + 2
MAIN_KERNELS = ("flash_forward_kernel", "flash_backward_dkdv_kernel", "flash_backward_dq_kernel")


def _compile(tmp_path, *args) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), PYTHONPATH=str(REPO),
               TRITON_DEFAULT_FP_FUSION="1")  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "flashtrain.lab.kernel_compile", *args], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=3000)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(line) for line in run.stdout.splitlines()]


def test_sass_facts_find_the_shortest_tensor_core_loop():
    """Counts HGMMA/HMMA and measures the innermost loop with tensor-core work, ignoring loops
    without it (the exit trap `BRA self`) and outer loops around inner ones."""
    sass = "\n".join(
        f"        /*{addr:04x}*/ {text} ;"
        for addr, text in [
            (0x00, "MOV R1, c[0x0][0x28]"),
            (0x10, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ"),  # outer loop start
            (0x20, "HMMA.16816.F32.BF16 R4, R8, R12, R4"),  # inner loop start
            (0x30, "STL [R1+0x8], R2"),
            (0x40, "@P0 BRA 0x20"),  # inner loop: 3 instructions
            (0x50, "@!P1 BRA 0x10"),  # outer loop
            (0x60, "EXIT"),
            (0x70, "BRA 0x70"),
            (0x80, "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24"),  # a longer loop: 4
            (0x90, "FMUL R2, R2, R3"),
            (0xA0, "FMUL R2, R2, R3"),
            (0xB0, "@P2 BRA 0x80"),
        ]
    )
    assert sass_facts(sass) == dict(wgmma=2, mma_sync=1, main_loop=3, loop_spills=1)


def _spill_allowed(line: dict) -> int:
    """Bytes a default launch may spill: none, except under Triton 3.6 (the GPU machines'),
    whose d128 block-sparse forward spills 8 bytes once per program, outside its loops, at 255
    registers (docs/kernel_compile.md "The masking rule's cost")."""
    import triton

    old_triton = tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9)
    sparse_d128_forward = ("d128" in line["launch"] and "sparse" in line["launch"]
                           and line["kernel"] == "flash_forward_kernel")  # fmt: skip
    return 8 if old_triton and sparse_d128_forward else 0


def _assert_hopper_defaults(lines: list[dict]) -> None:
    """The goal of issue 20 for the default launches (docs/kernel_compile.md): every product on
    wgmma, no spill (but _spill_allowed), the forward with descriptor loads and >= 3 stages."""
    main = [line for line in lines if line["kernel"] in MAIN_KERNELS]
    assert main
    for line in main:
        assert line["mma_sync"] == 0 and line["wgmma"] > 0, line
        assert line["loop_spills"] == 0 and line["spill"] <= _spill_allowed(line), line
        if line["kernel"] == "flash_forward_kernel":
            assert line["loads"] == "tma" and line["stages"] >= 3, line


def test_kernels_compile_for_hopper(tmp_path):
    """Front end only (~10 s): module globals, constexpr use, loop-carried types."""
    lines = _compile(tmp_path, "--launches", "features", "--front-end-only", "--arch", "90")
    assert len(lines) == FEATURE_KERNELS


def test_default_launch_compiles_the_hopper_way(tmp_path):
    """One default launch to a cubin (~30 s; the one that used mma.sync and spilled): wgmma
    only, no spills, descriptor forward with 3 stages."""
    lines = _compile(tmp_path, "--only", "bf16 d128 causal dense atomic-dQ")
    assert [line["kernel"] for line in lines] == [
        "flash_forward_kernel", "flash_backward_preprocess", "flash_backward_dkdv_kernel"]  # fmt: skip
    assert all(set(FACTS) <= set(line) for line in lines)
    _assert_hopper_defaults(lines)


@pytest.mark.slow
def test_every_default_launch_compiles_the_hopper_way(tmp_path):
    """The whole report (minutes): bf16/fp16 x d64/d128 x causal/full x dense/sparse x both
    backward modes."""
    lines = _compile(tmp_path, "--arch", "90")
    assert len({line["launch"] for line in lines}) == 32 + 4  # + grouped-query
    assert all(set(FACTS) <= set(line) for line in lines)
    _assert_hopper_defaults(lines)


@pytest.mark.slow
@pytest.mark.parametrize("arch", [80, 90])
def test_kernels_compile_to_cubin(tmp_path, arch):
    """The whole pipeline to a cubin (minutes): LLVM lowering, ptxas, resources reported. Every
    kernel's shared memory fits the GPU (the built-in configs after fit_shared_memory), and the
    launches that force descriptors get TMA instructions on Hopper and pointer loads before."""
    from flashtrain.kernels.tuning import _SHARED_BY_CAPABILITY

    lines = _compile(tmp_path, "--launches", "features", "--arch", str(arch))
    assert all(line["registers"] > 0 for line in lines)
    limit = _SHARED_BY_CAPABILITY[(arch // 10, arch % 10)]
    assert all(line["shared"] <= limit for line in lines), [l for l in lines if l["shared"] > limit]
    wants_tma = [
        line for line in lines if " tma" in line["launch"] and "preprocess" not in line["kernel"]
    ]
    assert wants_tma and all((line["loads"] == "tma") == (arch >= 90) for line in wants_tma)
    assert not any(line["loads"] == "tma" for line in lines if " pointer" in line["launch"])


def _assert_variants(lines: list[dict]) -> None:
    """Issue 30's goal for the forward variants (docs/kernel_compile.md "Variants"): every
    product on wgmma, shared memory within sm_90's, no spill in the main loop and none at all
    in the warp-specialized ones, which are warp-specialized (4 warps become 12: a load
    partition beside two consumer warpgroups). The persistent forward without warp
    specialization spills outside its main loop at d128 (and under Triton 3.6 at d64 with 2
    stages): its outer loop keeps the work item's state live at 255 registers."""
    forward = [line for line in lines if line["kernel"] == "flash_forward_kernel"]
    assert forward
    for line in forward:
        ws = " ws " in line["launch"]
        assert line["mma_sync"] == 0 and line["wgmma"] > 0, line
        assert line["loop_spills"] == 0 and (line["spill"] == 0 or not ws), line
        assert line["shared"] <= 232_448 and line["loads"] == "tma", line
        assert line["warp_specialized"] == ws and (line["warps"] == 12) == ws, line


@pytest.mark.slow  # ~12 s; a variant (not a default launch), also in the whole variants run
def test_warp_specialized_persistent_forward_compiles(tmp_path):
    """One variant to a cubin (~15 s): the persistent warp-specialized forward at d128."""
    lines = _compile(tmp_path, "--launches", "variants", "--only",
                     "fwd persistent ws 128x128 w4 s2 bf16 d128 causal")  # fmt: skip
    assert [(line["kernel"], line["block_m"], line["block_n"]) for line in lines] == [
        ("flash_forward_kernel", 128, 128)]  # fmt: skip
    assert lines[0]["spill"] == 0
    _assert_variants(lines)


@pytest.mark.slow
def test_every_forward_variant_compiles(tmp_path):
    """The variants report's forward launches (minutes). At d128 the 3-stage ws and persistent
    configs do not fit sm_90's shared memory: fit_shared_memory steps them to 2 stages, the
    binary of the 2-stage launch, which the report lists once."""
    from flashtrain.lab.kernel_compile import variant_launches

    lines = _compile(tmp_path, "--launches", "variants", "--only", "fwd ")
    stepped = {f"fwd {name} bf16 d128 {mode}" for mode in ("causal", "full")
               for name in ("ws 128x128 w4 s3", "persistent 128x128 w8 s3")}  # fmt: skip
    expected = {tag for tag, _ in variant_launches() if tag.startswith("fwd ")} - stepped
    assert {line["launch"] for line in lines} == expected
    _assert_variants(lines)
