"""The warp-specialized Gluon backward (kernels/hopper/flash_bwd_ws.py) as the compiler makes it
for sm_90, without a GPU (flashtrain/lab/kernel_compile.py's stand-in driver): live under the
installed Triton for one launch, and for every launch in the committed reports of Triton 3.6
(the GPU machines') and the newest. The goal (issue 54): four partitions (two consumer
warpgroups, a loader warp, a dQ writer sharing the third warpgroup), setmaxnreg handing both
consumers 240 registers and that warpgroup 24, within what the launch holds (a larger ask waits
forever for registers nobody frees); every product on wgmma (0 mma.sync); one full wgmma drain
an iteration of the main loop (FlashAttention-3's overlap; four before); no spill in the main
loop (none at all under the newest Triton; under 3.6 a few words saved across setmaxnreg);
shared memory within sm_90's 232,448 bytes and the model; dQ through the bulk reduce-add where
Gluon has it (per-element atomics on Triton 3.6). Then the launch contract (a real launch's
rules) with the backward launched from a fresh thread, as autograd's device thread launches
it."""

import json
import re

import pytest
from compile_testing import RESULTS, report_rows, run_kernel_compile, unsynced_arrives

from flashtrain.kernels import tuning
from flashtrain.kernels.hopper import gluon_api
from flashtrain.kernels.hopper.flash_bwd_ws import (
    CONSUMER_REGISTERS,
    MAX_REGISTERS,
    WORKER_REGISTERS,
)
from flashtrain.kernels.hopper.route import ws_backward_config
from flashtrain.lab.kernel_compile import hopper_launches

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route

REPORTS = {"3.6": RESULTS / "kernel-compile-sm90-triton3.6-hopper.md",
           "3.9": RESULTS / "kernel-compile-sm90-triton3.9-hopper.md"}  # fmt: skip
KERNEL = "flash_backward_ws_kernel"
SHARED_LIMIT = 232_448  # sm_90's opt-in shared memory per block
THREADS = 384  # three warpgroups
# Triton 3.6: words live across the partitions' setmaxnreg (ptxas saves what lies above a
# partition's new count), none in the main loop (docs/kernel_compile.md); more is new pressure
STASH_BYTES_36 = 64
LAUNCH = "ws-bwd bf16 d128 causal gqa"  # the live one: d128 and a group loop, the tightest


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory):
    """One compile cache: the contract's launch hits the compile test's binaries."""
    return tmp_path_factory.mktemp("triton-cache")


def _assert_goal(line: dict, bulk: bool) -> None:
    assert line["warp_specialized"] and line["partitions"] == ("4+4+1+1" if bulk else "4+4+1+2")
    counts = [int(n) for n in line["setmaxnreg"].split("/")]
    consumers, workers = int(CONSUMER_REGISTERS.value), int(WORKER_REGISTERS.value)
    assert consumers in counts and counts[-1] == workers, line
    # inside the region: both consumers and the loader's and writer's warpgroup, exactly the
    # launch's pool
    assert 128 * (2 * consumers + workers) == line["registers"] * THREADS, line
    assert line["registers"] == MAX_REGISTERS and line["warps"] == THREADS // 32, line
    assert line["mma_sync"] == 0 and line["wgmma"] > 0 and line["loads"] == "tma", line
    assert line["shared"] <= SHARED_LIMIT, line
    assert line["adds"] == ("bulk" if bulk else "atomic"), line
    assert line["loop_spills"] == 0 and line["spill"] <= (0 if bulk else STASH_BYTES_36), line
    # FlashAttention-3's overlap: S^T, dP^T and dV each retired with the next product in
    # flight (wait 1), one full drain an item for dK and dQ together
    assert (line["loop_drains"], line["loop_waits"]) == (1, 4), line


def test_the_ws_backward_compiles_the_hopper_way(triton_cache):
    """One launch to a cubin (~15 s) under the installed Triton."""
    lines = [
        json.loads(x)
        for x in run_kernel_compile(triton_cache, "--launches", "hopper", "--only", LAUNCH)
    ]
    ws = [line for line in lines if line["kernel"] == KERNEL]
    assert len(ws) == 1 and ws[0]["block_m"] == 64 and ws[0]["stages"] == 2
    _assert_goal(ws[0], bulk=bool(gluon_api.TMA_REDUCE))


def test_every_arrive_follows_a_barrier_of_its_partition(triton_cache):
    """The consumers release slots, dS^T halves and staging tiles with one thread's
    mbarrier.arrive and no partition_barrier of their own: the lowering puts a bar.sync of the
    partition right before each. The one exception allowed is the 1-warp dQ writer's (its
    warp is its whole partition: bar.warp.sync). The same launch as above (cached)."""
    run_kernel_compile(triton_cache, "--launches", "hopper", "--only", LAUNCH)
    ptx = sorted(triton_cache.rglob(f"{KERNEL}.ptx"))
    assert ptx, "no PTX of the backward in the compile cache"
    for path in ptx:
        text = path.read_text()
        # 4 sites a consumer (ds_ready, dq_ready, q_empty, keys_done), the writer's dq_empty
        assert text.count("mbarrier.arrive.shared") >= 9, path
        found = unsynced_arrives(text)
        writer = 1 if gluon_api.TMA_REDUCE else 0  # Triton 3.6's writer has 2 warps
        assert len(found) <= writer and all(op == "bar.warp.sync" for _, op in found), found


def test_the_ws_backward_keeps_the_launch_contract(triton_cache):
    """The same launch (cached) through the contract: the backward from a fresh thread finds
    the scratch allocator its descriptors need; grid, shared memory, registers x threads, and
    the alignment of everything its descriptors address (lse and delta as flat rows)."""
    out = run_kernel_compile(triton_cache, "--contract", "hopper", "--only", LAUNCH)
    assert not [line for line in out if line.startswith("VIOLATION")], out[-5:]
    launches = [json.loads(x) for x in out if x.startswith("{")]
    ws = [x for x in launches if x["kernel"] == KERNEL]
    assert len(ws) == 1 and ws[0]["thread"] == "backward" and ws[0]["scratch"] > 0
    assert ws[0]["registers"] * 32 * ws[0]["warps"] <= 65_536


@pytest.mark.parametrize("version", sorted(REPORTS))
def test_the_committed_reports_hold_the_goal(version):
    """Every launch of the hopper set, compiled under Triton `version` (its report's header says
    which Triton and commit made it): the goal, bulk reduce-add after 3.6."""
    text = REPORTS[version].read_text()
    assert f"under Triton {version}" in text
    rows = [r for r in report_rows(REPORTS[version]) if r["kernel"] == "ws_kernel"]
    assert {r["launch"] for r in rows} == {tag for tag, _ in hopper_launches()}
    for row in rows:
        _assert_goal(row, bulk=version != "3.6")


def test_the_shared_memory_model_matches_the_cubins():
    """tuning.ws_backward_shared_bytes, which fit_shared_memory and the sweep use, lies within
    1% above what the compilers allocate, for every tile of the reports."""
    for path in REPORTS.values():
        for row in report_rows(path):
            if row["kernel"] != "ws_kernel":
                continue
            head_dim = int(re.search(r" d(\d+) ", row["launch"]).group(1))
            element = 2  # fp16 and bf16 alike
            cfg = ws_backward_config(row["block_m"], row["stages"])
            model = tuning.ws_backward_shared_bytes(
                tuning.TileConfig(**{**cfg.__dict__, "block_d": head_dim}), element
            )
            assert row["shared"] <= model <= row["shared"] * 1.01, (row["launch"], model)


@pytest.mark.slow
def test_every_ws_backward_launch_compiles_the_hopper_way(tmp_path):
    """The whole hopper set (about 3 minutes) under the installed Triton, and its contract."""
    lines = [json.loads(x) for x in run_kernel_compile(tmp_path, "--launches", "hopper")]
    ws = [line for line in lines if line["kernel"] == KERNEL]
    assert {line["launch"] for line in ws} == {tag for tag, _ in hopper_launches()}
    for line in ws:
        _assert_goal(line, bulk=bool(gluon_api.TMA_REDUCE))
    out = run_kernel_compile(tmp_path, "--contract", "hopper")
    assert not [line for line in out if line.startswith("VIOLATION")], out[-5:]
