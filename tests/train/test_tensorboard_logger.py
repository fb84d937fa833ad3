"""logger=tensorboard: real TensorBoard event files, read back offline with TensorBoard's own
reader, under the same metric names as metrics.jsonl."""

from __future__ import annotations

import sys

import pytest
from config_testing import compose

from flashtrain.train.config import validate_config
from flashtrain.train.loggers import TENSORBOARD_DIR, TensorBoardSink, build_loggers
from flashtrain.train.metric_names import TOKENS_PER_S, TRAIN_LOSS
from flashtrain.typed_config import ConfigError

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} as TensorBoard reads the folder."""
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_scalars_land_under_the_metric_names_and_are_flushed_at_each_call(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    sink.log({TRAIN_LOSS: 2.5, TOKENS_PER_S: 1000.0}, step=10)
    # flushed: a running `tensorboard --logdir` (here its reader) sees the step before the close
    assert _scalars(tmp_path / "tb") == {TRAIN_LOSS: [(10, 2.5)], TOKENS_PER_S: [(10, 1000.0)]}
    sink.log({TRAIN_LOSS: 2.25, "eval/loss": 2.0}, step=20)
    sink.finish()
    got = _scalars(tmp_path / "tb")
    assert got[TRAIN_LOSS] == [(10, 2.5), (20, 2.25)] and got["eval/loss"] == [(20, 2.0)]


def test_a_resumed_run_hides_the_steps_it_logs_again(tmp_path):
    first = TensorBoardSink(tmp_path)
    for step in (1, 2, 3, 4):
        first.log({TRAIN_LOSS: float(step)}, step)
    first.finish()  # the run stopped after step 4; its checkpoint is at step 2
    resumed = TensorBoardSink(tmp_path, resumed_from=2)
    for step in (3, 4):
        resumed.log({TRAIN_LOSS: 10.0 * step}, step)
    resumed.finish()
    assert _scalars(tmp_path)[TRAIN_LOSS] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_logger_tensorboard_writes_into_the_run_dir_or_logger_dir(tmp_path):
    cfg = compose(["logger=tensorboard"])
    loggers = build_loggers(cfg, run_dir=tmp_path / "run", run_name="r", config={}, is_main=True)
    loggers.log({TRAIN_LOSS: 1.5}, step=1)
    loggers.finish()
    assert _scalars(tmp_path / "run" / TENSORBOARD_DIR) == {TRAIN_LOSS: [(1, 1.5)]}
    assert '"train/loss": 1.5' in (tmp_path / "run" / "metrics.jsonl").read_text()

    cfg = compose(["logger=tensorboard", f"logger.dir={tmp_path / 'shared'}"])
    build_loggers(cfg, run_dir=tmp_path / "run2", run_name="r", config={}, is_main=True).finish()
    assert list((tmp_path / "shared").glob("events.out.tfevents.*"))
    assert not (tmp_path / "run2" / TENSORBOARD_DIR).exists()


def test_without_the_tensorboard_package_the_config_says_what_to_install(monkeypatch):
    """Refused when the config is checked: before the model is built or the run folder made."""
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if the package were not installed
    with pytest.raises(ConfigError, match="logger=tensorboard needs .* pip install tensorboard"):
        validate_config(compose(["logger=tensorboard"]))
