"""The FlashAttention paper's figures that our runs are set beside, in one table.

Tri Dao, Daniel Y. Fu, Stefano Ermon, Atri Rudra, Christopher Ré: "FlashAttention: Fast and
Memory-Efficient Exact Attention with IO-Awareness", NeurIPS 2022 (arXiv:2205.14135).
A value of None is the paper reporting failure: chance accuracy or out of memory.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER = "FlashAttention (Dao et al., NeurIPS 2022, arXiv:2205.14135)"


@dataclass(frozen=True)
class PaperFigure:
    experiment: str
    key: tuple  # what a report looks it up by
    value: float | None  # None: failed (chance or out of memory)
    unit: str
    what: str  # the setting in words
    source: str  # where in the paper


_SEQLENS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
# Table 21 (memory, MB) and Table 20 (forward + backward, ms), one A100-40GB, no dropout.
_MEMORY_MB = {
    "PyTorch attention": (36, 104, 336, 1184, 4416, 17024, None, None, None, None),
    "FlashAttention": (22, 44, 104, 209, 418, 836, 1672, 3344, 6688, 13376),
}
_FWD_BWD_MS = {
    "PyTorch attention": (0.67, 0.70, 1.18, 3.67, 13.22, 50.44, None, None, None, None),
    "FlashAttention": (0.31, 0.31, 0.73, 2.29, 7.64, 30.09, 118.50, 470.51, 1876.08, 7492.85),
}
# Table 3: Long Range Arena accuracy (%).
_LRA_TASKS = ("ListOps", "Text", "Retrieval", "Image", "Pathfinder", "Avg")
_LRA = {
    "Transformer": (36.0, 63.6, 81.6, 42.3, 72.7, 59.3),
    "FlashAttention": (37.6, 63.9, 81.4, 43.5, 72.7, 59.8),
    "Block-sparse FlashAttention": (37.0, 63.0, 81.3, 43.6, 73.3, 59.6),
}


def _series(experiment, name, table, unit, what, source):
    return tuple(
        PaperFigure(experiment, (name, method, n), value, unit, f"{what}, {method}, {n}", source)
        for method, values in table.items()
        for n, value in zip(_SEQLENS, values)
    )


PAPER_FIGURES: tuple[PaperFigure, ...] = (
    # context-length: GPT-2 small on OpenWebText, 512K tokens per step at every context.
    *(
        PaperFigure(
            "context-length", ("ppl", ctx), ppl, "ppl", f"GPT-2 small, OWT, {ctx}", "Table 4"
        )
        for ctx, ppl in ((1024, 18.2), (2048, 17.6), (4096, 17.5))
    ),
    *(
        PaperFigure(
            "context-length", ("days", ctx), days, "days", f"8 x A100, context {ctx}", "Table 4"
        )
        for ctx, days in ((1024, 2.7), (2048, 3.0), (4096, 3.6))
    ),
    # pathfinder: (data name, attention impl) -> accuracy (%). LRA Pathfinder is 32 x 32; the
    # LRA "Transformer" row is standard attention, our sdpa.
    PaperFigure(
        "pathfinder",
        ("accuracy", "pathfinder32", "flash"),
        72.7,
        "%",
        "LRA Pathfinder, FlashAttention",
        "Table 3",
    ),
    PaperFigure(
        "pathfinder",
        ("accuracy", "pathfinder32", "blocksparse"),
        73.3,
        "%",
        "LRA Pathfinder, block-sparse",
        "Table 3",
    ),
    PaperFigure(
        "pathfinder",
        ("accuracy", "pathfinder32", "sdpa"),
        72.7,
        "%",
        "LRA Pathfinder, Transformer",
        "Table 3",
    ),
    PaperFigure(
        "pathfinder", ("accuracy", "pathx", "flash"), 61.4, "%", "Path-X, FlashAttention", "Table 6"
    ),
    PaperFigure(
        "pathfinder",
        ("accuracy", "pathx", "blocksparse"),
        56.0,
        "%",
        "Path-X, block-sparse",
        "Table 6",
    ),
    PaperFigure(
        "pathfinder", ("accuracy", "pathx", "sdpa"), None, "%", "Path-X, Transformer", "Table 6"
    ),
    PaperFigure(
        "pathfinder",
        ("accuracy", "path256", "blocksparse"),
        63.1,
        "%",
        "Path-256, block-sparse",
        "Table 6",
    ),
    PaperFigure(
        "pathfinder",
        ("accuracy", "path256", "flash"),
        None,
        "%",
        "Path-256, FlashAttention",
        "Table 6",
    ),
    *(
        PaperFigure(
            "pathfinder", ("lra", model, task), value, "%", f"LRA {task}, {model}", "Table 3"
        )
        for model, values in _LRA.items()
        for task, value in zip(_LRA_TASKS, values)
    ),
    # speed-memory: attention alone, by sequence length.
    *_series("speed-memory", "memory_mb", _MEMORY_MB, "MB", "attention memory", "Table 21"),
    *_series("speed-memory", "fwd_bwd_ms", _FWD_BWD_MS, "ms", "attention fwd+bwd", "Table 20"),
    # bert: BERT-large from the MLPerf 1.1 initial checkpoint, 8 x A100.
    PaperFigure(
        "bert", ("target_accuracy",), 72.0, "%", "MLPerf 1.1 target MLM accuracy", "Table 1"
    ),
    PaperFigure(
        "bert",
        ("minutes", "flashattention"),
        17.4,
        "min",
        "BERT-large to target, FlashAttention",
        "Table 1",
    ),
    PaperFigure(
        "bert",
        ("minutes", "mlperf"),
        20.0,
        "min",
        "BERT-large to target, Nvidia MLPerf 1.1",
        "Table 1",
    ),
)

LRA_TASKS = _LRA_TASKS
LRA_MODELS = tuple(_LRA)


def paper_figure(experiment: str, *key) -> PaperFigure | None:
    """The paper's figure for (experiment, key), or None when the paper has none."""
    for figure in PAPER_FIGURES:
        if figure.experiment == experiment and figure.key == tuple(key):
            return figure
    return None


def paper_value(experiment: str, *key) -> str:
    """The figure as a table cell: "18.2", "fails" (chance / out of memory) or "-" (none)."""
    figure = paper_figure(experiment, *key)
    if figure is None:
        return "-"
    return "fails" if figure.value is None else f"{figure.value:g}"
