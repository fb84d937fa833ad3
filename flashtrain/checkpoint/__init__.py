"""Weights on disk, in one place: where they come from and where they go.

    from flashtrain.checkpoint import load_model, initial_weights
    model, info = load_model("outputs/RUN")          # generate, evaluate, export, Python
    initial_weights(model, cfg.model.init_from, device=device)   # the trainer, after placing

    read.py            what a trainer checkpoint is; finding, checking and resuming one
    write.py           saving one (every rank its part; meta.json last, with the checksums)
    async_write.py     the same, written in the background (trainer.async_checkpoint)
    manifest.py        the checksums of a checkpoint's files, and checking them
    run_lock.py        one run at a time per checkpoint folder
    run_info.py        run.json: the commits, device and versions of a run
    sources.py         what a weights reference names (trainer checkpoint, torch file, hf:...),
                       read a row range at a time
    load_model.py      the one loader of a saved model, and CheckpointInfo
    initial_weights.py a run's initial weights: fresh, then model.init_from's, per shard
    export_hf.py       a trainer checkpoint -> a folder transformers' from_pretrained loads
    export_folder.py   where an export may go, its claim on it, what --overwrite replaces, the
                       swap into place

Below the trainer, generate/evaluate and export; above the models and flashtrain.hf (the
transformers weight mapping it reads hf: sources with).
"""

from flashtrain.checkpoint.initial_weights import initial_weights
from flashtrain.checkpoint.load_model import CheckpointInfo, load_model
from flashtrain.checkpoint.manifest import CheckpointError

__all__ = ["CheckpointError", "CheckpointInfo", "initial_weights", "load_model"]
