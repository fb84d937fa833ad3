"""The Path-X style sequence classifier: 2-D positions and their upsampling, pooling, padding."""

import pytest
import torch
import torch.nn.functional as F
from model_testing import TINY_CLASSIFIER

from flashtrain.checkpoint import initial_weights
from flashtrain.models import SequenceClassifier, build_model


def make(**overrides) -> SequenceClassifier:
    torch.manual_seed(0)
    return build_model({**TINY_CLASSIFIER, **overrides}, {"impl": "sdpa"}).eval()


def test_2d_positions_are_row_plus_column_in_raster_order():
    model = make()  # 64 tokens = 8 x 8 image
    assert model.pos_row.weight.shape == (8, 64) and model.pos_col.weight.shape == (8, 64)
    pos = model.positions(64)
    r, c = 3, 5
    torch.testing.assert_close(pos[r * 8 + c], model.pos_row.weight[r] + model.pos_col.weight[c])
    with pytest.raises(ValueError, match=r"8x8 = 64 pixels; allowed: seq_len == 64"):
        model.positions(49)


def test_upsampling_positions_from_a_smaller_image(tmp_path):
    small = make(max_seq_len=16)  # 4 x 4 "pre-training" image
    big = make(max_seq_len=64)  # 8 x 8 fine-tuning image
    row = small.pos_row.weight.detach().clone()
    big.load_state_dict_extended(small.state_dict(), mode="copy")  # nearest: each row twice
    torch.testing.assert_close(big.pos_row.weight, row.repeat_interleave(2, dim=0))
    big.load_state_dict_extended(small.state_dict(), mode="interpolate")  # bilinear on the grid
    new = big.pos_row.weight.detach()
    torch.testing.assert_close(new[1:-1:2], 0.75 * row[:-1] + 0.25 * row[1:])
    torch.testing.assert_close(new[2:-1:2], 0.25 * row[:-1] + 0.75 * row[1:])
    grid_small = small.positions(16).view(4, 4, -1)
    grid_big = big.positions(64).view(8, 8, -1)
    # pixel (2i+1, 2j+1) of the big image interpolates 3/4 towards small pixel (i, j), per axis
    i, j = 1, 2
    want = (
        0.5625 * grid_small[i, j]
        + 0.1875 * grid_small[i + 1, j]
        + 0.1875 * grid_small[i, j + 1]
        + 0.0625 * grid_small[i + 1, j + 1]
    )
    torch.testing.assert_close(grid_big[2 * i + 1, 2 * j + 1], want)
    assert torch.equal(big.blocks[0].attn.c_attn.weight, small.blocks[0].attn.c_attn.weight)
    path = tmp_path / "path64.pt"
    torch.save(small.state_dict(), path)
    from_cfg = build_model(
        {**TINY_CLASSIFIER, "init_from": str(path)}, {"impl": "sdpa"}
    )  # the Hydra way: model.init_from=..., read as the trainer does
    initial_weights(from_cfg, from_cfg.config.init_from)
    torch.testing.assert_close(from_cfg.pos_col.weight, big.pos_col.weight)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pooling_and_padding(pooling):
    model = make(pooling=pooling, position="1d")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (2, 40), generator=g)
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 25:] = 0
    labels = torch.tensor([1, 0])
    out = model(input_ids=ids, labels=labels, attention_mask=mask)
    assert out.logits.shape == (2, 2) and out.num_targets.item() == 2
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    other = ids.clone()
    other[1, 25:] = 0
    again = model(input_ids=other, labels=labels, attention_mask=mask)
    assert torch.equal(out.logits, again.logits)  # padding never counts
    alone = model(input_ids=ids[1:, :25], labels=labels[1:])
    torch.testing.assert_close(out.logits[1:], alone.logits, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        h, m = model.encode(ids, mask)
    if pooling == "cls":
        assert h.shape == (2, 41, 64) and m.shape == (2, 41) and m[:, 0].all()
        torch.testing.assert_close(out.logits, model.head(h[:, 0]))
    else:
        torch.testing.assert_close(out.logits[1], model.head(h[1, :25].mean(0)))


def test_pathx_shaped_forward_and_backward():
    """A 32 x 32 image (1024 pixel tokens), 2-D positions, training step with recomputation."""
    model = make(max_seq_len=1024, d_model=32, n_head=2, d_ff=64, recompute="all").train()
    ids = torch.randint(0, 256, (2, 1024))
    out = model(input_ids=ids, labels=torch.tensor([0, 1]))
    out.loss.backward()
    assert model.pos_row.weight.grad.abs().sum() > 0 and model.tok_emb.weight.grad is not None
    assert out.correct.dtype == torch.int64 and 0 <= out.correct.item() <= 2
