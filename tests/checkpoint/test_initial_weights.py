"""The pieces of a run's initial weights, in one process, on small shapes:

- flashtrain.models.materialize: a model built on the meta device and materialised on CPU holds
  bit for bit the weights of the same model built on CPU from the same seed, for every
  architecture, and the default generator continues as it would have (the trainer's data order
  and dropout draw from it next);
- hf/mapping.py's row reads (rows_to_ours / ImportPlan.rows), which let an FSDP2 rank read only
  its shard's rows of a transformers checkpoint: any row range of every rule kind (copy,
  transpose, vocab_rows with padding rows, split_rows of BERT's q/k/v) equals the same rows of
  the whole converted tensor, read from tensors or lazily from a safetensors file alike; a tied
  head that differs from its embedding is refused over exactly the rows where it differs;
- initial_weights / fill_from: sources that do not fit are refused naming model.init_from and
  the tensor; positional tables of another length resize exactly as load_state_dict_extended
  does (a transformers table longer than the model's gives its first rows instead); a model
  built with weights keeps those the source lacks; a meta model needs a device;
- load_model of a trainer checkpoint (both formats): the saved weights, in eval mode, in float32,
  a longer context's learned table tiled, and no fresh initialisation wasted on a model the
  checkpoint fills completely.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from omegaconf import OmegaConf

from flashtrain.checkpoint import initial_weights, load_model
from flashtrain.checkpoint.read import MODEL_OPTIM
from flashtrain.checkpoint.write import save_checkpoint
from flashtrain.hf.mapping import rows_to_ours
from flashtrain.hf.registry import mapping_for
from flashtrain.hf.source import SafetensorsView, open_weights
from flashtrain.models import GPT2, build_model, model_config
from flashtrain.models.materialize import materialize

GPT2_CFG = dict(arch="gpt2", n_layer=2, n_head=2, d_model=16, vocab_size=37, max_seq_len=12)
BERT_CFG = dict(arch="bert", n_layer=2, n_head=2, d_model=16, d_ff=24, vocab_size=37,
                max_seq_len=12)  # fmt: skip
LLAMA_CFG = dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=48,
                 vocab_size=37, max_seq_len=16)  # fmt: skip
# configs/model/pathx-classifier.yaml's architecture (2-D row/column tables, mean pooling), small
PATHX_CFG = dict(arch="classifier", n_layer=1, n_head=2, d_model=16, d_ff=32, vocab_size=256,
                 max_seq_len=64, num_classes=2)  # fmt: skip

ARCHS = {
    "gpt2": {**GPT2_CFG, "pad_vocab_multiple": 8},
    "gpt2-rotary": {**GPT2_CFG, "position": "rotary"},
    "bert-mlm": {**BERT_CFG, "pad_vocab_multiple": 8},
    "bert-classification": {**BERT_CFG, "head": "classification", "num_classes": 3},
    "llama-gqa-untied": {**LLAMA_CFG, "tie_embeddings": False, "pad_vocab_multiple": 8},
    "llama-gqa-tied": {**LLAMA_CFG, "tie_embeddings": True},
    "classifier-pathx": PATHX_CFG,
    "classifier-1d-cls": {**PATHX_CFG, "position": "1d", "pooling": "cls", "norm": "post"},
}


def _meta(cfg) -> torch.nn.Module:
    with torch.device("meta"):
        return build_model(cfg, "reference")


def _randomised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight off its init (a fresh model cannot pass for it)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _random_state(cfg, seed: int) -> dict[str, torch.Tensor]:
    return {
        k: v.clone()
        for k, v in _randomised(build_model(cfg, "reference"), seed).state_dict().items()
    }


def _assert_same_tensors(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        assert torch.equal(got[name], value), name


# ---- materialize


@pytest.mark.parametrize("name", ARCHS)
def test_materialize_equals_a_cpu_build_and_the_generator_continues_alike(name):
    cfg, seed = ARCHS[name], 1000 + list(ARCHS).index(name)
    torch.manual_seed(seed)
    want = build_model(cfg, "reference")
    want_next = torch.rand(16)

    torch.manual_seed(seed)
    model = _meta(cfg)
    assert all(p.is_meta for p in model.parameters())
    materialize(model, "cpu")
    got_next = torch.rand(16)

    _assert_same_tensors(dict(model.named_parameters()), dict(want.named_parameters()))
    assert torch.equal(got_next, want_next)
    assert all(p.device.type == "cpu" and p.requires_grad for p in model.parameters())
    # named_parameters lists a tensor once: a tied head added as a tensor of its own shows
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in want.named_parameters()]


def test_a_meta_build_draws_nothing_from_the_generator():
    torch.manual_seed(7)
    want = torch.rand(8)
    torch.manual_seed(7)
    for cfg in ARCHS.values():
        _meta(cfg)
    assert torch.equal(torch.rand(8), want)


# ---- transformers rows, a range at a time


def _hf_tensors(cfg_dict: dict, seed: int):
    """(cfg, mapping, flashtrain state with zero padding rows, transformers state: tied keys
    as copies of their targets)."""
    cfg = model_config(cfg_dict)
    state = _random_state(cfg_dict, seed)
    for value in state.values():
        if value.shape and value.shape[0] == cfg.padded_vocab_size > cfg.vocab_size:
            value[cfg.vocab_size :] = 0  # padding rows: transformers has none, import gives zeros
    mapping = mapping_for(cfg)
    hf = {k: v.clone() for k, v in mapping.state_to_hf(state, cfg).items()}
    return cfg, mapping, state, hf


def _save_safetensors(hf: dict, folder) -> dict:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in hf.items()}, str(folder / "model.safetensors"))
    views = open_weights(folder)
    assert all(isinstance(v, SafetensorsView) for v in views.values())
    return views


def _boundaries(rule, cfg, keys_shapes) -> list[int]:
    if rule.kind == "vocab_rows":
        return [cfg.vocab_size]
    if rule.kind == "split_rows":
        edges, offset = [], 0
        for shape in keys_shapes[:-1]:
            offset += shape[0]
            edges.append(offset)
        return edges
    return []


def _ranges(total: int, edges: list[int], g: torch.Generator, *, empty: bool) -> list[tuple]:
    out = [(0, total)]
    for b in edges:  # across each boundary, up to it, from it
        out += [(max(b - 1, 0), min(b + 1, total)), (max(b - 3, 0), b), (b, min(b + 2, total))]
    for _ in range(6):
        a, b = sorted(torch.randint(0, total + 1, (2,), generator=g).tolist())
        out.append((a, b))
    if empty:
        out += [(0, 0), (total, total), *((b, b) for b in edges)]
    else:
        out = [(a, b) for a, b in out if a < b]
    return out


# (architecture, the rule kinds its tensors use): every kind, each with padding where it can
MAPPED = {
    "gpt2": ({**GPT2_CFG, "pad_vocab_multiple": 8}, {"copy", "transpose", "vocab_rows"}),
    "bert-mlm": ({**BERT_CFG, "pad_vocab_multiple": 8}, {"copy", "split_rows", "vocab_rows"}),
    "llama": ({**LLAMA_CFG, "pad_vocab_multiple": 8}, {"copy", "vocab_rows"}),
}


@pytest.mark.parametrize("arch", MAPPED)
def test_any_row_range_equals_those_rows_of_the_whole_tensor(arch, tmp_path):
    cfg_dict, kinds = MAPPED[arch]
    cfg, mapping, state, hf = _hf_tensors(cfg_dict, seed=len(arch))
    plan = mapping.import_plan(hf.keys(), cfg)
    assert {rule.kind for rule, _ in plan.rules.values()} == kinds
    assert cfg.padded_vocab_size > cfg.vocab_size  # the padding rows are exercised
    have_views = True
    try:
        views = _save_safetensors(hf, tmp_path / arch)
    except ImportError:
        have_views = False
    g = torch.Generator().manual_seed(3)
    for ours, (rule, keys) in plan.rules.items():
        whole = plan.rows(ours, hf)
        assert torch.equal(whole, state[ours]), ours  # the round trip, padding rows zero
        total = whole.shape[0]
        edges = _boundaries(rule, cfg, [tuple(hf[k].shape) for k in keys])
        # empty ranges of split_rows: test_an_empty_range_of_a_split_tensor below
        for a, b in _ranges(total, edges, g, empty=rule.kind != "split_rows"):
            got = plan.rows(ours, hf, a, b)
            assert torch.equal(got, whole[a:b]), (ours, rule.kind, a, b)
            assert torch.equal(rows_to_ours(rule, [hf[k] for k in keys], a, b,
                                            plan.padded_vocab), whole[a:b])  # fmt: skip
            if have_views:
                lazy = plan.rows(ours, views, a, b)
                assert lazy.dtype == got.dtype and torch.equal(lazy, got), (ours, a, b, "views")


def test_an_empty_range_of_a_split_tensor():
    """An FSDP2 rank may hold none of a small fused q/k/v tensor's rows (more ranks than rows)."""
    cfg, mapping, state, hf = _hf_tensors({**BERT_CFG}, seed=5)
    plan = mapping.import_plan(hf.keys(), cfg)
    ours = "blocks.0.attn.c_attn.weight"
    whole = plan.rows(ours, hf)
    for a in (0, cfg.d_model, whole.shape[0]):
        assert torch.equal(plan.rows(ours, hf, a, a), whole[a:a])


def _untied_rows(hf: dict, key: str, rows: tuple[int, int]) -> dict:
    hf = dict(hf)
    head = hf[key].clone()
    head[rows[0] : rows[1]] += 1.0
    hf[key] = head
    return hf


@pytest.mark.parametrize("arch", ["gpt2", "bert-mlm"])
def test_a_tied_head_that_differs_is_refused_over_exactly_those_rows(arch, tmp_path):
    cfg_dict, _ = MAPPED[arch]
    cfg, mapping, _, hf = _hf_tensors(cfg_dict, seed=11)
    head = {"gpt2": "lm_head.weight", "bert-mlm": "cls.predictions.decoder.weight"}[arch]
    bad = (9, 14)
    hf = _untied_rows(hf, head, bad)
    plan = mapping.import_plan(hf.keys(), cfg)
    assert head in dict(plan.tied)
    sources = {"tensors": hf}
    try:
        sources["views"] = _save_safetensors(hf, tmp_path / arch)
    except ImportError:
        pass
    else:  # the same folder as model.init_from: refused while the weights are filled in
        (tmp_path / arch / "config.json").write_text(json.dumps(mapping.hf_config(cfg)))
        with pytest.raises(ValueError, match=rf"{head} differs from .* in hf:{tmp_path / arch}"):
            initial_weights(_meta(cfg_dict), f"hf:{tmp_path / arch}", device="cpu")
    g = torch.Generator().manual_seed(4)
    total = cfg.padded_vocab_size
    ranges = [(0, total), (0, bad[0]), (bad[1], total), (bad[0] - 1, bad[0] + 1),
              (bad[1] - 1, bad[1] + 1), (bad[0], bad[1]), (bad[1], bad[1]), (10, 11)]  # fmt: skip
    ranges += [tuple(sorted(torch.randint(0, total + 1, (2,), generator=g).tolist()))
               for _ in range(8)]  # fmt: skip
    for tensors in sources.values():
        with pytest.raises(ValueError, match=rf"{head} differs from "):
            plan.check_tied(tensors, 0, None)
        for a, b in ranges:
            overlaps = max(a, bad[0]) < min(b, bad[1])
            if overlaps:
                with pytest.raises(ValueError, match=rf"{head} differs from .*untied output"):
                    plan.check_tied(tensors, a, b)
            else:
                plan.check_tied(tensors, a, b)  # the head equals its embedding there
    # an intact head passes everywhere
    _, _, _, intact = _hf_tensors(cfg_dict, seed=11)
    plan.check_tied(intact, 0, None)


# ---- initial_weights: what does not fit


def _gpt2_model(**overrides) -> tuple[dict, torch.nn.Module]:
    cfg = {**GPT2_CFG, **overrides}
    return cfg, _meta(cfg)


@pytest.mark.parametrize("fault", ["missing", "extra", "shape"])
def test_a_state_dict_that_does_not_fit_is_refused_naming_the_tensor(fault, tmp_path):
    cfg, model = _gpt2_model()
    state = _random_state(cfg, seed=21)
    key = {"missing": "ln_f.bias", "extra": "blocks.9.attn.c_attn.weight",
           "shape": "blocks.1.mlp.c_fc.bias"}[fault]  # fmt: skip
    if fault == "missing":
        del state[key]
    elif fault == "extra":
        state[key] = torch.randn(48, 16)
    else:
        state[key] = torch.randn(state[key].shape[0] + 1)
    path = tmp_path / "init.pt"
    torch.save(state, path)
    with pytest.raises(ValueError) as err:
        initial_weights(model, str(path), device="cpu")
    message = str(err.value)
    assert f"model.init_from={path}" in message and key in message, message
    assert "ln_f.weight" not in message  # the tensor at fault, not every tensor


def test_a_missing_path_is_file_not_found_naming_it(tmp_path):
    _, model = _gpt2_model()
    path = tmp_path / "nowhere" / "init.pt"
    with pytest.raises(FileNotFoundError, match=str(path)):
        initial_weights(model, str(path), device="cpu")


@pytest.mark.parametrize("content", ["list", "non-tensor values", "not torch"])
def test_a_file_without_a_state_dict_is_refused(content, tmp_path):
    _, model = _gpt2_model()
    path = tmp_path / "init.pt"
    if content == "list":
        torch.save([torch.zeros(3)], path)
    elif content == "non-tensor values":
        torch.save({"wte.weight": 3, "step": "ten"}, path)
    else:
        path.write_text("not a torch file\n")
    with pytest.raises(ValueError, match=rf"model.init_from={path}: .*{path}"):
        initial_weights(model, str(path), device="cpu")


def test_a_legacy_format_state_dict_file_loads(tmp_path):
    """torch.save's pre-zip format (which cannot be memory-mapped) is read whole."""
    cfg, model = _gpt2_model()
    state = _random_state(cfg, seed=23)
    path = tmp_path / "legacy.pt"
    torch.save(state, path, _use_new_zipfile_serialization=False)
    initial_weights(model, str(path), device="cpu")
    _assert_same_tensors(model.state_dict(), state)


# ---- positional tables of another length

RESIZES = {
    # name: (model config, source max_seq_len, position_mode (None: the config's init_positions))
    "gpt2-longer-interpolate": ({**GPT2_CFG, "max_seq_len": 20}, 8, "interpolate"),
    "gpt2-longer-copy": ({**GPT2_CFG, "max_seq_len": 20}, 8, "copy"),
    "gpt2-longer-config-copy": ({**GPT2_CFG, "max_seq_len": 20, "init_positions": "copy"}, 8, None),
    "gpt2-shorter-interpolate": ({**GPT2_CFG, "max_seq_len": 5}, 12, "interpolate"),
    "bert-longer-copy": ({**BERT_CFG, "max_seq_len": 30}, 12, "copy"),
    "pathx-2d-interpolate": ({**PATHX_CFG, "max_seq_len": 144}, 16, "interpolate"),
    "pathx-2d-copy": ({**PATHX_CFG, "max_seq_len": 144}, 16, "copy"),
}


@pytest.mark.parametrize("name", RESIZES)
def test_positions_of_another_length_resize_as_load_state_dict_extended(name, tmp_path):
    cfg, source_len, mode = RESIZES[name]
    state = _random_state({**cfg, "max_seq_len": source_len}, seed=len(name))
    path = tmp_path / "init.pt"
    torch.save(state, path)
    model = _meta(cfg)
    report = initial_weights(model, str(path), device="cpu", position_mode=mode)

    want = build_model(cfg, "reference")
    want.load_state_dict_extended(state, mode or cfg.get("init_positions", "interpolate"))
    _assert_same_tensors(model.state_dict(), want.state_dict())
    tables = sorted(want.position_tables)
    assert tables and sorted(r.split()[0] for r in report.resized) == tables
    for key in tables:
        old, new = list(state[key].shape), list(want.state_dict()[key].shape)
        assert f"{key} {old} -> {new}" in report.resized
    assert sorted(report.read) == sorted(state)


def _hf_folder(folder, cfg_dict: dict, seed: int):
    """A transformers checkpoint folder (config.json + model.safetensors) of random weights,
    written by the mapping alone (no transformers needed). Returns its state (transformers keys)."""
    pytest.importorskip("safetensors")
    cfg, mapping, _, hf = _hf_tensors(cfg_dict, seed)
    _save_safetensors(hf, folder)
    (folder / "config.json").write_text(json.dumps(mapping.hf_config(cfg)))
    return hf


def test_a_longer_transformers_table_gives_its_first_rows(tmp_path, caplog):
    """A transformers checkpoint run on a shorter context takes its first positions (as
    transformers does), where a torch state dict's would be interpolated."""
    hf = _hf_folder(tmp_path / "hf", {**GPT2_CFG, "max_seq_len": 24}, seed=31)
    model = _meta({**GPT2_CFG, "max_seq_len": 10})
    with caplog.at_level("INFO", logger="flashtrain"):
        report = initial_weights(model, f"hf:{tmp_path / 'hf'}", device="cpu")
    # the log says where from, what was read, resized and kept fresh (0 too)
    assert (
        f"initial weights from hf:{tmp_path / 'hf'}: {len(dict(model.named_parameters()))} "
        "tensors read, 1 resized "
        "(wpe.weight [24, 16] -> [10, 16]), 0 not in it (kept their fresh init)"
    ) in caplog.text
    table = hf["transformer.wpe.weight"]
    assert table.shape[0] == 24
    assert torch.equal(model.wpe.weight.detach(), table[:10])
    assert report.resized == ["wpe.weight [24, 16] -> [10, 16]"]
    assert torch.equal(model.wte.weight.detach(), hf["transformer.wte.weight"])


# ---- initial_weights on a model built with weights; on the meta device


def test_a_model_with_weights_keeps_those_the_source_lacks(tmp_path):
    """A BERT classifier from a masked-LM checkpoint: the encoder read, the pooler and the
    classifier (not in an MLM checkpoint) keep the weights the model was built with."""
    hf = _hf_folder(tmp_path / "mlm", {**BERT_CFG}, seed=41)
    cfg = {**BERT_CFG, "head": "classification", "num_classes": 4}
    torch.manual_seed(0)
    model = build_model(cfg, "reference")
    built = {k: v.clone() for k, v in model.state_dict().items()}
    report = initial_weights(model, f"hf:{tmp_path / 'mlm'}")

    kept = ["classifier.bias", "classifier.weight", "pooler.bias", "pooler.weight"]
    assert sorted(report.kept_fresh) == kept
    assert ", 0 resized, 4 not in it (kept their fresh init): " in report.summary()
    got = model.state_dict()
    for key in kept:
        assert torch.equal(got[key], built[key]), key
    mlm = mapping_for(model_config(BERT_CFG)).state_from_hf(hf, model_config(BERT_CFG))
    for key, value in mlm.items():
        if key in got:
            assert torch.equal(got[key], value), key
            assert not torch.equal(got[key], built[key]), key  # random: off any init
    assert sorted(report.read) == sorted(k for k in got if k not in kept)


def test_a_meta_model_needs_a_device():
    _, model = _gpt2_model()
    with pytest.raises(ValueError, match="meta device"):
        initial_weights(model, None)
    assert all(p.is_meta for p in model.parameters())
    assert initial_weights(model, None, device="cpu") is None  # fresh weights only
    assert not any(p.is_meta for p in model.parameters())


# ---- load_model of a trainer checkpoint


def _saved_run(run_dir, *, sharded: bool, dtype=torch.float32, seed: int = 0):
    """A run directory with one checkpoint (step 3) of a GPT-2 of random weights in `dtype`;
    returns (the saved state, its step folder)."""
    model = _randomised(build_model(GPT2_CFG, "reference"), seed).to(dtype)
    config = {"model": GPT2_CFG, "attention": {"impl": "reference"},
              "data": {"name": "synthetic"}}  # fmt: skip
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        step_dir = save_checkpoint(
            run_dir / "checkpoints", 3, model=model,
            optimizer=torch.optim.AdamW(model.parameters()), trainer_state={"step": 3},
            meta={"run_name": "tiny", "model_config": GPT2_CFG},
            config_yaml=OmegaConf.to_yaml(config), sharded=sharded,
        )  # fmt: skip
    assert (step_dir / MODEL_OPTIM).exists() != sharded  # the format asked for
    return {k: v.clone() for k, v in model.state_dict().items()}, step_dir


@pytest.mark.parametrize("ref", ["run", "model_optim.pt", "dcp"])
def test_a_checkpoint_of_another_n_head_over_the_same_shapes_is_refused(ref, tmp_path):
    """n_head=2 -> 4 at the same d_model: every tensor has the same shape, but each weight
    would mean something else (as the hf: path and a resume refuse). The trainer's
    model_optim.pt inside a step folder is checked against that folder's meta.json too."""
    _, step_dir = _saved_run(tmp_path, sharded=ref == "dcp")
    source = str(step_dir / MODEL_OPTIM) if ref == "model_optim.pt" else str(tmp_path)
    model = _meta({**GPT2_CFG, "n_head": 4})
    with pytest.raises(ValueError) as err:
        initial_weights(model, source, device="cpu")
    message = str(err.value)
    assert message.startswith(f"model.init_from={source}: "), message
    assert "model.n_head=4 (checkpoint: 2)" in message and "set model.n_head=2" in message
    # what a new run may change: the context, dropout, how it is computed
    free = {**GPT2_CFG, "max_seq_len": 24, "dropout": 0.1, "recompute": "all"}
    initial_weights(_meta(free), source, device="cpu")


def test_a_bare_state_dict_is_checked_by_its_shapes_alone(tmp_path):
    """A torch file outside a checkpoint records no model config: n_head cannot be checked
    (docs say so), the shapes still are."""
    state = _random_state(GPT2_CFG, seed=31)
    path = tmp_path / "weights.pt"
    torch.save(state, path)
    model = _meta({**GPT2_CFG, "n_head": 4})
    initial_weights(model, str(path), device="cpu")
    _assert_same_tensors(model.state_dict(), state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sharded", [False, True], ids=["torch", "dcp"])
def test_load_model_gives_the_saved_weights_in_float32_eval_mode(sharded, dtype, tmp_path):
    saved, step_dir = _saved_run(tmp_path, sharded=sharded, dtype=dtype, seed=int(sharded))
    model, info = load_model(tmp_path)
    assert (info.path, info.step, info.run_name) == (step_dir, 3, "tiny")
    assert not any(m.training for m in model.modules())
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    _assert_same_tensors(model.state_dict(), {k: v.float() for k, v in saved.items()})


@pytest.mark.parametrize("sharded", [False, True], ids=["torch", "dcp"])
def test_load_model_at_a_longer_context_tiles_the_learned_table(sharded, tmp_path):
    saved, _ = _saved_run(tmp_path, sharded=sharded, seed=2)
    model, _ = load_model(tmp_path, max_seq_len=30, position_mode="copy")
    table = saved["wpe.weight"]  # (12, 16)
    want = {**saved, "wpe.weight": torch.cat([table, table, table[:6]])}  # (30, 16)
    _assert_same_tensors(model.state_dict(), want)
    assert model.config.max_seq_len == 30


@pytest.mark.parametrize("sharded", [False, True], ids=["torch", "dcp"])
def test_load_model_of_a_complete_checkpoint_draws_no_fresh_weights(sharded, tmp_path, monkeypatch):
    """Every tensor comes from the checkpoint, so none is initialised first: init_weights is
    never called, and the generator is left as it was."""
    saved, _ = _saved_run(tmp_path, sharded=sharded, seed=3)

    def no_init(self):
        raise AssertionError("init_weights called for a model the checkpoint fills")

    monkeypatch.setattr(GPT2, "init_weights", no_init)
    torch.manual_seed(5)
    want_next = torch.rand(8)
    torch.manual_seed(5)
    model, _ = load_model(tmp_path)
    assert torch.equal(torch.rand(8), want_next)
    _assert_same_tensors(model.state_dict(), saved)
