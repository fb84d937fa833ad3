"""A trainer checkpoint loaded for inference: the model in eval mode, the run's tokenizer, and
the facts a report names (run, step, commit).

CKPT may be a checkpoint (step_NNNNNN/), a checkpoints folder (its newest), or a run directory
(its checkpoints/ folder's newest); every file is checked against its checksum first
(flashtrain.train.checkpoint.resolve_checkpoint). Only the model's weights are read, by
checkpoint.read_model_state: both of the trainer's formats load (torch, and dcp from FSDP2 runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from flashtrain.data.config import CorpusConfig, SyntheticConfig, cache_root
from flashtrain.data.registry import data_config
from flashtrain.data.tokenization import build_tokenizer
from flashtrain.models import build_model
from flashtrain.train.checkpoint import CONFIG, read_meta, read_model_state, resolve_checkpoint
from flashtrain.train.run_info import read_run_info


class IntegerTokenizer:
    """Token ids written as decimal integers ("3 11 5"): the synthetic tasks' text form."""

    name = "integers"
    eos_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        try:
            ids = [int(word) for word in text.split()]
        except ValueError:
            raise ValueError(
                f"this run's data is synthetic: a prompt is token ids separated by spaces "
                f"(0..{self.vocab_size - 1}), got {text!r}"
            ) from None
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad} are outside 0..{self.vocab_size - 1}")
        return ids

    def decode(self, ids) -> str:
        return "".join(f" {i}" for i in ids)

    @property
    def special_ids(self) -> list[int]:
        return []


class TextTokenizer:
    """A corpus tokenizer (flashtrain.data.tokenization) with encode/decode of one text."""

    def __init__(self, tokenizer):
        self.inner = tokenizer
        self.name, self.vocab_size, self.eos_id = (
            tokenizer.name,
            tokenizer.vocab_size,
            tokenizer.eos_id,
        )

    def encode(self, text: str) -> list[int]:
        return self.inner.encode_batch([text])[0]

    def decode(self, ids) -> str:
        return self.inner.decode(list(ids))

    @property
    def special_ids(self) -> list[int]:
        """Ids that stand for no text (<eos>, <pad>, ...)."""
        return self.inner.special_ids


def run_tokenizer(data_cfg: Any):
    """The tokenizer of a run's data config: integers for synthetic data, the corpus's own
    (bytes, GPT-2 BPE, WordPiece) otherwise."""
    cfg = data_config(data_cfg)
    if isinstance(cfg, SyntheticConfig):
        return IntegerTokenizer(cfg.vocab_size)
    if isinstance(cfg, CorpusConfig):
        return TextTokenizer(build_tokenizer(cfg, cache_root(cfg)))
    raise ValueError(f"data loader {cfg.loader!r} has no text tokenizer to generate with")


@dataclass
class LoadedCheckpoint:
    model: torch.nn.Module  # eval mode, on the requested device
    config: Any  # the run's resolved config (an OmegaConf DictConfig)
    path: Path  # the checkpoint directory
    step: int
    run_name: str
    commit: str  # the code the run trained with ("unknown" when not recorded)

    @property
    def tokenizer(self):
        return run_tokenizer(self.config.data)

    def facts(self) -> dict:
        """What a report names about the checkpoint."""
        return dict(
            checkpoint=str(self.path), run=self.run_name, step=self.step, commit=self.commit
        )


def load_for_inference(
    path: str | Path, device: str | torch.device = "cpu", *, max_seq_len: int | None = None,
    position_mode: str = "interpolate",
) -> LoadedCheckpoint:  # fmt: skip
    """Build the run's model and load the checkpoint's weights into it.

    max_seq_len: build the model for this many positions instead of the trained length (GPT-2's
    learned table resized by `position_mode`: interpolate or copy; rotary models need nothing).
    """
    ckpt_dir = resolve_checkpoint(path)
    meta = read_meta(ckpt_dir)
    config_file = ckpt_dir / CONFIG
    if not config_file.is_file():
        raise ValueError(f"checkpoint {ckpt_dir} has no {CONFIG}: its run's config is unknown")
    config = OmegaConf.load(config_file)
    model_cfg = OmegaConf.to_container(config.model, resolve=True)
    model_cfg["init_from"] = None  # the checkpoint's weights replace any initial ones
    if max_seq_len is not None:
        model_cfg["max_seq_len"] = max_seq_len
    with torch.device("meta"):
        model = build_model(model_cfg, OmegaConf.to_container(config.attention, resolve=True))
    state, _ = read_model_state(ckpt_dir)
    # the model takes the tensors read (no second copy); learned positions resized if longer
    model.load_state_dict_extended(state, mode=position_mode, assign=True)
    del state
    model.to(device).eval()
    run_dir = ckpt_dir.parent.parent
    commit = read_run_info(run_dir).get("commit") or meta.get("commit") or "unknown"
    return LoadedCheckpoint(
        model=model,
        config=config,
        path=ckpt_dir,
        step=int(meta["step"]),
        run_name=str(meta.get("run_name") or run_dir.name),
        commit=str(commit),
    )
