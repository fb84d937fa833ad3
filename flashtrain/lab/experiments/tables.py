"""The experiment matrices, one table per experiment: scale -> ScaleTable (see spec.py).

Scales: `tiny` runs on a 2-core CPU in minutes per run, `gpu` in ~20 minutes on one GPU,
`paper` is the FlashAttention paper's setting (8 GPUs, hours to days; printed, run only on
request). Every train run names trainer.max_steps (the driver's "finished" test reads it).
`{runs}` in an override is the folder of the experiment's runs (for model.init_from chains).
"""

from __future__ import annotations

from dataclasses import replace

from flashtrain.lab.experiments.spec import ScaleTable

# Shared by the CPU scale: no wandb, progress as lines.
TINY_RUN = ("logger=none", "trainer.progress=lines")


def model(name: str, **sizes) -> tuple[str, ...]:
    """A model config and its size overrides: model("gpt2", n_layer=8) -> model=gpt2 ..."""
    return (f"model={name}", *(f"model.{key}={value}" for key, value in sizes.items()))


def schedule(*, steps, eval_every, eval_batches, ckpt_every, lr, warmup, log_every=10):
    """The training length, evaluation and checkpoint cadence and learning rate of a run."""
    return (
        f"trainer.max_steps={steps}",
        f"trainer.log_interval={log_every}",
        f"trainer.eval_interval={eval_every}",
        f"trainer.eval_batches={eval_batches}",
        f"trainer.ckpt_interval={ckpt_every}",
        f"optim.lr={lr}",
        f"optim.warmup_steps={warmup}",
    )


def context_points(contexts, tokens_per_step: int, micro_tokens: int):
    """One point per context length with the same tokens per optimizer step at each (the
    micro-batch holds micro_tokens; gradient accumulation makes up the rest)."""
    return tuple(
        (
            f"ctx{t}",
            (
                f"seq_len={t}",
                "global_batch_size=null",  # the batch is set in tokens
                f"global_batch_tokens={tokens_per_step}",
                f"micro_batch_size={max(1, micro_tokens // t)}",
            ),
        )
        for t in contexts
    )


# ---------------------------------------------------------------- context-length
# LM quality vs context length at equal tokens per step: GPT-2 small on OpenWebText in the
# paper (Table 4: ppl 18.2 / 17.6 / 17.5 at 1K / 2K / 4K); byte-level pysrc (or the synthetic
# recall task) here.
CONTEXT_LENGTH = {
    "tiny": ScaleTable(
        # The default run's model (2 layers, width 128). Synthetic recall with 8 keys: the
        # optimum falls from 1.36 (16 tokens) to 0.26 (128), so longer contexts must win once
        # the model recalls. pysrc bytes: 0.5M training tokens per run, ~2% of the library.
        common=(*TINY_RUN, *model("gpt2-tiny", n_layer=2, n_head=4, d_model=128)),
        points=context_points((64, 128, 256, 512), tokens_per_step=2048, micro_tokens=2048),
        data={
            "pysrc": (
                "data=pysrc",
                *schedule(
                    steps=250, eval_every=100, eval_batches=16, ckpt_every=200, lr=3e-3, warmup=25
                ),
            ),
            "synthetic": (
                "data=synthetic",
                *schedule(
                    steps=600, eval_every=100, eval_batches=16, ckpt_every=200, lr=3e-3, warmup=20
                ),
            ),
        },
        default_data="pysrc",
        cost="2-core CPU: 1-2 minutes per run, 4 runs (pysrc: tokenizing the library once, ~1 "
        "minute)",
        needs="nothing: pysrc is this Python's standard library, synthetic is generated",
    ),
    "gpu": ScaleTable(
        common=(
            *model("gpt2", n_layer=8, n_head=8, d_model=512),
            *schedule(
                steps=1000, eval_every=100, eval_batches=20, ckpt_every=200, lr=1e-3, warmup=50
            ),
        ),
        points=context_points((512, 1024, 2048, 4096), tokens_per_step=65536, micro_tokens=16384),
        data={
            "pysrc": ("data=pysrc",),
            "synthetic": ("data=synthetic",),
            "openwebtext": ("data=openwebtext",),
        },
        default_data="pysrc",
        cost="one H100: ~3 minutes per run, 4 runs (65M tokens each)",
        needs="a CUDA GPU (openwebtext: its token cache, scripts/prepare_data.py openwebtext)",
    ),
    "paper": ScaleTable(
        common=("trainer.max_steps=400000",),
        points=(
            ("ctx1024", ("experiment=owt/gpt2s-1k",)),
            ("ctx2048", ("experiment=owt/gpt2s-2k",)),
            ("ctx4096", ("experiment=owt/gpt2s-4k",)),
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
    "tiny": ScaleTable(
        # The easiest LRA difficulty (contour length 6), so that a few hundred CPU steps of a
        # 2-layer model can move off chance.
        common=(
            *TINY_RUN,
            *model("pathx-classifier", n_layer=2, n_head=2, d_model=64, d_ff=128, dropout=0.0),
            "data=pathfinder32",
            "data.num_samples=4000",
            "data.contour_length=6",
            "seq_len=1024",
            "global_batch_size=32",
            "micro_batch_size=32",
            *schedule(steps=150, eval_every=50, eval_batches=8, ckpt_every=150, lr=2e-3, warmup=15),
        ),
        # The last point is a control: the same model on 64 training images must memorise them
        # (train accuracy ~100%), so a run at chance is the task's difficulty, not a broken pipeline.
        points=(*_ATTENTIONS, ("flash-memorise64", ("attention=flash", "data.num_samples=80"))),
        cost="2-core CPU: ~4 minutes per run (one thread), after generating 4000 images once",
        needs="nothing: the Pathfinder images are generated (data.num_workers processes)",
    ),
    "gpu": ScaleTable(
        common=(
            "data.num_samples=20000",
            "global_batch_size=64",
            "trainer.max_steps=600",
            "trainer.eval_interval=100",
            "trainer.eval_batches=20",
            "trainer.ckpt_interval=200",
            "optim.warmup_steps=60",
        ),
        points=(
            ("pathx-flash", ("experiment=pathx/flash",)),
            ("pathx-blocksparse", ("experiment=pathx/blocksparse",)),
            ("pathx-sdpa", ("experiment=pathx/flash", "attention=sdpa")),
        ),
        cost="one H100: ~6 minutes per run, 3 runs, after generating 20K Path-X images once",
        needs="a CUDA GPU; Path-X images are generated (16 cores: a few minutes)",
    ),
    "paper": ScaleTable(
        # Pre-train on Path-64, then fine-tune with the positions upsampled (paper, Sec. 4.2).
        common=("trainer.max_steps=50000",),
        points=(
            ("path64-pretrain", ("experiment=pathx/flash", "data=pathfinder64", "seq_len=4096")),
            ("pathx-flash", ("experiment=pathx/flash", f"model.init_from={_PATH64}")),
            ("pathx-blocksparse", ("experiment=pathx/blocksparse", f"model.init_from={_PATH64}")),
            (
                "pathx-sdpa",
                ("experiment=pathx/flash", "attention=sdpa", f"model.init_from={_PATH64}"),
            ),
            (
                "path256-blocksparse",
                ("experiment=path256/blocksparse", f"model.init_from={_PATH64}"),
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
_STEP_RUN = (
    "data=synthetic",
    "global_batch_size=1",
    "micro_batch_size=1",
    "trainer.eval_interval=0",
    "trainer.eval_at_end=false",
    "trainer.ckpt_interval=0",
    "trainer.ckpt_at_end=false",
    "optim.warmup_steps=1",
)


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
_SPEED_MEMORY_GPU = ScaleTable(
    common=(*_STEP_RUN, "model=gpt2", "trainer.max_steps=10", "trainer.log_interval=5"),
    points=_GPU_STEPS,
    bench=(("kernels", ("--head-dims", "64", "--causal", "true")),),
    cost="one H100: ~15 minutes",
    needs="a CUDA GPU",
)
SPEED_MEMORY = {
    "tiny": ScaleTable(
        common=(
            *TINY_RUN,
            *_STEP_RUN,
            "model=gpt2-tiny",
            "trainer.max_steps=4",
            "trainer.log_interval=2",
        ),
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
_BERT_COMMON = ("data=bert_mlm", "data.hub_name=Salesforce/wikitext")
BERT = {
    "tiny": ScaleTable(
        # Offline: byte-level masked LM on pysrc (this Python's standard library; [PAD] [CLS]
        # [SEP] [MASK] are ids 256..259). A pipeline check, not the paper's result: always
        # guessing the commonest byte (space) scores 26.5% of the evaluated masked bytes.
        common=(
            *TINY_RUN,
            "data=pysrc_mlm",
            *model("bert-base", n_layer=2, n_head=2, d_model=128, d_ff=512, pad_vocab_multiple=64),
            "seq_len=128",
            "global_batch_size=32",
            "micro_batch_size=32",
            *schedule(
                steps=1800, eval_every=200, eval_batches=16, ckpt_every=600, lr=2e-3, warmup=100
            ),
        ),
        points=(("mlm", ()),),
        cost="2-core CPU, one thread: 8 min 16 s to 8 min 53 s measured (0.25-0.28 s a step; "
        "tokenizing the library once, ~20 s, included)",
        needs="nothing: pysrc is this Python's standard library, byte-level (no vocabulary files)",
    ),
    "gpu": ScaleTable(
        common=(
            *_BERT_COMMON,
            "model=bert-base",
            "data.hub_config=wikitext-103-raw-v1",
            "seq_len=512",
            "global_batch_size=128",
            "micro_batch_size=32",
            *schedule(
                steps=3000, eval_every=250, eval_batches=20, ckpt_every=500, lr=5e-4, warmup=300
            ),
        ),
        points=(("mlm", ()),),
        cost="one H100: ~20 minutes",
        needs="a CUDA GPU; WikiText-103 and bert-base-uncased's vocab.txt in the cache "
        "(the network once)",
    ),
    "paper": ScaleTable(
        common=("trainer.max_steps=1000000",),
        points=(("large-512-mlperf", ("experiment=bert/large-512", "data.preset=mlperf")),),
        nproc=8,
        cost="8 x A100: 17.4 +- 1.4 minutes from the MLPerf 1.1 initial checkpoint to 72.0% "
        "MLM accuracy (paper Table 1); the preset's 1M steps from scratch take days",
        needs="8 GPUs, English Wikipedia tokenized once, the WordPiece vocab; MLPerf's start "
        "checkpoint (model.init_from) is not distributed with flashtrain",
    ),
}

TABLES = {
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
