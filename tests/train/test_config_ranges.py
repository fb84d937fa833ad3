"""Every config number has a range, checked when the config is validated (before anything is
built): a value outside it is one ConfigError naming the key, the range and the value."""

from __future__ import annotations

import pytest
from config_testing import compose

from flashtrain.train.config import validate_config
from flashtrain.typed_config import ConfigError

TEXT = ["data=text_files", "data.data_files=corpus.txt"]
OUT_OF_RANGE = {
    # a negative norm would flip the sign of every clipped update
    "trainer.grad_clip=-1": "trainer.grad_clip must be >= 0 (0 or null: no clipping), got -1.0",
    "trainer.peak_flops=0": "trainer.peak_flops must be > 0 FLOP/s",
    "trainer.dist_timeout_s=0": "trainer.dist_timeout_s must be >= 1, got 0",
    "trainer.max_skipped_steps=-1": "trainer.max_skipped_steps must be >= 0, got -1",
    "trainer.cpu_step_time_limit_s=0": "trainer.cpu_step_time_limit_s must be > 0, got 0.0",
    "global_batch_size=0": "global_batch_size must be >= 1, got 0",
    "model.loss_chunk_size=0": "model.loss_chunk_size must be a positive int, got 0",
    "data.num_keys=0": "data.num_keys must be >= 1, got 0",
    "model.d_ff=0": "model.d_ff must be a positive int or null, got 0",
    "seed=-1": "seed must be >= 0, got -1",
}
TEXT_OUT_OF_RANGE = {
    "data.val_fraction=-0.5": "data.val_fraction must be in [0, 1), got -0.5",
    "data.val_fraction=1": "data.val_fraction must be in [0, 1), got 1.0",
    "data.test_fraction=1.5": "data.test_fraction must be in [0, 1), got 1.5",
    "data.num_proc=0": "data.num_proc must be >= 1 or null (null: one process), got 0",
    "data.shuffle_buffer=-1": "data.shuffle_buffer must be >= 0, got -1",
    "data.split_seed=-1": "data.split_seed must be >= 0, got -1",
}
PATHFINDER = ["data=pathfinder32", "model=pathx-classifier", "seq_len=1024"]
PATHFINDER_OUT_OF_RANGE = {
    "data.resolution=48": "data.resolution=48; allowed: 32, 64, 128, 256",
    "data.contour_length=1": "data.contour_length must be >= 2 paddles, got 1",
    "data.num_samples=19": "data.num_samples must be >= 20",
    "data.generator_seed=-1": "data.generator_seed must be >= 0, got -1",
    "data.num_workers=0": "data.num_workers must be >= 1 or null (null: all cores), got 0",
}


@pytest.mark.parametrize("override", OUT_OF_RANGE)
def test_a_number_out_of_range_is_refused_naming_it(override):
    with pytest.raises(ConfigError) as error:
        validate_config(compose([override]))
    assert OUT_OF_RANGE[override] in str(error.value)


@pytest.mark.parametrize("override", TEXT_OUT_OF_RANGE)
def test_a_text_data_number_out_of_range_is_refused_naming_it(override):
    with pytest.raises(ConfigError) as error:
        validate_config(compose([*TEXT, override]))
    assert TEXT_OUT_OF_RANGE[override] in str(error.value)


@pytest.mark.parametrize("override", PATHFINDER_OUT_OF_RANGE)
def test_a_pathfinder_number_out_of_range_is_refused_before_any_image_is_made(override):
    with pytest.raises(ConfigError) as error:
        validate_config(compose([*PATHFINDER, override]))
    assert PATHFINDER_OUT_OF_RANGE[override] in str(error.value)


def test_fractions_that_leave_nothing_to_train_on_are_refused():
    with pytest.raises(ConfigError, match=r"val_fraction \+ data.test_fraction must be < 1"):
        validate_config(compose([*TEXT, "data.val_fraction=0.5", "data.test_fraction=0.5"]))


def test_the_edges_of_the_ranges_are_allowed():
    cfg = validate_config(compose([*TEXT, "trainer.grad_clip=0", "trainer.max_skipped_steps=0",
                                   "data.val_fraction=0", "data.num_proc=1"]))  # fmt: skip
    assert cfg.trainer.grad_clip == 0 and cfg.data.num_proc == 1
