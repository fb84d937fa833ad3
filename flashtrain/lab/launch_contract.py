"""The launch contract: what a real CUDA launch enforces and the interpreter never checks, checked
on a machine without a GPU.

TRITON_INTERPRET runs a kernel's arithmetic, not its launch: the first GPU backward would have
raised "Kernel requires a runtime memory allocation, but no allocator was set" (Triton's scratch
allocator is per thread, and autograd runs a CUDA backward on its own thread). This check
launches the real launchers through the sm_90 stand-in driver of flashtrain/lab/kernel_compile.py
(each launch compiles, nothing runs) and, at every launch point, in the launching thread,
asserts what Triton's CUDA launcher and the hardware would:

    scratch      a compiled kernel with global_scratch_size > 0 finds an allocator in the
                 launching thread (triton/runtime/_allocation.py: a ContextVar, NullAllocator
                 by default; the launcher calls it for global_scratch_size x programs bytes)
    shared       shared memory per block <= the GPU's opt-in limit (232,448 B on sm_90:
                 CompiledKernel._init_handles raises OutOfResources past it)
    threads      registers x threads per block <= 65,536 (else cuFuncGetAttribute's
                 MAX_THREADS_PER_BLOCK falls under num_warps x 32: OutOfResources "threads")
    grid         x <= 2**31 - 1, y and z <= 65,535 (cuLaunchKernelEx: "invalid argument")
    descriptors  a launch with TMA / DQ_TMA on passes only (.., seq, head, head_dim) tensors with a
                 16-byte aligned base and 16-byte multiple strides (cuTensorMapEncodeTiled's rule)

Launch sets (`run(sets)`; `scripts/kernel_compile.py --contract`):
    defaults  every default attention launch (kernel_compile.default_launches), the forward in
              the calling thread and the backward in a fresh thread with an empty context, as
              autograd's CUDA device thread runs it
    features  every feature flag (kernel_compile.feature_launches), the same way
    decode    the split-KV decode kernels, launched from a fresh thread
    variants  the forward's Hopper variants (warp-specialized, persistent) and dK/dV with
              64-row query tiles (kernel_compile.variant_launches), launched from a fresh thread
    hopper    the warp-specialized Gluon backward (kernel_compile.hopper_launches), its
              backward in a fresh thread
    hopper-fwd  the Gluon forward (kernel_compile.hopper_forward_launches), launched from a
              fresh thread
    loss      the fused linear cross-entropy, forward here and backward in a fresh thread
    compiled  flash_attn_func inside torch.compile (aot_eager: the custom ops as opaque nodes),
              its backward through the real autograd engine from a fresh thread
    models    q/k/v as the models pass them (views of one fused QKV projection, packed varlen
              views, head_dim 36 whose views break descriptor alignment) with descriptors forced on
    shapes    the grid at the largest shapes the presets and the GPU suite use (and, per LM
              preset without context parallelism, its tokens as 16-token documents), no compile:
              zero-stride views stand in for the tensors, so nothing large is allocated

64-bit offsets (a tensor past 2**31 elements) are a property of the kernels' index arithmetic,
not of a launch: tests/attention/test_int32_limits.py checks them under the interpreter.
"""

from __future__ import annotations

import argparse
import contextvars
import functools
import json
import os
import sys
import threading
from dataclasses import dataclass, field

import torch

from flashtrain.kernels import tma, tuning
from flashtrain.kernels.common import GRID_X_MAX, GRID_YZ_MAX, UNBOUNDED
from flashtrain.lab import kernel_compile

REGISTERS_PER_BLOCK = 65_536  # sm_80 .. sm_90: a block's threads share one register file
# kernels whose tiles always go through descriptors (no TMA flag): the 4-d tensors and these
ALWAYS_DESCRIPTORS = {"flash_backward_ws_kernel": ("LSE", "DELTA")}


@dataclass
class Contract:
    """What the launches of one run did and broke."""

    arch: int
    compile_kernels: bool = True
    launches: list[dict] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    tag: str = ""  # the launch set entry being run

    def on_launch(self, fn, grid, args, kwargs, compile_kernel):
        """kernel_compile.install's hook, in the launching thread."""
        grid = tuple(grid(kwargs) if callable(grid) else grid) + (1, 1)
        grid = grid[:3]
        where = f"{self.tag}: {fn.__name__}"
        self._check_grid(where, grid)
        self._check_descriptors(where, fn, args, kwargs)
        kernel = compile_kernel() if self.compile_kernels else None
        record = dict(launch=self.tag, kernel=fn.__name__, grid=grid,
                      thread=threading.current_thread().name)  # fmt: skip
        if kernel is not None:
            record.update(self._check_kernel(where, kernel))
        self.launches.append(record)
        return kernel

    def _check_grid(self, where, grid) -> None:
        for axis, size, limit in zip("xyz", grid, (GRID_X_MAX, GRID_YZ_MAX, GRID_YZ_MAX)):
            if size > limit:
                self.violations.append(f"{where}: grid {grid}: {axis} = {size:,} > {limit:,}")

    def _check_descriptors(self, where, fn, args, kwargs) -> None:
        """TMA: every (.., seq, head, head_dim) tensor but the dQ accumulator goes through
        descriptors; DQ_TMA: the dQ accumulator (DQ_ACC) does; a kernel of
        ALWAYS_DESCRIPTORS: every tensor it reads or writes by tiles does (lse and delta as
        flat rows: a 16-byte aligned base)."""
        named = {n: a for n, a in zip(fn.arg_names, args) if isinstance(a, torch.Tensor)}
        flat = ALWAYS_DESCRIPTORS.get(fn.__name__, ())
        if fn.__name__ in ALWAYS_DESCRIPTORS:
            through = [n for n, t in named.items() if t.dim() == 4]
        else:
            through = [n for n, t in named.items() if t.dim() == 4 and n != "DQ_ACC"]
            through = (through if kwargs.get("TMA") else []) + (
                ["DQ_ACC"] if kwargs.get("DQ_TMA") else []
            )
        bad = {n: tuple(named[n].stride()) for n in through if not tma.aligned(named[n])}
        bad.update({n: f"base {named[n].data_ptr():#x}" for n in flat
                    if named[n].data_ptr() % 16})  # fmt: skip
        if bad:
            self.violations.append(f"{where}: descriptors on for unaligned tensors {bad}")

    def _check_kernel(self, where, kernel) -> dict:
        meta = kernel.metadata
        scratch = getattr(meta, "global_scratch_size", 0) or 0
        if scratch > 0 and not _allocator_in_this_thread():
            self.violations.append(
                f"{where}: needs {scratch} B of global scratch per program but thread "
                f"'{threading.current_thread().name}' has no allocator (triton.set_allocator)"
            )
        limit = tuning._SHARED_BY_CAPABILITY.get((self.arch // 10, self.arch % 10))
        if limit is not None and meta.shared > limit:
            self.violations.append(f"{where}: {meta.shared:,} B of shared memory > {limit:,}")
        facts = dict(scratch=scratch, shared=meta.shared, warps=meta.num_warps)
        if "cubin" in kernel.asm:  # the whole pipeline ran: registers are known
            registers = kernel_compile.kernel_facts(kernel)["registers"]
            threads = meta.num_warps * 32
            if registers * threads > REGISTERS_PER_BLOCK:
                self.violations.append(
                    f"{where}: {registers} registers x {threads} threads > {REGISTERS_PER_BLOCK:,}"
                )
            facts["registers"] = registers
        return facts


def _allocator_in_this_thread() -> bool:
    """Whether Triton's launcher would find a scratch allocator in the calling context."""
    from triton.runtime import _allocation  # the launcher's own lookup (Triton >= 3.4)

    return not isinstance(_allocation._allocator.get(), _allocation.NullAllocator)


def in_fresh_thread(fn) -> None:
    """fn() in a new thread with an empty context, as autograd's CUDA device thread runs a
    backward: nothing a caller set (Triton's allocator ContextVar) is visible there."""
    errors: list[BaseException] = []

    def run():
        try:
            contextvars.Context().run(fn)
        except BaseException as err:  # noqa: BLE001  (re-raised in the caller)
            errors.append(err)

    thread = threading.Thread(target=run, name="backward")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


# ------------------------------------------------------------------ launch sets
def loss_launches():
    """The fused linear cross-entropy's forward and backward kernels (bf16, a bias)."""
    from flashtrain.kernels.linear_cross_entropy import xent_backward, xent_forward

    def launch():
        n, width, vocab = 300, 256, 1000
        hidden = torch.empty(n, width, dtype=torch.bfloat16)
        weight = torch.empty(vocab, width, dtype=torch.bfloat16)
        bias, targets = torch.empty(vocab, dtype=torch.bfloat16), torch.zeros(n, dtype=torch.long)
        loss, lse = torch.empty(n), torch.empty(n)
        opts = dict(ignore_index=-100, label_smoothing=0.1, z_loss=1e-4)
        xent_forward(hidden, weight, bias, targets, loss, lse, None, **opts)
        in_fresh_thread(lambda: xent_backward(torch.ones(n), hidden, weight, bias, targets, lse,
                                              grad_hidden=True, grad_weight=True, **opts))  # fmt: skip

    yield "loss bf16 bias smoothing z-loss", launch


def compiled_launches():
    """flash_attn_func in a torch.compile'd function; backward by autograd from a fresh thread.
    The CPU route is pointed at the kernels for the call (on a GPU it always is)."""
    from flashtrain.attention import flash_attn_func, ops

    def launch(causal: bool):
        route = ops.route_for
        ops.route_for = lambda operand: "triton"
        try:
            torch._dynamo.reset()
            attend = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, causal=causal),
                                   backend="aot_eager", fullgraph=True)  # fmt: skip
            q, k, v = (torch.randn(2, 256, 4, 64, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))  # fmt: skip
            out = attend(q, k, v)
            in_fresh_thread(lambda: out.backward(torch.ones_like(out)))
        finally:
            ops.route_for = route

    yield "torch.compile bf16 d64 causal", lambda: launch(True)


def model_launches():
    """q/k/v as the models make them, descriptors forced on: the launchers must pass only
    aligned tensors to a descriptor launch (else fall back to pointer loads)."""

    def fused(head_dim, heads, varlen):
        # (B, S, 3, H, D) projection viewed as q, k, v (models/qkv.py); packed: (N, 3, H, D)
        shape = (512, 3, heads, head_dim) if varlen else (2, 256, 3, heads, head_dim)
        qkv = torch.empty(shape, dtype=torch.bfloat16)
        q, k, v = qkv.unbind(-3)
        lse = torch.empty(heads, 512) if varlen else torch.empty(2, heads, 256)
        cu = torch.tensor([0, 200, 512], dtype=torch.int32) if varlen else None
        opts = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=312 if varlen else 256,
                    max_seqlen_k=312 if varlen else 256, softmax_scale=head_dim**-0.5,
                    window_left=UNBOUNDED, window_right=0, dropout_p=0.0, seed=0)  # fmt: skip
        out, grads = torch.empty_like(q), [torch.empty_like(t) for t in (q, k, v)]
        with tuning.forced_tma(True):
            kernel_compile.flash_forward(q, k, v, out, lse, **opts)
            in_fresh_thread(lambda: kernel_compile.flash_backward(
                out, q, k, v, out, lse, *grads, deterministic=False, **opts))  # fmt: skip

    yield "fused qkv views bf16 d64", lambda: fused(64, 4, False)
    yield "fused qkv views bf16 d36 (unaligned)", lambda: fused(36, 3, False)
    yield "packed qkv views bf16 d64", lambda: fused(64, 4, True)


@dataclass(frozen=True)
class AttentionShape:
    """One attention call's shape: sequences (batch, or packed sequences when varlen) of seqlen
    tokens (the longest, when varlen)."""

    name: str
    sequences: int
    seqlen: int
    heads_q: int
    heads_kv: int
    head_dim: int
    causal: bool
    varlen: bool = False


def _stand_in(*shape, dtype=torch.bfloat16) -> torch.Tensor:
    """A tensor of `shape` (.., heads, head_dim) whose leading dims have stride 0: the launchers
    see the shapes, nothing of that size is allocated."""
    heads, head_dim = shape[-2:]
    row = torch.empty(heads * head_dim, dtype=dtype)
    return row.as_strided(shape, (0,) * (len(shape) - 2) + (head_dim, 1))


def launch_shape(s: AttentionShape) -> None:
    """The forward and the deterministic backward (the atomic one's dK/dV grid is the same) of
    one shape."""
    tokens = s.sequences * s.seqlen
    if s.varlen:
        q, k = _stand_in(tokens, s.heads_q, s.head_dim), _stand_in(tokens, s.heads_kv, s.head_dim)
        steps = torch.arange(s.sequences + 1, dtype=torch.int32) * s.seqlen
        cu, lse = steps, torch.empty(s.heads_q, tokens)
    else:
        q = _stand_in(s.sequences, s.seqlen, s.heads_q, s.head_dim)
        k = _stand_in(s.sequences, s.seqlen, s.heads_kv, s.head_dim)
        cu, lse = None, torch.empty(s.sequences, s.heads_q, s.seqlen)
    opts = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=s.seqlen, max_seqlen_k=s.seqlen,
                softmax_scale=s.head_dim**-0.5, window_left=UNBOUNDED,
                window_right=0 if s.causal else UNBOUNDED, dropout_p=0.0, seed=0)  # fmt: skip
    # written by the host after the launches (a grouped-query backward sums its per-head
    # partials into dK/dV): real, untouched memory, not zero-stride views
    grads = [torch.empty(t.shape, dtype=t.dtype) for t in (q, k, k)]
    kernel_compile.flash_forward(q, k, k, q, lse, **opts)
    kernel_compile.flash_backward(q, q, k, k, q, lse, *grads, deterministic=True, **opts)


def preset_shapes() -> list[AttentionShape]:
    """Every configs/experiment preset's attention call (ring context parallelism: the whole
    sequence, an upper bound for its chunks; Ulysses and hybrid: a rank's own call, its share of
    the heads over the whole sequence or ring shard), plus for every LM preset that could mask
    documents (no context parallelism) the same tokens packed as 16-token documents: a varlen
    call's sequences."""
    from omegaconf import OmegaConf

    from flashtrain.attention.ulysses import ulysses_kv_repeats
    from flashtrain.lab.bench.training import compose
    from flashtrain.lab.checkout import CONFIGS
    from flashtrain.train.config import AUTO_MICRO_BATCH_CPU, context_parallel_sizes

    shapes = []
    presets = CONFIGS / "experiment"
    for name in sorted(
        str(p.relative_to(presets).with_suffix("")) for p in presets.rglob("*.yaml")
    ):
        cfg = compose([f"experiment={name}"])
        model = OmegaConf.to_object(cfg.model)  # the model's config class: head_dim, causal
        causal = getattr(model, "causal", type(model).__name__ != "BertConfig")
        heads_q, heads_kv = model.n_head, getattr(model, "n_kv_head", None) or model.n_head
        seqlen = cfg.seq_len
        if cfg.trainer.context_parallel > 1 and cfg.trainer.context_parallel_mode != "ring":
            ring, ulysses = context_parallel_sizes(cfg.trainer)
            repeats = ulysses_kv_repeats(heads_q, heads_kv, ulysses)
            heads_q, heads_kv = heads_q // ulysses, heads_kv * repeats // ulysses
            seqlen //= ring
        dims = (heads_q, heads_kv, model.head_dim, causal)
        # micro_batch_size=auto is sized on the GPU; the batch only scales the grid's sequences
        micro = AUTO_MICRO_BATCH_CPU if cfg.micro_batch_size == "auto" else cfg.micro_batch_size
        shapes.append(AttentionShape(name, micro, seqlen, *dims))
        if causal and cfg.trainer.context_parallel == 1:  # a data.document_masking run
            tokens = micro * cfg.seq_len
            shapes.append(AttentionShape(f"{name} 16-token documents", max(1, tokens // 16), 16,
                                         *dims, varlen=True))  # fmt: skip
    return shapes


def suite_shapes() -> list[AttentionShape]:
    """The GPU suite's attention, long and sweep shapes (lab/gpu_suite/sections.py Sizes)."""
    from flashtrain.lab.gpu_suite.suite import Sizes

    z = Sizes.for_run(dry=False, rep=1)
    shapes = [
        AttentionShape(
            f"suite attention hd{d} S={s}",
            max(1, z.tokens // s),
            s,
            z.hidden // d,
            z.hidden // d,
            d,
            causal,
        )  # fmt: skip
        for d in z.head_dims
        for s in z.seqlens
        for causal in (False, True)
    ]
    batch, seqlen, heads, head_dim = z.long
    shapes += [AttentionShape(f"suite long S={seqlen}", batch, seqlen, heads, heads, head_dim, c)
               for c in (False, True)]  # fmt: skip
    return shapes


def shape_launches():
    for shape in preset_shapes() + suite_shapes():
        yield f"shape {shape.name}", functools.partial(launch_shape, shape)


LAUNCH_SETS = {
    "defaults": lambda: kernel_compile.default_launches(run_backward=in_fresh_thread),
    "features": lambda: kernel_compile.feature_launches(run_backward=in_fresh_thread),
    "decode": lambda: (
        (tag, functools.partial(in_fresh_thread, launch))
        for tag, launch in kernel_compile.decode_launches()
    ),  # fmt: skip
    "variants": lambda: (
        (tag, functools.partial(in_fresh_thread, launch))
        for tag, launch in kernel_compile.variant_launches()
    ),  # fmt: skip
    "hopper": lambda: kernel_compile.hopper_launches(run_backward=in_fresh_thread),
    "hopper-fwd": lambda: (
        (tag, functools.partial(in_fresh_thread, launch))
        for tag, launch in kernel_compile.hopper_forward_launches()
    ),  # fmt: skip
    "loss": loss_launches,
    "compiled": compiled_launches,
    "models": model_launches,
    "shapes": shape_launches,
}
COMPILES = {"shapes": False}  # sets checked without compiling (grid and alignment only)


def run(sets, arch: int = 90, only=(), front_end_only: bool = False) -> Contract:
    """Every launch of `sets` (those whose tag contains one of `only`, when given) through the
    stand-in driver for `arch`; the contract's record. A launch that raises is a violation too
    (the first GPU call would have raised it)."""
    contract = Contract(arch)
    compiled: list = []
    kernel_compile.install(arch, front_end_only, compiled, on_launch=contract.on_launch)
    for name in sets:
        contract.compile_kernels = COMPILES.get(name, True)
        for tag, launch in LAUNCH_SETS[name]():
            if only and not any(text in tag for text in only):
                continue
            contract.tag = tag
            try:
                launch()
            except Exception as err:  # noqa: BLE001  (recorded: the report lists every one)
                contract.violations.append(f"{tag}: raised {type(err).__name__}: {err}")
            compiled.clear()
    return contract


def main(argv: list[str] | None = None) -> int:
    """scripts/kernel_compile.py --contract SET... [--arch 90] [--only TEXT] [--front-end-only]:
    one JSON line per launch, then every violation; exit 1 if any, 2 on bad use."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contract", nargs="+", required=True, metavar="SET",
                        choices=[*LAUNCH_SETS, "all"], help="launch sets, or all")  # fmt: skip
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 90")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="only launches whose tag contains this text (repeatable: any)")  # fmt: skip
    parser.add_argument("--front-end-only", action="store_true",
                        help="stop after Triton's first IR (no scratch, shared or register facts)")  # fmt: skip
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        parser.error("the contract compiles; run it without TRITON_INTERPRET=1")
    sets = list(LAUNCH_SETS) if "all" in args.contract else args.contract
    contract = run(sets, args.arch, args.only, args.front_end_only)
    for launch in contract.launches:
        print(json.dumps(launch), flush=True)
    for violation in contract.violations:
        print(f"VIOLATION {violation}", flush=True)
    print(f"{len(contract.launches)} launches, {len(contract.violations)} violations", flush=True)
    return 1 if contract.violations else 0


if __name__ == "__main__":
    sys.exit(main())
