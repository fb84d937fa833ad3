"""model.recompute=offload (flashtrain/models/offload.py): bitwise the loss and gradients of
recompute=all (dropout replayed, autocast, packed documents), every block input but the last
released from the "device" (CPU here) after the forward, fetched back one block ahead, host
buffers reused across steps and never overwritten while a backward still needs them."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from llama_testing import TINY_LLAMA
from model_testing import TINY_BERT, TINY_GPT2, grads
from torch.multiprocessing.reductions import StorageWeakRef

from flashtrain.data.lm_batches import lm_batch
from flashtrain.models import build_model, model_config, offload

GPT2_DROPOUT = {**TINY_GPT2, "n_layer": 3, "dropout": 0.1, "attn_dropout": 0.1}


@pytest.fixture(autouse=True)
def torch_attention(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")


def _ids(batch: int = 2, seqlen: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 97, (batch, seqlen), generator=torch.Generator().manual_seed(seed))


def _model(cfg: dict, recompute: str, attention: str = "sdpa"):
    torch.manual_seed(0)
    return build_model({**cfg, "recompute": recompute}, {"impl": attention})


def _step(model, batch: dict, autocast: bool = False, seed: int = 1):
    """One training step's loss and gradients (dropout drawn from `seed`)."""
    model.zero_grad()
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(**batch)
    out.loss.backward()
    return out.loss.detach(), grads(model)


def _assert_equal(got, ref):
    loss, g = got
    loss_ref, g_ref = ref
    assert torch.equal(loss, loss_ref), (loss, loss_ref)
    assert g.keys() == g_ref.keys() and len(g) > 0
    for name in g_ref:
        assert torch.equal(g[name], g_ref[name]), name


def _documents(rows: int, length: int, seed: int) -> dict:
    """An LM batch cut at EOS (0): cu_seqlens, max_seqlen, position_ids (data/packing.py)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 97, (rows, length + 1), generator=g)
    for r in range(rows):
        tokens[r, torch.randperm(length - 1, generator=g)[:3] + 1] = 0
    return lm_batch(tokens.numpy(), eos_id=0)


@pytest.mark.parametrize("autocast", [False, True])
def test_offload_equals_all_gpt2_with_dropout(autocast):
    """Dropout on the residual branches and in attention: the recompute replays the forward's
    masks exactly as under recompute=all; under bf16 autocast too. Two steps: the second runs
    on the first's host buffers."""
    batch = {"input_ids": _ids(), "labels": _ids()}
    models = {mode: _model(GPT2_DROPOUT, mode) for mode in ("all", "offload")}
    for step in range(2):
        ref = _step(models["all"], batch, autocast, seed=step + 1)
        _assert_equal(_step(models["offload"], batch, autocast, seed=step + 1), ref)
    # dropout is on: other draws, other gradients
    other = _step(models["all"], batch, autocast, seed=99)
    assert not torch.equal(other[0], ref[0])


@pytest.mark.parametrize("autocast", [False, True])
def test_offload_equals_all_llama_packed_documents(autocast):
    """Packed (N, C) hidden states: the documents' tokens run through the varlen path, each
    document masked from the others (cu_seqlens), positions restarting per document."""
    batch = _documents(3, 17, seed=4)
    assert batch["cu_seqlens"].numel() > 4
    cfg = {**TINY_LLAMA, "n_layer": 3}
    models = {mode: _model(cfg, mode, "flash") for mode in ("all", "offload")}
    shapes = []
    models["offload"].blocks[0].register_forward_pre_hook(
        lambda module, args: shapes.append(tuple(args[0].shape))
    )
    ref = _step(models["all"], batch, autocast)
    _assert_equal(_step(models["offload"], batch, autocast), ref)
    tokens = batch["input_ids"].numel()
    assert shapes == [(tokens, cfg["d_model"])] * 2  # (N, C): forward, recompute


@pytest.mark.parametrize("arch", ["bert", "classifier"])
def test_offload_equals_all_padded_post_norm_models(arch):
    """BERT (post-LayerNorm) with a padded batch packed for the varlen path; the classifier."""
    ids = _ids(2, 20, seed=3)
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    if arch == "bert":
        cfg = {**TINY_BERT, "n_layer": 3}
        labels = torch.where((torch.arange(20) % 3 == 0) & mask.bool(), ids, -100)
    else:
        cfg = {"arch": "classifier", "n_layer": 3, "n_head": 2, "d_model": 32, "d_ff": 64}
        cfg.update(max_seq_len=25, position="2d", dropout=0.1, vocab_size=97)
        ids, mask = _ids(2, 25, seed=3), None
        labels = torch.tensor([0, 1])
    batch = {"input_ids": ids, "labels": labels, "attention_mask": mask}
    ref = _step(_model(cfg, "all", "flash"), batch)
    _assert_equal(_step(_model(cfg, "offload", "flash"), batch), ref)


def _input_refs(model, log: list, alive_at_recompute: dict | None = None):
    """Weak references to each block's input storage as the forward passes it (not the
    recompute's); alive_at_recompute[i]: which of them are alive when block i is recomputed."""
    refs = {}

    def remember(i):
        def hook(module, args):
            log.append(("run", i))
            if i not in refs:
                refs[i] = StorageWeakRef(args[0].untyped_storage())
            elif alive_at_recompute is not None:
                alive_at_recompute[i] = [not r.expired() for _, r in sorted(refs.items())]

        return hook

    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(remember(i))
    return refs


@pytest.mark.parametrize("mode", ["offload", "all"])
def test_block_inputs_leave_the_device_after_the_forward(mode):
    """Offload: after the forward only the last block's input is alive (recompute=all, the
    control: every block's), and it goes once its block's backward is done; the backward gives
    the host buffers back, the next step reuses them."""
    model = _model(GPT2_DROPOUT, mode)
    batch = {"input_ids": _ids(), "labels": _ids()}
    buffers = model.block_offload.buffers
    at_recompute = {}
    refs = _input_refs(model, [], at_recompute)
    out = model(**batch)
    alive = [not refs[i].expired() for i in range(3)]
    assert alive == ([False, False, True] if mode == "offload" else [True, True, True])
    lent = len(buffers.free)
    out.loss.backward()
    del out
    assert at_recompute[0][2] is False  # the last block's input: gone after its backward
    if mode == "all":
        assert lent == len(buffers.free) == 0
        return
    assert at_recompute == {2: [False, False, True], 1: [False] * 3, 0: [False] * 3}
    assert lent == 0 and len(buffers.free) == 2  # back once autograd freed the saved inputs
    first = {b.data_ptr() for b in buffers.free}
    model(**batch).loss.backward()
    assert {b.data_ptr() for b in buffers.free} == first


def test_fetches_one_block_ahead(monkeypatch):
    """The order of copies and block runs: each input but the last goes to the host before its
    block runs; in the backward, block i-1's input comes back as block i's recompute starts."""
    log = []
    model = _model({**TINY_GPT2, "n_layer": 4}, "offload")
    _input_refs(model, log)
    to_host, prefetch = offload.PlainCopies.to_host, offload.BlockInput.prefetch

    def logged_to_host(self, x, host):
        log.append("to_host")
        to_host(self, x, host)

    def logged_prefetch(self):
        if self.on_device is None:
            log.append(("fetch", self.index))
        prefetch(self)

    monkeypatch.setattr(offload.PlainCopies, "to_host", logged_to_host)
    monkeypatch.setattr(offload.BlockInput, "prefetch", logged_prefetch)
    out = model(input_ids=_ids(), labels=_ids())
    forward = ["to_host", ("run", 0), "to_host", ("run", 1), "to_host", ("run", 2), ("run", 3)]
    assert log == forward
    out.loss.backward()
    backward = [("fetch", 2), ("run", 3), ("fetch", 1), ("run", 2), ("fetch", 0), ("run", 1)]
    assert log == forward + backward + [("run", 0)]


def test_two_forwards_before_a_backward_and_retain_graph():
    """After a warm-up step has left two host buffers free, a second forward before the first's
    backward takes new ones (the first's are still waited on, not overwritten); retain_graph:
    a second backward fetches the inputs again."""
    batches = [{"input_ids": _ids(seed=s), "labels": _ids(seed=s + 5)} for s in (0, 1)]
    results = {}
    for mode in ("all", "offload"):
        model = _model(GPT2_DROPOUT, mode)
        model(**batches[1]).loss.backward()  # warm-up: its buffers go back to the free list
        model.zero_grad()
        torch.manual_seed(1)
        loss = sum(model(**b).loss for b in batches)
        free = model.block_offload.buffers.free
        assert len(free) == 0
        loss.backward(retain_graph=True)
        loss.backward()
        results[mode] = (loss.detach(), grads(model))
        assert len(free) == (4 if mode == "offload" else 0)  # 2 per forward, all back
    _assert_equal(results["offload"], results["all"])


class _SavesPlaceholderAndInput(torch.autograd.Function):
    """What torch < 2.5's checkpoint saves: a 0-element placeholder next to the inputs."""

    @staticmethod
    def forward(ctx, placeholder, x):
        ctx.save_for_backward(placeholder, x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        placeholder, x = ctx.saved_tensors
        assert placeholder.numel() == 0 and x.shape == grad.shape
        return None, grad * 2


def test_only_the_block_input_is_offloaded():
    forward = offload.BlockInputOffload().forward_pass()
    leaf = torch.randn(3, 4, requires_grad=True)
    x = leaf * 1
    with forward.saving_input(x, to_host=True):
        y = _SavesPlaceholderAndInput.apply(torch.empty(0, requires_grad=True), x)
    assert forward.count == 1 and torch.equal(forward.last.host, x)
    assert forward.last.on_device is None
    y.sum().backward()
    assert torch.equal(leaf.grad, torch.full((3, 4), 2.0))


def test_no_grad_runs_blocks_plainly(monkeypatch):
    def refuse(*args):
        raise AssertionError("no block input is offloaded without grad")

    monkeypatch.setattr(offload.PlainCopies, "to_host", refuse)
    batch = {"input_ids": _ids(), "labels": _ids()}
    ref = _model(TINY_GPT2, "none").eval()
    model = _model(TINY_GPT2, "offload").eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).loss, ref(**batch).loss)
    assert model.recomputes_block(0) and model.recomputes_block(1)


def test_offload_config_and_state():
    assert model_config({**TINY_GPT2, "recompute": "offload"}).recompute == "offload"
    with pytest.raises(ValueError, match="allowed: none, all, every_k, offload"):
        model_config({**TINY_GPT2, "recompute": "host"})
    # buffers and streams do not travel with a copied or pickled model
    state = offload.BlockInputOffload()
    state.buffers.give(torch.zeros(3))
    assert copy.deepcopy(state).buffers.free == []
    assert pickle.loads(pickle.dumps(state)).buffers.free == []
    assert len(state.buffers.free) == 1
