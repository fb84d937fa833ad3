"""Document boundaries (EOS) in packed windows -> cu_seqlens for the varlen kernel."""

import torch

from flashtrain.data.packing import cu_seqlens_from_eos


def test_sequences_end_after_each_eos_and_at_each_row_end():
    eos = 9
    ids = torch.tensor([[1, 2, 9, 3, 4, 5], [9, 1, 1, 1, 9, 2]])
    cu, max_len = cu_seqlens_from_eos(ids, eos)
    # Row 0: [1 2 9] [3 4 5]; row 1: [9] [1 1 1 9] [2]  (offsets over the flattened 12 tokens)
    assert cu.tolist() == [0, 3, 6, 7, 11, 12]
    assert cu.dtype == torch.int32
    assert max_len == 4


def test_no_eos_gives_one_sequence_per_row():
    cu, max_len = cu_seqlens_from_eos(torch.zeros(3, 5, dtype=torch.int64), eos_id=1)
    assert cu.tolist() == [0, 5, 10, 15] and max_len == 5
