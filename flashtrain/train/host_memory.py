"""Will a CPU run fit in this host's memory? Its peak, estimated from the shapes before any weight
exists, against what the host has free: a run that cannot fit is refused at start (ConfigError,
exit 2) with what would fit, not killed by the allocator minutes later.

The peak of a training step on a CPU, per rank (the ranks of one node share its memory, so it
is multiplied by LOCAL_WORLD_SIZE):

    states        16 B per parameter (fp32 weights, gradients, AdamW's two moments; sharded
                  under FSDP2), + 4 B per parameter for DDP's gradient buckets
    activations   what one micro-batch's blocks keep for the backward pass: memory_estimate's
                  per-token count at the run's CPU precision (fp32: 4 B everywhere; bf16
                  autocast: 2 B, the residual stream 4 B), + the S x S probabilities per block
                  where the attention route keeps them (attention=reference, or sdpa with
                  dropout or a window: PyTorch's math kernel)
    working set   the larger of what exists beside the activations at the end of the forward
                  (the chunked loss's (chunk, vocab) float32 logits, its saved gradients of
                  the hidden states and the head's weight) and at the start of the backward
                  (one block's gradients, and the attention backward's float32 copies and
                  (B, H, rows, S) score blocks on the chunked PyTorch path: torch_path.py)
    baseline      the process itself: Python, torch and the project's imports, the data
                  pipeline (measured below)

Where the routes differ (attention/route.py): on a CPU, float32 attention without dropout or a
window runs ATen's fused flash kernel (O(S) memory, nothing S x S); everything else the chunked
PyTorch path, CHUNK query rows at a time (a block-sparse layout: block_size rows). The loss is
the chunked PyTorch path (the fused kernels run on a CPU only under TRITON_INTERPRET=1, a test
set-up, and hold less).

Calibration (2026-11-27, this project's 2-core CPU machine, 24 GiB; peak RSS of
`python train.py ... trainer.max_steps=2 trainer.allow_slow_cpu=true` by /usr/bin/time):

    config (fp32 unless said)                       estimate    measured peak
    default (gpt2-tiny, seq 128, micro 8)           0.47 GiB    0.42 GiB
    gpt2-tiny, seq 2048, micro 1                    0.50 GiB    0.45 GiB
    llama-tiny, seq 1024, micro 1                   0.47 GiB    0.43 GiB
    gpt2 (vocab 16, synthetic), seq 1024, micro 1   2.45 GiB    2.11 GiB
    gpt2, vocab 50257, seq 1024, micro 1            3.44 GiB    3.02 GiB
    gpt2 (vocab 16), seq 4096, micro 1              4.73 GiB    4.27 GiB
    gpt2 (vocab 16), seq 1024, micro 1, bf16        2.29 GiB    2.16 GiB
    gpt2 (vocab 16), seq 16384, micro 8             97.3 GiB    (the run that crashed at 24 GiB)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashtrain.attention.torch_path import CHUNK
from flashtrain.train.activation_memory import (
    ActivationPlan,
    activation_memory,
    block_bytes,
    layer_shapes,
)
from flashtrain.train.config import BatchPlan
from flashtrain.train.distributed import is_sharded, local_ranks, state_shards
from flashtrain.train.memory_estimate import STATE_BYTES_PER_PARAM, gib
from flashtrain.typed_config import ConfigError

MIB = 2**20
# The process before the model: Python, torch, the project's imports, the data pipeline
# (measured: 0.37 GiB after the imports, 0.42 GiB at the default run's peak less its model).
PROCESS_BASELINE = 440 * MIB
# Kept free of the estimate: the allocator's slack and what other processes (and the page
# cache a run's data and checkpoints use) take while it runs.
MARGIN = 0.05
MEMINFO = Path("/proc/meminfo")
CGROUP_V2 = Path("/sys/fs/cgroup")  # memory.max, memory.current, memory.stat
CGROUP_V1 = Path("/sys/fs/cgroup/memory")  # memory.limit_in_bytes, memory.usage_in_bytes
NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1
SEQ_LEN_STEP = 128  # a suggested seq_len is a multiple of this

_ACT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# What the process's RSS grows per block and token over the count of the tensors autograd saves
# (which matches memory_estimate's count): freed memory the allocator keeps, gradients in
# flight; under CPU autocast also the float32 outputs of ops outside its lists (layer norms)
# and their 16-bit copies. Measured with GPT-2 blocks at 4096 tokens (2 vs 4 blocks): fp32
# 58.4 KB vs 49.2 KB counted per token and block, bf16 40.2 KB vs 27.6 KB.
SAVED_TO_RSS = {"fp32": 1.2, "bf16": 1.5, "fp16": 1.5}


@dataclass(frozen=True)
class HostMemoryEstimate:
    """Peak host bytes of a CPU training step: per rank, times `ranks` on this node."""

    states: float  # weights, gradients, AdamW states (+ DDP buckets)
    activations: float  # one micro-batch's, kept for the backward pass
    working_set: float  # the loss's or the attention backward's temporaries, the larger
    baseline: float  # the process itself
    ranks: int  # processes on this node (LOCAL_WORLD_SIZE)
    tokens: int  # per micro-batch and rank: micro_batch_size x seq_len / context_parallel

    @property
    def per_rank(self) -> float:
        return self.states + self.activations + self.working_set + self.baseline

    @property
    def total(self) -> float:
        return self.ranks * self.per_rank

    def describe(self) -> str:
        ranks = f" x {self.ranks} ranks on this node" if self.ranks > 1 else ""
        return (
            f"~{_size(self.total)} (states {_size(self.states)}, activations of "
            f"{self.tokens:,} tokens {_size(self.activations)}, working set "
            f"{_size(self.working_set)}, process {_size(self.baseline)}{ranks})"
        )


@dataclass(frozen=True)
class HostAvailable:
    """Bytes a new run can take on this host, and where the figure comes from."""

    bytes: int
    source: str  # "MemAvailable" or the cgroup limit's files


def _size(n_bytes: float) -> str:
    """GiB, or MiB below one (a tiny model's parts would all read 0.0 GiB)."""
    return gib(n_bytes) if n_bytes >= 2**30 else f"{n_bytes / MIB:.0f} MiB"


def attention_route(model_cfg: Any, attention_cfg: Any, precision: str) -> tuple[str, int]:
    """What the attention holds on a CPU: ("linear", 0) for ATen's flash kernel (O(S)),
    ("chunked", rows) for the PyTorch path's (B, H, rows, S) blocks, ("quadratic", 0) for a
    kernel that keeps (B, H, S, S) probabilities per block."""
    impl = getattr(attention_cfg, "impl", "flash")
    dropout = getattr(model_cfg, "attn_dropout", 0.0) > 0
    windowed = getattr(model_cfg, "sliding_window", None) is not None
    softcap = bool(getattr(model_cfg, "attn_logit_softcap", None))
    if impl == "reference" or (impl == "sdpa" and (dropout or windowed)):
        return "quadratic", 0
    if impl == "blocksparse":
        return "chunked", attention_cfg.block_size
    if impl == "sdpa" or (precision == "fp32" and not (dropout or windowed or softcap)):
        return "linear", 0
    return "chunked", CHUNK


def estimate_host_peak(
    model: Any,
    cfg: Any,
    plan: BatchPlan,
    *,
    precision: str,
    strategy: str,
    ranks: int | None = None,
) -> HostMemoryEstimate:
    """The peak host memory of training `model` (built on the meta device is enough) with this
    plan on a CPU. cfg: the run's config (model, attention, trainer.ddp); precision: the
    resolved trainer.precision (fp32 or bf16); ranks: processes on this node (LOCAL_WORLD_SIZE
    when None)."""
    m = model.config
    params = model.num_parameters()
    act = _ACT_BYTES[precision]
    residual = 4  # the weights' dtype: fp32 (FSDP2's param_dtype below)
    if is_sharded(strategy) and cfg.trainer.fsdp.param_dtype != "auto":
        residual = _ACT_BYTES[cfg.trainer.fsdp.param_dtype]
    batch, seq = plan.micro_batch_size, plan.seq_len // plan.context_parallel
    tokens = batch * seq
    shapes = layer_shapes(model)
    activation_plan = ActivationPlan(
        tokens=tokens, batch=batch, act_bytes=act, residual_bytes=residual,
        recompute=m.recompute, recomputed=sum(model.recomputes_block(i) for i in range(m.n_layer)),
        tile_tokens=getattr(m, "tile_tokens", 0), dropout_masks=m.dropout > 0,
    )  # fmt: skip
    saved = activation_memory(shapes, activation_plan)
    block = block_bytes(shapes, activation_plan)
    # what the blocks keep (offloaded inputs are host memory here too) and one recomputed block
    kept_by_blocks = saved.terms["saved blocks"] + saved.terms["block inputs"] + saved.host
    if activation_plan.recomputed:
        kept_by_blocks += block
    states = STATE_BYTES_PER_PARAM * params / state_shards(strategy, cfg.trainer, plan.world_size)
    if strategy == "ddp" and plan.world_size > 1 and not cfg.trainer.ddp.gradient_as_bucket_view:
        states += 4.0 * params  # the buckets the gradients are copied into
    route, rows = attention_route(m, cfg.attention, precision)
    # one (B, H, S, S) float32 block of probabilities per block: the blocks a route keeps
    square = 4.0 * batch * m.n_head * seq * plan.seq_len
    kept = SAVED_TO_RSS[precision] * kept_by_blocks
    activations = kept + (m.n_layer * square if route == "quadratic" else 0.0)
    return HostMemoryEstimate(
        states=states,
        activations=activations,
        working_set=max(
            _loss_working_set(m, tokens, act),
            _backward_working_set(block, m, tokens, route, rows, batch, seq, square),
        ),  # fmt: skip
        baseline=float(PROCESS_BASELINE),
        ranks=local_ranks() if ranks is None else ranks,
        tokens=tokens,
    )


def _loss_working_set(m: Any, tokens: int, act: int) -> float:
    """The chunked LM loss at the end of the forward: a chunk's float32 logits (c, V), turned
    into their gradient in place (+ the 16-bit product they are cast from), and the gradients it
    saves for the backward: the hidden states' (N, C) and the head weight's (V, C) in float32,
    with one (V, C) product being added to it (+ the weight's 16-bit copy)."""
    chunk_size = getattr(m, "loss_chunk_size", None)
    if chunk_size is None:  # no LM head (a classifier): its loss is (B, classes)
        return 0.0
    vocab, width = m.vocab_size, m.d_model
    chunk = min(chunk_size, tokens)
    low_precision = act * (chunk * vocab + vocab * width) if act < 4 else 0
    return 4.0 * (chunk * vocab + tokens * width + 2 * vocab * width) + low_precision


def _backward_working_set(
    block: float, m: Any, tokens: int, route: str, rows: int, batch: int, seq: int, square: float
) -> float:
    """The start of the backward: gradients of one block's saved tensors (`block` bytes, like
    its activations), and the attention backward's own: float32 q, k, v, out, dout and dq, dk, dv
    (8 x (N, C)) and, on the chunked path, five (B, H, rows, S) float32 blocks (scores,
    probabilities, their gradients); S x S ones on a quadratic route."""
    attention = 8 * 4.0 * tokens * m.d_model
    if route == "chunked":
        attention += 5 * 4.0 * batch * m.n_head * min(rows, seq) * seq
    elif route == "quadratic":
        attention += 2 * square
    return block + attention


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _inactive_file(stat: Path, key: str) -> int:
    """Page cache the kernel reclaims before refusing memory (counted in a cgroup's usage)."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return 0
    values = dict(line.split()[:2] for line in lines if len(line.split()) >= 2)
    return int(values.get(key, 0))


def _cgroup_free(cgroup_v2: Path, cgroup_v1: Path) -> tuple[int, str] | None:
    """The cgroup limit less its usage (less reclaimable page cache): v2, else v1."""
    for folder, limit, usage, cache in (
        (cgroup_v2, "memory.max", "memory.current", "inactive_file"),
        (cgroup_v1, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    ):
        cap, used = _read_int(folder / limit), _read_int(folder / usage)
        if cap is None or used is None or cap >= NO_LIMIT:
            continue
        used = max(0, used - _inactive_file(folder / "memory.stat", cache))
        return max(0, cap - used), f"the cgroup limit ({folder / limit} less {usage})"
    return None


def _mem_available(meminfo: Path) -> int | None:
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    line = next((s for s in lines if s.startswith("MemAvailable:")), None)
    return None if line is None else int(line.split()[1]) * 1024  # kB


def available_host_memory(
    meminfo: Path = MEMINFO, cgroup_v2: Path = CGROUP_V2, cgroup_v1: Path = CGROUP_V1
) -> HostAvailable | None:
    """What a new allocation can take on this host: MemAvailable (Linux), capped by this
    process's cgroup memory limit; None where neither can be read (then nothing is refused)."""
    mem_available = _mem_available(meminfo)
    found = [(mem_available, f"MemAvailable in {meminfo}")] if mem_available is not None else []
    cgroup = _cgroup_free(cgroup_v2, cgroup_v1)
    if cgroup is not None:
        found.append(cgroup)
    if not found:
        return None
    free, source = min(found)  # the tighter of the two
    return HostAvailable(free, source)


def available_host_bytes(
    meminfo: Path = MEMINFO, cgroup_v2: Path = CGROUP_V2, cgroup_v1: Path = CGROUP_V1
) -> int | None:
    """available_host_memory's bytes: the one host figure training and inference check against."""
    found = available_host_memory(meminfo, cgroup_v2, cgroup_v1)
    return None if found is None else found.bytes


def process_rss(statm: Path = Path("/proc/self/statm")) -> int:
    """This process's resident bytes now (Linux; 0 where unknown)."""
    try:
        return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def check_host_memory(
    estimate: HostMemoryEstimate,
    available: HostAvailable | None,
    plan: BatchPlan,
    estimate_for: Callable[[BatchPlan], HostMemoryEstimate],
    resident_per_rank: float = 0.0,
) -> None:
    """ConfigError when `estimate` exceeds (1 - MARGIN) of what is available, naming what would
    fit: the largest micro_batch_size, else (at micro_batch_size=1) the largest seq_len, each
    estimated by estimate_for(plan with that change). Nothing is refused when available is None.

    resident_per_rank: what each rank's process already holds (process_rss() at the check,
    where every rank of the node has started): MemAvailable no longer has it, so up to the
    estimate's baseline it is not counted again."""
    if available is None:
        return
    budget = (1 - MARGIN) * available.bytes

    def to_come(e: HostMemoryEstimate) -> float:
        return e.total - e.ranks * min(resident_per_rank, e.baseline)

    if to_come(estimate) <= budget:
        return

    def fits(p: BatchPlan) -> bool:
        return to_come(estimate_for(p)) <= budget

    in_use = estimate.total - to_come(estimate)
    running = f", {_size(in_use)} of it already in use by the running processes" if in_use else ""
    raise ConfigError(
        f"this CPU run needs {estimate.describe()} of host memory{running}; "
        f"{gib(available.bytes)} is available ({available.source}, {MARGIN:.0%} kept free); "
        f"{_what_fits(plan, fits)}, or trainer.max_steps=0 for a dry run"
    )


def _what_fits(plan: BatchPlan, fits: Callable[[BatchPlan], bool]) -> str:
    """The largest micro_batch_size that fits; else the largest seq_len at micro_batch_size=1."""
    for micro in range(plan.micro_batch_size - 1, 0, -1):
        if fits(dataclasses.replace(plan, micro_batch_size=micro)):
            return f"micro_batch_size={micro} fits"
    one = dataclasses.replace(plan, micro_batch_size=1)
    step = SEQ_LEN_STEP * plan.context_parallel
    seq = (plan.seq_len - 1) // step * step
    while seq >= step:
        if fits(dataclasses.replace(one, seq_len=seq)):
            return f"micro_batch_size=1 seq_len={seq} fits"
        seq -= step
    return "not even micro_batch_size=1 at a shorter seq_len fits: use a smaller model or a GPU"
