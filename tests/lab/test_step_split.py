"""The training profiler's split (flashtrain.lab.bench.step_split, issue 44): on a hand-timed
two-step CUDA trace (tests/fixtures/profiler/, made by the script beside it) the exact buckets,
each kernel counted once and overlap shared, idle from the window's gaps; every flashtrain kernel
bucketed by its name; a CPU trace by the ops' self time; and a real tiny CPU training run whose
buckets and idle add up to its profiled step."""

from __future__ import annotations

import ast
import importlib.util
import json

import pytest
import torch
from config_testing import REPO
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from flashtrain.lab.bench import profile_step
from flashtrain.lab.bench.step_buckets import BUCKETS, bucket_by_name
from flashtrain.lab.bench.step_split import profile_split, split_trace

FIXTURES = REPO / "tests" / "fixtures" / "profiler"
CUDA_TRACE = FIXTURES / "two_step_cuda_trace.json"

# ms per step, by hand from the timeline in make_two_step_trace.py's docstring
EXPECTED_MS = {
    "matmul": 0.130,  # sm90 GEMM 100 µs + nvjet 60 µs beside NCCL: half of it
    "attention": 0.240,  # fwd 80, fill in the op 10, preprocess 10, dkdv 100, dq 20 + 40 / 2
    "loss": 0.080,  # xent_forward 60, xent_combine 10, mul under flashtrain::loss 10
    "elementwise": 0.020,  # AccumulateGrad's add
    "optimizer": 0.050,  # fused AdamW 40, fill under Optimizer.step 10
    "communication": 0.050,  # NCCL 100 µs, half of it beside compute
    "memcpy": 0.025,  # HtoD 20, memset 5
    "data": 0.005,  # the copy kernel under flashtrain::data
    "idle": 0.2875,  # gaps 5 + 70 + 100 + 225 (to step 2) + 5 + 70 + 100, over two steps
}


@pytest.fixture(scope="module")
def cuda_split() -> dict:
    return split_trace(CUDA_TRACE)


def _fixture_script():
    spec = importlib.util.spec_from_file_location("make_trace", FIXTURES / "make_two_step_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fixture_is_what_its_script_writes():
    assert json.loads(CUDA_TRACE.read_text()) == _fixture_script().build_trace()


def test_cuda_buckets_are_the_hand_computed_ones(cuda_split):
    assert cuda_split["device"] == "cuda" and cuda_split["steps"] == 2
    assert list(cuda_split["ms_per_step"]) == list(BUCKETS)
    assert cuda_split["ms_per_step"] == pytest.approx(EXPECTED_MS, abs=1e-6)
    # the host's step range and the GPU window (first to last kernel of the steps), per step
    assert cuda_split["step_ms"] == pytest.approx(1.0)
    assert cuda_split["window_ms"] == pytest.approx(0.8875)


def test_buckets_and_idle_fill_the_window_and_no_more(cuda_split):
    total = sum(cuda_split["ms_per_step"].values())
    assert total == pytest.approx(cuda_split["window_ms"], rel=0.02)
    assert sum(cuda_split["share"].values()) == pytest.approx(1.0, rel=0.02)
    assert cuda_split["ms_per_step"]["idle"] > 0  # the old split read 0 here


def test_overlapping_kernels_share_their_time(cuda_split):
    """NCCL runs beside dq and the nvjet GEMM for 100 µs: counted once, half to each side."""
    trace = json.loads(CUDA_TRACE.read_text())
    on_gpu = [
        e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    measured = [e for e in on_gpu if 0 <= e["ts"] < 2000]
    each_whole_us = sum(e["dur"] for e in measured)  # what a per-kernel sum counts
    busy = sum(ms for b, ms in cuda_split["ms_per_step"].items() if b != "idle")
    assert each_whole_us / 2 / 1e3 - busy == pytest.approx(0.1)  # the 100 µs of overlap, once
    assert cuda_split["ms_per_step"]["communication"] == pytest.approx(0.05)


def test_kernels_outside_the_steps_are_left_out(cuda_split):
    """The kernels launched before ProfilerStep#1 and after ProfilerStep#2 (fills, adds)."""
    assert cuda_split["window_ms"] * 2 == pytest.approx(1.775)  # 100 .. 1875 µs
    elementwise = cuda_split["top"]["elementwise"]
    assert [k["launches_per_step"] for k in elementwise] == [1.0]


def test_top_kernels_per_bucket(cuda_split):
    top = cuda_split["top"]
    assert [(k["name"], k["ms_per_step"]) for k in top["attention"]] == [
        ("flash_backward_dkdv_kernel", 0.1),
        ("flash_forward_kernel", 0.08),
        ("flash_backward_dq_kernel", 0.04),
        ("flash_backward_preprocess", 0.01),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 0.01),
    ]
    assert [k["name"] for k in top["loss"]][::2] == ["xent_forward_kernel", "xent_combine_kernel"]
    assert top["matmul"][0]["name"].startswith("sm90_xmma_gemm")
    assert all(k["launches_per_step"] == 1.0 for ks in top.values() for k in ks)
    assert "idle" not in top and set(top) <= set(BUCKETS)


def test_another_step_range(cuda_split):
    """profile_step.py measures the trainer's flashtrain::step ranges (inside ProfilerStep#N)."""
    split = split_trace(CUDA_TRACE, step_range="flashtrain::step")
    assert split["step_ms"] == pytest.approx(0.985)
    assert split["ms_per_step"] == cuda_split["ms_per_step"]


def test_a_trace_without_steps_is_a_clear_error():
    trace = _fixture_script().build_trace()
    trace["traceEvents"] = [
        e for e in trace["traceEvents"] if not e.get("name", "").startswith("ProfilerStep#")
    ]
    with pytest.raises(ValueError, match=r"no 'ProfilerStep#' range in the trace"):
        split_trace(trace)


def test_the_split_is_json():
    assert json.loads(json.dumps(split_trace(CUDA_TRACE))) == split_trace(CUDA_TRACE)


def _launched_kernels() -> list[str]:
    """The kernels package's launch entry points: @triton.jit / @gluon.jit functions named
    *_kernel (and flash_backward_preprocess), read from the source."""
    names = []
    for path in sorted((REPO / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            jit = any(
                ast.unparse(d.func if isinstance(d, ast.Call) else d) in ("triton.jit", "gluon.jit")
                for d in node.decorator_list
            )
            if jit and (node.name.endswith("_kernel") or node.name == "flash_backward_preprocess"):
                names.append(node.name)
    return names


def test_every_flashtrain_kernel_is_attention_or_loss_by_its_name():
    names = _launched_kernels()
    assert {"flash_forward_kernel", "flash_backward_ws_kernel", "xent_grad_weight_kernel"} <= set(
        names
    )
    buckets = {name: bucket_by_name(name) for name in names}
    assert buckets == {n: "loss" if n.startswith("xent_") else "attention" for n in names}


@pytest.mark.parametrize(
    "name, bucket",
    [
        ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128", "attention"),
        ("fmha_cutlassB_f16_aligned_64x64_k128_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)", "attention"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>", "matmul"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "matmul"),
        ("triton_tem_fused_addmm_0", "matmul"),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "matmul"),
        ("liger_cross_entropy_kernel", "loss"),
        ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>", "loss"),
        ("void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, LogSoftMaxForwardEpilogue>", "loss"),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor>", "optimizer"),
        ("triton_poi_fused_add_gelu_0", None),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", None),
    ],
)  # fmt: skip
def test_library_kernel_names(name, bucket):
    assert bucket_by_name(name) == bucket


def test_cpu_trace_counts_self_time_once():
    """Host ops only: each op's own time (its duration less its children's), the data range
    whole, other threads left out, idle the rest of the step."""

    def op(name, start, end, cat="cpu_op", tid=1):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": start,
                "dur": end - start}  # fmt: skip

    trace = {
        "traceEvents": [
            op("ProfilerStep#3", 0, 100, "user_annotation"),
            op("flashtrain::data", 0, 10, "user_annotation"),
            op("aten::copy_", 2, 8),  # inside the data range: counted with it
            op("aten::mm", 10, 30),  # 18 of its own
            op("aten::empty", 12, 14),
            op("flashtrain::loss", 30, 50, "user_annotation"),
            op("aten::log_softmax", 31, 41),
            op("aten::add", 41, 45),  # generic, under flashtrain::loss
            op("autograd::engine::evaluate_function: AddBackward0", 50, 58),  # a wrapper: idle
            op("aten::mul", 52, 55),
            op("Optimizer.step#AdamW.step", 60, 80, "user_annotation"),
            op("aten::add_", 62, 70),
            op("aten::add", 20, 90, tid=2),  # the prefetch thread: not the step's time
            op("aten::add", 120, 130),  # after the step
        ]
    }
    split = split_trace(trace)
    assert split["device"] == "cpu" and split["steps"] == 1 and split["step_ms"] == 0.1
    expected_us = {"data": 10, "matmul": 18, "elementwise": 2 + 3, "loss": 14, "optimizer": 8}
    expected_us["idle"] = 100 - sum(expected_us.values())
    got_us = {b: ms * 1e3 for b, ms in split["ms_per_step"].items() if ms}
    assert got_us == pytest.approx(expected_us)


def test_time_counted_twice_is_refused():
    """Two ops of one thread that overlap without nesting (a broken trace) would count 20 µs
    twice: the split refuses to report more busy time than the step has."""
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
             "ts": 0, "dur": 100},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 60},
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 40,
             "dur": 60},
        ]
    }  # fmt: skip
    with pytest.raises(ValueError, match="miss the window"):
        split_trace(trace)


def test_profile_split_of_a_scheduled_profiler():
    """As the GPU suite calls it: a profiler with a wait/warmup/active schedule, after its
    `with` block; the ProfilerStep#N ranges of the active steps are measured."""
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.AdamW(model.parameters())
    targets = torch.arange(8) % 16
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
    ) as prof:
        for _ in range(5):
            with record_function("flashtrain::loss"):
                loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 16)), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    split = profile_split(prof)
    assert split["steps"] == 2 and split["device"] == "cpu"
    assert sum(split["ms_per_step"].values()) == pytest.approx(split["step_ms"], rel=0.02)
    assert min(split["ms_per_step"][b] for b in ("matmul", "loss", "optimizer")) > 0


# train_testing.TINY's model (tests/train is not on this folder's path), eight sequences a step
TINY_RUN = ["model=gpt2-tiny", "model.n_layer=2", "model.n_head=2", "model.d_model=64",
            "seq_len=64", "micro_batch_size=4", "global_batch_size=8"]  # fmt: skip


def test_profile_step_on_a_tiny_cpu_run(tmp_path, monkeypatch):
    """scripts/profile_step.py end to end: the buckets and idle add up to the profiled step."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")  # not the Triton interpreter
    profile_step.main(
        ["--steps", "2", "--warmup", "1", "--out", str(tmp_path), "--tag", "t", *TINY_RUN]
    )
    report = json.loads((tmp_path / "step-cpu-t.json").read_text())
    split = report["ms_per_step"]
    assert report["device"] == "cpu" and report["steps"] == 2
    assert report["step_range"] == "flashtrain::step"
    assert sum(split.values()) == pytest.approx(report["step_ms"], rel=0.02)
    assert min(split[b] for b in ("matmul", "attention", "loss", "elementwise", "data")) > 0
    table = (tmp_path / "step-cpu-t.md").read_text()
    assert "| bucket | ms / step | share | top ops" in table and "| matmul |" in table
