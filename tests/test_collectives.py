"""on_rank_0: rank 0's work, its value kept there, and its refusal raised on every rank (else
the other ranks would go on into a collective that rank 0 has left)."""

from __future__ import annotations

import pytest
from spawn_testing import run_ranks

from flashtrain.collectives import broadcast_object, on_rank_0
from flashtrain.typed_config import ConfigError


def ranks_worker(rank: int, world_size: int) -> None:
    calls = []
    value = on_rank_0(lambda: calls.append(rank) or "lock", (ConfigError,), is_main=rank == 0)
    assert value == ("lock" if rank == 0 else None) and calls == ([0] if rank == 0 else [])

    def refuse():
        raise ConfigError("trainer.ckpt_dir: held by another run")

    with pytest.raises(ConfigError, match="held by another run"):
        on_rank_0(refuse, (ConfigError,), is_main=rank == 0)
    assert broadcast_object(rank) == 0  # every rank still in step for the next collective


def test_rank_0s_value_and_refusal_reach_every_rank(tmp_path):
    run_ranks(ranks_worker, 2, tmp_path)


def test_an_error_of_another_kind_is_not_caught_for_the_other_ranks():
    def crash():
        raise KeyError("a bug, not a refusal")

    with pytest.raises(KeyError):
        on_rank_0(crash, (ConfigError,), is_main=True)
