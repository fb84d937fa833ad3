"""What scripts/evaluate.py writes: eval.json (everything), eval.md (tables) and
loss_by_position.png, each naming the checkpoint's run, step and commit; written atomically."""

from __future__ import annotations

import json
from pathlib import Path

from flashtrain.data.files import atomic_path
from flashtrain.plots import curves, panels, save


def _fmt(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def payload(facts: dict, data: dict, results: list, bits_per_byte: bool) -> dict:
    lengths = []
    for r in results:
        entry = dict(seq_len=r.seq_len, windows=r.windows, tokens=r.tokens, loss=r.loss,
                     perplexity=r.perplexity, optimal_loss=r.optimal_loss, notes=r.notes)  # fmt: skip
        if bits_per_byte:
            entry["bits_per_byte"] = r.bits_per_byte()
            entry["bytes"] = r.tokens if r.text_tokens is None else r.text_tokens
        entry["positions"] = [
            dict(start=a, end=b, loss=loss, tokens=n,
                 optimal=None if r.position_optimal is None else r.position_optimal[i])
            for i, (a, b, loss, n) in enumerate(zip(r.bucket_edges, r.bucket_edges[1:],
                                                    r.position_loss, r.position_tokens))
        ]  # fmt: skip
        lengths.append(entry)
    return dict(**facts, data=data, lengths=lengths)


def markdown(report: dict) -> str:
    data = report["data"]
    bpb = any("bits_per_byte" in entry for entry in report["lengths"])
    lines = [
        f"# Evaluation of {report['run']} at step {report['step']}",
        "",
        f"Checkpoint `{report['checkpoint']}` (commit `{report['commit']}`), trained at "
        f"seq_len {report['trained_seq_len']}; data `{data['name']}` ({data['split']} split). "
        "Loss in nats per scored token" + ("; bits per byte on the byte targets only (no "
        "<eos>)." if bpb else "."),
        "",
        "| seq_len | windows | tokens | loss | perplexity |" + (" bits/byte |" if bpb else "")
        + " optimum | notes |",
        "|---:|---|---:|---:|---:|" + ("---:|" if bpb else "") + "---:|---|",
    ]  # fmt: skip
    for e in report["lengths"]:
        row = (f"| {e['seq_len']} | {e['windows']} | {e['tokens']} | {e['loss']:.4f} | "
               f"{e['perplexity']:.3f} |")  # fmt: skip
        if bpb:
            row += f" {e['bits_per_byte']:.4f} |"
        lines.append(row + f" {_fmt(e['optimal_loss'])} | {'; '.join(e['notes'])} |")
    lines += ["", "Loss by token position (bucket = positions [start, end)):", ""]
    for e in report["lengths"]:
        lines += [f"seq_len {e['seq_len']}:", "", "| positions | tokens | loss | optimum |",
                  "|---|---:|---:|---:|"]  # fmt: skip
        for p in (p for p in e["positions"] if p["tokens"]):
            lines.append(f"| {p['start']}-{p['end']} | {p['tokens']} | {_fmt(p['loss'])} | "
                         f"{_fmt(p['optimal'])} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    fig, (ax,) = panels(1, width=6.5, height=4.2)
    series = {}
    for e in report["lengths"]:
        mids = [max(0.5, (p["start"] + p["end"] - 1) / 2) for p in e["positions"]]
        series[f"seq_len {e['seq_len']}"] = (mids, [p["loss"] for p in e["positions"]])
    optimal = [e for e in report["lengths"] if e["optimal_loss"] is not None]
    if optimal:
        longest = max(optimal, key=lambda e: e["seq_len"])
        mids = [max(0.5, (p["start"] + p["end"] - 1) / 2) for p in longest["positions"]]
        series["optimum"] = (mids, [p["optimal"] for p in longest["positions"]],
                             {"color": "black", "linestyle": "--"})  # fmt: skip
    title = (f"{report['run']} step {report['step']} ({report['commit'][:10]}): "
             f"{report['data']['name']}")  # fmt: skip
    curves(ax, series, title=title, xlabel="token position", ylabel="loss (nats)", logx=True,
           marker="o")  # fmt: skip
    fig.tight_layout()
    save(fig, path)


def check_folder(out: Path) -> None:
    """Refuse an output path that names a file, or lies under one, before anything is evaluated
    (the files go into a folder, made if missing)."""
    out = Path(out)
    blocking = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        where = "is a file" if blocking == out else f"lies under {blocking}, a file"
        raise ValueError(
            f"--out {out} {where}: name a folder (made if missing) for eval.json, eval.md and "
            "loss_by_position.png"
        )


def write(report: dict, out: Path) -> list[Path]:
    out = Path(out)
    paths = [out / "eval.json", out / "eval.md", out / "loss_by_position.png"]
    with atomic_path(paths[0]) as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
    with atomic_path(paths[1]) as tmp:
        tmp.write_text(markdown(report) + "\n")
    plot(report, paths[2])
    return paths
