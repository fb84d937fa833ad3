"""How often an iteration of a kernel's main loop waits for its tensor-core products, read from
the PTX (the compile tool's loop_waits / loop_drains: flashtrain/lab/kernel_compile.py).

An asynchronous warpgroup product (wgmma) runs while the warpgroup goes on; `wgmma.wait_group N`
blocks until at most N of its committed groups are still running. N = 0 drains them all: the
tensor cores have nothing of this warpgroup's left, and until it issues again they idle for it.
FlashAttention-3's overlap keeps one product in flight (N = 1) wherever the next one does not
need its result. The counts are of one iteration's path through the loop's blocks: LLVM's
comments in the PTX name the innermost loop each block belongs to, and the path with the most
waits (a branch taken on some tiles only, the masked ones, is one path) is the one counted.
"""

from __future__ import annotations

import re

# a PTX basic block opens at a label or at LLVM's "// %bb.N:" line; LLVM's loop comments on it
# name the innermost loop it belongs to ("in Loop: Header=BB0_39") or that it heads one
_BLOCK = re.compile(r"^(?:\$L__(BB\d+_\d+):|// %bb\.\d+:)", re.M)
_LOOP = re.compile(r"in Loop: Header=(BB\d+_\d+)|=>\s*This (?:Inner )?Loop Header")
_BRANCH = re.compile(r"^\s*(?:@!?%p\d+\s+)?bra(?:\.uni)?\s+\$L__(BB\d+_\d+);", re.M)
_WAIT = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+(\d+);")
_ENDS = re.compile(r"(bra\.uni|bra|ret|exit|trap)\b")  # an unconditional last instruction


def blocks(ptx: str) -> list[dict]:
    """The PTX's basic blocks in text order: label (None for an unlabelled one), loop (the
    header of the innermost loop it belongs to, None outside loops), targets (its branches'),
    falls (whether it falls through to the next block), waits (its wgmma waits' counts) and
    wgmma (whether it issues one)."""
    starts = [m.start() for m in _BLOCK.finditer(ptx)] + [len(ptx)]
    found = []
    for lo, hi in zip(starts, starts[1:]):
        text = ptx[lo:hi]
        lines = text.split("\n")
        comments = [lines[0], *[x for x in lines[1:4] if x.lstrip().startswith("//")]]
        member = _LOOP.search("\n".join(comments))
        label = _BLOCK.match(text).group(1)
        code = [x.strip() for x in lines if x.strip() and not x.lstrip().startswith(("//", "."))]
        found.append(dict(label=label, loop=(member.group(1) or label) if member else None,
                          targets=_BRANCH.findall(text),
                          falls=not (code and _ENDS.match(code[-1])),
                          waits=[int(n) for n in _WAIT.findall(text)],
                          wgmma="wgmma.mma_async" in text))  # fmt: skip
    return found


def _heaviest_path(found: list[dict], header: str) -> tuple[int, int]:
    """(drains, waits) of the iteration path of loop `header` with the most of them: from the
    header through the loop's blocks until a branch back to it."""
    members = [i for i, b in enumerate(found) if b["loop"] == header]
    at = {found[i]["label"]: i for i in members if found[i]["label"]}
    start = at.get(header)
    if start is None:
        return 0, 0
    most: dict[int, tuple[int, int]] = {}

    def walk(i: int) -> tuple[int, int]:
        if i not in most:
            nxt = [at[t] for t in found[i]["targets"] if t in at]
            if found[i]["falls"] and i + 1 in members:
                nxt.append(i + 1)
            after = [walk(j) for j in nxt if j != start] or [(0, 0)]  # the back edge: done
            own = found[i]["waits"]
            most[i] = (own.count(0) + max(a for a, _ in after),
                       len(own) + max(b for _, b in after))  # fmt: skip
        return most[i]

    return walk(start)


def loop_waits(ptx: str) -> dict:
    """{loop_waits, loop_drains}: every wgmma.wait_group of an iteration of the main loop, and
    those with a count of 0, on its heaviest path (module docstring). The main loop: an
    innermost loop that issues wgmma, the most-waiting one (each consumer partition has its own
    copy). 0 and 0 without one."""
    found = blocks(ptx)
    heads = {b["loop"] for b in found if b["loop"]}
    loops = [h for h in heads if any(b["wgmma"] for b in found if b["loop"] == h)]
    drains, waits = max((_heaviest_path(found, h) for h in loops), default=(0, 0))
    return dict(loop_waits=waits, loop_drains=drains)
