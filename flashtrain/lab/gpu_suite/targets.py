"""The issue-12 targets as ratios of TFLOP/s measured in the same process on the same inputs:
ours over SDPA's FLASH (FlashAttention-2) and CUDNN backends, block-sparse over FlexAttention,
and our forward over the chip's bf16 matmul peak; the issue-43 and issue-46 targets of the Gluon
backward and forward (the hopper section) over cuDNN's; and the issue-44 targets of the training section (MFU, ours
vs SDPA's best backend through the trainer, a step split that accounts for the GPU window)."""

from __future__ import annotations

import math

MIN_SEQLEN = 4096  # the targets are at >= 4K tokens (geometric mean over the lengths measured)
# (name, mode, causal, head_dim, baseline method, goal)
DENSE = [
    ("fwd hd128 vs FA2", "fwd", False, 128, "sdpa_flash_attention", 1.5),
    ("fwd hd128 vs cuDNN", "fwd", False, 128, "sdpa_cudnn_attention", 1.0),
    ("fwd+bwd hd128 vs FA2", "fwd_bwd", False, 128, "sdpa_flash_attention", 1.2),
    ("causal fwd hd64 vs FA2", "fwd", True, 64, "sdpa_flash_attention", 1.5),
    ("causal fwd hd64 vs cuDNN", "fwd", True, 64, "sdpa_cudnn_attention", 1.0),
    ("causal fwd+bwd hd64 vs FA2", "fwd_bwd", True, 64, "sdpa_flash_attention", 1.2),
]
SPARSE = ("block-sparse fwd+bwd vs FlexAttention", 1.2)
PEAK_FRACTION = ("fwd hd128 fraction of bf16 matmul peak", 0.6)
# The Gluon backward (hopper section, method flashtrain_gluon) over cuDNN, issue 43:
# (name, mode, causal, head_dim, goal)
GLUON = "flashtrain_gluon"
CUDNN = "sdpa_cudnn_attention"
HOPPER = [
    ("Gluon bwd hd128 vs cuDNN", "bwd", False, 128, 0.90),
    ("Gluon bwd hd64 vs cuDNN", "bwd", False, 64, 0.90),
    ("Gluon causal bwd hd128 vs cuDNN", "bwd", True, 128, 0.90),
    ("Gluon causal bwd hd64 vs cuDNN", "bwd", True, 64, 0.90),
    ("Gluon fwd+bwd hd128 vs cuDNN", "fwd_bwd", False, 128, 0.85),
]
# The Gluon forward over cuDNN, issue 46: (name, method, mode, causal, head_dim, goal); the
# forward alone (method flashtrain_gluon_fwd: the built-in backward beside it) and both Gluon
# kernels together (flashtrain_gluon_both)
GLUON_FWD, GLUON_BOTH = "flashtrain_gluon_fwd", "flashtrain_gluon_both"
HOPPER_FWD = [
    *[(f"Gluon {'causal ' * c}fwd hd{d} vs cuDNN", GLUON_FWD, "fwd", c, d, 1.0)
      for c in (False, True) for d in (128, 64)],
    *[(f"Gluon {'causal ' * c}fwd+bwd (both Gluon) hd{d} vs cuDNN", GLUON_BOTH, "fwd_bwd", c, d,
       0.95) for c in (False, True) for d in (128, 64)],
]  # fmt: skip


def _geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _target(name, ratio, goal) -> dict:
    passed = None if ratio is None else ratio >= goal
    return {"target": name, "ratio": ratio, "goal": goal, "passed": passed}


def _tflops_by_length(rows: list[dict], dry: bool):
    """tflops(method, mode, causal, head_dim) -> {seqlen: TFLOP/s} of the dense rows at >= 4K.
    The dry run's toy head dims stand in for 128 and 64 (largest, smallest) and its toy
    lengths for >= 4K."""
    dense = [r for r in rows if not r.get("variant") and r.get("tflops")]
    dims = sorted({r["head_dim"] for r in dense}, reverse=True)
    stand_in = {128: dims[0], 64: dims[-1]} if dry and dims else {}
    min_len = 0 if dry else MIN_SEQLEN

    def tflops(method, mode, causal, head_dim):
        head_dim = stand_in.get(head_dim, head_dim)
        return {
            r["seqlen"]: r["tflops"]
            for r in dense
            if (r["method"], r["mode"], r["causal"], r["head_dim"]) == (method, mode, causal, head_dim)
            and r["seqlen"] >= min_len
        }  # fmt: skip

    return tflops


def _ratio(ours: dict, theirs: dict) -> float | None:
    """Geometric mean over the lengths both sides measured."""
    return _geomean([ours[s] / theirs[s] for s in ours if s in theirs])


def target_ratios(rows: list[dict], matmul_peak: float | None, dry: bool) -> list[dict]:
    """Every target, its ratio None until both sides are measured."""
    tflops = _tflops_by_length(rows, dry)
    out = []
    for name, mode, causal, head_dim, base, goal in DENSE:
        ours, theirs = (
            tflops("flashtrain", mode, causal, head_dim),
            tflops(base, mode, causal, head_dim),
        )
        out.append(_target(name, _ratio(ours, theirs), goal))
    sparse = {
        r["method"]: r
        for r in rows
        if str(r.get("variant")).startswith("blocksparse ") and "dense" not in r["variant"]
        and r["mode"] == "fwd_bwd"
    }  # fmt: skip
    ours, flex = sparse.get("flashtrain", {}), sparse.get("flex", {})
    ratio = ours["tflops"] / flex["tflops"] if ours.get("tflops") and flex.get("tflops") else None
    out.append(_target(*SPARSE[:1], ratio, SPARSE[1]))
    fwd = tflops("flashtrain", "fwd", False, 128)
    frac = max(fwd.values()) / matmul_peak if fwd and matmul_peak else None
    out.append(_target(PEAK_FRACTION[0], frac, PEAK_FRACTION[1]))
    return out


def hopper_target_ratios(rows: list[dict], dry: bool) -> list[dict]:
    """The Gluon backward's and forward's targets, ratios None until both sides are measured."""
    tflops = _tflops_by_length(rows, dry)
    targets = [(name, GLUON, mode, causal, d, goal) for name, mode, causal, d, goal in HOPPER]
    return [
        _target(name, _ratio(tflops(method, mode, causal, d), tflops(CUDNN, mode, causal, d)), goal)
        for name, method, mode, causal, d, goal in targets + HOPPER_FWD
    ]


def add_row_ratios(rows: list[dict]) -> None:
    """Each timed row's TFLOP/s over cuDNN's at its shape and mode (ratio_vs_cudnn) and, for the
    Gluon rows, over today's default flashtrain's (ratio_vs_flashtrain); None where either is
    missing."""
    by_shape = {
        (r["method"], r["mode"], r["causal"], r["head_dim"], r["seqlen"]): r.get("tflops")
        for r in rows
        if "mode" in r
    }
    for r in rows:
        if "mode" not in r or r["method"] == CUDNN:
            continue
        shape = (r["mode"], r["causal"], r["head_dim"], r["seqlen"])
        pairs = [("ratio_vs_cudnn", CUDNN)] + [("ratio_vs_flashtrain", "flashtrain")] * (
            r["method"] in (GLUON, GLUON_FWD, GLUON_BOTH)
        )
        for field, base in pairs:
            theirs = by_shape.get((base, *shape))
            r[field] = r["tflops"] / theirs if r.get("tflops") and theirs else None


# The training section (issue 44), predictions written before a GPU measured them:
# (name, goal). The MFU is the trainer's (docs/benchmarks.md), with our attention.
TRAINING_MFU = ("GPT-2 small 1K MFU % (flash)", 45.0)
TRAINING_VS_SDPA = ("Llama-125M 16K tokens/s flash vs best SDPA", 1.0)
# 1 - |buckets + idle - GPU window| / window, the worst row; a row whose split failed fails it
TRAINING_SPLIT = ("step split accounts for the GPU window (worst row)", 0.98)


def _training_row(rows: list[dict], model: str, seqlen: int, attention: str) -> dict:
    return next((r for r in rows if (r["model"], r["seqlen"], r["attention"]) ==
                 (model, seqlen, attention)), {})  # fmt: skip


def _split_accounted(row: dict) -> float:
    split = row["split"]
    window = split["window_ms"]
    accounted = sum(split["ms_per_step"].values())
    return 1.0 - abs(accounted - window) / window if window else 0.0


def _split_target(rows: list[dict]) -> dict:
    measured = [r for r in rows if "tokens_per_s" in r]  # not the unsupported baselines' notes
    accounted = [_split_accounted(r) for r in measured if r.get("split")]
    target = _target(TRAINING_SPLIT[0], min(accounted, default=None), TRAINING_SPLIT[1])
    if any("split" in r and not r["split"] for r in measured):  # absent: an older record's row
        target["passed"] = False  # its split missed the window by more than step_split allows
    return target


def training_targets(rows: list[dict], dry: bool) -> list[dict]:
    """The training targets, ratios None until measured. The dry run's shortest GPT-2 length
    stands in for 1K and Llama's longest for 16K."""
    rows = [r for r in rows if "model" in r]
    lengths = {
        m: sorted(r["seqlen"] for r in rows if r["model"] == m) for m in ("gpt2", "llama-125m")
    }
    gpt2_len = lengths["gpt2"][0] if dry and lengths["gpt2"] else 1024
    llama_len = lengths["llama-125m"][-1] if dry and lengths["llama-125m"] else 16384
    mfu = _training_row(rows, "gpt2", gpt2_len, "flash").get("mfu_percent")
    ours = _training_row(rows, "llama-125m", llama_len, "flash").get("tokens_per_s")
    sdpa = [_training_row(rows, "llama-125m", llama_len, a).get("tokens_per_s")
            for a in ("sdpa-flash", "sdpa-cudnn")]  # fmt: skip
    best = max((t for t in sdpa if t), default=None)
    return [
        _target(TRAINING_MFU[0], mfu, TRAINING_MFU[1]),
        _target(TRAINING_VS_SDPA[0], ours / best if ours and best else None, TRAINING_VS_SDPA[1]),
        _split_target(rows),
    ]
