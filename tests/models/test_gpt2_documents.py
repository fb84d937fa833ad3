"""Document masking: a packed LM window cut at EOS (cu_seqlens and position_ids from the data
pipeline) gives the loss of running each document alone."""

from __future__ import annotations

import pytest
import torch
from model_testing import TINY_GPT2

from flashtrain.data.lm_batches import lm_batch
from flashtrain.models import build_model

EOS = 0


def _windows(rows: int, length: int, seed: int):
    """(rows, length + 1) token rows with EOS at random places (at least two per row)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, TINY_GPT2["vocab_size"], (rows, length + 1), generator=g)
    for r in range(rows):
        cut = torch.randperm(length - 1, generator=g)[:3] + 1
        tokens[r, cut] = EOS
    return tokens.numpy()


@pytest.mark.parametrize("position", ["learned", "rotary"])
def test_loss_equals_each_document_alone(position):
    torch.manual_seed(0)
    model = build_model({**TINY_GPT2, "position": position}, "flash").eval()
    batch = lm_batch(_windows(3, 29, seed=5), eos_id=EOS)
    ids, labels, cu = batch["input_ids"], batch["labels"], batch["cu_seqlens"]
    assert len(cu) > 3 + 1 and batch["max_seqlen"] < 29  # the rows were cut
    with torch.no_grad():
        packed = model(**batch)
        flat_ids, flat_labels = ids.reshape(-1), labels.reshape(-1)
        loss_sum, count = torch.zeros(()), 0
        for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
            alone = model(flat_ids[None, start:end], flat_labels[None, start:end])
            loss_sum += alone.loss * alone.num_targets
            count += int(alone.num_targets)
        whole = model(ids, labels)  # without the boundaries: attends across documents
    assert int(packed.num_targets) == count
    assert torch.allclose(packed.loss, loss_sum / count, rtol=1e-5, atol=1e-6)
    assert (whole.loss - packed.loss).abs() > 1e-4  # so the equality above says something


def test_positions_restart_after_every_eos():
    batch = lm_batch(_windows(2, 16, seed=1), eos_id=EOS)
    ids, pos = batch["input_ids"], batch["position_ids"]
    for row_ids, row_pos in zip(ids, pos):
        expected, p = [], 0
        for token in row_ids.tolist():
            expected.append(p)
            p = 0 if token == EOS else p + 1
        assert row_pos.tolist() == expected
    assert lm_batch(_windows(2, 16, seed=1)).keys() == {"input_ids", "labels"}  # masking off
