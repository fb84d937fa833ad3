"""Ring attention (context parallelism) benchmark: per-rank peak memory and forward+backward
time of ring_attn_func against the sequence length, each rank holding S/P tokens.

    python scripts/bench_ring.py --ranks 2                      # starts torchrun itself
    torchrun --nproc_per_node=8 scripts/bench_ring.py --seqlens 65536 131072 262144

NCCL on CUDA (one GPU per rank), gloo on CPU (the PyTorch attention path: small sizes only; on a
CPU the figures show that memory per rank falls as 1/P, not speed). Rank 0 writes
benchmarks/results/ring-<device>.{json,md,png}, the device, torch, triton and commit named.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from flashtrain.attention import ring_attn_func
from flashtrain.lab.bench.measure import environment
from flashtrain.lab.bench.results import slug, write_json
from flashtrain.lab.checkout import REPO, RESULTS


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--ranks", type=int, default=2, help="processes to start when not under torchrun"
    )
    p.add_argument("--seqlens", type=int, nargs="+", default=None)
    p.add_argument("--heads", type=int, default=None, help="default 16 on CUDA, 2 on CPU")
    p.add_argument("--head-dim", type=int, default=None, help="default 128 on CUDA, 32 on CPU")
    p.add_argument("--layout", default="zigzag", choices=("zigzag", "contiguous"))
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--rep", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args()


def relaunch_under_torchrun(nproc: int) -> int:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
    )
    return subprocess.call(cmd + ["--standalone", "-m", __spec__.name, *sys.argv[1:]], env=env)


def rss_mib() -> float:
    """This process's resident set now (Linux /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def cpu_peak_growth_mib(fn) -> float:
    """The resident set's peak above its level before fn(), sampled every millisecond on a
    thread (large CPU tensors are mapped and unmapped, so the set falls again after fn)."""
    base, peak, done = rss_mib(), [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        fn()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], rss_mib()) - base


def run_point(seqlen: int, args, device, dtype) -> dict:
    """Median fwd+bwd milliseconds over args.rep and the peak memory growth of this rank."""
    world = dist.get_world_size()
    local = seqlen // world
    shape = (1, local, args.heads, args.head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in "qkv")
    causal = not args.no_causal

    def step():
        ring_attn_func(q, k, v, causal=causal, layout=args.layout).sum().backward()

    step()  # warm-up: kernels compiled, buffers allocated
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        grown = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    else:
        grown = cpu_peak_growth_mib(step)
    times = []
    for _ in range(args.rep):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return {"ms": sorted(times)[len(times) // 2], "peak_mib": grown}


def main() -> int:
    args = parse_args()
    if "RANK" not in os.environ:
        return relaunch_under_torchrun(args.ranks)
    cuda = torch.cuda.is_available()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    world = dist.get_world_size()
    args.heads = args.heads or (16 if cuda else 2)
    args.head_dim = args.head_dim or (128 if cuda else 32)
    dtype = torch.bfloat16 if cuda else torch.float32
    seqlens = args.seqlens or ([16384, 65536, 131072] if cuda else [1024, 2048, 4096])
    rows = []
    for seqlen in seqlens:
        if seqlen % (2 * world):
            raise SystemExit(f"seqlen {seqlen} is not a multiple of 2 x {world} ranks")
        point = run_point(seqlen, args, device, dtype)
        gathered = [None] * world
        dist.all_gather_object(gathered, point)
        row = {
            "seqlen": seqlen,
            "ranks": world,
            "tokens_per_rank": seqlen // world,
            "ms": max(p["ms"] for p in gathered),  # the step waits for the slowest rank
            "peak_mib_per_rank": max(p["peak_mib"] for p in gathered),
        }
        rows.append(row)
        if rank == 0:
            print(f"S={seqlen:>7} P={world}: fwd+bwd {row['ms']:9.1f} ms, "
                  f"peak {row['peak_mib_per_rank']:8.1f} MiB per rank", flush=True)  # fmt: skip
    if rank == 0:
        write_results(rows, args, world)
    dist.destroy_process_group()
    return 0


def write_results(rows: list[dict], args, world: int) -> None:
    env = environment()
    name = f"ring-{slug(env['device'])}-p{world}"
    setup = {
        "heads": args.heads,
        "head_dim": args.head_dim,
        "layout": args.layout,
        "causal": not args.no_causal,
    }
    write_json(args.out / f"{name}.json", {"env": env, "setup": setup, "rows": rows})
    lines = [
        f"# Ring attention, {world} ranks ({setup['layout']}, "
        f"{'causal' if setup['causal'] else 'non-causal'}, {args.heads} heads x {args.head_dim})",
        "",
        f"Device: **{env['device']}**, torch {env['torch']}, triton {env['triton']}, "
        f"CUDA {env['cuda']}, commit {env['commit']}. Time: the slowest rank's median forward + "
        "backward; memory: the largest rank's peak growth during one step (CUDA: allocated; CPU: "
        "resident set, sampled each millisecond).",
        "",
        "| seqlen | tokens per rank | fwd+bwd ms | peak MiB per rank |",
        "|---|---|---|---|",
    ]
    if env["device"] == "cpu":
        lines[3:3] = [
            "",
            "On a CPU the memory column is blurred by the allocator reusing freed memory: it shows "
            "that no (S x S) buffer appears (one of 16K x 16K fp32 scores is 1 GiB), not a 1/P "
            "trend; the time shows the work per rank, on cores the ranks share.",
        ]
    lines += [
        f"| {r['seqlen']} | {r['tokens_per_rank']} | {r['ms']:.1f} | {r['peak_mib_per_rank']:.1f} |"
        for r in rows
    ]
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    seqlens = [r["seqlen"] for r in rows]
    left.plot(seqlens, [r["ms"] for r in rows], marker="o")
    left.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="fwd+bwd ms")
    right.plot(seqlens, [r["peak_mib_per_rank"] for r in rows], marker="o")
    right.set(xscale="log", xlabel="sequence length", ylabel="peak MiB per rank")
    fig.suptitle(f"ring attention over {world} ranks on {env['device']}")
    fig.tight_layout()
    fig.savefig(args.out / f"{name}.png", dpi=100)
    print(f"wrote {args.out / name}.{{json,md,png}}")


if __name__ == "__main__":
    raise SystemExit(main())
