"""trainer.eval_tasks: the retrieval tasks (flashtrain/data/retrieval: passkey, needle, RULER's
families) at every evaluation, beside the validation loss.

Each rank scores its share of every (task, length, depth) cell, eval_task_samples samples a
cell in all, by the answer's likelihood (one teacher-forced pass per batch: greedy-correct or
not, and its log-probability; no generation), and the sums are added across ranks. Logged as
eval/<task>/<length> (accuracy, the mean over the depths) and eval/tasks_s (the seconds they
took), and rank 0 keeps the newest evaluation's tables and heatmap in <run>/retrieval/.
What it may cost is the sample count: cells x samples x length tokens per evaluation.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from flashtrain.collectives import all_reduce_sum
from flashtrain.data.retrieval.registry import SampleMaker, resolve_tasks
from flashtrain.data.retrieval.text import SegmentEncoder, TaskTextError
from flashtrain.models.decoder import position_limit
from flashtrain.tasks import report as task_report
from flashtrain.tasks.grid import GridSpec, grid_tokens, run_grid
from flashtrain.tasks.report import length_label
from flashtrain.tasks.scoring import LikelihoodAnswerer
from flashtrain.typed_config import ConfigError
from flashtrain.utils import format_count

TASKS_SECONDS = "eval/tasks_s"
FOLDER = "retrieval"  # under the run directory: the newest evaluation's report


def grid_spec(cfg) -> GridSpec:
    """The grid trainer.eval_tasks asks for (lengths: [seq_len] unless given)."""
    t = cfg.trainer
    lengths = sorted(set(t.eval_task_lengths or [int(cfg.seq_len)]))
    return GridSpec(resolve_tasks(list(t.eval_tasks)), lengths, sorted(set(t.eval_task_depths)),
                    t.eval_task_samples)  # fmt: skip


def eval_tasks_summary(cfg) -> str:
    """The summary's line: the tasks and what they cost per evaluation (the dry run too)."""
    spec = grid_spec(cfg)
    return (
        f"eval tasks: {', '.join(spec.tasks)} at {', '.join(map(length_label, spec.lengths))} "
        f"tokens: {len(spec.cells())} cells x {spec.samples} samples = "
        f"{format_count(grid_tokens(spec))} tokens of forward passes per evaluation (likelihood "
        "scoring)"
    )


def task_metric(task: str, length: int) -> str:
    return f"eval/{task}/{length_label(length)}"


@contextlib.contextmanager
def whole_root(model, sharded: bool):
    """FSDP2: the root's own parameters (embeddings, final norm, a tied head) gathered, for the
    scoring passes call hidden_states, not forward, whose hook would gather them; each block
    still gathers its own in its forward."""
    if not sharded:
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


class RetrievalEval:
    """Built at start from the trainer's settings; refuses there what cannot run."""

    def __init__(self, cfg, model, data, env, run_dir: Path, batch_size: int, *, sharded: bool):
        t = cfg.trainer
        self.env, self.run_dir = env, Path(run_dir)
        try:
            self.spec = grid_spec(cfg)
            if data.tokenizer is None:  # synthetic ids, pixels: no text to write a task in
                raise TaskTextError(
                    f"data '{cfg.data.name}' comes as token ids, with no tokenizer to write the "
                    "retrieval tasks' text: train on text (data=pysrc, text_files, retrieval)"
                )
            self.encoder = SegmentEncoder(data.tokenizer)
        except ValueError as e:
            raise ConfigError(f"trainer.eval_tasks: {e}") from None
        if sharded and t.eval_task_samples % env.world_size:
            # every rank runs as many forward passes (each block's all-gather is a collective)
            raise ConfigError(
                f"trainer.eval_task_samples={t.eval_task_samples}: under trainer.strategy="
                f"{t.strategy} it must be a multiple of the {env.world_size} ranks (each scores "
                "as many samples of every cell)"
            )
        limit, longest = position_limit(model), max(self.spec.lengths)
        if limit is not None and longest > limit:
            raise ConfigError(
                f"trainer.eval_task_lengths: {longest} is beyond the model's {limit} "
                f"learned positions (model.max_seq_len): give lengths <= {limit}"
            )
        self.maker = SampleMaker(self.encoder, seed=int(cfg.seed))
        for task in self.spec.tasks:  # a length too short for a task: refused now
            for length in self.spec.lengths:
                try:
                    self.maker.samples(task, length, self.spec.depths[0], [0])
                except ValueError as e:
                    raise ConfigError(f"trainer.eval_task_lengths: {e}") from None
        self.answerer = LikelihoodAnswerer(model, batch_size=batch_size)
        self.trained, self.sharded, self.model = int(cfg.seq_len), sharded, model

    def __call__(self, step: int, run_name: str, commit: str | None, autocast) -> dict[str, float]:
        start = time.perf_counter()
        with autocast(), whole_root(self.model, self.sharded):
            cells = run_grid(
                self.spec, self.maker, self.answerer, rank=self.env.rank,
                world_size=self.env.world_size, reduce=self._sum,
            )  # fmt: skip
        metrics = {}
        for task in self.spec.tasks:
            for length in self.spec.lengths:
                mine = [c for c in cells if (c.task, c.length) == (task, length)]
                metrics[task_metric(task, length)] = sum(c.accuracy for c in mine) / len(mine)
        metrics[TASKS_SECONDS] = time.perf_counter() - start
        if self.env.is_main:
            facts = dict(run=run_name, step=step, checkpoint="(during training)",
                         commit=commit or "unknown", trained_seq_len=self.trained)  # fmt: skip
            settings = dict(score="likelihood", samples=self.spec.samples, seed=self.maker.seed,
                            text_filler="pysrc", tokenizer=self.encoder.name, notes=[])  # fmt: skip
            task_report.write(task_report.payload(facts, settings, cells), self.run_dir / FOLDER)
        return metrics

    def _sum(self, values: list[float]) -> list[float]:
        if self.env.world_size == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.env.device)
        return all_reduce_sum(t).tolist()
