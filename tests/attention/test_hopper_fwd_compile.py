"""The Gluon forward (kernels/hopper/flash_fwd_ws.py) as the compiler makes it for sm_90, without
a GPU (flashtrain/lab/kernel_compile.py's stand-in driver): live under the installed Triton for
one launch, and for every launch in the committed reports of Triton 3.6 (the GPU machines') and
the newest. The goal (issues 46 and 54): three partitions of a warpgroup each (the loader as the
default partition, and two consumer warpgroups), setmaxnreg handing the consumers 232 registers
and the loader the 40 they leave, within what the launch holds (a larger ask waits forever for
registers nobody frees); every product on wgmma (0 mma.sync); no spill in the main loop (none
at all at head_dim 64; at 128 a few words outside the loop); shared memory (the output staging
tile included) within sm_90's 232,448 bytes and the model tuning.shared_bytes uses; every
consumer arrive after a barrier of its warpgroup (the kernel adds none of its own: the lowering
puts one there). Then the launch contract (a real launch's rules) with the forward launched from
a fresh thread."""

import json
import re

import pytest
from compile_testing import RESULTS, report_rows, run_kernel_compile, unsynced_arrives

from flashtrain.kernels import tuning
from flashtrain.kernels.hopper.flash_fwd_ws import CONSUMER_REGISTERS, MAX_REGISTERS
from flashtrain.kernels.hopper.route import ws_forward_config
from flashtrain.lab.kernel_compile import hopper_forward_launches

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route

REPORTS = {"3.6": RESULTS / "kernel-compile-sm90-triton3.6-hopper-fwd.md",
           "3.9": RESULTS / "kernel-compile-sm90-triton3.9-hopper-fwd.md"}  # fmt: skip
KERNEL = "flash_forward_ws_kernel"
SHARED_LIMIT = 232_448  # sm_90's opt-in shared memory per block
THREADS = 384  # three warpgroups
# head_dim 128: words live across the partitions' setmaxnreg (ptxas saves what lies above a
# partition's new count) and a consumer's per-item state, none in the main loop
# (docs/kernel_compile.md); more would be new pressure
D128_STASH_BYTES = 64
LAUNCH = "ws-fwd bf16 d128 causal gqa"  # the live one: d128 and GQA


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory):
    """One compile cache: the contract's launch hits the compile test's binary."""
    return tmp_path_factory.mktemp("triton-cache")


def _assert_goal(line: dict) -> None:
    assert line["warp_specialized"] and line["partitions"] == "4+4+4", line
    counts = [int(n) for n in line["setmaxnreg"].split("/")]
    consumers, loader = int(CONSUMER_REGISTERS.value), counts[-1]
    assert consumers in counts and loader == 40, line
    # inside the region: the loader's warpgroup and both consumers' within the launch's pool
    assert 128 * (loader + 2 * consumers) <= line["registers"] * THREADS, line
    assert line["registers"] == MAX_REGISTERS and line["warps"] == THREADS // 32, line
    assert line["mma_sync"] == 0 and line["wgmma"] > 0 and line["loads"] == "tma", line
    assert line["shared"] <= SHARED_LIMIT and line["loop_spills"] == 0, line
    allowed = D128_STASH_BYTES if " d128 " in line["launch"] + " " else 0
    assert line["spill"] <= allowed, line
    # a key tile's two waits: S_t retired with the last tile's P V in flight (wait 1), then
    # that P V before O is rescaled (the one drain)
    assert (line["loop_drains"], line["loop_waits"]) == (1, 2), line


def test_the_gluon_forward_compiles_the_hopper_way(triton_cache):
    """One launch to a cubin (~40 s) under the installed Triton."""
    out = run_kernel_compile(triton_cache, "--launches", "hopper-fwd", "--only", LAUNCH)
    lines = [json.loads(x) for x in out]
    fwd = [line for line in lines if line["kernel"] == KERNEL]
    assert len(fwd) == 1 and fwd[0]["block_m"] == 128 and fwd[0]["stages"] == 2
    _assert_goal(fwd[0])


def test_every_consumer_arrive_follows_a_barrier_of_its_warpgroup(triton_cache):
    """The kernel releases buffers (K after S, V after P V, Q after the last S) and hands over
    turns with one thread's mbarrier.arrive and no partition_barrier of its own: Triton's
    lowering (3.9) or its barrier pass (3.6) puts a bar.sync right before each. The same launch
    as above (cached); a Triton that stopped doing so would fail here."""
    assert unsynced_arrives("wgmma.wait_group.sync.aligned 0;\n"
                            "@%p1 mbarrier.arrive.shared::cta.b64 _, [%r1];") == [(2, "wgmma.wait_group.sync.aligned")]  # fmt: skip
    run_kernel_compile(triton_cache, "--launches", "hopper-fwd", "--only", LAUNCH)
    ptx = sorted(triton_cache.rglob(f"{KERNEL}.ptx"))
    assert ptx, "no PTX of the forward in the compile cache"
    for path in ptx:
        text = path.read_text()
        assert text.count("mbarrier.arrive.shared") >= 16, path  # 8 sites a consumer at least
        assert not unsynced_arrives(text), (path, unsynced_arrives(text)[:5])


def test_the_gluon_forward_keeps_the_launch_contract(triton_cache):
    """The same launch (cached) through the contract, from a fresh thread: the scratch
    allocator its device-side descriptors need, grid, shared memory, registers x threads, and
    the alignment of everything its descriptors address."""
    out = run_kernel_compile(triton_cache, "--contract", "hopper-fwd", "--only", LAUNCH)
    assert not [line for line in out if line.startswith("VIOLATION")], out[-5:]
    launches = [json.loads(x) for x in out if x.startswith("{")]
    fwd = [x for x in launches if x["kernel"] == KERNEL]
    assert len(fwd) == 1 and fwd[0]["scratch"] > 0
    assert fwd[0]["registers"] * 32 * fwd[0]["warps"] <= 65_536


@pytest.mark.parametrize("version", sorted(REPORTS))
def test_the_committed_reports_hold_the_goal(version):
    """Every launch of the hopper-fwd set, compiled under Triton `version` (its report's header
    says which Triton and commit made it)."""
    text = REPORTS[version].read_text()
    assert f"under Triton {version}" in text
    rows = [r for r in report_rows(REPORTS[version]) if r["kernel"] == "forward_ws_kernel"]
    assert {r["launch"] for r in rows} == {tag for tag, _ in hopper_forward_launches()}
    for row in rows:
        _assert_goal(row)


def test_the_shared_memory_model_matches_the_cubins():
    """tuning.ws_forward_shared_bytes, which fit_shared_memory and the sweep use, lies within
    1% above what the compilers allocate, for every tile of the reports."""
    for path in REPORTS.values():
        for row in report_rows(path):
            if row["kernel"] != "forward_ws_kernel":
                continue
            head_dim = int(re.search(r" d(\d+) ", row["launch"]).group(1))
            cfg = tuning.TileConfig(**{**ws_forward_config(row["stages"]).__dict__,
                                       "block_d": head_dim})  # fmt: skip
            model = tuning.ws_forward_shared_bytes(cfg, 2)  # fp16 and bf16 alike
            assert row["shared"] <= model <= row["shared"] * 1.01, (row["launch"], model)
