"""``AttnscopeCallback``: ``attnscope.watch`` inside a PyTorch Lightning ``Trainer``.

    from attnscope.integrations.lightning import AttnscopeCallback
    trainer = pl.Trainer(max_steps=1000, callbacks=[AttnscopeCallback(probe=ids, every=100, run_dir="runs/pl")])

Built on ``lightning.pytorch`` when that package is installed, else on ``pytorch_lightning``. Step 0 is
watched when training starts, then every ``every`` optimizer steps (``trainer.global_step``), with the
loss ``training_step`` returned and the metrics it logged (``trainer.callback_metrics``) as scalars.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnscope.core.runs.watch import Watcher

try:
    from lightning.pytorch import Callback
except ImportError:
    from pytorch_lightning import Callback


class AttnscopeCallback(Callback):
    def __init__(self, probe: Any, every: int = 100, run_dir: str | Path = "runs/lightning", **watch_kw: Any):
        self.probe = probe
        self.every = every
        self.run_dir = run_dir
        self.watch_kw = watch_kw
        self.watcher: Watcher | None = None
        self._last = -1

    def on_train_start(self, trainer, pl_module):
        if self.watcher is None:
            self.watcher = Watcher(pl_module, self.probe, self.every, self.run_dir, **self.watch_kw)
            self.watcher.step(trainer.global_step)
            self._last = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.watcher is None or step == self._last:  # gradient accumulation: no optimizer step yet
            return
        self._last = step
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        metrics = {k: v for k, v in trainer.callback_metrics.items() if k != "loss"}
        self.watcher.step(step, loss=loss, **metrics)

    def on_train_end(self, trainer, pl_module):
        if self.watcher is not None:
            self.watcher.close()
