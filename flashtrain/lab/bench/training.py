"""Training throughput for the GPU suite: one run of the real trainer (flashtrain.train.Trainer on
a Hydra-composed configs/train.yaml) per model, context length and attention, with
micro_batch_size=auto and a fixed global batch in tokens. A row holds the medians of tokens/s,
step time and MFU over the steady steps (after the compile), the micro-batch the trainer chose,
peak memory, and where the profiled steps' time went (step_split.profile_split: per-step ms by
bucket, the GPU window, the heaviest kernels).

MFU is the trainer's one definition (flashtrain/train/metrics.py, docs/benchmarks.md): the
model's estimate_flops_per_token (attention counted as FlashAttention counts it) times tokens/s
over the GPU's dense bf16 peak from the table."""

from __future__ import annotations

import functools
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from flashtrain.lab.bench.measure import is_cuda_fault
from flashtrain.lab.bench.step_split import profile_split
from flashtrain.lab.checkout import CONFIGS
from flashtrain.train.metric_names import STEP_TIME_S, TOKENS_PER_S, TRAIN_LOSS, canonical_row
from flashtrain.train.metrics import mfu_percent


def compose(overrides: list[str]):
    """configs/train.yaml with overrides, as train.py composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    _register_schemas_once()
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


@functools.cache
def _register_schemas_once() -> None:
    """As train.py, once a process: again costs ~0.06 s a compose (the suite composes nine)."""
    from flashtrain.train import register_schemas

    register_schemas()


# The measured models at GPT-2's vocabulary (so the two compare at the same size), and the tiny
# stand-ins of the dry run.
MODELS = {"gpt2": ("model=gpt2",), "llama-125m": ("model=llama-125m",)}
DRY_MODELS = {
    "gpt2": ("model=gpt2-tiny", "model.n_layer=2", "model.n_head=2", "model.d_model=64"),
    "llama-125m": ("model=llama-tiny", "model.n_layer=2", "model.d_model=64"),
}
# A row's attention: ours, and SDPA pinned to PyTorch's FlashAttention-2 or to cuDNN's kernel.
ATTENTIONS = {
    "flash": ("attention=flash",),
    "sdpa-flash": ("attention=sdpa", "attention.backend=flash"),
    "sdpa-cudnn": ("attention=sdpa", "attention.backend=cudnn"),
}


@dataclass(frozen=True)
class Schedule:
    """A run's steps: `warm` left out (the compile, the allocator's first sizes), `timed` whose
    medians are the row's, one profiler warm-up step, then `profiled` steps recorded."""

    warm: int
    timed: int
    profiled: int

    @property
    def steps(self) -> int:
        return self.warm + self.timed + 1 + self.profiled

    def is_timed(self, step: int) -> bool:
        return self.warm < step <= self.warm + self.timed


def overrides_for(model: str, seqlen: int, attention: str, compile_: bool, steps: int,
                  tokens: int, dry_run: bool) -> list[str]:  # fmt: skip
    """`model` (a MODELS key) on the synthetic data, `tokens` a step, the micro-batch the memory
    plan fits; the dry run shrinks everything to the tiny model of the same family on CPU."""
    base = [
        *ATTENTIONS[attention],
        f"seq_len={seqlen}",
        f"trainer.max_steps={steps}",
        f"trainer.compile={str(compile_).lower()}",
        "trainer.log_interval=1",
        "trainer.eval_interval=0",
        "trainer.eval_at_end=false",
        "trainer.ckpt_interval=0",
        "trainer.ckpt_at_end=false",
        "trainer.progress=lines",
        "logger=none",
        "data=synthetic",
        "micro_batch_size=auto",
        "global_batch_size=null",
        f"global_batch_tokens={tokens}",
    ]
    if dry_run:
        # one thread: the toy needs no more, and no sample of how busy the cores are (0.1 s a run)
        return base + [*DRY_MODELS[model], "trainer.device=cpu", "trainer.cpu_threads=1"]
    return base + [*MODELS[model], "data.vocab_size=50257"]


def baseline_note(attention: str, err: RuntimeError) -> str | None:
    """An SDPA baseline's RuntimeError (a pinned backend without a kernel for these inputs: cuDNN
    on a CPU, say) is a note on its row, as in the attention section; None: raise it. Never a
    note: any error in a run of ours or raised by flashtrain (a non-finite loss), a CUDA fault
    (the context is dead: the suite stops), and running out of memory (micro_batch_size=auto's
    plan failed, which the suite must show)."""
    ours = attention == "flash" or type(err).__module__.startswith("flashtrain")
    if ours or isinstance(err, torch.OutOfMemoryError) or is_cuda_fault(err):
        return None
    return f"unsupported: {first_sentence(err)}"


def backend_missing(attention: str, device: str) -> str | None:
    """The note of an SDPA backend that has no kernel on `device` at all (cuDNN on a CPU), from
    one tiny causal call, so no trainer is built for it; None: it runs here (a run's own shapes
    may still be refused: baseline_note)."""
    backend = dict(o.split("=") for o in ATTENTIONS[attention]).get("attention.backend")
    if backend is None:
        return None
    from torch.nn.attention import sdpa_kernel

    from flashtrain.models.attention_layers import SDPA_BACKENDS

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q = torch.zeros(1, 1, 16, 64, device=device, dtype=dtype)
    try:
        with sdpa_kernel(SDPA_BACKENDS[backend]):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    except RuntimeError as err:
        return baseline_note(attention, err)
    return None


def first_sentence(err: BaseException) -> str:
    """The error's first sentence (PyTorch's no-kernel errors run on with advice)."""
    line = (str(err).strip().splitlines() or [""])[0]
    return re.split(r"(?<=\.)\s", line, maxsplit=1)[0][:200]


def _profiler(cuda: bool, schedule: Schedule):
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    wait = schedule.warm + schedule.timed
    return torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=wait, warmup=1, active=schedule.profiled, repeat=1),
    )


def _split(prof) -> dict:
    """{"split": ...} or, when the trace cannot be split (its buckets miss the window by more
    than step_split's tolerance, or the split fails), {"split": None, "split_error": why}: the
    run's throughput stays on record and the target on the split fails."""
    try:
        return {"split": profile_split(prof)}
    except Exception as err:  # noqa: BLE001  (the split must not lose the run's figures)
        return {"split": None, "split_error": f"{type(err).__name__}: {str(err)[:300]}"}


def _fresh_compile_caches() -> None:
    """Each run compiles as a fresh process would: without it a later run's blocks recompile
    with dynamic shapes (automatic dynamic shapes, once a second seqlen was seen) or fall back
    to eager at dynamo's recompile limit. The on-disk Inductor and Triton caches stay."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def run_training(model: str, seqlen: int, attention: str, compile_: bool, schedule: Schedule,
                 tokens: int, run_dir: Path, dry_run: bool) -> dict:  # fmt: skip
    """One trainer run, its row (the module docstring); an SDPA backend that has no kernel for
    these inputs gives a row with a note and no figures."""
    from flashtrain.train import Trainer

    overrides = overrides_for(model, seqlen, attention, compile_, schedule.steps, tokens, dry_run)
    cfg = compose(overrides)
    cuda = torch.cuda.is_available() and not dry_run
    row = {"model": model, "seqlen": seqlen, "attention": attention, "compile": compile_,
           "steps": schedule.steps, "global_batch_tokens": tokens}  # fmt: skip
    missing = backend_missing(attention, "cuda" if cuda else "cpu")
    if missing:
        return dict(row, note=missing)
    if compile_:
        _fresh_compile_caches()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    prof = _profiler(cuda, schedule)
    trainer = Trainer(cfg, run_dir)
    ok = False
    try:
        with prof:
            trainer.fit(on_step=lambda step: prof.step())
        ok = True
    except RuntimeError as err:
        note = baseline_note(attention, err)
        if note is None:
            raise
        return dict(row, note=note)
    finally:
        trainer.close(clean=ok)
    plan = trainer.plan
    metrics = [canonical_row(json.loads(line))
               for line in (run_dir / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    timed = [r for r in metrics if TOKENS_PER_S in r and schedule.is_timed(r["step"])]
    tokens_per_s = statistics.median(r[TOKENS_PER_S] for r in timed)
    auto = getattr(trainer, "auto_batch", None)
    row.update(
        micro_batch_size=plan.micro_batch_size,
        grad_accum=plan.grad_accum,
        micro_batch_choice=auto.describe() if auto is not None else None,
        timed_steps=len(timed),
        tokens_per_s=tokens_per_s,
        step_ms=1e3 * statistics.median(r[STEP_TIME_S] for r in timed),
        mfu_percent=mfu_percent(trainer.flops_per_token, tokens_per_s, trainer.peak.flops),
        flops_per_token=trainer.flops_per_token,
        peak_flops=trainer.peak.flops,
        peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        final_loss=metrics[-1].get(TRAIN_LOSS),
        **_split(prof),
    )
    if compile_:  # a graph break runs eager between the compiled pieces: the MFU story's part
        row["graph_breaks"] = sum(torch._dynamo.utils.counters["graph_break"].values())
    return row
