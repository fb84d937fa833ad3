"""The stream of a loader whose data is generated from the seed (synthetic recall, retrieval
windows): window i of a stream is a pure function of (seed, stream, i), so the order does not
depend on how many ranks share it, a resume is a step count, and validation is a stream of its
own, eval_batches batches per rank. Subclasses write batch(stream, indices)."""

from __future__ import annotations

from flashtrain.data.module import DataModule, DataRun, EvalBatches, eval_items
from flashtrain.data.sampling import check_same_stream
from flashtrain.data.stream_identity import IDENTITY_KEY, check_same_data

TRAIN_STREAM, VAL_STREAM = 0, 1


class GeneratedLM(DataModule):
    task = "lm"
    num_classes = None

    def __init__(self, run: DataRun, what: str):
        super().__init__(run)
        # validation: eval_batches batches per rank, windows numbered from 0 in their own stream
        count = self.eval_batches * self.micro_batch_size * self.world_size
        self.val_items = eval_items(count, self.rank, self.world_size, f"{what} validation")
        self.step = 0

    @classmethod
    def check_run_settings(cls, cfg, *, seq_len: int, eval_batches: int | None) -> None:
        """Validation is eval_batches batches per rank: a number, not null (all)."""
        if eval_batches is None:
            raise ValueError(
                f"{cfg.name} validation data is generated, so it has no natural size: set "
                "trainer.eval_batches (validation batches per rank) to a number"
            )

    def batch(self, stream: int, indices) -> dict:
        raise NotImplementedError

    def train_batches(self):
        batch = self.micro_batch_size
        while True:
            first = (self.step * self.world_size + self.rank) * batch
            self.step += 1
            yield self.batch(TRAIN_STREAM, range(first, first + batch))

    def val_batches(self):
        return EvalBatches(
            lambda items: self.batch(VAL_STREAM, items), self.val_items, self.micro_batch_size, None
        )

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed, "world_size": self.world_size,
                IDENTITY_KEY: self.data_identity}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        check_same_data(state, self.data_identity)
        check_same_stream(state, self)
        self.step = int(state["step"])
