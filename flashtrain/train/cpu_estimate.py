"""How long a training step would take on this CPU, and the refusal of runs meant for a GPU.

The estimate is the step's FLOPs (model.estimate_flops_per_token x tokens per rank) over the
measured float32 matmul rate times CPU_STEP_EFFICIENCY.
"""

from __future__ import annotations

from flashtrain.train.metrics import format_duration
from flashtrain.typed_config import ConfigError
from flashtrain.utils import format_count

# Fraction of a plain float32 matmul's speed a whole training step reaches on a CPU (for the
# time-per-step estimate only; roughly 0.5 for small GPT-2s on a 2-core x86 machine).
CPU_STEP_EFFICIENCY = 0.5


def estimate_cpu_step_time(flops_per_step_per_rank: float, matmul_flops: float) -> float:
    """Seconds per optimizer step, from the step's FLOPs on one rank and the measured FLOP/s."""
    return flops_per_step_per_rank / max(matmul_flops * CPU_STEP_EFFICIENCY, 1.0)


def refuse_slow_cpu_run(
    seconds_per_step: float, flops_per_step: float, remaining_steps: int, limit_s: float
) -> None:
    """ConfigError when a step would take longer than trainer.cpu_step_time_limit_s."""
    if seconds_per_step <= limit_s:
        return
    raise ConfigError(
        f"this run would take about {format_duration(seconds_per_step)} per optimizer step on "
        f"this CPU ({format_count(flops_per_step)}FLOP per step, {remaining_steps} steps: about "
        f"{format_duration(seconds_per_step * remaining_steps)} in all). It is meant for a GPU. "
        f"To run it here anyway, add trainer.allow_slow_cpu=true; for a size a CPU manages, use "
        f"experiment=cpu/tiny (or model=gpt2-tiny seq_len=256); trainer.max_steps=0 only builds it."
    )
