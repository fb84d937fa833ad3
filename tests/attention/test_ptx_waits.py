"""The compile tool's count of the main loop's wgmma waits (flashtrain/lab/ptx_waits.py) on PTX
written the way LLVM writes it: blocks by label or "// %bb.N:", LLVM's loop comments, a branch
taken on some iterations only, a loop without products beside the main one."""

import pytest

from flashtrain.lab import ptx_waits

pytestmark = pytest.mark.single_route  # text parsing: run once, not once per CPU route

# a loop without products (a loader's), then the main loop: its header waits once (count 1),
# a masked branch drains (count 0) and joins the latch, which drains and branches back
PTX = """
$L__BB0_2:                              // =>This Inner Loop Header: Depth=1
	mbarrier.try_wait.parity.shared::cta.b64 complete, [%r1], %r2;
	wgmma.wait_group.sync.aligned 0;
	@%p1 bra 	$L__BB0_2;
// %bb.3:
	bra.uni 	$L__BB0_10;
$L__BB0_5:                              // =>This Inner Loop Header: Depth=1
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r3}, %rd1, %rd2, p, 1, 1, 0, 1;
	wgmma.commit_group.sync.aligned;
	wgmma.wait_group.sync.aligned 1;
	@%p2 bra 	$L__BB0_7;
// %bb.6:                               //   in Loop: Header=BB0_5 Depth=1
	wgmma.wait_group.sync.aligned 0;
	wgmma.wait_group.sync.aligned 1;
$L__BB0_7:                              // %join
                                        //   in Loop: Header=BB0_5 Depth=1
	wgmma.wait_group.sync.aligned 0;
	@%p3 bra 	$L__BB0_5;
$L__BB0_10:
	ret;
"""


def test_the_heaviest_iteration_of_the_main_loop_is_counted():
    # the path through the masked branch: 1 + (0, 1) + 0 = four waits, two of them drains
    assert ptx_waits.loop_waits(PTX) == {"loop_waits": 4, "loop_drains": 2}


def test_a_loop_without_products_is_not_the_main_loop():
    loader_only = PTX.split("$L__BB0_5:")[0] + "$L__BB0_10:\n\tret;\n"
    assert ptx_waits.loop_waits(loader_only) == {"loop_waits": 0, "loop_drains": 0}


def test_blocks_follow_the_comments_and_the_branches():
    found = {b["label"] or f"bb{i}": b for i, b in enumerate(ptx_waits.blocks(PTX))}
    assert found["BB0_5"]["loop"] == "BB0_5" and found["BB0_7"]["loop"] == "BB0_5"
    assert found["BB0_5"]["targets"] == ["BB0_7"] and found["BB0_5"]["falls"]
    assert found["BB0_10"]["loop"] is None and not found["BB0_10"]["falls"]


# an inner loop as LLVM comments it when nested: its header's comment on the line after the
# label, indented by depth ("=>  This Inner Loop Header: Depth=2")
NESTED = """
$L__BB0_3:                              // =>This Loop Header: Depth=1
                                        //     Child Loop BB0_4 Depth 2
	mbarrier.try_wait.parity.shared::cta.b64 complete, [%r1], %r2;
$L__BB0_4:                              // %body
                                        //   Parent Loop BB0_3 Depth=1
                                        // =>  This Inner Loop Header: Depth=2
	wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%r3}, %rd1, %rd2, p, 1, 1, 0, 1;
	wgmma.commit_group.sync.aligned;
	wgmma.wait_group.sync.aligned 1;
	wgmma.wait_group.sync.aligned 0;
	@%p2 bra 	$L__BB0_4;
// %bb.5:                               //   in Loop: Header=BB0_3 Depth=1
	wgmma.wait_group.sync.aligned 0;
	@%p3 bra 	$L__BB0_3;
	ret;
"""


def test_a_nested_inner_loop_is_found_by_its_indented_header():
    # the inner loop (one wait(1), one wait(0)), not the outer one's epilogue drain
    found = {b["label"]: b for b in ptx_waits.blocks(NESTED) if b["label"]}
    assert found["BB0_4"]["loop"] == "BB0_4"
    assert ptx_waits.loop_waits(NESTED) == {"loop_waits": 2, "loop_drains": 1}
