"""Every context-parallel mode (ring, ulysses, hybrid) on 4 gloo ranks equals one process, with
document masking, activation offload and sequence-tiled layers; and the memory plan
(flashtrain/train/activation_memory.py) is calibrated: each rank's measured activation peak is
within +-15% of the plan's, for every mode.

One spawn of 4 ranks runs every case (rank r of each sequence's group holds piece u of ring shard
r // U, flashtrain.attention.ring_sharding.take_cp_shard) and writes what it measured; the
tests read it. A Llama (GQA: 4 query heads, 2 K/V heads, so Ulysses over 4 ranks repeats each
K/V head) on the PyTorch CPU attention path, float32.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass

import pytest
import torch
import torch.distributed as dist
from spawn_testing import run_ranks
from torch.distributed._tools.mem_tracker import MemTracker

from flashtrain.data.packing import document_fields
from flashtrain.models import build_model
from flashtrain.train.activation_memory import ActivationPlan, activation_memory, layer_shapes
from flashtrain.train.context_parallel import ContextParallel

EOS = 0
WORLD = 4
TOLERANCE = 0.15  # the calibration's: measured peak within +-15% of the plan


@dataclass(frozen=True)
class Case:
    mode: str  # ring | ulysses | hybrid
    ulysses: int  # U: ranks per Ulysses group (ring: 1)
    layout: str = "zigzag"
    documents: bool = True
    recompute: str = "none"
    tile_tokens: int = 0
    batch: int = 2
    seq_len: int = 56  # 14 tokens per rank: chunks of 7 (zigzag over 4), pieces across documents


EXACT = [
    Case("ring", 1, recompute="all"),
    Case("ring", 1, layout="contiguous", recompute="offload", tile_tokens=5),
    Case("ulysses", 4, recompute="offload", tile_tokens=9),
    Case("ulysses", 4, documents=False, batch=1),
    Case("hybrid", 2, recompute="all", tile_tokens=4),
    Case("hybrid", 2, layout="contiguous", documents=False, recompute="offload"),
]
# Memory: 512 tokens per rank, the model narrow and short so that activations dominate. Each
# mode with every block recomputed and with offload + MLP tiles; ring also without recompute.
CALIBRATION = [
    Case(mode, u, documents=False, recompute=recompute, tile_tokens=tile, batch=1, seq_len=2048)
    for mode, u, recompute, tile in (
        ("ring", 1, "none", 0),
        ("ring", 1, "offload", 128),
        ("ulysses", 4, "all", 0),
        ("ulysses", 4, "offload", 128),
        ("hybrid", 2, "all", 0),
        ("hybrid", 2, "offload", 128),
    )
]


def model_config(case: Case, **extra) -> dict:
    return dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=64,
                vocab_size=64, max_seq_len=case.seq_len, **extra)  # fmt: skip


def memory_config(case: Case) -> dict:
    return dict(arch="llama", n_layer=3, n_head=4, n_kv_head=2, d_model=64, d_ff=256,
                vocab_size=128, max_seq_len=case.seq_len)  # fmt: skip


def make_batch(case: Case, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (case.batch, case.seq_len + 1), generator=generator)
    if case.documents:  # documents of 1 to ~20 tokens, crossing chunks, pieces and ranks
        ends = torch.rand(ids.shape, generator=generator) < 0.08
        ids[ends] = EOS
    batch = {"input_ids": ids[:, :-1].clone(), "labels": ids[:, 1:].clone()}
    if case.documents:
        batch.update(document_fields(batch["input_ids"], EOS))
    return batch


def groups(world_size: int) -> dict[int, tuple]:
    """U -> (Ulysses group, ring group) of this rank: U = 4 or 1: the world and None; U = 2:
    Ulysses groups {0, 1}, {2, 3} and ring groups {0, 2}, {1, 3} (rank = r * U + u)."""
    rank = dist.get_rank()
    made = {}
    for members in ([0, 1], [2, 3], [0, 2], [1, 3]):  # every rank creates every group, in order
        made[tuple(members)] = dist.new_group(members)
    ulysses = made[(0, 1)] if rank < 2 else made[(2, 3)]
    ring = made[(0, 2)] if rank % 2 == 0 else made[(1, 3)]
    return {1: (None, None), 4: (None, None), 2: (ulysses, ring)}


def context_parallel(case: Case, rank: int, group_pairs: dict) -> ContextParallel:
    ulysses_group, ring_group = group_pairs[case.ulysses]
    ring_size = WORLD // case.ulysses
    return ContextParallel(
        size=WORLD, layout=case.layout, rank=rank, mode=case.mode, ring_size=ring_size,
        ulysses_size=case.ulysses, ulysses_group=ulysses_group if case.mode != "ring" else None,
        ring_group=ring_group if case.mode == "hybrid" else None, group=None,
    )  # fmt: skip


def split_model(cp: ContextParallel, config: dict, state: dict):
    model = build_model(config, cp.attention("flash"))
    model.load_state_dict(state)
    return model


def global_loss_backward(out) -> torch.Tensor:
    """The loss over every rank's targets (token-weighted), its backward run on this rank's part."""
    total = out.num_targets.clone()
    dist.all_reduce(total)
    (out.loss * out.num_targets / total).backward()
    loss = (out.loss * out.num_targets / total).detach()
    dist.all_reduce(loss)
    return loss


def check_exact(case: Case, rank: int, group_pairs: dict) -> dict:
    """The split run's loss and summed gradients against one process's: the largest relative
    differences (the test asserts on them)."""
    torch.manual_seed(1234)  # the same weights and batch on every rank
    reference = build_model(model_config(case), "flash")  # one process: no split, no offload
    batch = make_batch(case, seed=zlib.crc32(repr(case).encode()))
    ref_out = reference(**batch)
    ref_out.loss.backward()
    cp = context_parallel(case, rank, group_pairs)
    config = model_config(case, recompute=case.recompute, tile_tokens=case.tile_tokens)
    model = split_model(cp, config, reference.state_dict())
    loss = global_loss_backward(model(**cp.shard_batch(batch)))
    worst = 0.0
    for p, ref in zip(model.parameters(), reference.parameters()):
        grad = p.grad.clone()
        dist.all_reduce(grad)  # each rank's part of the gradient: the sum is the whole
        scale = ref.grad.abs().max().clamp_min(1e-12)
        worst = max(worst, float((grad - ref.grad).abs().max() / scale))
    loss_error = abs(float(loss) - float(ref_out.loss)) / abs(float(ref_out.loss))
    return {"case": asdict(case), "rank": rank, "loss": loss_error, "grads": worst}


def measure_memory(case: Case, rank: int, group_pairs: dict) -> dict:
    torch.manual_seed(99)
    config = dict(memory_config(case), recompute=case.recompute, tile_tokens=case.tile_tokens)
    cp = context_parallel(case, rank, group_pairs)
    model = build_model(config, cp.attention("flash"))
    batch = cp.shard_batch(make_batch(case, seed=5))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        global_loss_backward(model(**batch))
    peak = {str(k).split(".")[-1]: v for k, v in tracker.get_tracker_snapshot("peak")[
        torch.device("cpu")].items()}  # fmt: skip
    measured = peak["Total"] - peak["PARAM"] - peak["GRAD"]
    plan = ActivationPlan(
        tokens=case.batch * case.seq_len // WORLD, batch=case.batch, act_bytes=4,
        residual_bytes=4, recompute=case.recompute,
        recomputed=sum(model.recomputes_block(i) for i in range(model.config.n_layer)),
        tile_tokens=case.tile_tokens, mode=case.mode, ring_size=WORLD // case.ulysses,
        ulysses_size=case.ulysses,
    )  # fmt: skip
    planned = activation_memory(layer_shapes(model), plan)
    # on a CPU the offloaded block inputs are in the same memory as everything else
    return {"case": asdict(case), "rank": rank, "measured": measured,
            "planned": planned.device + planned.host,
            "terms": dict(planned.terms, host=planned.host)}  # fmt: skip


def worker(rank: int, world_size: int, out_dir: str) -> None:
    import os

    os.environ["FLASHTRAIN_CPU_ATTENTION"] = "torch"  # a child process: ours to set
    group_pairs = groups(world_size)
    rows = {
        "exact": [check_exact(case, rank, group_pairs) for case in EXACT],
        "memory": [measure_memory(case, rank, group_pairs) for case in CALIBRATION],
    }
    with open(f"{out_dir}/rank-{rank}.json", "w") as f:
        json.dump(rows, f)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict[str, list[dict]]:
    """Every case run on 4 ranks: each rank's rows, by kind."""
    tmp = tmp_path_factory.mktemp("cp_modes")
    run_ranks(worker, WORLD, tmp, str(tmp))
    rows = {"exact": [], "memory": []}
    for rank in range(WORLD):
        for kind, mine in json.loads((tmp / f"rank-{rank}.json").read_text()).items():
            rows[kind] += mine
    return rows


def test_every_mode_with_documents_offload_and_tiles_equals_one_process(measured):
    rows = measured["exact"]
    assert {r["case"]["mode"] for r in rows} == {"ring", "ulysses", "hybrid"}
    assert len(rows) == WORLD * len(EXACT)
    off = [r for r in rows if not (r["loss"] < 2e-6 and r["grads"] < 1e-5)]
    assert not off, off


def test_each_ranks_measured_activation_peak_is_within_15_percent_of_the_plan(measured):
    off = []
    for row in measured["memory"]:
        ratio = row["planned"] / row["measured"]
        if not 1 - TOLERANCE <= ratio <= 1 + TOLERANCE:
            off.append(f"{row['case']} rank {row['rank']}: planned {row['planned'] / 2**20:.2f} "
                       f"MiB, measured {row['measured'] / 2**20:.2f} MiB ({ratio:.2f}x) "
                       f"{ {k: round(v / 2**20, 2) for k, v in row['terms'].items()} }")  # fmt: skip
    assert not off, "\n".join(off)
