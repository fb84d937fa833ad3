"""The reports (flashtrain.lab.reports, scripts/report.py) on run folders written by hand: the
tables hold the right numbers beside the paper's, the plots exist, restarts and missing pieces
are handled."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from report_testing import (
    GPU_RUN,
    launch,
    lm_config,
    lm_curve,
    lm_eval,
    write_run,
)

from flashtrain import plots
from flashtrain.data.synthetic import recall_optimal_loss
from flashtrain.lab.reports import context_length, write_reports
from flashtrain.lab.reports.labels import (
    curve_labels,
    model_and_context,
    run_model,
    run_name,
    run_path,
)
from flashtrain.lab.reports.runs import load_run, read_metrics
from flashtrain.train.metric_names import (
    STEP_TIME_S,
    TRAIN_ACCURACY,
    TRAIN_LOSS,
    TRAIN_TOKENS_SEEN,
)

PYSRC = {"name": "pysrc", "loader": "lm_corpus", "tokenizer": "byte"}


def assert_png(path: Path) -> None:
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000  # a drawn figure, not an empty canvas


def test_metrics_of_a_resumed_run_keep_the_rows_logged_after_the_restart(tmp_path):
    rows = [
        {"step": 10, TRAIN_LOSS: 3.0},
        {"step": 20, TRAIN_LOSS: 2.5},
        {"step": 20, "eval/loss": 2.6},
        {"step": 30, TRAIN_LOSS: 2.4},  # lost with the crash: the run resumes from step 20
        {"step": 30, "eval/loss": 2.45},
        {"step": 30, TRAIN_LOSS: 2.3},
        {"step": 40, TRAIN_LOSS: 2.2},
        {"step": 40, "eval/loss": 2.25},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 50, "lo')
    train, evals = read_metrics(path)
    assert [(r["step"], r[TRAIN_LOSS]) for r in train] == [
        (10, 3.0),
        (20, 2.5),
        (30, 2.3),
        (40, 2.2),
    ]
    assert [(r["step"], r["eval/loss"]) for r in evals] == [(20, 2.6), (40, 2.25)]


def test_context_length_report_byte_level_and_openwebtext(tmp_path):
    runs = tmp_path / "runs"
    for ctx, loss in ((64, 1.5), (128, 1.4), (256, 1.3)):
        write_run(
            runs / f"pysrc-{ctx}",
            lm_config(PYSRC, ctx, max_steps=30),
            lm_curve(loss, 30, 4096),
            [lm_eval(30, loss)],
            launch=launch("context-length", data="pysrc"),
            model_choice="gpt2-tiny",
        )
    owt = {"name": "openwebtext", "loader": "lm_corpus", "tokenizer": "gpt2"}
    write_run(
        runs / "owt-1k",
        lm_config(owt, 1024, max_steps=40),
        lm_curve(3.0, 20, 524288),  # partial: 20 of 40 steps
        [lm_eval(20, math.log(20.5))],
        run_info=GPU_RUN,
        launch=launch("context-length", scale="paper", data="openwebtext"),
    )
    written = write_reports(sorted(runs.iterdir()), tmp_path / "out")
    assert written == [tmp_path / "out" / "context-length.md"]
    text = written[0].read_text()
    for ctx, loss in ((64, 1.5), (128, 1.4), (256, 1.3)):
        ppl, bits = math.exp(loss), loss / math.log(2)
        row = f"| {ctx} | gpt2 (gpt2-tiny) | `pysrc-{ctx}` | tiny | {loss:.4g} | {ppl:.4g} | {bits:.4g} |"
        assert row in text
    assert "| 1024 | gpt2 | `owt-1k` | paper | 3.02 | 20.5 |\n" in text  # no paper column
    assert "| 1024 | 18.2 | 2.7 |" in text  # the paper's own table
    assert "not comparable" in text
    assert "Tokens per optimizer step: 4,096 at every context length." in text
    assert (
        "| `owt-1k` | gpt2 | paper | partial | 20/40 | 10.49M | 8 x NVIDIA H100 80GB HBM3 |" in text
    )
    assert (
        "| `pysrc-64` | gpt2 (gpt2-tiny) | tiny | done | 30/30 | 122.88K | CPU (2 threads) |"
        in text
    )
    for name in ("context-length-loss.png", "context-length-final.png"):
        assert f"]({name})" in text
        assert_png(tmp_path / "out" / name)


def test_context_length_report_synthetic_bounds(tmp_path):
    data = {"name": "synthetic", "loader": "synthetic", "num_keys": 16, "num_values": 16}
    data["loss_on"] = "values"
    write_run(tmp_path / "syn", lm_config(data, 64), lm_curve(2.0, 20, 512), [lm_eval(20, 2.0)])
    (path,) = write_reports([tmp_path / "syn"], tmp_path / "out")
    best, floor = recall_optimal_loss(64, 16, 16), math.log(16)
    closed = (floor - 2.0) / (floor - best)
    row = f"| 64 | gpt2 | `syn` | - | 2 | {best:.4g} | {floor:.4g} | {closed:.0%} |"
    assert row in path.read_text()


def test_two_models_at_one_context_are_two_curves_and_two_table_rows(tmp_path):
    runs = [
        write_run(
            tmp_path / "runs" / f"{arch}-{ctx}",
            lm_config(PYSRC, ctx, max_steps=30, arch=arch),
            lm_curve(loss, 30, 4096),
            [lm_eval(30, loss)],
            model_choice=f"{arch}-tiny",
        )
        for arch, ctx, loss in (("gpt2", 128, 1.4), ("llama", 128, 1.3), ("gpt2", 384, 1.2))
    ]
    (path,) = write_reports(runs, tmp_path / "out")
    text = path.read_text()
    assert "| 128 | gpt2 (gpt2-tiny) | `gpt2-128` | - | 1.4 |" in text
    assert "| 128 | llama (llama-tiny) | `llama-128` | - | 1.3 |" in text

    groups = context_length.groups_by_data([load_run(r) for r in runs])
    loss_ax = context_length.loss_figure(groups).axes[0]
    curves = (
        "gpt2 (gpt2-tiny), ctx 128",
        "llama (llama-tiny), ctx 128",
        "gpt2 (gpt2-tiny), ctx 384",
    )
    expected = {f"{curve} {kind}" for curve in curves for kind in ("train", "eval")}
    assert {line.get_label() for line in loss_ax.get_lines()} == expected

    ours, paper = context_length.final_figure(groups).axes
    final = {line.get_label(): list(line.get_xdata()) for line in ours.get_lines()}
    assert final == {"gpt2 (gpt2-tiny)": [128, 384], "llama (llama-tiny)": [128]}
    plots.pyplot().close("all")
    # Every tick labelled: the contexts present and nothing between them.
    assert [t.get_text() for t in ours.get_xticklabels()] == ["128", "384"]
    assert len(ours.xaxis.get_minorticklocs()) == 0
    # The paper's perplexities on axes of their own, named by their unit and source.
    assert [line.get_label() for line in paper.get_lines()] == ["paper, Table 4"]
    assert "perplexity" in paper.get_title() and "paper" in paper.get_title()
    assert "perplexity" in paper.get_ylabel()
    assert [t.get_text() for t in paper.get_xticklabels()] == ["1024", "2048", "4096"]


def test_runs_sharing_model_context_and_name_keep_their_own_labels(tmp_path):
    config, curve = lm_config(PYSRC, 128), lm_curve(1.0, 10, 64)
    day1 = write_run(tmp_path / "day1" / "12-00-00", config, curve)
    day2 = write_run(tmp_path / "day2" / "12-00-00", config, curve)
    records = [load_run(day1), load_run(day2), load_run(day1)]  # the first given twice
    labels = curve_labels(records, (model_and_context, run_name, run_path))
    same = "gpt2, ctx 128, 12-00-00"
    assert labels == [f"{same}, {day1}", f"{same}, {day2}", f"{same}, {day1} #2"]
    # Curves across contexts need no more than the model while the contexts differ.
    other = write_run(tmp_path / "256", lm_config(PYSRC, 256), curve)
    pair = [load_run(day1), load_run(other)]
    assert curve_labels(pair, (run_model, run_name), x=lambda r: r.cfg("seq_len")) == ["gpt2"] * 2


def test_a_run_with_old_metric_names_still_reports(tmp_path):
    old_rows = [
        {"step": 10, "loss": 2.5, "tokens_seen": 640.0, "step_time_s": 0.5},
        {"step": 20, "loss": 2.2, "tokens_seen": 1280.0, "step_time_s": 0.5},
    ]
    synthetic = {"name": "synthetic", "loader": "synthetic"}
    run = write_run(tmp_path / "old", lm_config(synthetic, 64), old_rows, [lm_eval(20, 2.3)])
    record = load_run(run)
    assert (record.train[-1][TRAIN_LOSS], record.tokens_seen) == (2.2, 1280.0)
    (path,) = write_reports([run], tmp_path / "out")
    text = path.read_text()
    assert "| `old` | gpt2 | - | done | 20/20 | 1.28K |" in text
    assert "Tokens per optimizer step: 64 at every context length." in text


def classifier_config(
    task: str, seq_len: int, impl: str, contour: int = 14, samples: int = 200_000
) -> dict:
    return {
        "seq_len": seq_len,
        "model": {"arch": "classifier"},
        "attention": {"impl": impl},
        "data": {"name": task, "contour_length": contour, "num_samples": samples},
        "trainer": {"max_steps": 20},
    }


def test_pathfinder_report(tmp_path):
    for impl, accs in (("flash", (0.55, 0.61)), ("blocksparse", (0.58, 0.52))):
        write_run(
            tmp_path / f"pathx-{impl}",
            classifier_config("pathx", 16384, impl),
            [{"step": s, TRAIN_LOSS: 0.69, TRAIN_ACCURACY: a, TRAIN_TOKENS_SEEN: s * 64 * 16384.0}
             for s, a in ((10, accs[0]), (20, accs[1]))],
            [{"step": s, "eval/loss": 0.69, "eval/accuracy": a}
             for s, a in ((10, accs[0]), (20, accs[1]))],
        )  # fmt: skip
    write_run(
        tmp_path / "path32",
        classifier_config("pathfinder32", 1024, "sdpa", contour=6, samples=4000),
        [{"step": 20, TRAIN_LOSS: 0.6, TRAIN_ACCURACY: 0.7, TRAIN_TOKENS_SEEN: 20 * 32 * 1024.0}],
        [{"step": 20, "eval/loss": 0.6, "eval/accuracy": 0.75}],
    )
    runs = [tmp_path / "path32", *sorted(tmp_path.glob("pathx-*"))]
    (path,) = write_reports(runs, tmp_path / "out")
    text = path.read_text()
    assert (
        "| Path-32 (contour 6) | sdpa | `path32` | - | 3,200 | 640 | 75.0 | 75.0 | 70.0 | 72.7 |"
        in text
    )
    assert (
        "| Path-X | flash | `pathx-flash` | - | 160,000 | 1,280 | 61.0 | 61.0 | 61.0 | 61.4 |"
        in text
    )
    assert (
        "| Path-X | blocksparse | `pathx-blocksparse` | - | 160,000 | 1,280 | 52.0 | 58.0 | 52.0 | 56 |"
        in text
    )
    assert "| FlashAttention | 37.6 | 63.9 | 81.4 | 43.5 | 72.7 | 59.8 |" in text
    assert_png(tmp_path / "out" / "pathfinder-accuracy.png")


def bench_row(method, seqlen, ms, mib, note=""):
    return {"method": method, "mode": "fwd_bwd", "seqlen": seqlen, "batch": 16384 // seqlen,
            "heads": 32, "head_dim": 64, "causal": False, "density": 1.0, "variant": "",
            "ms": ms, "tflops": 1.0 if ms else None, "peak_mib": mib, "note": note}  # fmt: skip


def test_speed_memory_report_bench_and_steps(tmp_path):
    bench = tmp_path / "kernels"
    bench.mkdir()
    rows = [
        bench_row("flashtrain", 1024, 2.0, 100.0),
        bench_row("sdpa_math", 1024, 4.0, 800.0),
        bench_row("flashtrain", 4096, 8.0, 100.0),
        bench_row("sdpa_math", 4096, None, None, "OOM"),
    ]
    env = {"device": "NVIDIA H100 80GB HBM3", "commit": "feedbeef", "torch": "2.11"}
    payload = {"env": env, "args": {"sweep": "dense"}, "rows": rows}
    (bench / "attention-dense-nvidia-h100-reproduce.json").write_text(json.dumps(payload))
    for impl, times in (("flash", (0.1, 0.3)), ("reference", (0.2, 1.6))):
        for seq_len, t in zip((256, 1024), times):
            write_run(
                tmp_path / f"step-{impl}-{seq_len}",
                lm_config({"name": "synthetic", "loader": "synthetic"}, seq_len, 6, impl),
                [{"step": 3, STEP_TIME_S: 9.0, "memory/max_rss_gib": 0.5, TRAIN_LOSS: 5.0},
                 {"step": 6, STEP_TIME_S: t, "memory/max_rss_gib": 4 * t, TRAIN_LOSS: 5.0}],
                launch=launch("speed-memory"),
            )  # fmt: skip
    write_run(  # a second model at the same attention and length: its own column
        tmp_path / "step-flash-llama-1024",
        lm_config({"name": "synthetic", "loader": "synthetic"}, 1024, 6, "flash", arch="llama"),
        [{"step": 6, STEP_TIME_S: 0.4, "memory/max_rss_gib": 1.5, TRAIN_LOSS: 5.0}],
        launch=launch("speed-memory"),
    )
    runs = [bench, *sorted(tmp_path.glob("step-*"))]
    (path,) = write_reports(runs, tmp_path / "out")
    text = path.read_text()
    assert "| 1024 | 2 | 100 | 8.0x | 5.7x | 2.0x | 1.6x |" in text  # paper: 1184/209, 3.67/2.29
    assert "| 4096 | 8 | 100 | OOM | 20.4x | OOM | 1.7x |" in text
    assert "| `kernels` | - | - | done | - | - | NVIDIA H100 80GB HBM3 | `feedbeef` |" in text
    assert "| seq_len | flash, gpt2 | flash, llama | reference, gpt2 |" in text
    assert "| 1024 | 0.3 s / 1.2 GiB | 0.4 s / 1.5 GiB | 1.6 s / 6.4 GiB |" in text
    names = [
        "speed-memory-step.png",
        *(f"speed-memory-kernels-dense-{v}.png" for v in ("ms", "peak_mib")),
    ]
    for name in names:
        assert_png(tmp_path / "out" / name)


def test_bert_report(tmp_path):
    config = {"seq_len": 128, "model": {"arch": "bert", "n_layer": 12, "d_model": 768},
              "data": {"name": "bert_mlm"}, "trainer": {"max_steps": 20}}  # fmt: skip
    write_run(
        tmp_path / "bert",
        config,
        [{"step": s, TRAIN_LOSS: 9.0 - s / 10, TRAIN_ACCURACY: s / 100} for s in (10, 20)],
        [{"step": 20, "eval/loss": 7.5, "eval/ppl": math.exp(7.5), "eval/accuracy": 0.123}],
    )
    (path,) = write_reports([tmp_path / "bert"], tmp_path / "out")
    assert "| `bert` | - | 12 layers x 768 | bert_mlm | 128 | 7.5 | 12.3 | 72 |" in path.read_text()
    assert_png(tmp_path / "out" / "bert-curves.png")


def test_the_cli_reports_and_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    from flashtrain.lab.reports import build as report

    run = write_run(tmp_path / "syn", lm_config({"name": "synthetic"}, 64), lm_curve(2.0, 10, 64))
    assert report.main([str(run), "--out", str(tmp_path / "out")]) == 0
    assert "context-length.md" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "is not a run folder" in capsys.readouterr().err


def test_a_run_without_metrics_is_listed_as_not_started_or_failed(tmp_path):
    run = tmp_path / "new"
    run.mkdir()
    (run / "reproduce.json").write_text(json.dumps(launch("bert")))
    record = load_run(run)
    assert (record.experiment, record.status, record.steps) == ("bert", "not started", 0)
    failed = launch("bert")
    failed["launches"][0]["exit_code"] = 2
    (run / "reproduce.json").write_text(json.dumps(failed))
    assert load_run(run).status == "not started, exit 2"
    (path,) = write_reports([run], tmp_path / "out")
    assert "No run has logged metrics yet." in path.read_text()


@pytest.mark.parametrize("arch, experiment", [("classifier", "pathfinder"), ("bert", "bert")])
def test_experiment_is_inferred_without_reproduce_json(tmp_path, arch, experiment):
    run = write_run(tmp_path / "r", {"model": {"arch": arch}, "trainer": {"max_steps": 1}})
    assert load_run(run).experiment == experiment
