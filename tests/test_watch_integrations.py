"""attnscope.watch where people train: a real Hugging Face Trainer with AttnscopeCallback, a PyTorch
Lightning Trainer, and DistributedDataParallel and FSDP on two gloo processes (rank 0 alone writes;
training stays bit-identical)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from attnscope.core.runs.runfile import Run
from tests.usermodels import annotated as A

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


# -- Hugging Face Trainer -------------------------------------------------------------------------


def _tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, num_labels=2,
                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)  # fmt: skip
    return BertForSequenceClassification(cfg)


def _hf_train(tmp_path: Path, callbacks: list, name: str):
    from transformers import AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments

    from attnscope.models.pretrained import minilm_dir

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    texts = ["a good film", "a bad film", "truly great", "awful and dull", "fine", "not good"] * 4
    data = [{**tok(t), "labels": i % 2} for i, t in enumerate(texts)]
    model = _tiny_bert()
    args = TrainingArguments(output_dir=str(tmp_path / name), max_steps=6, per_device_train_batch_size=4,
                             logging_steps=2, report_to=[], save_strategy="no", use_cpu=True, seed=7,
                             disable_tqdm=True)  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorWithPadding(tok), callbacks=callbacks)  # fmt: skip
    trainer.train()
    return model


def test_hf_trainer_callback_writes_a_run_and_training_is_unchanged(tmp_path):
    from attnscope.integrations.hf import AttnscopeCallback

    cb = AttnscopeCallback(probe=["a good film", "an awful one"], every=2, run_dir=tmp_path / "run")
    watched = _hf_train(tmp_path, [cb], "w")
    plain = _hf_train(tmp_path, [], "p")
    for (name, a), b in zip(plain.state_dict().items(), watched.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    run = Run.open(tmp_path / "run")
    assert run.steps() == [0, 2, 4, 6]
    traces = run.traces(6)
    assert len(traces) == 2 and traces[0].kinds == ("enc_self",)
    assert traces[0].src_tokens[:3] == ("[CLS]", "a", "good")
    assert traces[0].enc_self.shape == (2, 4, 5, 5)  # 2 layers x 4 heads, the padded probe's 5 tokens
    assert "loss" in run.series() and run.series()["loss"][0] == [2, 4, 6]
    assert "learning_rate" in run.series()
    # the probe's maps are the model's own (output_attentions on the eager path), at the final weights
    from transformers import AutoTokenizer

    from attnscope.models.pretrained import minilm_dir

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    enc = tok(["a good film", "an awful one"], return_tensors="pt", padding=True)
    watched.eval()
    watched.config._attn_implementation = "eager"
    with torch.no_grad():
        own = watched(**enc, output_attentions=True).attentions
    for layer in range(2):
        np.testing.assert_allclose(traces[1].enc_self[layer], own[layer][1].numpy(), atol=2e-3)


# -- PyTorch Lightning -----------------------------------------------------------------------------


def test_lightning_callback_writes_a_run(tmp_path):
    pl = pytest.importorskip(
        "pytorch_lightning", reason="pytorch-lightning is a test dependency (requirements.txt)"
    )
    from attnscope.integrations.lightning import AttnscopeCallback

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = A.make_model(dropout=0.1)

        def forward(self, src, tgt):
            return self.net(src, tgt)

        def training_step(self, batch, _):
            src, tgt = batch
            loss = -self(src, tgt).gather(-1, tgt[..., None]).mean()
            self.log("nll", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), 1e-3)

    src, tgt = A.sample_batch()
    loader = torch.utils.data.DataLoader(list(zip(src, tgt, strict=True)), batch_size=3)
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[AttnscopeCallback(probe=(src, tgt), every=2, run_dir=tmp_path / "run")])  # fmt: skip
    trainer.fit(Module(), loader)
    run = Run.open(tmp_path / "run")
    assert run.steps() == [0, 2, 4]
    assert run.traces(4)[0].kinds == ("enc_self", "dec_self", "cross")
    assert run.series()["loss"][0] == [1, 2, 3, 4] and "nll" in run.series()


# -- DistributedDataParallel -----------------------------------------------------------------------


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _ddp(out: Path, run: str, mode: str = "ddp") -> dict[int, dict[str, torch.Tensor]]:
    out.mkdir()
    worker = str(ROOT / "tests" / "watch_ddp_worker.py")
    subprocess.run(
        [sys.executable, worker, str(out), run, _free_port(), mode], check=True, cwd=ROOT, timeout=240
    )
    return {r: load_file(str(out / f"rank{r}.safetensors")) for r in (0, 1)}


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_distributed_rank_zero_writes_once_and_training_is_unchanged(tmp_path, mode):
    watched = _ddp(tmp_path / "w", str(tmp_path / "run"), mode)
    plain = _ddp(tmp_path / "p", "-", mode)
    for rank in (0, 1):
        for name, a in plain[rank].items():
            assert torch.equal(a, watched[rank][name]), (rank, name)
    run = Run.open(tmp_path / "run")
    assert run.steps() == [0, 2, 4]
    assert [r["step"] for r in run.scalars()] == list(range(6))  # one writer: each step once
    assert run.header["world_size"] == 2
    # DDP: the module under the wrapper; FSDP: the sharded module itself, whose forward gathers the shards
    assert run.header["model"] == ("EncoderDecoder" if mode == "ddp" else "FSDPEncoderDecoder")
    assert run.traces(4)[0].kinds == ("enc_self", "dec_self", "cross")
