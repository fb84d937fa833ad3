"""A flashtrain checkpoint -> a folder transformers' from_pretrained loads with no custom code.

    export_checkpoint("outputs/2026-01-01/12-00-00", "my-model")     # scripts/export_hf.py

Writes config.json, model.safetensors (sharded with an index above max_shard_size),
generation_config.json for decoders, the run's tokenizer files when it used a Hugging Face
tokenizer (checked to be the files the weights were trained with), a README.md (where it came
from; byte-level runs: how ids are made) and flashtrain_export.json (what marks the folder as an
export). Everything is written into a temporary folder beside OUT_DIR and renamed into place
when complete, so OUT_DIR is either absent, the previous export, or the whole new one; the
export claims OUT_DIR while it writes, so two exports of one folder never both succeed.

Never losing data: an OUT_DIR that is, holds or lies inside the exported run is refused, and
overwrite replaces only a previous export (flashtrain/checkpoint/export_folder.py).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from omegaconf import OmegaConf

from flashtrain.checkpoint.export_folder import (
    EXPORT_MARKER,
    README_MARK,
    claim_out_dir,
    export_marker,
    finish_files,
    refuse_out_dir_in_the_run,
    refuse_what_overwrite_would_lose,
    refused_writes_named,
    swap_into_place,
    temporary_folder_beside,
)
from flashtrain.checkpoint.load_model import load_model
from flashtrain.checkpoint.manifest import CheckpointError
from flashtrain.checkpoint.read import check_tokenizer, resolve_checkpoint
from flashtrain.hf.convert import to_hf
from flashtrain.hf.registry import mapping_for
from flashtrain.hf.tokenizer_files import TokenizerInfo, load_run_tokenizer, write_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DECODERS = ("gpt2", "llama")


def export_checkpoint(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    max_shard_size: str | int = "5GB",
    dtype: str | None = None,
    tokenizer: bool = True,
    overwrite: bool = False,
    on_note=None,
) -> Path:
    """Export `checkpoint` (a step folder, or a checkpoints folder or run directory: its newest
    intact one) to `out_dir`. dtype: float32 | bfloat16 | float16 (default: as saved).
    tokenizer=False skips the tokenizer files (e.g. when the vocabulary files are not on this
    machine). on_note(line): told of each damaged newer checkpoint passed over (default: a
    warning in the log). Returns out_dir. Refuses (ValueError) an out_dir that is, holds or
    lies in the exported run; (FileExistsError) an existing one unless overwrite, and then
    unless it is a previous export or empty, a symbolic link, one another export is writing or
    that appeared while this one ran; (OutDirNotWritable) one the file system refuses to write
    (permissions, read-only, full), after removing the partial export."""
    out = Path(out_dir).absolute()
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; allowed: {', '.join(DTYPES)}")
    step_dir = resolve_checkpoint(checkpoint, on_skip=on_note)
    refuse_out_dir_in_the_run(out, checkpoint, step_dir)
    refuse_what_overwrite_would_lose(out, overwrite)  # before the model loads: refused at once
    model, info = load_model(step_dir, attention="reference")
    mapping = mapping_for(model.config)  # refuses what has no transformers twin, before writing
    mapping.hf_config(model.config)
    if dtype is not None:
        model.to(DTYPES[dtype])
    run_config = (
        {} if info.run_config is None else OmegaConf.to_container(info.run_config, resolve=False)
    )
    trained_tokenizer = _trained_tokenizer(run_config, info) if tokenizer else None

    with refused_writes_named(out), claim_out_dir(out):
        # again, holding OUT_DIR: another export may have finished while the model loaded
        refuse_what_overwrite_would_lose(out, overwrite, meanwhile=True)
        tmp = temporary_folder_beside(out)
        try:
            _write_export(
                tmp, model, info, run_config, tokenizer, trained_tokenizer, max_shard_size
            )
            finish_files(tmp)
            swap_into_place(tmp, out, overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


def _write_export(
    folder: Path, model, info, run_config: dict, tokenizer: bool, trained_tokenizer, max_shard_size
) -> None:
    if tokenizer:
        tok = write_tokenizer(run_config, folder, model.config.max_seq_len, trained_tokenizer)
    else:
        tok = TokenizerInfo(None, readme="Tokenizer files were not exported (--no-tokenizer).")
    hf_model = to_hf(model, extra_config=tok.token_ids)
    hf_model.save_pretrained(folder, max_shard_size=max_shard_size)
    if model.config.arch in DECODERS:
        from transformers import GenerationConfig

        GenerationConfig(**tok.token_ids).save_pretrained(folder)
    (folder / "README.md").write_text(_readme(info, hf_model, tok, model.config))
    (folder / EXPORT_MARKER).write_text(json.dumps(export_marker(info), indent=2) + "\n")


def _trained_tokenizer(run_config: dict, info):
    """(kind, tokenizer) of the run's data config, refused when its files are not the ones the
    checkpoint's weights were trained with."""
    try:
        kind, tok = load_run_tokenizer(run_config)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{e}\n(the run's tokenizer files are needed to export them; pass "
            "--no-tokenizer / tokenizer=False to export the model without them)"
        ) from e
    if tok is not None:
        data_ids = (run_config.get("data") or {}).get("vocab_size")
        try:
            check_tokenizer(
                tok, info.meta, info.path, data_ids if isinstance(data_ids, int) else None
            )
        except CheckpointError as e:
            raise CheckpointError(f"{e}; or pass --no-tokenizer to export without them") from e
    return kind, tok


def _readme(info, hf_model, tok: TokenizerInfo, cfg) -> str:
    cls = type(hf_model).__name__
    auto = "AutoModelForCausalLM" if cfg.arch in DECODERS else (
        "AutoModelForMaskedLM" if cls == "BertForMaskedLM" else "AutoModelForSequenceClassification"
    )  # fmt: skip
    run = info.meta.get("run_name", "")
    # where it came from, by name (no path of this machine): the run, its checkpoint, its code
    commits = info.run_info.get("commits") or [info.run_info.get("commit")]
    commit = ", ".join(dict.fromkeys(c for c in commits if c)) or "unknown"
    # init_from may name a local file; the weights here replace it anyway
    model_config = {
        k: v for k, v in (info.meta.get("model_config") or {}).items() if k != "init_from"
    }
    return f"""# {run or "flashtrain model"} ({cls})

{README_MARK} (`scripts/export_hf.py`) from run `{run or "?"}`, checkpoint
`{info.path.name}` (step {info.step}, {info.meta.get("tokens_seen", "?")} tokens seen,
{info.meta.get("params", "?")} parameters), trained with flashtrain commit `{commit}`.

```python
from transformers import {auto}
model = {auto}.from_pretrained("this/folder")
```

Context length: {cfg.max_seq_len} positions. {tok.readme}

flashtrain model config: `{model_config}`
"""
