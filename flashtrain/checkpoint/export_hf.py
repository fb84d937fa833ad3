"""A flashtrain checkpoint -> a folder transformers' from_pretrained loads with no custom code.

    export_checkpoint("outputs/2026-01-01/12-00-00", "my-model")     # scripts/export_hf.py

Writes config.json, model.safetensors (sharded with an index above max_shard_size),
generation_config.json for decoders, the run's tokenizer files when it used a Hugging Face
tokenizer, and a README.md (where it came from; byte-level runs: how ids are made). Everything is
written into a temporary folder beside OUT_DIR and renamed into place when complete, so OUT_DIR
is either absent, the previous export, or the whole new one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from flashtrain.checkpoint.load_model import load_model
from flashtrain.file_integrity import fsync_directory
from flashtrain.hf.convert import to_hf
from flashtrain.hf.registry import mapping_for
from flashtrain.hf.tokenizer_files import TokenizerInfo, write_tokenizer

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
) -> Path:
    """Export `checkpoint` (a step folder, or a checkpoints folder or run directory: its newest
    intact one) to `out_dir`. dtype: float32 | bfloat16 | float16 (default: as saved).
    tokenizer=False skips the tokenizer files (e.g. when the vocabulary files are not on this
    machine). Returns out_dir. Refuses an existing out_dir unless overwrite."""
    out = Path(out_dir).absolute()
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; allowed: {', '.join(DTYPES)}")
    model, info = load_model(checkpoint, attention="reference")
    mapping = mapping_for(model.config)  # refuses what has no transformers twin, before writing
    mapping.hf_config(model.config)
    if dtype is not None:
        model.to(DTYPES[dtype])

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        if tokenizer:
            try:
                run_config = (
                    {} if info.run_config is None
                    else OmegaConf.to_container(info.run_config, resolve=False)
                )  # fmt: skip
                tok = write_tokenizer(run_config, tmp, model.config.max_seq_len)
            except FileNotFoundError as e:
                raise FileNotFoundError(
                    f"{e}\n(the run's tokenizer files are needed to export them; pass "
                    "--no-tokenizer / tokenizer=False to export the model without them)"
                ) from e
        else:
            tok = TokenizerInfo(None, readme="Tokenizer files were not exported (--no-tokenizer).")
        hf_model = to_hf(model, extra_config=tok.token_ids)
        hf_model.save_pretrained(tmp, max_shard_size=max_shard_size)
        if model.config.arch in DECODERS:
            from transformers import GenerationConfig

            GenerationConfig(**tok.token_ids).save_pretrained(tmp)
        (tmp / "README.md").write_text(_readme(info, hf_model, tok, model.config))
        _finish_files(tmp)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _finish_files(folder: Path) -> None:
    """Durable, with the permissions of an ordinary folder (mkdtemp makes it private)."""
    umask = os.umask(0)
    os.umask(umask)
    for f in folder.iterdir():
        os.chmod(f, 0o666 & ~umask)
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    os.chmod(folder, 0o777 & ~umask)
    fsync_directory(folder)


def _swap_into_place(tmp: Path, out: Path) -> None:
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    fsync_directory(out.parent)


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

Exported by flashtrain (`scripts/export_hf.py`) from run `{run or "?"}`, checkpoint
`{info.path.name}` (step {info.step}, {info.meta.get("tokens_seen", "?")} tokens seen,
{info.meta.get("params", "?")} parameters), trained with flashtrain commit `{commit}`.

```python
from transformers import {auto}
model = {auto}.from_pretrained("this/folder")
```

Context length: {cfg.max_seq_len} positions. {tok.readme}

flashtrain model config: `{model_config}`
"""
