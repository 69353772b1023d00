"""attnscope.watch in a training loop: bit-identical training, crash-safe run folders, resuming, thinning
within the budget, the audit naming the step a mask bug appears, and the reader's checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import attnscope
from attnscope.core.runs import runfile
from attnscope.core.runs.runfile import Run, RunFormatError
from attnscope.core.runs.watch import parse_size
from tests.usermodels import annotated as A

ROOT = Path(__file__).resolve().parents[1]
VOCAB = [f"w{i}" for i in range(A.VOCAB_SIZE)]


class Leaky(A.EncoderDecoder):
    """The Annotated Transformer with a switch that drops the decoder's causal mask (a mask bug)."""

    leak = False

    def forward(self, src, tgt):
        src_mask = (src != A.PAD).unsqueeze(-2)
        tgt_mask = (tgt != A.PAD).unsqueeze(-2)
        if not self.leak:
            tgt_mask = tgt_mask & A.subsequent_mask(tgt.size(-1)).type_as(src_mask)
        else:
            tgt_mask = tgt_mask.expand(-1, tgt.size(-1), -1)
        return self.generator(self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask))


def _model(seed: int = 0, dropout: float = 0.1):
    torch.manual_seed(seed)
    m = A.make_model(dropout=dropout)
    m.__class__ = Leaky
    return m


def _train(model, steps: int, watcher=None, leak_at: int | None = None, frozen: bool = False):
    src, tgt = A.sample_batch()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    model.train()
    if frozen:
        model.src_embed.eval()  # a part the user keeps in eval mode on purpose
    for step in range(steps):
        model.leak = leak_at is not None and step >= leak_at
        out = model(src, tgt)
        loss = -out.gather(-1, tgt[..., None]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if watcher is not None:
            watcher.step(step, loss=loss, accuracy=torch.tensor(0.5))
    return model


def _probe():
    return A.sample_batch()


def test_training_is_bit_identical_with_and_without_watching(tmp_path):
    plain = _train(_model(), 12)

    def greedy_forward(model, probe):  # a probe forward that draws random numbers: they must be given back
        torch.rand(3)
        return model(*probe)

    torch.manual_seed(123)  # the state training continues from, the same in both runs
    watched = _model()
    w = attnscope.watch(watched, _probe(), every=3, run_dir=tmp_path / "r", vocab=VOCAB, forward=greedy_forward,
                        arch="encoder-decoder", pad=0, audit_every=6, keep_weights=True)  # fmt: skip
    _train(watched, 12, w)
    w.close()
    torch.manual_seed(123)
    plain = _train(_model(), 12)
    for (name, a), b in zip(plain.state_dict().items(), watched.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    run = Run.open(tmp_path / "r")
    assert run.steps() == [0, 3, 6, 9]
    assert sorted(run.audits()) == [0, 6]
    # the weights kept at a step are the model's at that step
    from safetensors.torch import load_file

    kept = load_file(str(run.weights(9)))
    assert kept["generator.proj.weight"].dtype == torch.float16


def test_each_module_keeps_its_own_training_flag(tmp_path):
    m = _model()
    w = attnscope.watch(m, _probe(), every=1, run_dir=tmp_path / "r", vocab=VOCAB)
    m.train()
    m.src_embed.eval()
    assert w.step(0, loss=1.0)
    assert m.training and m.decoder.training and not m.src_embed.training
    assert not any(x.training for x in m.src_embed.modules())
    w.close()


def test_the_run_holds_the_probe_traces_as_captured(tmp_path):
    m = _model(dropout=0.0).eval()
    src, tgt = _probe()
    with attnscope.capture_attention(m) as cap:
        m(src, tgt)
    w = attnscope.watch(m, (src, tgt), every=1, run_dir=tmp_path / "r", vocab=VOCAB)
    w.step(0)
    w.close()
    run = Run.open(tmp_path / "r")
    traces = run.traces(0)
    assert len(traces) == 3 and traces[0].kinds == ("enc_self", "dec_self", "cross")
    assert traces[1].src_tokens == tuple(VOCAB[i] for i in src[1].tolist())
    assert traces[1].tgt_tokens == tuple(VOCAB[i] for i in tgt[1].tolist())
    own = cap.stacks()
    for kind in traces[0].kinds:
        for i, tr in enumerate(traces):
            want = own[kind][i].numpy()
            np.testing.assert_allclose(tr.probs(kind), want, atol=1e-3)  # float16 on disk
            assert getattr(tr, f"{kind}_scores") is None  # a run keeps the maps, not the scores
    assert run.header["kinds"] == ["enc_self", "dec_self", "cross"] and run.header["probe"]["n"] == 3


def test_the_audit_names_the_step_where_the_mask_bug_appears(tmp_path):
    m = _model()
    w = attnscope.watch(m, _probe(), every=5, run_dir=tmp_path / "r", vocab=VOCAB, arch="encoder-decoder",
                        pad=0, audit_every=5)  # fmt: skip
    _train(m, 21, w, leak_at=10)
    w.close()
    run = Run.open(tmp_path / "r")
    audits = run.audits()
    assert [s for s, a in audits.items() if a["passed"]] == [0, 5]
    step, audit = run.first_failed_audit()
    assert step == 10
    assert "causal_leak" in audit["failed"]
    assert any("causal_leak" in line for line in audit["lines"])
    series = run.series()
    assert series["loss"][0] == list(range(21)) and series["accuracy"][1][0] == 0.5


def test_thinning_keeps_the_run_within_its_budget_log_spaced(tmp_path):
    m = _model(dropout=0.0)
    w = attnscope.watch(m, _probe(), every=1, run_dir=tmp_path / "r", vocab=VOCAB)
    w.step(0)
    one = w.run.size()
    w.close()
    budget = int(one * 6.5)
    w = attnscope.watch(m, _probe(), every=1, run_dir=tmp_path / "t", vocab=VOCAB, budget=budget)
    for step in range(60):
        w.step(step, loss=float(step))
    w.close()
    run = Run.open(tmp_path / "t")
    kept = run.steps()
    total = sum(f.stat().st_size for f in (tmp_path / "t" / "steps").rglob("*") if f.is_file())
    assert total <= budget
    assert kept[0] == 0 and kept[-3:] == [57, 58, 59]
    middle = kept[1:-3]
    assert middle and all(s < 57 for s in middle)
    # log-spaced: the kept steps spread over log(step), not bunched at the end
    assert min(middle) < 20
    assert [r["step"] for r in run.scalars()] == list(range(60))  # scalars are never thinned
    for s in kept:
        assert len(run.traces(s)) == 3


def test_thin_choice_drops_the_most_crowded_step():
    # dropping 8 leaves log(10) - log(5), the smallest gap; the first and the latest three stay
    assert runfile.thin_choice([0, 1, 2, 4, 8, 9, 10, 11]) == 8
    assert runfile.thin_choice([0, 1, 2, 3, 50, 60, 70]) == 2
    assert runfile.thin_choice([0, 100, 200, 300]) is None  # only the first and latest three
    steps = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    victim = runfile.thin_choice(steps)
    assert victim not in (0, 80, 90, 100) and victim >= 60  # late steps are closer in log(step)


def test_a_killed_run_keeps_every_earlier_step_and_continues(tmp_path):
    run_dir = tmp_path / "r"
    script = textwrap.dedent(
        f"""
        import sys, torch, attnscope
        sys.path.insert(0, {str(ROOT)!r})
        from tests.usermodels import annotated as A
        torch.manual_seed(0)
        m = A.make_model()
        w = attnscope.watch(m, A.sample_batch(), every=1, run_dir={str(run_dir)!r})
        step = 0
        while True:
            w.step(step, loss=float(step))
            step += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list((run_dir / "steps").glob("step-*"))) < 6:
            time.sleep(0.05)
        assert proc.poll() is None, "the writer stopped by itself"
        os.kill(proc.pid, signal.SIGKILL)  # no clean-up, mid-write most likely
    finally:
        proc.wait(30)
    run = Run.open(run_dir)
    steps = run.steps()
    assert len(steps) >= 6 and steps == list(range(len(steps)))
    for s in steps:
        assert len(run.traces(s)) == 3  # every complete step reads whole
    run.scalars()  # a line cut short is not an error
    # a half-written step and a half-written line, as a kill leaves them, are cleaned up on reopening
    (run_dir / "steps" / ".tmp-step-0000009999-1").mkdir()
    with open(run_dir / "scalars.jsonl", "a") as fh:
        fh.write('{"step": 99')
    last = max(steps[-1], *(r["step"] for r in run.scalars()))
    m = _model()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        w = attnscope.watch(m, _probe(), every=1, run_dir=run_dir, vocab=VOCAB)
        assert w.last_step == last
        assert not w.step(last, loss=0.0)  # already there: not written twice
        assert w.step(last + 1, loss=1.0)
        w.close()
    assert any("already holds steps" in str(x.message) for x in said)
    run = Run.open(run_dir)
    assert run.steps()[-1] == last + 1
    assert not list((run_dir / "steps").glob(".tmp-*"))
    assert [r["step"] for r in run.scalars()][-1] == last + 1
    assert (run_dir / "scalars.jsonl").read_bytes().endswith(b"\n")


def test_probe_forms_and_labels(tmp_path):
    m = _model(dropout=0.0)
    src, tgt = _probe()
    stoi = {t: i for i, t in enumerate(VOCAB)}
    w = attnscope.watch(m, {"src": src, "tgt": tgt}, every=1, run_dir=tmp_path / "d", vocab=stoi)
    w.step(0)
    w.close()
    tr = Run.open(tmp_path / "d").traces(0)[0]
    assert tr.src_tokens[0] == "w4"
    # no vocabulary: the ids themselves
    w = attnscope.watch(m, (src, tgt), every=1, run_dir=tmp_path / "n")
    w.step(0)
    w.close()
    assert Run.open(tmp_path / "n").traces(0)[0].src_tokens[:2] == ("4", "5")


class MaskedInputs(torch.nn.Module):
    """The model called as Hugging Face models are: token ids beside a 0/1 attention mask (1 = a token)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        src_mask = attention_mask.bool().unsqueeze(-2)
        tgt_mask = (decoder_input_ids != A.PAD).unsqueeze(-2) & A.subsequent_mask(decoder_input_ids.size(-1))
        inner = self.inner
        return inner.generator(
            inner.decode(inner.encode(input_ids, src_mask), src_mask, decoder_input_ids, tgt_mask)
        )


@pytest.mark.parametrize("form", ["dict", "tuple"])
def test_a_padding_mask_beside_the_ids_labels_no_side(tmp_path, form):
    """A 0/1 mask is a 2-D integer tensor too: the decoder side is labelled by the decoder's ids (the ones
    the model looked up in an embedding, or named so), never by the mask's 1s and 0s."""
    m = MaskedInputs(_model(dropout=0.0))
    src, tgt = _probe()
    src = src[:, :6]  # as long as the decoder input: the mask's labels would fit its side
    mask = (src != A.PAD).long()
    probe = (
        {"input_ids": src, "attention_mask": mask, "decoder_input_ids": tgt}
        if form == "dict"
        else (src, mask, tgt)
    )
    run = tmp_path / form
    w = attnscope.watch(m, probe, every=1, run_dir=run, vocab=VOCAB)
    w.step(0)
    w.close()
    tr = Run.open(run).traces(0)[1]
    assert tr.src_tokens == tuple(VOCAB[i] for i in src[1].tolist())
    assert tr.tgt_tokens == tuple(VOCAB[i] for i in tgt[1].tolist())
    assert "cross" in tr.kinds and "dec_self" in tr.kinds


def test_a_step_counter_that_restarts_each_epoch_writes_over_nothing(tmp_path):
    """Steps 0..3 of a second epoch come after step 3 of the first: they are not written (the first
    epoch's probes and scalars stay as they were), and watch says so once."""
    m = _model(dropout=0.0)
    src, tgt = _probe()
    w = attnscope.watch(m, (src, tgt), every=2, run_dir=tmp_path / "e", vocab=VOCAB)
    for i in range(4):
        w.step(i, loss=1.0 + i)
    step0 = (tmp_path / "e").glob("steps/*0/probe-0.npz")
    before = {p: p.read_bytes() for p in step0}
    assert before
    with torch.no_grad():  # the model changes, so a step written again would differ
        for p in m.parameters():
            p.add_(0.1)
    with pytest.warns(UserWarning, match="step 0 came after step 3") as said:
        for i in range(4):
            assert w.step(i, loss=10.0 + i) is False
        w.log(1, accuracy=0.5)
    assert sum("came after" in str(x.message) for x in said) == 1
    w.step(4, loss=5.0)  # the counter going on again is written
    w.close()
    run = Run.open(tmp_path / "e")
    assert {p: p.read_bytes() for p in before} == before
    assert [r["step"] for r in run.scalars()] == [0, 1, 2, 3, 4]
    assert run.series()["loss"][1] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert run.steps() == [0, 2, 4]


def test_an_adapter_probe_of_texts(tmp_path):
    adapter = ROOT / "examples" / "my_adapter.py"
    from attnscope.core.families.adapter import load_adapter

    lm = load_adapter(adapter)
    model = lm.model
    w = attnscope.watch(model, ["hello", "abc"], every=2, run_dir=tmp_path / "a", adapter=adapter,
                        targets=["olleh", "cba"], audit_every=2)  # fmt: skip
    w.step(0, loss=1.0)
    w.close()
    run = Run.open(tmp_path / "a")
    traces = run.traces(0)
    assert [t.src_tokens[:5] for t in traces][0] == tuple("hello")
    want = lm.trace(["hello", "abc"], ["olleh", "cba"])
    np.testing.assert_allclose(traces[0].probs("cross"), want[0].probs("cross"), atol=1e-3)
    assert run.audits()[0]["passed"]
    assert run.header["probe"]["texts"] == ["hello", "abc"]


def test_bad_arguments_are_one_sentence(tmp_path):
    m = _model()
    with pytest.raises(ValueError, match="needs adapter="):
        attnscope.watch(m, ["some text"], run_dir=tmp_path / "x")
    with pytest.raises(ValueError, match="every must be"):
        attnscope.watch(m, _probe(), every=0, run_dir=tmp_path / "x")
    with pytest.raises(ValueError, match="audit_every needs"):
        attnscope.watch(m, _probe(), audit_every=5, run_dir=tmp_path / "x")
    with pytest.raises(ValueError, match="no attention was captured"):
        attnscope.watch(torch.nn.Linear(4, 4), torch.randn(2, 4), run_dir=tmp_path / "x")
    assert parse_size("500MB") == 500 << 20 and parse_size("1 GB") == 1 << 30 and parse_size(1000) == 1000
    with pytest.raises(ValueError, match="size"):
        parse_size("lots")


def test_a_probe_that_fails_later_does_not_stop_training(tmp_path):
    m = _model(dropout=0.0)
    state = {"fail": False}

    def forward(model, probe):
        if state["fail"]:
            raise RuntimeError("out of memory (pretend)")
        return model(*probe)

    w = attnscope.watch(m, _probe(), every=1, run_dir=tmp_path / "r", forward=forward)
    state["fail"] = True
    with pytest.warns(UserWarning, match="could not probe step 1"):
        assert not w.step(1, loss=2.0)
    w.close()
    rec = Run.open(tmp_path / "r").by_step()[1]
    assert rec["loss"] == 2.0 and "out of memory" in rec["watch_error"]


@pytest.mark.parametrize(
    "header, message",
    [
        ("not json", "not JSON"),
        ("[" * 50 + "]" * 50, "nests deeper"),
        (json.dumps({"format": "other"}), "not an attnscope run"),
        (json.dumps({"format": "attnscope-run", "version": 99}), "version 99"),
        (json.dumps({"format": "attnscope-run", "version": 1, "every": "often"}), "every"),
    ],
)
def test_the_reader_refuses_bad_headers_in_one_sentence(tmp_path, header, message):
    (tmp_path / "run.json").write_text(header)
    with pytest.raises(RunFormatError, match=message):
        Run.open(tmp_path)


def test_the_reader_refuses_bad_parts_in_one_sentence(tmp_path):
    m = _model(dropout=0.0)
    w = attnscope.watch(m, _probe(), every=1, run_dir=tmp_path / "r", vocab=VOCAB)
    w.step(0)
    w.close()
    run = Run.open(tmp_path / "r")
    step_dir = tmp_path / "r" / "steps" / runfile.step_dir_name(0)
    (step_dir / "probe-1.npz").write_bytes(b"PK\x03\x04 broken")
    with pytest.raises(RunFormatError, match="step 0"):
        run.traces(0)
    (step_dir / "step.json").write_text(json.dumps({"step": 0, "probe": 10**6}))
    with pytest.raises(RunFormatError, match="probe"):
        run.traces(0)
    (tmp_path / "r" / "scalars.jsonl").write_text('{"step": 0}\n{"no step": 1}\n')
    with pytest.raises(RunFormatError, match="line 2"):
        run.scalars()
    with pytest.raises(RunFormatError, match="not a folder"):
        Run.open(tmp_path / "missing")


def test_the_example_trains_and_writes_a_run_that_opens(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("watch_training", ROOT / "examples" / "watch_training.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    model, _ = ex.train(20, str(tmp_path / "run"), every=10)
    run = Run.open(tmp_path / "run")
    assert run.steps() == [0, 10, 20]
    assert sorted(run.audits()) == [0, 10, 20] and all(a["passed"] for a in run.audits().values())
    traces = run.traces(20)
    assert len(traces) == len(ex.PROBE) and traces[0].src_tokens == (
        *ex.PROBE[0],
        "<eos>",
        "<pad>",
        "<pad>",
        "<pad>",
        "<pad>",
        "<pad>",
    )
    assert len(run.series()["loss"][0]) == 21


def test_a_step_with_weights_replays_any_input(tmp_path):
    adapter = ROOT / "examples" / "my_adapter.py"
    from attnscope.core.families.adapter import load_adapter
    from attnscope.models import registry

    model = load_adapter(adapter).model
    with torch.no_grad():  # a different model at step 0 than the adapter's trained one
        for p in model.parameters():
            p.mul_(0.5)
    w = attnscope.watch(model, ["hello"], every=1, run_dir=tmp_path / "r", adapter=adapter, targets=["olleh"],
                        keep_weights=True)  # fmt: skip
    w.step(0)
    w.close()
    lm = attnscope.load(f"{tmp_path / 'r'}@0")
    assert registry.model_kind(f"{tmp_path / 'r'}@0") == "adapter"
    recorded = Run.open(tmp_path / "r").traces(0)[0]
    replayed = lm.trace(["hello"], ["olleh"])[0]
    np.testing.assert_allclose(replayed.probs("cross"), recorded.probs("cross"), atol=2e-2)  # float16 weights
    trained = load_adapter(adapter).trace(["hello"], ["olleh"])[0]
    assert np.abs(trained.probs("cross") - recorded.probs("cross")).max() > 0.05  # the step's, not the file's
    other = lm.trace(["a different input"])[0]  # any input, not only the probe
    assert other.src_tokens[:3] == ("a", " ", "d")
    from attnscope.core.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="no step 7"):
        attnscope.load(f"{tmp_path / 'r'}@7")
    w = attnscope.watch(model, ["hello"], every=1, run_dir=tmp_path / "nw", adapter=adapter)
    w.step(0)
    w.close()
    with pytest.raises(ModelLoadError, match="kept no weights"):
        attnscope.load(f"{tmp_path / 'nw'}@0")


def test_a_compiled_model_is_probed_through_its_original_module(tmp_path, monkeypatch):
    """torch.compile's wrapper: the probe runs on ``_orig_mod`` (eager, where capture sees every op), so
    watching never triggers a compilation and records the same maps as the module itself."""
    m = _model(dropout=0.0).eval()
    compiled = torch.compile(m)
    assert compiled._orig_mod is m
    calls = []
    monkeypatch.setattr(type(compiled), "forward", lambda self, *a, **k: calls.append(1))  # never called
    w = attnscope.watch(compiled, _probe(), every=1, run_dir=tmp_path / "r", vocab=VOCAB)
    assert w.step(0, loss=1.0)
    w.close()
    assert not calls
    src, tgt = _probe()
    with attnscope.capture_attention(m) as cap:
        m(src, tgt)
    got = Run.open(tmp_path / "r").traces(0)[0].probs("cross")
    np.testing.assert_allclose(got, cap.stacks()["cross"][0].numpy(), atol=1e-3)
