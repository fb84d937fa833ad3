"""The trainer's compiled blocks (flashtrain/train/compile.py compile_blocks): no graph break, and
no recompile after the first step while the batches change, forward and backward, with the
numbers of the eager model.

The batches change as a run's do: packed documents (cu_seqlens' length and max_seqlen change
every batch) and padded batches through flash (the packed token count and max_seqlen change).
aot_eager keeps the tests fast and traces the backward as inductor does; one test runs inductor.
Attention takes the PyTorch path on CPU (tests/train/conftest.py).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from config_testing import compose
from torch._dynamo.utils import counters

from flashtrain.data.packing import document_fields
from flashtrain.models import build_model
from flashtrain.train.compile import VARYING_INTS, compile_blocks, declare_varying_ints
from flashtrain.train.config import TrainerConfig

SEQ, VOCAB, EOS = 64, 97, 0
TINY_BERT = dict(
    arch="bert", n_layer=2, n_head=2, d_model=64, d_ff=128, max_seq_len=SEQ, vocab_size=VOCAB,
    dropout=0.0, attn_dropout=0.0,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from nothing and leaves dynamic_sources as it found it (config.patch
    restores it; monkeypatch would delete the entry, which hides it)."""
    config = torch.compiler.config
    torch._dynamo.reset()
    counters.clear()
    with config.patch(dynamic_sources=config.dynamic_sources):
        yield
    torch._dynamo.reset()


def tiny_model(name: str, attention: str) -> torch.nn.Module:
    """configs/model/<name>.yaml at seq_len 64, as train.py composes it."""
    model_cfg = compose([f"model={name}", f"seq_len={SEQ}"]).model
    model_cfg.vocab_size = VOCAB
    torch.manual_seed(0)
    return build_model(model_cfg, attention)


def document_batches(steps: int) -> list[dict]:
    """LM batches (2, 64) whose documents (ending at EOS) differ in number and longest each step."""
    gen = torch.Generator().manual_seed(0)
    batches = []
    for step in range(steps):
        ids = torch.randint(1, VOCAB, (2, SEQ), generator=gen)
        ends = torch.rand(2, SEQ, generator=gen) < 0.04 + 0.06 * step
        ids = ids.masked_fill(ends, EOS)
        batches.append(dict(input_ids=ids, labels=ids, **document_fields(ids, EOS)))
    tables = [(len(b["cu_seqlens"]), b["max_seqlen"]) for b in batches]
    assert len(set(tables)) == steps, tables  # every step brings a new document table
    return batches


def plain_batches(steps: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(1, VOCAB, (2, SEQ), generator=gen) for _ in range(steps)]
    return [dict(input_ids=x, labels=x) for x in ids]


def padded_batches(steps: int) -> list[dict]:
    """MLM batches (3, 64) padded to 64: the real token count and the longest row change."""
    gen = torch.Generator().manual_seed(0)
    batches = []
    for step in range(steps):
        ids = torch.randint(5, VOCAB, (3, SEQ), generator=gen)
        lengths = torch.tensor([SEQ - step, 20 + 7 * step, 9 + step])
        mask = torch.arange(SEQ) < lengths[:, None]  # (B, T)
        chosen = (torch.rand(3, SEQ, generator=gen) < 0.3) & mask
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        batches.append(dict(input_ids=ids, labels=labels, attention_mask=mask.long()))
    return batches


def run_steps(model, batches) -> list[tuple[torch.Tensor, dict]]:
    """Forward and backward per batch: (loss, gradients) each."""
    results = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads))
    return results


def graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def check_compiles_once(model, batches, *, backend="aot_eager", atol=1e-6):
    """Compile the blocks as the trainer does, train on batches: no graph break, no recompile
    after the first step (dynamo raises on one), the eager model's losses and gradients."""
    eager = copy.deepcopy(model)
    compile_blocks(model, TrainerConfig(compile=True), backend=backend)
    got = run_steps(model, batches[:1])
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1 and graph_breaks() == 0, dict(counters["graph_break"])
    with torch._dynamo.config.patch(error_on_recompile=True):
        got += run_steps(model, batches[1:])
    assert counters["stats"]["unique_graphs"] == graphs and graph_breaks() == 0
    for (loss, grads), (want_loss, want_grads) in zip(got, run_steps(eager, batches)):
        torch.testing.assert_close(loss, want_loss, atol=atol, rtol=1e-5)
        assert grads.keys() == want_grads.keys()
        for name in grads:
            torch.testing.assert_close(grads[name], want_grads[name], atol=atol, rtol=1e-4)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_document_tables_compile_once(name):
    """Each step's cu_seqlens has another length and max_seqlen another value."""
    check_compiles_once(tiny_model(name, "flash"), document_batches(4))


@pytest.mark.parametrize("attention", ["flash", "sdpa"])
@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_plain_batches_compile_once(name, attention):
    check_compiles_once(tiny_model(name, attention), plain_batches(3))


def test_padded_batches_through_flash_compile_once():
    """BERT packs the real tokens of a padded batch for flash (unpad_input): (N, C) per batch."""
    check_compiles_once(build_model(TINY_BERT, "flash"), padded_batches(4))


def test_inductor_document_tables_compile_once():
    """The trainer's own backend (C++ on CPU): the symbolic sizes reach generated code."""
    check_compiles_once(
        tiny_model("gpt2-tiny", "flash"), document_batches(3), backend="inductor", atol=1e-5
    )


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_compile_blocks_mode(cuda_graphs, monkeypatch):
    """Every block compiles with the given backend; mode=reduce-overhead with cuda_graphs."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    model = tiny_model("gpt2-tiny", "flash")
    compile_blocks(model, TrainerConfig(compile=True, cuda_graphs=cuda_graphs), backend="eager")
    mode = {"mode": "reduce-overhead"} if cuda_graphs else {}
    assert calls == [{"backend": "eager", **mode}] * len(model.blocks)


def test_varying_ints_join_the_dynamic_sources_once():
    torch.compiler.config.dynamic_sources = "L['x']:0"  # a user's entry, kept
    declare_varying_ints()
    declare_varying_ints()
    assert torch.compiler.config.dynamic_sources == ",".join(["L['x']:0", *VARYING_INTS])
