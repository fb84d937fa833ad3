"""The weight mapping between a flashtrain model and its transformers twin, as rules.

Each architecture (gpt2.py, bert.py) lists, for a model config, one Rule per flashtrain
state-dict key: the transformers key(s) it corresponds to and how the tensor changes on the way.
The same rules drive both directions, so export and import cannot drift apart:

    copy        the same tensor
    transpose   GPT-2's Conv1D stores (in, out); nn.Linear stores (out, in)
    vocab_rows  embedding rows: flashtrain pads the vocabulary to a multiple (pad_vocab_multiple);
                transformers holds exactly vocab_size rows (padding dropped; zeros on import)
    split_rows  one fused (3C, ...) q/k/v tensor <-> separate query / key / value tensors

Tied transformers keys (GPT-2's lm_head, BERT's decoder) appear in the exported state dict as the
same tensor as their target, and on import must equal it (an untied head has no flashtrain twin).

This module needs neither transformers nor safetensors: configs are plain dicts (config.json).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashtrain.models.config import TransformerConfig

KINDS = ("copy", "transpose", "vocab_rows", "split_rows")


@dataclass(frozen=True)
class Rule:
    ours: str  # flashtrain state-dict key
    theirs: tuple[str, ...]  # transformers key(s); several only for split_rows
    kind: str = "copy"


def rules_for_layers(n_layer: int, layer_rules) -> list[Rule]:
    """Per-layer rules: layer_rules(i) -> [Rule, ...] for every block i."""
    return [rule for i in range(n_layer) for rule in layer_rules(i)]


def to_theirs(rule: Rule, tensor: torch.Tensor, vocab_size: int) -> list[torch.Tensor]:
    if rule.kind == "copy":
        return [tensor]
    if rule.kind == "transpose":
        return [tensor.t().contiguous()]
    if rule.kind == "vocab_rows":
        return [tensor[:vocab_size].contiguous()]
    if rule.kind == "split_rows":
        return [t.contiguous() for t in tensor.chunk(len(rule.theirs), dim=0)]
    raise ValueError(f"unknown rule kind {rule.kind!r}; allowed: {', '.join(KINDS)}")


def rows_to_ours(
    rule: Rule, tensors: list, start: int, stop: int, padded_vocab: int
) -> torch.Tensor:
    """Rows start..stop of the flashtrain tensor `rule` makes of `tensors` (transformers
    tensors, or lazy views of them that read only what is indexed: hf/source.py), reading only
    the parts of them those rows come from (an FSDP2 shard is a range of rows)."""
    if rule.kind == "copy":
        return tensors[0][start:stop]
    if rule.kind == "transpose":  # our rows are their columns
        return tensors[0][:, start:stop].t()
    if rule.kind == "vocab_rows":
        t = tensors[0]
        real = t[start : min(stop, t.shape[0])] if start < t.shape[0] else t[0:0]
        pad = (stop - start) - real.shape[0]
        return torch.cat([real, real.new_zeros(pad, *real.shape[1:])]) if pad > 0 else real
    if rule.kind == "split_rows":
        parts, offset = [], 0
        for t in tensors:
            lo, hi = max(start, offset), min(stop, offset + t.shape[0])
            if lo < hi:
                parts.append(t[lo - offset : hi - offset])
            offset += t.shape[0]
        if not parts:  # a rank holding none of its rows (more ranks than rows)
            return tensors[0][0:0]
        return torch.cat(parts) if len(parts) > 1 else parts[0]
    raise ValueError(f"unknown rule kind {rule.kind!r}; allowed: {', '.join(KINDS)}")


def rows_of_ours(rule: Rule, shapes: list[tuple[int, ...]], padded_vocab: int) -> int:
    """How many rows the flashtrain tensor of `rule` has, from its sources' shapes."""
    if rule.kind == "transpose":
        return shapes[0][1]
    if rule.kind == "vocab_rows":
        return max(padded_vocab, shapes[0][0])
    if rule.kind == "split_rows":
        return sum(s[0] for s in shapes)
    return shapes[0][0]


@dataclass(frozen=True)
class ImportPlan:
    """A transformers checkpoint read into one architecture: per flashtrain key, its rule and
    the checkpoint's keys (as stored); tensors are made one at a time, whole or a row range."""

    arch: str
    rules: dict[str, tuple[Rule, tuple[str, ...]]]
    tied: tuple[tuple[str, str], ...]  # (stored key, stored key it must equal)
    padded_vocab: int
    source: str = ""

    def rows(self, ours: str, tensors, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows start..stop (all: stop None) of flashtrain tensor `ours`; tensors: stored key
        -> tensor or lazy view."""
        rule, keys = self.rules[ours]
        sources = [tensors[k] for k in keys]
        total = rows_of_ours(rule, [tuple(t.shape) for t in sources], self.padded_vocab)
        return rows_to_ours(
            rule, sources, start, total if stop is None else stop, self.padded_vocab
        )

    def check_tied(self, tensors, start: int, stop: int | None) -> None:
        """A tied key (an output head) must equal its target: in rows start..stop, so the ranks
        reading their own row ranges check the whole of it between them."""
        where = f" in {self.source}" if self.source else ""
        for key, target in self.tied:
            if not torch.equal(tensors[key][start:stop], tensors[target][start:stop]):
                raise ValueError(
                    f"{key} differs from {target}{where}: an untied output head, which "
                    f"flashtrain's {self.arch} (head tied to the embedding) cannot hold"
                )


class HFRows:
    """RowSource over a transformers checkpoint through its ImportPlan (hf/mapping.py)."""

    def __init__(self, description: str, plan, tensors: dict):
        self.description, self.plan, self.tensors = description, plan, tensors

    def shapes(self) -> dict[str, tuple[int, ...]]:
        out = {}
        for ours, (rule, keys) in self.plan.rules.items():
            shapes = [tuple(self.tensors[k].shape) for k in keys]
            rest = shapes[0][1:] if rule.kind != "transpose" else (shapes[0][0],)
            out[ours] = (rows_of_ours(rule, shapes, self.plan.padded_vocab), *rest)
        return out

    def rows(self, name: str, start: int, stop: int, placed=None) -> torch.Tensor:
        return self.plan.rows(name, self.tensors, start, stop)

    def check_rows(self, held) -> None:
        for ours, (_, keys) in self.plan.rules.items():
            if any(target in keys for _, target in self.plan.tied) and ours in held:
                self.plan.check_tied(self.tensors, *held[ours])
                return
        self.plan.check_tied(self.tensors, 0, None)


class ArchMapping:
    """One architecture's bridge. Subclasses set arch / model_type and implement the methods."""

    arch: str = ""  # flashtrain model.arch
    model_type: str = ""  # transformers config.json model_type (of an export)

    @property
    def model_types(self) -> tuple[str, ...]:
        """The config.json model_types this mapping imports."""
        return (self.model_type,)

    # ---- configs

    def hf_class(self, cfg: TransformerConfig) -> str:
        """The transformers class name the exported folder loads as."""
        raise NotImplementedError

    def hf_config(self, cfg: TransformerConfig) -> dict:
        """A transformers config.json dict (model_type, architectures, fields) for `cfg`;
        raises ValueError naming what transformers has no equivalent for."""
        raise NotImplementedError

    def config_from_hf(self, hf: dict) -> dict:
        """flashtrain model-config fields from a transformers config dict; raises ValueError
        naming a config.json field whose value flashtrain does not implement."""
        raise NotImplementedError

    # (flashtrain field, config.json field): the fields that must agree to load the weights
    # into an already configured model (model.init_from=hf:...). Positions may differ (resized).
    architecture_fields: tuple[tuple[str, str], ...] = ()

    # ---- weights

    def rules(self, cfg: TransformerConfig) -> list[Rule]:
        raise NotImplementedError

    def tied(self, cfg: TransformerConfig) -> dict[str, str]:
        """transformers key -> the transformers key it is tied to."""
        return {}

    def normalize_keys(self, state: dict, cfg: TransformerConfig) -> dict:
        """transformers checkpoints as found on the hub (old prefixes, buffers) -> the keys of
        the class hf_class(cfg). Default: unchanged."""
        return state

    def optional(self, cfg: TransformerConfig) -> tuple[str, ...]:
        """flashtrain key prefixes a checkpoint may lack (a head the checkpoint was not trained
        with, e.g. a classifier on a masked-LM checkpoint): those keep their fresh init."""
        return ()

    def ignored(self, cfg: TransformerConfig) -> tuple[str, ...]:
        """transformers key prefixes with no flashtrain twin that may be dropped on import
        (another head: BERT's next-sentence classifier, a pooler an MLM model does not use)."""
        return ()

    # ---- the two directions

    def state_to_hf(self, state: dict, cfg: TransformerConfig) -> dict:
        """flashtrain state dict -> transformers state dict (tied keys share their tensor)."""
        out: dict[str, torch.Tensor] = {}
        for rule in self.rules(cfg):
            if rule.ours not in state:
                raise KeyError(f"the model's state has no {rule.ours} (config {cfg})")
            tensors = to_theirs(rule, state[rule.ours], cfg.vocab_size)
            out.update(zip(rule.theirs, tensors, strict=True))
        for key, target in self.tied(cfg).items():
            out[key] = out[target]
        return out

    def import_plan(self, keys, cfg: TransformerConfig, source: str = "") -> ImportPlan:
        """Which of a transformers checkpoint's `keys` make each flashtrain tensor, checked
        before any tensor is read: keys the rules do not cover are refused (unless ignored()),
        and so are missing ones (unless optional(): they are left out of the plan)."""
        # normalized key -> the key as stored (normalize_keys renames, never touches values)
        stored = self.normalize_keys({k: k for k in keys}, cfg)
        where = f" in {source}" if source else ""
        used: set[str] = set()
        rules: dict[str, tuple[Rule, tuple[str, ...]]] = {}
        optional = self.optional(cfg)
        for rule in self.rules(cfg):
            missing = [k for k in rule.theirs if k not in stored]
            if missing:
                if rule.ours.startswith(optional) and optional:
                    continue
                raise KeyError(
                    f"transformers weight {missing[0]} (flashtrain {rule.ours}) is missing{where}"
                )
            used.update(rule.theirs)
            rules[rule.ours] = (rule, tuple(stored[k] for k in rule.theirs))
        tied = []
        for key, target in self.tied(cfg).items():
            if key in stored and target in stored:
                tied.append((stored[key], stored[target]))
            used.add(key)
        ignored = self.ignored(cfg)
        extra = sorted(
            k for k in stored if k not in used and not (ignored and k.startswith(ignored))
        )
        if extra:
            raise ValueError(
                f"transformers weights with no flashtrain {self.arch} twin{where}: "
                f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}"
            )
        return ImportPlan(self.arch, rules, tuple(tied), cfg.padded_vocab_size, source)

    def state_from_hf(self, hf_state: dict, cfg: TransformerConfig, source: str = "") -> dict:
        """transformers state dict -> flashtrain state dict (import_plan's checks, then every
        tensor whole)."""
        plan = self.import_plan(hf_state.keys(), cfg, source)
        plan.check_tied(hf_state, 0, None)
        return {ours: plan.rows(ours, hf_state) for ours in plan.rules}

    def check_architecture(self, hf: dict, cfg: TransformerConfig, source: str) -> None:
        """Refuse, naming the field, a transformers config whose architecture differs from the
        configured model's (weights of other shapes or another function)."""
        theirs = self.config_from_hf(hf)
        for ours_key, hf_key in self.architecture_fields:
            want, got = getattr(cfg, ours_key), theirs.get(ours_key)
            if want != got:
                raise ValueError(
                    f"model.{ours_key}={want!r} but the Hugging Face checkpoint {source} has "
                    f"{hf_key}={hf.get(hf_key)!r} (model.{ours_key}={got!r}); set "
                    f"model.{ours_key}={got!r} to start from it"
                )


def _gelu_name(activation: str) -> str:
    return {"gelu": "gelu", "gelu_tanh": "gelu_new"}[activation]


GELU_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def activation_from_hf(name: str | None, field: str, model_type: str) -> str:
    if name not in GELU_FROM_HF:
        raise ValueError(
            f"{model_type} config {field}={name!r} is not implemented in flashtrain; "
            f"allowed: {', '.join(GELU_FROM_HF)}"
        )
    return GELU_FROM_HF[name]


def activation_to_hf(activation: str) -> str:
    return _gelu_name(activation)
