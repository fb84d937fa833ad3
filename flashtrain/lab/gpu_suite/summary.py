"""summary.md: the suite's figures as markdown tables, rebuilt from suite.json's state after
every measurement (the targets are derived here, from the attention rows and the peaks, the
hopper section's rows and the training section's)."""

from __future__ import annotations

import itertools

from flashtrain.lab.bench import results, ws_route
from flashtrain.lab.bench.long_context_report import NOT_MEASURED, markdown_rows
from flashtrain.lab.gpu_suite.loss_section import loss_lines
from flashtrain.lab.gpu_suite.targets import (
    add_row_ratios,
    hopper_target_ratios,
    target_ratios,
    training_targets,
)

DRY = ", DRY RUN (toy sizes on CPU, no figure is a measurement)"


def _fmt(value, digits=2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def derive(state: dict) -> None:
    """Fields computed from the measurements (kept in suite.json too): the targets, and the
    hopper section's ratios per row."""
    dry = bool(state["runs"] and state["runs"][-1].get("dry_run"))
    hopper = state["sections"].get("hopper")
    if hopper is not None and "rows" in hopper:
        add_row_ratios(hopper["rows"])
        hopper["targets"] = hopper_target_ratios([r for r in hopper["rows"] if "mode" in r], dry)
    attention = state["sections"].get("attention")
    if attention is not None:
        peak = {}
        for row in state["sections"].get("peaks", {}).get("rows", []):
            peak.update(row)
        attention["targets"] = target_ratios(
            attention.get("rows", []), peak.get("matmul_peak_tflops"), dry
        )
    training = state["sections"].get("training")
    if training is not None and "rows" in training:
        training["targets"] = training_targets(training["rows"], dry)


def _header(state: dict) -> list[str]:
    env = state["runs"][-1] if state["runs"] else {}
    lines = [
        "# GPU suite",
        "",
        f"Device **{env.get('device')}** (capability {env.get('capability', '-')}, driver "
        f"{env.get('driver') or '-'}), torch {env.get('torch')}, triton {env.get('triton')}, "
        f"CUDA {env.get('cuda')}, commit {env.get('commit')}{DRY if env.get('dry_run') else ''}.",
    ]
    if env.get("missing_modules"):
        lines += ["", f"Missing Python modules: {', '.join(env['missing_modules'])} (the "
                  "sections that need them fail and say so; without matplotlib, no plots)."]  # fmt: skip
    # "compile s": the section's compile phase (its kernels' first launches, side by side),
    # included in its seconds and spent before any of its measurements
    lines += ["", "| section | status | measured | seconds | compile s |", "|---|---|---|---|---|"]
    for name, sec in state["sections"].items():
        done = sum(1 for v in sec.get("measured", {}).values() if v == "ok")
        lines.append(f"| {name} | {sec.get('status')} | {done}/{len(sec.get('planned', []))} | "
                     f"{sec.get('seconds', '-')} | {sec.get('compile_seconds', '-')} |")  # fmt: skip
    return lines


def _correctness(sec: dict) -> list[str]:
    rows = sec.get("rows", [])
    wrong = [r["case"] for r in rows if not r.get("passed")]
    lines = ["", f"## Correctness: {len(rows) - len(wrong)}/{len(sec.get('planned', []))} pass"]
    return lines + [f"- WRONG: {c}" for c in wrong]


def _targets(sec: dict, title: str = "## Targets (issue 12)") -> list[str]:
    lines = [
        "",
        title,
        "",
        "| target | ratio | goal | pass |",
        "|---|---|---|---|",
    ]
    for t in sec.get("targets", []):
        verdict = {True: "PASS", False: "fail", None: "-"}[t["passed"]]
        lines.append(f"| {t['target']} | {_fmt(t['ratio'])} | {t['goal']} | {verdict} |")
    return lines


# The split's buckets shown one to a column (step_split.py); communication, memcpy, data: "other"
SPLIT_COLUMNS = ("matmul", "attention", "loss", "elementwise", "optimizer")
ATTENTION_ORDER = ("flash", "sdpa-flash", "sdpa-cudnn")


def _split_cells(split: dict | None) -> list[str]:
    if not split:
        return ["-"] * (len(SPLIT_COLUMNS) + 3)
    ms = split["ms_per_step"]
    other = sum(v for k, v in ms.items() if k not in (*SPLIT_COLUMNS, "idle"))
    cells = [ms.get(k) for k in SPLIT_COLUMNS] + [other, ms.get("idle"), split.get("window_ms")]
    return [_fmt(float(v), 1) if v is not None else "-" for v in cells]


def _training_order(row: dict) -> tuple:
    order = ATTENTION_ORDER.index(row["attention"]) if row["attention"] in ATTENTION_ORDER else 9
    return row["model"], row["seqlen"], order


def _training(sec: dict, dry: bool) -> list[str]:
    """One row per trainer run: throughput, MFU, memory, and the profiled step's split."""
    rows = sorted((r for r in sec.get("rows", []) if "model" in r), key=_training_order)
    lines = ["", "## Training through the trainer (issue 44)" + (DRY if dry else ""), "",
             "micro_batch_size=auto, one global batch in tokens; tokens/s, MFU and step ms are "
             "medians of the steady steps (docs/benchmarks.md: MFU); the split is ms per "
             "profiled step (flashtrain/lab/bench/step_split.py): other = communication + memcpy"
             " + data, idle = no kernel running, window = first to last kernel.", "",
             "| model | seqlen | attention | micro x accum | tokens/s | MFU % | peak GiB | matmul "
             "| attention | loss | elementwise | optimizer | other | idle | window ms | step ms |",
             "|---" * 16 + "|"]  # fmt: skip
    for r in rows:
        head = f"| {r['model']} | {r['seqlen']} | {r['attention']} | "
        if "note" in r:
            lines.append(head + f"{r['note']} |" + " |" * 12)
            continue
        # .get: a record an older suite began (same OUT, earlier call) lacks the newer fields
        cells = [f"{r.get('micro_batch_size', '-')} x {r.get('grad_accum', '-')}",
                 _fmt(r.get("tokens_per_s"), 0), _fmt(r.get("mfu_percent"), 1),
                 _fmt(r.get("peak_allocated_gib"), 1), *_split_cells(r.get("split")),
                 _fmt(r.get("step_ms"), 1)]  # fmt: skip
        lines.append(head + " | ".join(cells) + " |")
    lines += _training_notes(rows)
    return lines + _targets(sec, "### Targets (issue 44, predictions)")


def _training_notes(rows: list[dict]) -> list[str]:
    """What the micro-batch sizing said per model and length, graph breaks, failed splits."""
    notes = {}
    for r in rows:
        if r.get("micro_batch_choice"):
            notes.setdefault((r["model"], r["seqlen"]), r["micro_batch_choice"])
    lines = [f"- {model} S={seqlen}: {choice}" for (model, seqlen), choice in notes.items()]
    lines += [f"- {r['model']} S={r['seqlen']} {r['attention']}: {r['graph_breaks']} graph "
              "break(s) in the compiled blocks" for r in rows if r.get("graph_breaks")]  # fmt: skip
    lines += [f"- {r['model']} S={r['seqlen']} {r['attention']}: no split: {r['split_error']}"
              for r in rows if r.get("split_error")]  # fmt: skip
    return [""] + lines if lines else []


def _long(sec: dict) -> list[str]:
    lines = ["", "## Long sequence", "", "| seqlen | causal | mode | ms | TFLOP/s | peak MiB |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in sec.get("rows", []):
        lines.append(f"| {r['seqlen']} | {r['causal']} | {r['mode']} | {_fmt(r['ms'])} | "
                     f"{_fmt(r['tflops'], 1)} | {_fmt(r['peak_mib'], 0)} |")  # fmt: skip
    return lines


def _longctx(sec: dict) -> list[str]:
    lines = ["", f"## Long context by context-parallel mode ({NOT_MEASURED})", ""]
    lines += markdown_rows(sec.get("rows", []))
    return lines + [f"- {name}: skipped, estimated {e['estimated_s']} s at {e['tflops']} TFLOP/s, "
                    f"{e['left_s']} s left" for name, e in sec.get("estimates", {}).items()]  # fmt: skip


def _decode(sec: dict) -> list[str]:
    lines = ["", "## Decode step (one query row per sequence)", "",
             "| cache tokens | method | time (us) | max diff vs kvcache |", "|---|---|---|---|"]  # fmt: skip
    for r in sec.get("rows", []):
        lines.append(f"| {r['cache_len']} | {r['method']} | {_fmt(r['seconds'] * 1e6, 1)} | "
                     f"{r['max_abs_diff_vs_kvcache']:.1e} |")  # fmt: skip
    return lines


def _sweep(sec: dict) -> list[str]:
    lines = ["", f"## Tile sweep: table {sec.get('table_file')}, descriptor loads "
             f"{'allowed' if sec.get('tma_allowed') else 'not allowed (their checks did not all pass)'}",
             "", "| key | config | ms | built-in ms | speedup |", "|---|---|---|---|---|"]  # fmt: skip
    for r in sec.get("rows", []):
        if "config" in r:
            lines.append(f"| {r['measurement']} | {r.get('note', '')} | {_fmt(r.get('ms'))} | "
                         f"{_fmt(r.get('builtin_ms'))} | {_fmt(r.get('speedup_vs_builtin'))} |")  # fmt: skip
        else:
            lines.append(f"| {r['case']} | check | {'ok' if r['passed'] else 'WRONG'} | | |")
    return lines


def _route(row: dict) -> str:
    """Which backward ran: "gluon", or "triton (route: why not)"."""
    return ws_route.label(row.get("kernel", "-"), row.get("route"))


def _hopper_guard(rows: list[dict]) -> list[str]:
    guard = next((r for r in rows if "outcome" in r), None)
    if guard is None:
        return ["", "Guard (child process): not run."]
    cases = ", ".join(f"a {phase} case {s:.0f} s" for phase, s in guard.get("cases_s", {}).items())
    lines = ["", f"Guard (child process, small shapes and many work items; hung: {cases}, "
             f"{guard['idle_s']:.0f} s without a line while no case runs, or "
             f"{guard['timeout_s']:.0f} s in all): **{guard['outcome']}**: {guard['detail']}, "
             f"in {guard['seconds']} s.", "",
             "| guard case | kernel | s | max diff vs built-in | wrong |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in guard["cases"]:
        lines.append(f"| {r['case']} | {_route(r)} | {r['seconds']} | "
                     f"{_fmt(r['max_diff_vs_builtin'], 4)} | {r.get('wrong') or ''} |")  # fmt: skip
    consan = "; ".join(f"{r.get('role', 'both kernels')}: **{r['consan']}** ({r['detail']})"
                       for r in guard.get("consan", []))  # fmt: skip
    if consan:
        lines += ["", f"ConSan (Triton's concurrency sanitizer, the smallest case): {consan}."]
    if guard["outcome"] != "passed" and guard["stderr_tail"]:  # what the issue needs
        tail = guard["stderr_tail"].strip().splitlines()[-20:]
        lines += ["", "The child's stderr, last lines:", "", "```", *tail, "```"]
    return lines


GRADIENTS = ("out", "dq", "dk", "dv")


def _hopper_checks(rows: list[dict], planned: int) -> list[str]:
    checks = [r for r in rows if "passed" in r]
    passed = sum(1 for r in checks if r["passed"])
    lines = ["", f"### Correctness: {passed}/{planned} pass", "",
             "| case | kernel | out | dq | dk | dv | pass |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in checks:
        if r["kind"] == "nonfinite":  # relative diffs vs finite inputs, on rows that see no NaN
            errs = [f"{r['out_diff']:.1e} (vs finite)", f"{r['dq_diff']:.1e} (vs finite)", "", ""]
        else:  # ours vs float32 math (PyTorch's low precision in brackets)
            errs = [f"{r[f'{g}_err']:.1e} ({r[f'{g}_torch_err']:.1e})" for g in GRADIENTS]
        lines.append(f"| {r['case']} | {_route(r)} | {' | '.join(errs)} | "
                     f"{'ok' if r['passed'] else 'FAILED: ' + r['failure']} |")  # fmt: skip
    return lines


def _hopper_table(sec: dict) -> list[str]:
    rows = [r for r in sec.get("rows", []) if "key" in r]
    lines = ["", f"### Tuning table ({sec.get('table_file', '-')}; written only for a config that "
             "agrees with the built-in one, beats it, and passed every check above)", "",
             "| key | ms | built-in ms | speedup | max diff | written | note |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['key']} | {_fmt(r.get('ms'))} | {_fmt(r.get('builtin_ms'))} | "
                     f"{_fmt(r.get('speedup_vs_builtin'))} | "
                     f"{_fmt(r.get('max_diff_vs_builtin'), 4)} | "
                     f"{'yes' if r['winner'] else 'no'} | {r.get('note', '')} |")  # fmt: skip
    return lines


HOPPER_METHODS = (("flashtrain_gluon", "Gluon"), ("flashtrain", "default"),
                  ("sdpa_cudnn_attention", "cuDNN"), ("sdpa_flash_attention", "FA2"),
                  ("flex", "Flex"), ("flashtrain_gluon_fwd", "Gluon fwd"),  # issue 46
                  ("flashtrain_gluon_both", "Gluon both"), ("flashtrain_ws_fwd", "ws fwd"),
                  ("flashtrain_persistent_fwd", "persistent fwd"))  # fmt: skip


def _hopper_timing(rows: list[dict]) -> list[str]:
    """One line per shape and mode: each method's TFLOP/s (or why none), then the Gluon
    backward's ratios to cuDNN and to today's default."""
    cell = {(r["method"], r["mode"], r["head_dim"], r["causal"], r["seqlen"]): r for r in rows}
    shapes = list(dict.fromkeys((r["head_dim"], r["causal"], r["seqlen"]) for r in rows))
    names = " | ".join(label for _, label in HOPPER_METHODS)
    lines = ["", "### Timing (TFLOP/s)", "", f"| hd | causal | seqlen | mode | {names} | "
             "Gluon / cuDNN | Gluon / default |",
             "|---" * (6 + len(HOPPER_METHODS)) + "|"]  # fmt: skip
    for (head_dim, causal, seqlen), mode in itertools.product(shapes, ("bwd", "fwd_bwd", "fwd")):
        found = [cell.get((method, mode, head_dim, causal, seqlen)) for method, _ in HOPPER_METHODS]
        values = [("-" if r is None else _fmt(r["tflops"], 1) if r.get("tflops")
                   else (r.get("note") or "-").split(":")[0]) for r in found]  # fmt: skip
        gluon = found[0] or {}
        lines.append(f"| {head_dim} | {causal} | {seqlen} | {mode} | {' | '.join(values)} | "
                     f"{_fmt(gluon.get('ratio_vs_cudnn'))} | "
                     f"{_fmt(gluon.get('ratio_vs_flashtrain'))} |")  # fmt: skip
    return lines


def _hopper(sec: dict, dry: bool) -> list[str]:
    """The Gluon kernels' check: guard, correctness, targets vs cuDNN, timing, table."""
    rows = sec.get("rows", [])
    lines = ["", "## Hopper: the Gluon backward and forward (issues 43, 46)" + (DRY if dry else "")]
    lines += _hopper_guard(rows) + _hopper_checks(rows, len(sec.get("checks", [])))
    lines += _targets(sec, "### Targets (Gluon kernels vs cuDNN, geometric mean over 4K and 16K)")
    timed = [r for r in rows if "mode" in r]
    if timed:
        kernels = sorted({_route(r) for r in timed if r["method"] == "flashtrain_gluon"})
        lines += _hopper_timing(timed) + ["", f"Gluon rows' backward: {'; '.join(kernels)}."]
    return lines + _hopper_table(sec)


def _pytest(sec: dict) -> list[str]:
    rows = sec.get("rows", [])
    status = rows[0]["summary"] if rows else sec.get("status")
    return ["", f"## pytest -m gpu: {status} (log and junit beside this file)"]


def summary_markdown(state: dict) -> str:
    lines = _header(state)
    sections = state["sections"]
    env_dry = bool(state["runs"] and state["runs"][-1].get("dry_run"))
    if "correctness" in sections:
        lines += _correctness(sections["correctness"])
    peak = {}
    for row in sections.get("peaks", {}).get("rows", []):
        peak.update(row)
    if peak:
        lines += ["", f"## Peaks: bf16 matmul {_fmt(peak.get('matmul_peak_tflops'), 1)} TFLOP/s, "
                  f"copy {_fmt(peak.get('copy_bandwidth_gbs'), 0)} GB/s"]  # fmt: skip
    attention = sections.get("attention", {})
    if attention:
        lines += _targets(attention)
        rows = [r for r in attention.get("rows", []) if "mode" in r]
        if rows:
            env = state["runs"][-1] if state["runs"] else {}
            table = results.markdown_table(rows, env, "Attention").split("\n", 3)[-1]
            lines += ["", "## Attention (TFLOP/s)" + (DRY if env_dry else ""), table]
    if "loss" in sections:
        lines += loss_lines(sections["loss"])
    if "training" in sections:
        lines += _training(sections["training"], env_dry)
    if "long" in sections:
        lines += _long(sections["long"])
    if "longctx" in sections:
        lines += _longctx(sections["longctx"])
    if "decode" in sections:
        lines += _decode(sections["decode"])
    if "hopper" in sections:
        lines += _hopper(sections["hopper"], env_dry)
    if "sweep" in sections:
        lines += _sweep(sections["sweep"])
    if "pytest" in sections:
        lines += _pytest(sections["pytest"])
    return "\n".join(lines) + "\n"
