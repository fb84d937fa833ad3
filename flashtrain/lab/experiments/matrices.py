"""The experiment matrices, one per experiment: scale -> ScaleMatrix (see spec.py).

Each experiment is defined once: the settings of its runs live in its YAML presets under
configs/experiment/ (<experiment>/<scale>.yaml, or the paper's own presets such as
owt/gpt2s-4k), and a matrix names the preset and only what varies between its runs (the points:
context length, attention) plus the scale's data choices, cost and needs. Scales: `tiny` runs
on a 2-core CPU in minutes per run, `gpu-call` (context-length and pathfinder only) in one
9-minute GPU call with the steps set from measured throughput (scripts/paper_call.py), `gpu` in
~20 minutes on one GPU, `paper` is the FlashAttention paper's setting (8 GPUs, hours to days;
printed, run only on request). Every train run's preset (or point) sets trainer.max_steps (the
driver's "finished" test reads it).
`{runs}` in an override is the folder of the experiment's runs (for model.init_from chains).
"""

from __future__ import annotations

from dataclasses import replace

from flashtrain.lab.experiments.spec import ScaleMatrix


def preset(name: str) -> tuple[str, ...]:
    """The override that selects configs/experiment/<name>.yaml."""
    return (f"experiment={name}",)


def context_points(contexts, micro_tokens: int):
    """One point per context length; the micro-batch holds micro_tokens (the preset fixes the
    tokens per optimizer step, gradient accumulation makes up the rest)."""
    return tuple(
        (f"ctx{t}", (f"seq_len={t}", f"micro_batch_size={max(1, micro_tokens // t)}"))
        for t in contexts
    )


# ---------------------------------------------------------------- context-length
# LM quality vs context length at equal tokens per step: GPT-2 small on OpenWebText in the
# paper (Table 4: ppl 18.2 / 17.6 / 17.5 at 1K / 2K / 4K); byte-level pysrc (or the synthetic
# recall task) here.
CONTEXT_LENGTH = {
    "tiny": ScaleMatrix(
        common=(),
        points=context_points((64, 128, 256, 512), micro_tokens=2048),
        data={
            "pysrc": preset("context-length/tiny-pysrc"),
            "synthetic": preset("context-length/tiny-synthetic"),
        },
        default_data="pysrc",
        cost="2-core CPU: 1-2 minutes per run, 4 runs (pysrc: tokenizing the library once, ~1 "
        "minute)",
        needs="nothing: pysrc is this Python's standard library, synthetic is generated",
    ),
    "gpu-call": ScaleMatrix(
        common=preset("context-length/gpu-call"),
        # 1K first and its second seed last: the pair measures the seed-to-seed spread that the
        # longer contexts must beat; scripts/paper_call.py sets every run's steps alike.
        points=(
            *context_points((1024, 16384, 4096), micro_tokens=32768),
            ("ctx1024-seed2", ("seq_len=1024", "micro_batch_size=32", "seed=2")),
        ),
        data={"pysrc": ()},
        default_data="pysrc",
        cost="one H100/H200 call of 9 minutes with pathfinder (scripts/paper_call.py): ~1 "
        "minute per run, equal tokens at every context",
        needs="a CUDA GPU; the hydra and datasets wheels (../shared/gpu/wheels.sh full)",
    ),
    "gpu": ScaleMatrix(
        common=preset("context-length/gpu"),
        points=context_points((512, 1024, 2048, 4096), micro_tokens=16384),
        data={
            "pysrc": ("data=pysrc",),
            "synthetic": ("data=synthetic",),
            "openwebtext": ("data=openwebtext",),
        },
        default_data="pysrc",
        cost="one H100: ~3 minutes per run, 4 runs (65M tokens each)",
        needs="a CUDA GPU (openwebtext: its token cache, scripts/prepare_data.py openwebtext)",
    ),
    "paper": ScaleMatrix(
        common=(),
        points=(
            ("ctx1024", preset("owt/gpt2s-1k")),
            ("ctx2048", preset("owt/gpt2s-2k")),
            ("ctx4096", preset("owt/gpt2s-4k")),
        ),
        data={"openwebtext": ()},
        default_data="openwebtext",
        nproc=8,
        cost="8 x A100 per run; the paper: 2.7 days (1K), 3.0 days (2K), 3.6 days (4K) (Table 4)",
        needs="8 GPUs with 80 GB, OpenWebText tokenized once (scripts/prepare_data.py "
        "openwebtext num_proc=16) and the GPT-2 BPE files",
    ),
}

# ---------------------------------------------------------------- pathfinder
# Is there a path between the two dots? Accuracy of dense vs block-sparse vs SDPA attention.
# Paper: LRA Pathfinder (32 x 32) 72.7 / 73.3 (block-sparse); Path-X (128 x 128) 61.4 with
# FlashAttention, 56.0 block-sparse; Path-256 63.1 block-sparse, pre-trained on Path-64.
_ATTENTIONS = (
    ("flash", ("attention=flash",)),
    ("blocksparse", ("attention=blocksparse", "attention.block_size=64")),
    ("sdpa", ("attention=sdpa",)),
)
_PATH64 = "{runs}/pathfinder-paper-path64-pretrain/checkpoints/step_050000/model_optim.pt"
PATHFINDER = {
    "tiny": ScaleMatrix(
        common=preset("pathfinder/tiny"),
        # The last point is a control: the same model on 64 training images must memorise them
        # (train accuracy ~100%), so a run at chance is the task's difficulty, not a broken pipeline.
        points=(*_ATTENTIONS, ("flash-memorise64", ("attention=flash", "data.num_samples=80"))),
        cost="2-core CPU: ~4 minutes per run (one thread), after generating 4000 images once",
        needs="nothing: the Pathfinder images are generated (data.num_workers processes)",
    ),
    "gpu-call": ScaleMatrix(
        common=preset("pathfinder/gpu-call"),
        # Path-X runs only when Pathfinder-32 has left chance and time is left (paper_call.py).
        points=(
            ("path32-flash", ()),
            (
                "pathx-flash",
                (
                    "data=pathx",
                    "seq_len=16384",
                    "data.num_samples=20000",
                    "global_batch_size=64",
                    "micro_batch_size=32",
                ),
            ),
        ),
        cost="the rest of the 9-minute call after context-length (scripts/paper_call.py)",
        needs="a CUDA GPU; images generated on the CPU cores while context-length trains",
    ),
    "gpu": ScaleMatrix(
        common=preset("pathfinder/gpu"),
        points=(
            ("pathx-flash", ()),
            ("pathx-blocksparse", ("attention=blocksparse",)),
            ("pathx-sdpa", ("attention=sdpa",)),
        ),
        cost="one H100: ~6 minutes per run, 3 runs, after generating 20K Path-X images once",
        needs="a CUDA GPU; Path-X images are generated (16 cores: a few minutes)",
    ),
    "paper": ScaleMatrix(
        # Pre-train on Path-64, then fine-tune with the positions upsampled (paper, Sec. 4.2).
        common=(),
        points=(
            ("path64-pretrain", (*preset("pathx/flash"), "data=pathfinder64", "seq_len=4096")),
            ("pathx-flash", (*preset("pathx/flash"), f"model.init_from={_PATH64}")),
            ("pathx-blocksparse", (*preset("pathx/blocksparse"), f"model.init_from={_PATH64}")),
            (
                "pathx-sdpa",
                (*preset("pathx/flash"), "attention=sdpa", f"model.init_from={_PATH64}"),
            ),
            (
                "path256-blocksparse",
                (*preset("path256/blocksparse"), f"model.init_from={_PATH64}"),
            ),
        ),
        nproc=8,
        cost="8 x A100; the paper states no time. Our FLOP count at 40% MFU: Path-64 ~3, "
        "each Path-X run ~50, Path-256 (block-sparse) ~5 A100-hours",
        needs="8 GPUs; 200K generated images per resolution (hours of CPU for 128 and 256 px)",
    ),
}

# ---------------------------------------------------------------- speed-memory
# Attention and training-step time and peak memory vs sequence length: flash vs sdpa vs
# reference. Paper (A100-40GB, Tables 20-21): at 4K, PyTorch attention 50.4 ms / 17024 MB,
# FlashAttention 30.1 ms / 836 MB (20x less memory).


def step_points(lengths_by_attention: dict[str, tuple[int, ...]]):
    """Training-step runs: one per (attention, sequence length)."""
    return tuple(
        (f"step-{impl}-{t}", (f"attention={impl}", f"seq_len={t}"))
        for impl, lengths in lengths_by_attention.items()
        for t in lengths
    )


_GPU_STEPS = step_points(
    {
        "flash": (1024, 2048, 4096, 8192, 16384),
        "sdpa": (1024, 2048, 4096, 8192, 16384),
        "reference": (1024, 2048, 4096),  # the (T, T) matrices of 12 layers: OOM beyond 4K
    }
)
_SPEED_MEMORY_GPU = ScaleMatrix(
    common=preset("speed-memory/gpu"),
    points=_GPU_STEPS,
    bench=(("kernels", ("--head-dims", "64", "--causal", "true")),),
    cost="one H100: ~15 minutes",
    needs="a CUDA GPU",
)
SPEED_MEMORY = {
    "tiny": ScaleMatrix(
        common=preset("speed-memory/tiny"),
        points=step_points(
            {impl: (256, 512, 1024, 2048, 4096) for impl in ("flash", "sdpa", "reference")}
        ),
        bench=(("kernels", ("--seqlens", "256", "1024", "4096", "16384")),),
        cost="2-core CPU: ~5 minutes (15 short runs); the kernel benchmark needs CUDA and "
        "writes tile counts on a CPU",
        needs="nothing",
    ),
    "gpu": _SPEED_MEMORY_GPU,
    "paper": replace(
        _SPEED_MEMORY_GPU,
        bench=(("kernels", ()), ("blocksparse", ("--sweep", "blocksparse"))),
        cost="one GPU: the paper measured on one A100-40GB (Fig. 3); ~30 minutes on an H100",
    ),
}

# ---------------------------------------------------------------- bert
# Masked-LM loss and accuracy. Paper (Table 1): BERT-large from the MLPerf 1.1 initial
# checkpoint to 72.0% MLM accuracy in 17.4 minutes on 8 x A100 (Nvidia's MLPerf: 20.0).
BERT = {
    "tiny": ScaleMatrix(
        common=preset("bert/tiny"),
        points=(("mlm", ()),),
        cost="2-core CPU, one thread: 8 min 16 s to 8 min 53 s measured (0.25-0.28 s a step; "
        "tokenizing the library once, ~20 s, included)",
        needs="nothing: pysrc is this Python's standard library, byte-level (no vocabulary files)",
    ),
    "gpu": ScaleMatrix(
        common=preset("bert/gpu"),
        points=(("mlm", ()),),
        cost="one H100: ~20 minutes",
        needs="a CUDA GPU; WikiText-103 and bert-base-uncased's vocab.txt in the cache "
        "(the network once)",
    ),
    "paper": ScaleMatrix(
        common=(),
        points=(("large-512-mlperf", (*preset("bert/large-512"), "data.preset=mlperf")),),
        nproc=8,
        cost="8 x A100: 17.4 +- 1.4 minutes from the MLPerf 1.1 initial checkpoint to 72.0% "
        "MLM accuracy (paper Table 1); the preset's 1M steps from scratch take days",
        needs="8 GPUs, English Wikipedia tokenized once, the WordPiece vocab; MLPerf's start "
        "checkpoint (model.init_from) is not distributed with flashtrain",
    ),
}

MATRICES = {
    "context-length": CONTEXT_LENGTH,
    "pathfinder": PATHFINDER,
    "speed-memory": SPEED_MEMORY,
    "bert": BERT,
}

SUMMARIES = {
    "context-length": "LM quality vs context length at equal tokens per optimizer step",
    "pathfinder": "Pathfinder / Path-X / Path-256 accuracy: dense vs block-sparse vs SDPA",
    "speed-memory": "attention and training-step time and peak memory vs sequence length",
    "bert": "BERT masked-LM loss and accuracy (MLPerf settings at the paper scale)",
}
