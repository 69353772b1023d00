"""``AttnscopeCallback``: ``attnscope.watch`` inside a Hugging Face ``Trainer``.

    from attnscope.integrations.hf import AttnscopeCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer,
                      callbacks=[AttnscopeCallback(probe=["a first text", "a second"], every=50, run_dir="runs/hf")])

The probe is texts (tokenized with the Trainer's tokenizer, padded as one batch), a dict of tensors
(``model(**probe)``), or anything ``attnscope.watch`` takes. Step 0 (the model before training) is
watched when training starts; then every ``every`` optimizer steps (``state.global_step``), and every
value the Trainer logs (loss, learning rate, grad norm, eval metrics) goes into the run's scalars.
Under distributed training the callback runs on every process and the watcher probes on rank 0 only
(FSDP: every rank runs the probe, rank 0 writes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from attnscope.core.runs.watch import Watcher


class AttnscopeCallback(TrainerCallback):
    def __init__(self, probe: Any, every: int = 100, run_dir: str | Path = "runs/hf", **watch_kw: Any):
        self.probe = probe
        self.every = every
        self.run_dir = run_dir
        self.watch_kw = watch_kw
        self.watcher: Watcher | None = None

    def _probe(self, model: Any, tokenizer: Any) -> Any:
        probe = self.probe
        if isinstance(probe, (list, tuple)) and probe and all(isinstance(t, str) for t in probe):
            if "adapter" in self.watch_kw:
                return list(probe)
            if tokenizer is None or not callable(tokenizer):
                raise ValueError(
                    "AttnscopeCallback got a probe of texts but the Trainer has no tokenizer "
                    "(pass processing_class= to the Trainer, or give the probe as token-id tensors)"
                )
            enc = tokenizer(list(probe), return_tensors="pt", padding=True)
            probe = {
                k: v for k, v in dict(enc).items() if k in ("input_ids", "attention_mask", "token_type_ids")
            }
        return probe

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.watcher is None and model is not None:
            tokenizer = processing_class if processing_class is not None else kwargs.get("tokenizer")
            kw = dict(self.watch_kw)
            if tokenizer is not None and hasattr(tokenizer, "convert_ids_to_tokens"):
                kw.setdefault("vocab", tokenizer)
            self.watcher = Watcher(model, self._probe(model, tokenizer), self.every, self.run_dir, **kw)
            self.watcher.step(state.global_step)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.watcher is not None and state.global_step % self.every == 0:
            self.watcher.step(state.global_step)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.watcher is not None and logs:
            self.watcher.log(state.global_step, **logs)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.watcher is not None:
            self.watcher.close()
        return control
