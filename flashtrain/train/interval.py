"""The training metrics of one logging interval: mean loss per update, the last lr and grad norm,
and accuracy over every target seen (MLM, classification)."""

from __future__ import annotations

from flashtrain.train.metric_names import TRAIN_ACCURACY, TRAIN_GRAD_NORM, TRAIN_LOSS, TRAIN_LR


class IntervalStats:
    def __init__(self) -> None:
        self.flushed_updates = 0  # updates the last flush's loss averages
        self.lr = float("nan")
        self.grad_norm = float("nan")
        self._reset()

    def _reset(self) -> None:
        self.loss_sum, self.updates = 0.0, 0
        self.correct, self.targets = 0.0, 0.0

    def add_update(self, loss: float, lr: float, grad_norm: float) -> None:
        """An optimizer step that was taken (skipped non-finite steps are not counted)."""
        self.loss_sum += loss
        self.updates += 1
        self.lr, self.grad_norm = lr, grad_norm

    def add_accuracy(self, correct: float, targets: float) -> None:
        self.correct += correct
        self.targets += targets

    def flush(self) -> dict[str, float]:
        """{train/loss, train/lr, train/grad_norm} when an update was made, {train/accuracy} when
        targets were scored; then starts the next interval."""
        metrics: dict[str, float] = {}
        self.flushed_updates = self.updates
        if self.updates:
            metrics[TRAIN_LOSS] = self.loss_sum / self.updates
            metrics[TRAIN_LR] = self.lr
            metrics[TRAIN_GRAD_NORM] = self.grad_norm
        if self.targets:
            metrics[TRAIN_ACCURACY] = self.correct / self.targets
        self._reset()
        return metrics
