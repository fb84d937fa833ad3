"""The loss section (issue 44, item 4): the LM head's loss, forward + backward, at the GEMM's speed?

The mean cross-entropy of hidden (N, C) @ weight (V, C)^T over N tokens, backward to hidden and
weight, bf16 on CUDA (float32 toys in the dry run), at GPT-2's vocabulary (V 50257, C 768) and
Llama-3's (V 128256, C 2048, Llama-3.2-1B's head), at 16K and 64K tokens: 16K is the suite's
Llama length and about a training micro-batch per GPU (GPT-2 small: 16 x 1K), enough row tiles
to fill the H200's 132 SMs; 64K is the long section's length, where plain logits would take
64K x 128256 x 4 B = 32 GiB in float32 and the kernel runs in its steady state. Methods side by
side (flashtrain/lab/bench/loss_methods.py): fused (flashtrain's Triton kernel), chunked
(flashtrain's PyTorch path), compiled (a chunked cross-entropy under torch.compile) and liger
(Liger-Kernel's fused linear cross-entropy, where importable: otherwise its row says how to
carry the wheel).

Per (vocabulary, tokens), in this order:
    check   every method once on the same inputs vs chunked (loss and both gradients, relative
            error, tolerances suited to bf16); fused and compiled (our code) are timed only if
            they agree, so a wrong kernel is never reported as fast; Liger's errors are recorded.
            compiled's and Liger's first calls (their compiles) happen here, untimed.
    timing  each method: ms (median), TFLOP/s with FLOPs = 6 N C V (forward logits 2NCV,
            backward dH and dW 4NCV), that as a fraction of the bf16 matmul peak of the peaks
            section (measured here when the record has none), the peak memory allocated beyond
            the inputs (the gradients dH and dW included), and a verdict against the issue's
            target: fused at GPT-2's vocabulary >= 70% of that peak.
Before any of it, a compile phase launches the fused kernel once at every timed shape.

Note on the target: the fused kernel computes 5 products of N x C x V (the logits thrice, for
bitwise-repeatable gradients without atomics: kernels/linear_cross_entropy.py), the others 3,
so under the 6 N C V count fused's ceiling is 60% of the matmul peak.
"""

from __future__ import annotations

import time

import torch

from flashtrain.lab.bench import measure
from flashtrain.lab.bench.loss_methods import loss_and_grads, loss_fn, unavailable
from flashtrain.lab.gpu_suite.record import Section
from flashtrain.lab.gpu_suite.suite import Suite
from flashtrain.models.fused_cross_entropy import runs_triton

METHODS = ("fused", "chunked", "compiled", "liger")
GATED = ("fused", "compiled")  # ours: timed only after they agree with chunked
# others' code: a RuntimeError of theirs is a note ("unsupported"), not a failure
BASELINES = ("compiled", "liger")
TARGET_FRACTION = 0.70  # issue 44: fused fwd+bwd at GPT-2's vocabulary, of the bf16 matmul peak
# bf16 products, float32 accumulation: the methods differ by rounding (chunked rounds its logits
# to bf16, the kernel keeps them in float32) and the gradients' final bf16 cast, ~0.4% of a norm
LOSS_RTOL, GRAD_RTOL = 1e-3, 2e-2
# (V, C) per vocabulary, the target's first, and token counts: real / dry run. Read from the
# suite's Sizes (loss_vocabs, loss_tokens) where it has them.
REAL_SIZES = (((50257, 768), (128256, 2048)), (16384, 65536))
DRY_SIZES = (((129, 16), (257, 32)), (32, 64))
VOCAB_NAMES = {50257: "GPT-2", 128256: "Llama-3"}
CHUNK = 2048  # chunked's and compiled's tokens per chunk (flashtrain's default chunk_size)
# timed calls: about TIMED_MS of them at an assumed rate, at least MIN_REP, at most the suite's rep
ASSUMED_TFLOPS, TIMED_MS, MIN_REP = 400.0, 250.0, 5
PEAK = "bf16 matmul peak"
DRY = ", DRY RUN (toy sizes on CPU, no figure is a measurement)"


def loss_sizes(suite: Suite):
    """((V, C) per vocabulary, token counts, chunk): the Sizes fields, or this file's defaults."""
    vocabs, tokens = DRY_SIZES if suite.dry else REAL_SIZES
    vocabs = getattr(suite.sizes, "loss_vocabs", vocabs)
    tokens = getattr(suite.sizes, "loss_tokens", tokens)
    return vocabs, tokens, min(CHUNK, max(1, min(tokens) // 2))  # the dry run has chunks too


def vocab_label(vocab: int, hidden: int) -> str:
    name = VOCAB_NAMES.get(vocab)
    return f"{name + ' ' if name else ''}V={vocab} C={hidden}"


def _name(vocab: int, hidden: int, tokens: int, what: str) -> str:
    return f"{vocab_label(vocab, hidden)} N={tokens} {what}"


def recorded_peak(state: dict) -> float | None:
    """The bf16 matmul TFLOP/s of the peaks section in this record (this call or an earlier one)."""
    rows = state["sections"].get("peaks", {}).get("rows", [])
    found = [r["matmul_peak_tflops"] for r in rows if r.get("matmul_peak_tflops")]
    return found[-1] if found else None


def _free_cuda() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _inputs(suite: Suite, vocab: int, hidden: int, tokens: int):
    """hidden (N, C) ~ N(0, 1), weight (V, C) ~ N(0, 0.02^2) (GPT-2's init), labels (N,)."""
    device, dtype = suite.device, suite.sizes.dtype
    gen = torch.Generator(device).manual_seed(0)  # the same inputs every time, no global seed
    h = torch.randn(tokens, hidden, generator=gen, device=device, dtype=dtype).requires_grad_()
    w = 0.02 * torch.randn(vocab, hidden, generator=gen, device=device, dtype=dtype)
    y = torch.randint(0, vocab, (tokens,), generator=gen, device=device)
    return h, w.requires_grad_(), y


# ---- the section -------------------------------------------------------------------------------


def section_loss(suite: Suite, sec: Section) -> None:
    vocabs, tokens, chunk = loss_sizes(suite)
    shapes = [(v, c, n) for v, c in vocabs for n in tokens]
    peak = recorded_peak(suite.record.state)
    cells = {_name(*s, m): [*s, m] for s in shapes for m in METHODS}
    sec.data.update(dry=suite.dry, cells=cells, chunk=chunk, target_vocab=vocabs[0][0],
                    target_fraction=TARGET_FRACTION)  # fmt: skip
    sec.plan(([] if peak else [PEAK])
             + [n for s in shapes for n in (_name(*s, "check"), *[_name(*s, m) for m in METHODS])])  # fmt: skip
    if peak is None:  # no peaks section in this record: the fractions need one
        z = suite.sizes
        row = sec.measure(PEAK, lambda: {"kind": "peak", "matmul_n": z.matmul_n, "matmul_peak_tflops":
                          measure.matmul_peak_tflops(z.matmul_n, device=suite.device)})  # fmt: skip
        peak = row["matmul_peak_tflops"] if row else None
    sec.data["matmul_peak_tflops"] = peak
    sec.data["peak_source"] = "peaks section" if PEAK not in sec.data["planned"] else "this section"
    sec.compile({f"fused {_name(*s, '')}".strip(): _fused_launch(suite, *s, chunk) for s in shapes},
                suite.compile_workers)  # fmt: skip
    for shape in shapes:
        _shape(suite, sec, shape, chunk, peak)
        _free_cuda()


def _fused_launch(suite: Suite, vocab: int, hidden: int, tokens: int, chunk: int):
    """A compile-phase launch: the fused loss's forward and backward once at a timed shape."""
    return lambda: loss_fn("fused", *_inputs(suite, vocab, hidden, tokens), chunk)()


def _shape(suite: Suite, sec: Section, shape, chunk: int, peak: float | None) -> None:
    """The check, then every method timed, on one set of inputs of `shape` = (V, C, N)."""
    check_name = _name(*shape, "check")
    if sec.why_not():
        for name in (check_name, *[_name(*shape, m) for m in METHODS]):
            sec.measure(name, lambda: None)  # recorded as skipped, with the reason
        return
    h, w, y = _inputs(suite, *shape)
    check = sec.measure(check_name, lambda: check_shape(suite, h, w, y, chunk))
    wrong = [f"{m}: {why}" for m in GATED if check and (why := _disagreement(check[m]))]
    if wrong:  # its figures stay in the row; the check fails
        sec.data["measured"][check_name] = f"failed: wrong: {'; '.join(wrong)}"[:400]
        suite.record.save()
    for method in METHODS:
        name = _name(*shape, method)
        refused = _refusal(check, method, sec.data["measured"][check_name])
        row = sec.measure(name, lambda method=method, refused=refused: time_method(
            suite, method, h, w, y, chunk, peak, refused))  # fmt: skip
        if row and row["note"].startswith("failed"):
            sec.data["measured"][name] = row["note"]
            suite.record.save()
        if row:
            shown = f"{row['ms']:.2f} ms, {_pct(row['peak_fraction'])} of peak" if row["ms"] else ""
            print(f"  {name}: {shown or row['note']}", flush=True)


def _disagreement(entry: dict) -> str:
    """Why a check entry of ours fails ("" where it agrees, or a baseline cannot run here)."""
    if entry.get("agrees") or entry.get("note", "").startswith(("skipped", "unsupported")):
        return ""
    if entry.get("note"):
        return entry["note"]
    return ", ".join(f"{k} err {entry[k]:.1e}" for k in ("loss", "dh", "dw"))


def _refusal(check: dict | None, method: str, check_status: str) -> str:
    """ "" where `method` may be timed; for ours without an agreeing check, why not."""
    if method not in GATED:
        return ""
    if check is None:
        return f"failed: not verified: the check did not run ({check_status[:200]})"
    if check[method].get("note", "").startswith(("skipped", "unsupported")):
        return check[method]["note"]  # a baseline that cannot run here: its note, as the timing's
    why = _disagreement(check[method])
    return f"failed: not verified: {why}" if why else ""


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float32 (NaN where either is not finite)."""
    a, b = a.float(), b.float()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))


def check_shape(suite: Suite, h, w, y, chunk: int) -> dict:
    """Every method's loss and gradients vs chunked's on the same inputs: {method: {"loss", "dh",
    "dw": relative errors, "agrees", "first_call_s"} or {"note": why none}}. An error in a
    method is its note (a CUDA fault is raised: the context is dead); chunked's is raised."""
    ref_loss, ref_dh, ref_dw = loss_and_grads("chunked", h, w, y, chunk)
    device, dtype = torch.device(suite.device), suite.sizes.dtype
    fused_kernel = "triton" if runs_triton(device, dtype) else "chunked stand-in: no Triton here"
    row = {"kind": "check", "vocab": w.shape[0], "hidden": h.shape[1], "tokens": h.shape[0],
           "chunked": {"loss_value": ref_loss}, "fused_kernel": fused_kernel,
           "loss_rtol": LOSS_RTOL, "grad_rtol": GRAD_RTOL}  # fmt: skip
    for method in ("fused", "compiled", "liger"):
        skip = unavailable(method, device)
        if skip:
            row[method] = {"note": skip}
            continue
        start = time.monotonic()
        try:
            loss, dh, dw = loss_and_grads(method, h, w, y, chunk)
        except Exception as err:  # noqa: BLE001  (one method's error must not lose the others)
            if measure.is_cuda_fault(err):
                raise
            why = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
            row[method] = {"note": f"{'unsupported' if method in BASELINES else 'failed'}: {why}"}
            continue
        errors = {"loss": abs(loss - ref_loss) / max(abs(ref_loss), 1e-30),
                  "dh": _rel(dh, ref_dh), "dw": _rel(dw, ref_dw)}  # fmt: skip
        agrees = errors["loss"] <= LOSS_RTOL and max(errors["dh"], errors["dw"]) <= GRAD_RTOL
        seconds = round(time.monotonic() - start, 2)  # compiled's and Liger's: their compiles
        row[method] = {**errors, "agrees": agrees, "first_call_s": seconds}
        del dh, dw
    return row


def _reps(suite: Suite, flops: float) -> tuple[int, int]:
    """(warmup, rep) of measure.measure: about TIMED_MS of timed calls at ASSUMED_TFLOPS."""
    if suite.dry:
        return 0, 1
    est_ms = flops / (ASSUMED_TFLOPS * 1e9)
    return 1, max(MIN_REP, min(suite.sizes.rep, int(TIMED_MS / est_ms)))


def time_method(suite: Suite, method: str, h, w, y, chunk: int, peak, refused: str = "") -> dict:
    """One method's row: ms, TFLOP/s (6 N C V), fraction of `peak`, peak MiB beyond the inputs,
    its verdict against the target; or, where it cannot or may not run, why in "note"."""
    (tokens, hidden), vocab = h.shape, w.shape[0]
    flops = 6 * tokens * hidden * vocab
    row = {"kind": "time", "vocab": vocab, "hidden": hidden, "tokens": tokens, "method": method,
           "flops": flops, "ms": None, "tflops": None, "peak_fraction": None, "peak_mib": None,
           "meets_target": None, "note": refused or unavailable(method, suite.device)}  # fmt: skip
    if row["note"]:
        return row
    warmup, rep = _reps(suite, flops)
    m = measure.measure(loss_fn(method, h, w, y, chunk), warmup, rep, suite.device,
                        baseline=method in BASELINES)  # fmt: skip
    row.update(ms=m.ms, peak_mib=m.peak_mib, note=m.note, warmup=warmup, rep=rep)
    if m.ms:
        row["tflops"] = flops / (m.ms * 1e-3) / 1e12
        if peak:
            row["peak_fraction"] = row["tflops"] / peak
            row["meets_target"] = row["peak_fraction"] >= TARGET_FRACTION
    return row


# ---- summary.md --------------------------------------------------------------------------------


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(fraction) -> str:
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def _agreement(check: dict | None, method: str) -> str:
    """The method's relative errors vs chunked (loss / dH / dW), or why there are none."""
    if method == "chunked":
        return "reference"
    entry = (check or {}).get(method)
    if not entry:
        return "-"
    if "note" in entry:
        return entry["note"].split(":")[0]
    errors = " / ".join(f"{entry[k]:.0e}" for k in ("loss", "dh", "dw"))
    return errors + ("" if entry["agrees"] else " WRONG")


def _verdict(row: dict | None, status: str) -> str:
    if row is None or row.get("ms") is None:
        return (row or {}).get("note") or status
    if row.get("meets_target") is None:
        return "no matmul peak"
    return f"{'meets' if row['meets_target'] else 'below'} {TARGET_FRACTION:.0%}"


def _target_line(sec: dict, rows: dict) -> str:
    vocab = sec.get("target_vocab")
    fused = [r for r in rows.values() if r.get("kind") == "time" and r["method"] == "fused"
             and r["vocab"] == vocab]  # fmt: skip
    found = [f"N={r['tokens']}: {_pct(r['peak_fraction'])} "
             f"({'PASS' if r['meets_target'] else 'fail' if r['meets_target'] is False else '-'})"
             for r in fused]  # fmt: skip
    return (f"Target (issue 44): fused fwd+bwd at {VOCAB_NAMES.get(vocab, f'V={vocab}')}'s "
            f"vocabulary >= {TARGET_FRACTION:.0%} of the bf16 matmul peak: "
            f"{'; '.join(found) if found else 'not measured'}.")  # fmt: skip


def loss_lines(sec: dict) -> list[str]:
    """The section's markdown for summary.md: the target's line, then one table row per
    (vocabulary, tokens, method), measured or not (then its status says why)."""
    rows = {r["measurement"]: r for r in sec.get("rows", []) if "measurement" in r}
    checks = {(r["vocab"], r["tokens"]): r for r in rows.values() if r.get("kind") == "check"}
    peak = sec.get("matmul_peak_tflops")
    lines = ["", "## LM-head loss: forward + backward (issue 44)" + (DRY if sec.get("dry") else ""),
             "", _target_line(sec, rows), "",
             f"FLOPs = 6 N C V; % of the bf16 matmul peak, {_fmt(peak, 1)} TFLOP/s "
             f"({sec.get('peak_source', '-')}); peak MiB: allocated beyond the inputs, dH and dW "
             "included; errors: relative to chunked, loss / dH / dW. Fused computes 5 products of "
             "N C V (the logits thrice, for repeatable gradients), the others 3: its ceiling under "
             "this count is 60% of the peak.", "",
             "| vocabulary | tokens | method | ms | TFLOP/s | % of peak | peak MiB | vs chunked | "
             "verdict |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    measured = sec.get("measured", {})
    for name in sec.get("planned", []):
        cell = sec.get("cells", {}).get(name)
        if cell is None:  # the check and the peak: not rows of their own
            continue
        vocab, hidden, tokens, method = cell
        row, check = rows.get(name), checks.get((vocab, tokens))
        data = row or {}
        if method == "fused" and check and check.get("fused_kernel") != "triton":
            method = f"fused ({check.get('fused_kernel')})"  # a CPU run without the interpreter
        lines.append(f"| {vocab_label(vocab, hidden)} | {tokens} | {method} | {_fmt(data.get('ms'))} "
                     f"| {_fmt(data.get('tflops'), 1)} | {_pct(data.get('peak_fraction'))} | "
                     f"{_fmt(data.get('peak_mib'), 0)} | {_agreement(check, cell[3])} "
                     f"| {_verdict(row, measured.get(name, 'not reached'))} |")  # fmt: skip
    return lines
