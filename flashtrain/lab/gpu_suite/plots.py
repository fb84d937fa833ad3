"""The suite's plots, written into OUT beside summary.md (cli.py calls write() where matplotlib is
installed; without it the figures are in suite.json and summary.md): the attention section's
TFLOP/s by length, and the training section's MFU, a group of bars per model and length, a bar
per attention, each labelled with its tokens/s."""

from __future__ import annotations

from pathlib import Path

from flashtrain.lab.bench import results

ATTENTION_PLOTS = (("fwd_bwd", "attention-fwd-bwd.png"), ("fwd", "attention-fwd.png"))
TRAINING_PLOT = "training-mfu.png"
# the bars' order in a group, and their colours (fixed: an attention without a figure is skipped)
TRAINING_ATTENTIONS = {"flash": "C0", "sdpa-flash": "C1", "sdpa-cudnn": "C2"}


def write(state: dict, out: Path) -> None:
    """Every plot whose section has rows to draw."""
    rows = state["sections"].get("attention", {}).get("rows", [])
    dense = [r for r in rows if "mode" in r and not r.get("variant")]
    for mode, name in ATTENTION_PLOTS:
        results.plot(dense, out / name, "tflops", "TFLOP/s", mode)
    training_plot(state["sections"].get("training", {}).get("rows", []), out / TRAINING_PLOT)


def training_plot(rows: list[dict], path: Path) -> None:
    """MFU % per (model, seqlen) group, a bar per attention (none where a run has no figure);
    nothing is written before a run measured one."""
    measured = [r for r in rows if r.get("mfu_percent") is not None]
    if not measured:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["model"], r["seqlen"]) for r in rows if "model" in r})
    by_key = {(r["model"], r["seqlen"], r["attention"]): r for r in measured}
    width = 0.8 / len(TRAINING_ATTENTIONS)
    fig, ax = plt.subplots(figsize=(max(5.0, 2.2 * len(groups)), 4.0))
    for i, (attention, colour) in enumerate(TRAINING_ATTENTIONS.items()):
        xs, heights, labels = [], [], []
        for g, (model, seqlen) in enumerate(groups):
            row = by_key.get((model, seqlen, attention))
            if row is not None:
                xs.append(g + (i - (len(TRAINING_ATTENTIONS) - 1) / 2) * width)
                heights.append(row["mfu_percent"])
                labels.append(f"{row['tokens_per_s'] / 1e3:.0f}K")
        if not xs:
            continue
        bars = ax.bar(xs, heights, width, label=attention, color=colour)
        ax.bar_label(bars, labels, fontsize=6, padding=1)  # tokens/s over each bar
    ax.set_xticks(range(len(groups)), [f"{m}\nS={s}" for m, s in groups])
    ax.set_ylabel("MFU % (labels: tokens/s)")
    ax.set_title("training through the trainer, by attention")
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.2)  # room for the labels and the legend above the bars
    ax.legend(fontsize=7, ncols=len(TRAINING_ATTENTIONS), loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
