"""Run folders (attnscope.watch) in the dashboard: ``attnscope view FOLDER`` and the sidebar's "Open a
run" box open them on the Training page (slider over every watched step, loss curve, entropy per head,
the animation thinned to stay small, the mask audit's first failure named), the slider follows a run
being written only when it was on the newest step, Compare takes two steps, and bad folders are one
sentence. The pure pieces (the animation's choice of frames, the curves) are tested on their own.
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch
from apptest_helpers import _array, assert_clean, assert_no_exception, figure, run_app

import attnscope
from attnscope import cli
from attnscope.core.runs.runfile import Run
from attnscope.dashboard import keys as K
from attnscope.dashboard import watched
from attnscope.dashboard.plots import training as P
from tests.usermodels import annotated as A

VOCAB = [f"w{i}" for i in range(20)]


def _drop_causal_after(model, flag: dict):
    """The annotated model's forward, but without the causal mask once ``flag["drop"]`` is set."""

    def forward(self, src, tgt):
        src_mask = (src != A.PAD).unsqueeze(-2)
        tgt_mask = (tgt != A.PAD).unsqueeze(-2)
        if not flag["drop"]:
            tgt_mask = tgt_mask & A.subsequent_mask(tgt.size(-1)).type_as(src_mask)
        memory = self.encode(src, src_mask)
        return self.generator(self.decode(memory, src_mask, tgt, tgt_mask))

    model.forward = types.MethodType(forward, model)


def start_run(folder, *, audit_every=10, drop_after=None):
    """A watcher on the annotated encoder-decoder, and the function that trains it up to a step."""
    torch.manual_seed(0)
    m = A.make_model(dropout=0.1)
    src, tgt = A.sample_batch()
    flag = {"drop": False}
    if drop_after is not None:
        _drop_causal_after(m, flag)
    opt = torch.optim.Adam(m.parameters(), 1e-3)
    w = attnscope.watch(m, probe=(src, tgt), every=5, run_dir=folder, vocab=VOCAB, arch="encoder-decoder",
                        pad=0, audit_every=audit_every)  # fmt: skip
    m.train()
    done = [0]

    def train_to(last: int) -> None:
        for step in range(done[0], last + 1):
            flag["drop"] = drop_after is not None and step > drop_after
            loss = -m(src, tgt).gather(-1, tgt[..., None]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(step, loss=loss)
        done[0] = last + 1

    return w, train_to


def make_run(folder, last=20, **kw):
    w, train_to = start_run(folder, **kw)
    train_to(last)
    w.close()
    return folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("runs") / "toy")


@pytest.fixture(scope="module")
def leaky_run(tmp_path_factory):
    """The causal mask is dropped after step 10; the audit runs every 5 steps, so it fails from 15."""
    return make_run(tmp_path_factory.mktemp("runs") / "leaky", audit_every=5, drop_after=10)


@pytest.fixture(autouse=True)
def _fresh_caches():
    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()


def _slider(at):
    return at.select_slider(key=K.TRAIN_STEP)


# -- the pure pieces -----------------------------------------------------------------------------


def test_log_spaced_keeps_the_ends_and_favours_early_steps():
    steps = list(range(0, 1001, 10))
    got = P.log_spaced(steps, 8)
    assert got[0] == 0 and got[-1] == 1000 and len(got) == len(set(got)) == 8 and got == sorted(got)
    assert sum(s < 500 for s in got) > sum(s >= 500 for s in got)
    assert P.log_spaced([3, 1, 2], 5) == [1, 2, 3]
    assert P.log_spaced([0, 5], 1) == [5]


def _figure_bytes(plan, n_layers, n_heads, nq, nk) -> int:
    rng = np.random.default_rng(0)
    p = rng.random((n_layers, n_heads, nq, nk)).astype(np.float32)
    p /= p.sum(-1, keepdims=True)
    toks_q, toks_k = [f"q{i}" for i in range(nq)], [f"k{i}" for i in range(nk)]
    fig = P.replay_figure([p] * len(plan.steps), list(plan.steps), toks_q, toks_k, title="t",
                          max_tile=plan.max_tile)  # fmt: skip
    return len(fig.to_json())


def test_replay_plan_plays_every_step_when_it_fits():
    plan = P.replay_plan([0, 5, 10, 15], 2, 4, 6, 7)
    assert plan.steps == (0, 5, 10, 15) and not plan.thinned and not plan.pooled
    assert plan.max_tile == P.GRID_MAX_TILE


@pytest.mark.parametrize(
    ("shape", "budget"),
    [((2, 4, 30, 30), 200_000), ((4, 4, 300, 300), 400_000), ((12, 12, 64, 64), 1_000_000)],
)
def test_replay_plan_stays_under_the_budget(shape, budget):
    steps = list(range(0, 2000, 10))
    plan = P.replay_plan(steps, *shape, max_bytes=budget)
    assert plan.thinned and 2 <= len(plan.steps) <= P.MAX_FRAMES
    assert plan.steps[0] == 0 and plan.steps[-1] == steps[-1]
    assert plan.total_bytes <= budget
    assert _figure_bytes(plan, *shape) <= budget  # the estimate holds for the real figure
    if max(shape[2:]) > plan.max_tile:
        assert plan.pooled == (plan.max_tile < P.GRID_MAX_TILE)
    if len(plan.steps) < P.MIN_FRAMES:  # frames go below the floor only once tiles are as coarse as allowed
        assert plan.max_tile == P.MIN_TILE


def test_run_curves_figure_draws_loss_first_and_marks_the_steps():
    series = {"acc": ([0, 1, 2], [0.1, 0.5, 0.9]), "loss": ([0, 1, 2], [3.0, 2.0, 1.0])}
    fig = P.run_curves_figure(series, 1, title="t", failed_step=2)
    assert [t.name for t in fig.data] == ["loss", "acc"]
    assert list(fig.data[0].y) == [3.0, 2.0, 1.0]
    xs = sorted({s.x0 for s in fig.layout.shapes})
    assert xs == [1, 2]
    assert any("audit failed" in a.text for a in fig.layout.annotations)
    long = {"loss": (list(range(10_000)), [1.0] * 10_000)}
    drawn = P.run_curves_figure(long, None, title="t", max_points=100).data[0]
    assert len(drawn.x) <= 101 and drawn.x[-1] == 9_999


# -- the dashboard -------------------------------------------------------------------------------


def test_view_env_opens_the_run_on_the_training_page(run_dir, monkeypatch):
    run = Run.open(run_dir)
    steps = run.steps()
    monkeypatch.setenv(watched.RUN_ENV, str(run_dir))
    at = run_app()
    assert_clean(at)
    assert [t.value for t in at.title] == ["Training"]
    assert at.session_state[K.RUN] == str(run_dir)
    slider = _slider(at)
    assert slider.options == [f"{s:,}" for s in steps] and slider.value == steps[-1]
    loss = figure(at, "loss and metrics")
    assert loss["data"][0]["name"] == "loss"
    np.testing.assert_allclose(_array(loss["data"][0]["y"]), run.series()["loss"][1])
    assert figure(at, f"at step {steps[-1]}: all layers")
    entropy = figure(at, "entropy per head")
    assert len(entropy["data"]) == 2 * 4  # one line per head: 2 layers x 4 heads
    replay = figure(at, "through training")
    assert [f["name"] for f in replay["frames"]] == [str(s) for s in steps]
    assert any("audit passed at all 3 audited steps" in s.value for s in at.success)

    slider.set_value(5).run()  # another step: the grid follows the slider
    assert_clean(at)
    assert figure(at, "at step 5: all layers")
    at.selectbox(key=K.TRAIN_PROBE).set_value(2).run()
    at.radio(key=K.TRAIN_KIND).set_value("cross").run()
    assert_clean(at)
    grid = figure(at, "cross-attention at step 5")
    probs = run.traces(5)[2].probs("cross")  # [layer, head, query, key]: 2 x 4 x 6 x 7
    z = _array(grid["data"][0]["z"])
    assert z.shape == (2 * 6, 4 * 7)
    np.testing.assert_allclose(z[:6, :7], np.rint(probs[0, 0] * 100), atol=1)  # layer 0, head 0


def test_the_slider_follows_a_growing_run_only_from_the_newest_step(tmp_path, monkeypatch):
    w, train_to = start_run(tmp_path / "growing", audit_every=None)
    train_to(10)
    monkeypatch.setenv(watched.RUN_ENV, str(tmp_path / "growing"))
    at = run_app()
    assert_clean(at)
    assert _slider(at).value == 10
    assert any("Live" in c.value for c in at.caption)
    train_to(15)
    at.run()
    assert _slider(at).value == 15 and _slider(at).options[-1] == "15"  # on the newest: it follows
    _slider(at).set_value(5).run()
    train_to(20)
    at.run()
    assert_clean(at)
    assert _slider(at).value == 5 and _slider(at).options[-1] == "20"  # elsewhere: it stays
    assert figure(at, "at step 5: all layers")
    w.close()


def test_the_first_failed_audit_is_named_and_marked(leaky_run, monkeypatch):
    run = Run.open(leaky_run)
    step, audit = run.first_failed_audit()
    assert step == 15 and audit["failed"]
    monkeypatch.setenv(watched.RUN_ENV, str(leaky_run))
    at = run_app()
    assert_no_exception(at)
    said = [e.value for e in at.error]
    assert len(said) == 1 and "first failed at step 15" in said[0], said
    for name in audit["failed"]:
        assert name in said[0]
    assert audit["lines"][0] in said[0]
    curves = figure(at, "loss and metrics")
    lines = [s for s in curves["layout"]["shapes"] if s["line"]["color"] == P.FAILED]
    assert lines and all(s["x0"] == 15 for s in lines)


def test_a_thinned_animation_says_so(run_dir, monkeypatch):
    monkeypatch.setattr(P, "REPLAY_MAX_BYTES", 1)  # nothing fits: the first and the newest step only
    monkeypatch.setenv(watched.RUN_ENV, str(run_dir))
    at = run_app()
    assert_clean(at)
    replay = figure(at, "through training")
    assert [f["name"] for f in replay["frames"]] == ["0", "20"]
    assert any("Thinned" in c.value and "log-spaced" in c.value for c in at.caption)
    assert _slider(at).options == [f"{s:,}" for s in Run.open(run_dir).steps()]  # the slider keeps all


def test_open_a_run_from_the_sidebar_inside_the_allowed_folders(run_dir, monkeypatch):
    at = run_app("reverse", "attention")
    at.sidebar.text_input(key=K.RUN_PATH).input("/etc").run()
    at.sidebar.button(key=K.RUN_PATH_BUTTON).click().run()
    assert_no_exception(at)
    said = [e.value for e in at.sidebar.error]
    assert len(said) == 1 and "outside the folders" in said[0], said
    assert not at.session_state[K.RUN] if K.RUN in at.session_state else True

    monkeypatch.setenv("ATTNSCOPE_MODEL_DIRS", str(run_dir.parent))
    at.sidebar.text_input(key=K.RUN_PATH).input(str(run_dir))
    at.sidebar.button(key=K.RUN_PATH_BUTTON).click().run()
    assert_clean(at)
    assert at.session_state[K.RUN] == str(run_dir)
    assert [t.value for t in at.title] == ["Training"]  # the run shows on the Training page
    assert _slider(at).value == Run.open(run_dir).steps()[-1]
    at.switch_page("app_pages/attention.py").run()  # other pages keep the sidebar's model
    assert_clean(at)
    assert figure(at, "· layer 0 · head 0")
    at.sidebar.button(key=K.RUN_CLOSE_BUTTON).click().run()
    at.switch_page("app_pages/training.py").run()
    assert_clean(at)
    assert at.session_state[K.RUN] is None and figure(at, "learning curves")  # the zoo's replay again


def test_bad_folders_are_one_sentence(run_dir, tmp_path, monkeypatch):
    not_run = tmp_path / "plain"
    not_run.mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "run.json").write_text('{"format": "attnscope-run", "version": 99}')
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for bad in (not_run, broken, tmp_path / "missing"):
        monkeypatch.setenv(watched.RUN_ENV, str(bad))
        at = run_app()
        assert_no_exception(at)
        said = [e.value for e in at.sidebar.error]
        assert len(said) == 1 and said[0].startswith("Cannot open") and "\n" not in said[0], said
        assert [t.value for t in at.title] == ["Attention"]  # the app goes on with the model
    monkeypatch.delenv(watched.RUN_ENV)
    monkeypatch.setenv("ATTNSCOPE_MODEL_DIRS", str(tmp_path))
    at = run_app()
    for bad in (not_run, broken, a_file, tmp_path / "missing", ""):
        at.sidebar.text_input(key=K.RUN_PATH).input(str(bad))
        at.sidebar.button(key=K.RUN_PATH_BUTTON).click().run()
        assert_no_exception(at)
        said = [e.value for e in at.sidebar.error]
        assert len(said) == 1 and said[0].startswith("Cannot open") and "\n" not in said[0], (bad, said)


def test_attnscope_view_checks_the_folder_before_serving(run_dir, tmp_path, monkeypatch, capsys):
    (tmp_path / "plain").mkdir()
    assert cli.main(["view", str(tmp_path / "plain")]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "run.json" in err[0], err
    served = {}

    def fake_exec(exe, cmd, env):
        served.update(env)
        raise SystemExit(0)

    monkeypatch.setattr(cli.os, "execve", fake_exec)
    with pytest.raises(SystemExit):
        cli.main(["view", str(run_dir), "--port", "8599"])
    assert served[cli.RUN_ENV] == str(run_dir.resolve()) and cli.VIEW_ENV not in served
    assert "run toy (5 watched steps, latest 20)" in capsys.readouterr().out
    assert cli.RUN_ENV == watched.RUN_ENV


def test_compare_two_steps_of_the_run(run_dir, monkeypatch):
    run = Run.open(run_dir)
    steps = run.steps()
    monkeypatch.setenv(watched.RUN_ENV, str(run_dir))
    at = run_app(page="compare")
    assert_clean(at)
    assert at.radio(key=K.CMP_MODE).value == "two steps of the open run"
    assert at.select_slider(key=K.CMP_RUN_A).value == steps[0]
    at.select_slider(key=K.CMP_RUN_B).set_value(10).run()
    at.selectbox(key=K.CMP_SEQ).set_value(1).run()
    at.radio(key=K.CMP_KIND).set_value("dec_self").run()
    at.selectbox(key=K.CMP_LAYER).set_value(1).run()
    at.selectbox(key=K.CMP_HEAD).set_value(2).run()
    assert_clean(at)
    a, b = run.traces(steps[0])[1], run.traces(10)[1]
    fa = figure(at, f"at step {steps[0]}<br>")
    fb = figure(at, "B: step 10<br>")
    np.testing.assert_allclose(_array(fa["data"][0]["z"]), a.probs("dec_self")[1, 2], atol=1e-6)
    np.testing.assert_allclose(_array(fb["data"][0]["z"]), b.probs("dec_self")[1, 2], atol=1e-6)
    diff = figure(at, "B − A")
    want = b.probs("dec_self")[1, 2] - a.probs("dec_self")[1, 2]
    np.testing.assert_allclose(_array(diff["data"][0]["z"]), want, atol=1e-4)


def test_another_input_at_a_step_of_a_run_with_weights_and_an_adapter(tmp_path, monkeypatch):
    """A run watched with keep_weights and an adapter replays any input at its steps (the page's
    "Another input at this step"), with the model as it was there; without code allowed it says why."""
    import attnscope
    from attnscope.core.families.adapter import load_adapter
    from attnscope.dashboard import user_models

    adapter = Path(__file__).resolve().parents[1] / "examples" / "my_adapter.py"
    model = load_adapter(adapter).model
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)  # step 0 is not the adapter's trained model
    w = attnscope.watch(model, ["hello"], every=1, run_dir=tmp_path / "r", adapter=adapter,
                        targets=["olleh"], keep_weights=True)  # fmt: skip
    w.step(0)
    w.close()
    monkeypatch.setenv(watched.RUN_ENV, str(tmp_path / "r"))
    monkeypatch.delenv(user_models.ALLOW_CODE_ENV, raising=False)
    at = run_app()
    assert_clean(at)
    assert any(user_models.ALLOW_CODE_ENV in c.value for c in at.caption)  # code off: said, not run
    monkeypatch.setenv(user_models.ALLOW_CODE_ENV, "1")
    at = run_app()
    at.text_input(key="run_other_input").input("world").run()
    assert_clean(at)
    grid = figure(at, "of 'world' at step 0")
    want = attnscope.load(f"{tmp_path / 'r'}@0").trace(["world"], truncate=True)[0]
    kind = "cross" if "cross-attention" in grid["layout"]["title"]["text"] else "enc_self"
    z = _array(grid["data"][0]["z"])
    probs = want.probs(kind)
    nq, nk = probs.shape[2:]
    np.testing.assert_allclose(z[:nq, :nk], np.rint(probs[0, 0] * 100), atol=1)


def test_a_run_says_what_its_maps_leave_out(tmp_path, monkeypatch):
    """A watched model with an attention-pooling head (keys ``x[:, 1:]``): the run's maps are the encoder's,
    and the Training page says the pool was left out of them."""
    from tests.test_capture_trace_tokens import Pooled, _ids

    w = attnscope.watch(Pooled(), _ids(), every=1, run_dir=tmp_path / "pooled")
    w.step(0)
    w.close()
    monkeypatch.setenv(watched.RUN_ENV, str(tmp_path / "pooled"))
    at = run_app()
    assert_clean(at)
    assert figure(at, "at step 0: all layers")
    said = [m.value for m in at.warning if m.value.startswith("Capture's notes on these maps")]
    assert len(said) == 1 and "cross (pool) left out of the trace" in said[0], [m.value for m in at.warning]


def test_a_loss_that_diverged_is_said_on_the_page(tmp_path, monkeypatch):
    """A NaN loss is kept as null in the run, named under not_finite, and the Training page says from which
    step the curve leaves it out."""
    torch.manual_seed(0)
    m = A.make_model(dropout=0.0)
    w = attnscope.watch(m, probe=A.sample_batch(), every=2, run_dir=tmp_path / "nan", vocab=VOCAB)
    with pytest.warns(UserWarning, match="loss is not finite at step 3"):
        for step, loss in enumerate([2.0, 1.5, 1.2, float("nan"), float("inf"), 0.9]):
            w.step(step, loss=torch.tensor(loss))
    w.close()
    run = Run.open(tmp_path / "nan")
    assert run.not_finite() == {"loss": 3}
    assert run.series()["loss"] == ([0, 1, 2, 5], [2.0, 1.5, pytest.approx(1.2), pytest.approx(0.9)])
    assert run.by_step()[4]["loss"] is None and run.by_step()[4]["not_finite"] == ["loss"]
    monkeypatch.setenv(watched.RUN_ENV, str(tmp_path / "nan"))
    at = run_app()
    assert_clean(at)
    said = [m.value for m in at.warning if "Not finite" in m.value]
    assert len(said) == 1 and "loss first at step 3" in said[0], [m.value for m in at.warning]
