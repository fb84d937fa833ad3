"""`python scripts/evaluate.py CKPT --tasks passkey needle ruler --seq-len 1k 4k --depths 0:1:11`:
the retrieval tasks (flashtrain.tasks) on a checkpoint instead of perplexity: a table per task
(lengths x depths), the heatmap, a curve per task by length, as retrieval.md, .json and PNGs
beside the run. Everything that can be refused is, before the first sample is scored: the
task names, lengths the model cannot take or the tasks cannot fit, the budget, the memory."""

from __future__ import annotations

import sys

from flashtrain.data.retrieval.registry import SampleMaker, resolve_tasks
from flashtrain.data.retrieval.text import SegmentEncoder
from flashtrain.inference.cli_args import integer
from flashtrain.inference.evaluate import check_evaluation_fits
from flashtrain.inference.task_answers import GeneratingAnswerer
from flashtrain.models.decoder import position_limit
from flashtrain.tasks import report as task_report
from flashtrain.tasks.grid import GridSpec, grid_tokens, parse_depths, parse_lengths, run_grid
from flashtrain.tasks.scoring import SCORES, LikelihoodAnswerer

CPU_BUDGET = 2_000_000  # tokens a grid may feed a model on a CPU unless --budget says more


def add_arguments(p) -> None:
    p.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                   help="retrieval tasks instead of perplexity: passkey, needle, ruler (its 7 "
                        "families), all, or family names; --seq-len gives their lengths")  # fmt: skip
    p.add_argument("--depths", default="0:1:5",
                   help="needle depths: START:STOP:COUNT (0:1:11) or a list (0,0.5,1); 0 = the start")  # fmt: skip
    p.add_argument("--samples", type=integer(1, "samples per cell"), default=4,
                   help="samples per (task, length, depth) cell")  # fmt: skip
    p.add_argument("--score", choices=SCORES, default="generate",
                   help="generate (greedy decoding, string match) or likelihood (one pass: "
                        "is the answer the greedy one; fast)")  # fmt: skip
    p.add_argument("--filler-files", nargs="+", default=None, metavar="GLOB",
                   help="text files for the real-text haystacks (default: pysrc, this Python's "
                        "standard library)")  # fmt: skip
    p.add_argument("--budget", type=integer(1, "tokens"), default=None,
                   help=f"the most tokens the grid may feed the model (default on a CPU: "
                        f"{CPU_BUDGET:,}; none on a GPU)")  # fmt: skip
    p.add_argument("--seed", type=integer(0, "a seed"), default=0, help="the samples' seed")


def check_lengths(model, lengths: list[int], trained: int) -> list[str]:
    """Lengths beyond a learned position table are refused (the tasks are scored within the
    positions the model has); beyond the trained length of a rotary model, a note each."""
    limit = position_limit(model)
    if limit is not None and max(lengths) > limit:
        raise ValueError(
            f"length {max(lengths)} is beyond the model's {limit} learned positions "
            f"(model.max_seq_len): give lengths <= {limit}"
        )
    return [
        f"length {n} is beyond the trained {trained} tokens (rotary positions, unscaled)"
        for n in lengths
        if n > trained
    ]


def run_tasks(args, model, info, config, tokenizer, out) -> list:
    """Score the grid and write the report; returns the files written."""
    spec = GridSpec(
        resolve_tasks(",".join(args.tasks)),
        parse_lengths(args.seq_len),
        parse_depths(args.depths),
        args.samples,
    )
    trained = int(config.model.max_seq_len)
    notes = check_lengths(model, spec.lengths, trained)
    encoder = SegmentEncoder(tokenizer)
    maker = SampleMaker(encoder, seed=args.seed, filler_files=args.filler_files)
    for task in spec.tasks:  # a length too short for a task: refused before any scoring
        for length in spec.lengths:
            maker.samples(task, length, spec.depths[0], [0])
    budget = (
        args.budget
        if args.budget is not None
        else (CPU_BUDGET if str(args.device) == "cpu" else None)
    )
    tokens = grid_tokens(spec)
    if budget is not None and tokens > budget:
        raise ValueError(
            f"the grid feeds the model {tokens:,} tokens ({len(spec.cells())} cells x "
            f"{spec.samples} samples), over the budget of {budget:,}: fewer --samples, "
            "--seq-len or --depths, or a larger --budget"
        )
    check_evaluation_fits(model, max(spec.lengths), args.batch_size, args.device)
    if args.score == "generate":
        answerer = GeneratingAnswerer(model, encoder, batch_size=args.batch_size)
    else:
        answerer = LikelihoodAnswerer(model, batch_size=args.batch_size)
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(spec.cells()) * spec.samples, unit="sample", file=sys.stderr)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    cells = run_grid(spec, maker, answerer, on_samples=bar.update if bar else None)
    if bar is not None:
        bar.close()
    facts = {**info.facts(), "trained_seq_len": trained}
    settings = dict(score=args.score, samples=spec.samples, seed=args.seed,
                    text_filler=args.filler_files or "pysrc", tokenizer=encoder.name, notes=notes)  # fmt: skip
    return task_report.write(task_report.payload(facts, settings, cells), out)
