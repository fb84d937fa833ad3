"""What the paper call runs on a GPU, and its CPU dry run: the same phases at toy sizes.

The runs themselves are the `gpu-call` scale of the experiment matrices
(flashtrain/lab/experiments/matrices.py, presets configs/experiment/*/gpu-call.yaml); a setting
here says only how the call fits them into its budget, and, for the dry run, how it shrinks them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flashtrain.lab.experiments.overrides import merge_overrides, setting
from flashtrain.lab.experiments.spec import Run


@dataclass(frozen=True)
class CallSettings:
    name: str  # gpu | dry-run
    budget_s: float  # the whole call, report included (--budget-min overrides it)
    # Overrides added to every run of an experiment (after the matrix's), and a run's context
    # mapped to the one run here with its micro-batch: the dry run's toy lengths.
    context_extra: tuple[str, ...]
    seq_lens: dict[int, int]
    pathfinder_extra: tuple[str, ...]
    pathx_extra: tuple[str, ...]
    # Pathfinder image processes; None: half the cores less 2 (the rest tokenize pysrc, then
    # feed the trainer; the images are needed only after context-length, minutes later)
    generator_workers: int | None
    probe_steps: int  # steps timed per run shape by the probe (the first is left out)
    max_steps: int | None  # a cap on every run's steps (the dry run's few)
    min_steps: int  # fewer steps fit: the run is not started (recorded `skipped: budget`)
    eval_tokens: int  # tokens scored at every context by the position evaluation
    eval_batch_size: int
    run_end_s: float  # a train run's time after its last step: checkpoint, final eval, exit
    eval_start_s: float  # the evaluation process's imports and model loads, per run
    report_reserve_s: float  # kept for the report at the end
    context_share: float  # of the time after the probe: context-length with its evaluation
    grace_s: float  # after SIGTERM at a run's deadline, before SIGKILL (its checkpoint)
    pathfinder_evals: int  # evaluations over a Pathfinder run (the accuracy curve's points)
    probe_limit_s: float  # the probe's deadline (data preparation included)
    # Each child's own time limit (the probe's, a run's prediction plus slack, the evaluation's)
    # times this. 1 on a GPU, where the budget is real. The dry run checks the phases' code,
    # not the timing: its toy children take seconds on idle cores and several times that on a
    # busy machine, so its limits (and its budget) are hang guards, never met by luck.
    deadline_scale: float = 1.0
    # the children's environment on top of the call's: on a CPU, attention's PyTorch route,
    # not the Triton interpreter that a test run sets (minutes a step at these sizes)
    child_env: tuple[tuple[str, str], ...] = ()


GPU = CallSettings(
    name="gpu",
    budget_s=540.0,
    context_extra=("data.num_proc=8",),
    seq_lens={1024: 1024, 4096: 4096, 16384: 16384},
    pathfinder_extra=(),
    pathx_extra=(),
    generator_workers=None,
    probe_steps=4,
    max_steps=None,
    min_steps=20,
    eval_tokens=2**20,
    eval_batch_size=8,
    run_end_s=8.0,
    eval_start_s=4.0,
    report_reserve_s=20.0,
    context_share=0.72,
    grace_s=30.0,
    pathfinder_evals=8,
    probe_limit_s=150.0,
)

# Toy sizes on a CPU: one thread per process, tiny models, one pysrc folder, a few images.
_CPU = ("trainer.device=cpu", "trainer.cpu_threads=1")
DRY_RUN = CallSettings(
    name="dry-run",
    budget_s=1800.0,  # a hang guard like its deadlines: about a minute on 2 idle cores
    context_extra=(
        *_CPU,
        "model.n_layer=2",
        "model.n_head=2",
        "model.d_model=32",
        "global_batch_tokens=256",
        "data.pysrc_packages=false",
        "data.pysrc_under=email",
        "data.val_fraction=0.2",
        "trainer.eval_batches=2",
    ),
    seq_lens={1024: 32, 4096: 64, 16384: 128},
    pathfinder_extra=(
        *_CPU,
        "model.n_layer=1",
        "model.n_head=2",
        "model.d_model=32",
        "model.d_ff=64",
        "data.num_samples=200",
        "global_batch_size=16",
        "micro_batch_size=16",
        "trainer.eval_batches=2",
    ),
    # Path-X's code path at Pathfinder-32's size (16K pixel tokens are hours on a CPU)
    pathx_extra=("data.resolution=32", "seq_len=1024", "micro_batch_size=16"),
    generator_workers=2,
    probe_steps=2,
    max_steps=3,
    min_steps=1,
    eval_tokens=512,
    eval_batch_size=2,
    run_end_s=2.0,
    eval_start_s=1.0,
    report_reserve_s=5.0,
    context_share=0.72,
    grace_s=10.0,
    pathfinder_evals=2,
    probe_limit_s=60.0,
    deadline_scale=20.0,
    child_env=(("FLASHTRAIN_CPU_ATTENTION", "torch"),),
)

SETTINGS = {"gpu": GPU, "dry-run": DRY_RUN}


def context_run(run: Run, settings: CallSettings) -> Run:
    """A context-length run as the call runs it: the setting's overrides, and its context
    mapped (the micro-batch keeps the matrix's tokens per micro-batch)."""
    args = merge_overrides(run.args, settings.context_extra)
    seq_len = int(setting(args, "seq_len"))
    here = settings.seq_lens[seq_len]
    if here != seq_len:
        tokens = int(setting(args, "global_batch_tokens"))
        args = merge_overrides(args, (f"seq_len={here}", f"micro_batch_size={tokens // here}"))
    return replace(run, args=tuple(args))


def pathfinder_run(run: Run, settings: CallSettings, pathx: bool) -> Run:
    extra = (*settings.pathfinder_extra, *(settings.pathx_extra if pathx else ()))
    return replace(run, args=tuple(merge_overrides(run.args, extra)))
