"""A short real training run shared by the export and init_from tests (one per session).

Without transformers every test module here skips itself (hf_testing's importorskip); this file
imports hf_testing inside the fixtures, since a skip raised while a conftest loads is an error."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """`python train.py` for 6 steps of the tiny GPT-2, a checkpoint at step 6: its run folder."""
    from hf_testing import TINY_RUN, run_train

    cwd = tmp_path_factory.mktemp("run")
    res = run_train([*TINY_RUN, "trainer.max_steps=6", "trainer.ckpt_interval=6",
                     "trainer.eval_interval=6", "hydra.run.dir=run"], cwd)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return cwd / "run"


@pytest.fixture(scope="session")
def exported(trained, tmp_path_factory):
    """That checkpoint exported to a transformers folder."""
    from flashtrain.checkpoint.export_hf import export_checkpoint

    return export_checkpoint(trained / "checkpoints", tmp_path_factory.mktemp("hf") / "tiny-gpt2")
