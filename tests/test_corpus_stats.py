"""core stats: per-head statistics over a corpus, equal to a line-by-line computation; bad lines
counted, never fatal; resumable after an interrupt; the same under torchrun with 2 CPU processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnscope.core.analysis import corpus
from attnscope.core.families.native import load_folder

ROOT = Path(__file__).resolve().parents[1]
GOOD = ["hello world", "abc", "attention is all you need", "the cat sat", "a", "mask (or not)", "x = y;",
        "zzz top", "one two three", "(())", "quick brown fox", "jumps", "over the lazy dog", "42 is it"]  # fmt: skip
BAD = {"": "empty", "ÉCOLE": "outside the vocabulary", "a" * 60: "too long"}


@pytest.fixture(scope="module")
def lines_file(tmp_path_factory) -> Path:
    lines = [*GOOD * 3, *BAD]  # 42 good lines, then one of each bad kind
    path = tmp_path_factory.mktemp("corpus") / "lines.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnscope", "stats", *args], capture_output=True, text=True, timeout=300,
        cwd=cwd or ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )  # fmt: skip


@pytest.fixture(scope="module")
def single(tiny_folder, lines_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "stats.parquet"
    done = _cli(
        "--model", str(tiny_folder), "--input-file", str(lines_file), "--out", str(out), "--batch", "8"
    )
    assert done.returncode == 0, done.stderr
    return out, done


def test_statistics_equal_a_line_by_line_computation(single, tiny_folder, lines_file):
    out, done = single
    frame, meta = corpus.read(out)
    assert meta["n_inputs"] == len(GOOD) * 3 and meta["model"] == str(tiny_folder)
    lm = load_folder(tiny_folder)
    per_line = [corpus.trace_stats(lm.trace([t])[0], lm.cfg.pad_id) for t in GOOD * 3]
    assert set(frame["kind"]) == {"enc_self", "dec_self", "cross"}
    assert set(frame["stat"]) == set(corpus.STATS) - {"monotonic"} | {"monotonic"}
    for kind in ("enc_self", "cross"):
        for stat in ("entropy", "distance", "previous", "specials", "punctuation"):
            values = np.stack([s[kind][stat] for s in per_line])  # (lines, layer, head)
            np.testing.assert_allclose(
                corpus.stat_matrix(frame, kind, stat), np.nanmean(values, 0), atol=1e-6
            )
            np.testing.assert_allclose(
                corpus.stat_matrix(frame, kind, stat, "std"), np.nanstd(values, 0, ddof=1), atol=1e-6
            )
            np.testing.assert_allclose(
                corpus.stat_matrix(frame, kind, stat, "max"), np.nanmax(values, 0), atol=1e-6
            )
            # the most atypical inputs: the line with the highest value of layer 0 head 0 is first in top_high
            row = frame[
                (frame["kind"] == kind)
                & (frame["stat"] == stat)
                & (frame["layer"] == 0)
                & (frame["head"] == 0)
            ].iloc[0]
            top = json.loads(row["top_high"])
            assert len(top) == corpus.TOP_K
            assert top[0]["value"] == pytest.approx(values[:, 0, 0].max(), abs=1e-6)
            assert top[0]["text"] == (GOOD * 3)[top[0]["line"]]


def _reference(trace, kind: str) -> dict[str, np.ndarray]:
    """Every statistic of one kind of one trace by plain loops over layers, heads, rows and keys:
    written from the statistics' definitions, independent of attnscope.core.analysis."""
    sides = {"enc_self": ("src", "src"), "dec_self": ("tgt", "tgt"), "cross": ("tgt", "src")}[kind]
    real = {"src": trace.src_real, "tgt": trace.tgt_real}
    q_ok, k_ok = (np.asarray(real[s], bool) for s in sides)
    _, keys = trace.axes(kind)
    p = np.asarray(trace.probs(kind), dtype=np.float64)
    n_layers, n_heads, n_q, n_k = p.shape
    qs = [q for q in range(n_q) if q_ok[q]]
    ks = [k for k in range(n_k) if k_ok[k]]
    names = [
        "entropy",
        "distance",
        "diagonal",
        "previous",
        "next",
        "first",
        "last",
        "specials",
        "punctuation",
    ]
    names += ["monotonic"] if kind == "cross" else []
    vnorms = trace.value_norms(kind)
    names += ["sink_weight"] + (["sink_moves", "vw_entropy"] if vnorms is not None else [])
    # sinks: the first real key, special tokens other than PAD, punctuation (PAD keys are not real)
    sinks = [k for k in ks if k == ks[0] or corpus.is_punctuation(keys[k])
             or (corpus.is_special(keys[k]) and keys[k] not in ("<pad>", "[PAD]"))]  # fmt: skip
    out = {n: np.full((n_layers, n_heads), np.nan) for n in names}
    for ly in range(n_layers):
        for h in range(n_heads):
            rows = {n: [] for n in names}
            for q in qs:
                w = p[ly, h, q]
                rows["entropy"].append(-sum(w[k] * math.log(w[k]) for k in ks if w[k] > 0))
                rows["distance"].append(sum(w[k] * abs(q - k) for k in ks))
                for name, off in (("diagonal", 0), ("previous", -1), ("next", 1)):
                    if 0 <= q + off < n_k and k_ok[q + off]:
                        rows[name].append(w[q + off])
                rows["first"].append(w[ks[0]])
                rows["last"].append(w[ks[-1]])
                rows["specials"].append(sum(w[k] for k in ks if corpus.is_special(keys[k])))
                rows["punctuation"].append(sum(w[k] for k in ks if corpus.is_punctuation(keys[k])))
                rows["sink_weight"].append(sum(w[k] for k in sinks))
                if vnorms is not None:  # what moves: alpha_qk ||f(x_k)||, the row scaled to sum 1
                    moved = {k: w[k] * float(vnorms[ly, h, k]) for k in ks}
                    total = sum(moved.values())
                    share = {k: v / total for k, v in moved.items()} if total > 0 else dict.fromkeys(ks, 0.0)
                    rows["sink_moves"].append(sum(share[k] for k in sinks))
                    rows["vw_entropy"].append(-sum(x * math.log(x) for x in share.values() if x > 0))
            for n in names:
                if rows[n]:
                    out[n][ly, h] = sum(rows[n]) / len(rows[n])
            if kind == "cross" and len(qs) > 1:
                best = [max(ks, key=lambda k, q=q: p[ly, h, q, k]) for q in qs]
                pairs = [(i, j) for i in range(len(qs)) for j in range(i + 1, len(qs))]
                out["monotonic"][ly, h] = sum(np.sign(best[j] - best[i]) for i, j in pairs) / len(pairs)
    return out


def test_every_statistic_of_every_kind_equals_an_independent_reference(single, tiny_folder):
    """Each statistic's corpus mean, for every kind, against plain loops written from its definition."""
    out, _ = single
    frame, _ = corpus.read(out)
    lm = load_folder(tiny_folder)
    lines = GOOD * 3
    per_line = [lm.trace([t])[0] for t in lines]
    assert set(frame["kind"]) == {"enc_self", "dec_self", "cross"}
    for kind in ("enc_self", "dec_self", "cross"):
        refs = [_reference(tr, kind) for tr in per_line]
        assert {"sink_weight", "sink_moves", "vw_entropy"} <= set(refs[0])  # the fixture carries value norms
        for stat in refs[0]:
            want = np.nanmean(np.stack([r[stat] for r in refs]), 0)
            got = corpus.stat_matrix(frame, kind, stat)
            np.testing.assert_allclose(got, want, atol=1e-5, err_msg=f"{kind} {stat}")


def test_bad_lines_are_counted_and_reported(single):
    out, done = single
    _, meta = corpus.read(out)
    assert meta["skipped"] == {"empty": 1, "outside the vocabulary": 1, "too long": 1}
    assert "lines skipped: 1 empty, 1 outside the vocabulary, 1 too long" in done.stdout
    # the summary names the parked heads (or says there are none), with its thresholds
    frame, _ = corpus.read(out)
    parked = corpus.parked_heads(frame)
    assert "parked heads (weight on sinks >= 50%, what moves from them <= 0.5 x that)" in done.stdout
    assert (f": {len(parked)}: " if parked else ": none") in done.stdout
    assert not Path(str(out) + ".partial.json").exists()  # a finished run leaves no partial state


def test_parked_heads_over_a_corpus_follow_the_means():
    rows = []
    for (ly, h), (w, m) in {
        (0, 0): (0.8, 0.3),
        (0, 1): (0.8, 0.5),
        (1, 0): (0.4, 0.0),
        (1, 1): (0.5, 0.25),
    }.items():
        for stat, v in (("sink_weight", w), ("sink_moves", m)):
            rows.append({"kind": "enc_self", "layer": ly, "head": h, "stat": stat, "mean": v})
    frame = pd.DataFrame(rows)
    got = [(r["layer"], r["head"]) for r in corpus.parked_heads(frame)]
    assert got == [
        (0, 0),
        (1, 1),
    ]  # 0.3 <= 0.4 and 0.25 <= 0.25; (0, 1) moves too much, (1, 0) weighs too little
    assert "2: enc_self L0 H0 (0.80 weight, 0.30 moves), enc_self L1 H1" in corpus.parked_summary(frame)
    assert "not measured" in corpus.parked_summary(frame[frame["stat"] == "sink_weight"])


def test_specials_and_punctuation_tokens():
    assert corpus.is_special("<eos>") and corpus.is_special("[CLS]") and corpus.is_special("<|endoftext|>")
    assert not corpus.is_special("<") and not corpus.is_special("hello")
    assert corpus.is_punctuation(";") and corpus.is_punctuation("Ġ,") and corpus.is_punctuation("...")
    assert (
        not corpus.is_punctuation("a")
        and not corpus.is_punctuation("<eos>")
        and not corpus.is_punctuation(" ")
    )


def test_resume_after_an_interrupt_gives_the_same_result(tiny_folder, lines_file, tmp_path):
    lm = load_folder(tiny_folder)
    lines = corpus.read_lines(lines_file)
    meta = {"model": "tiny", "n_lines": len(lines)}
    whole = corpus.run(lm, lines, batch=4, meta=meta).frame()
    partial = tmp_path / "s.parquet.partial.json"
    with pytest.raises(KeyboardInterrupt):
        corpus.run(lm, lines, batch=4, partial=partial, stop_after=3, meta=meta)
    saved = json.loads(partial.read_text())
    assert saved["next"] == 12 and saved["acc"]["n_inputs"] == 12
    resumed = corpus.run(lm, lines, batch=4, partial=partial, resume=True, meta=meta).frame()
    pd.testing.assert_frame_equal(resumed, whole)
    with pytest.raises(ValueError, match="another run"):
        corpus.run(lm, lines, batch=4, partial=partial, resume=True, meta={**meta, "model": "other"})


def test_torchrun_two_processes_equal_one(single, tiny_folder, lines_file, tmp_path):
    out1, _ = single
    out2 = tmp_path / "dist.parquet"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "attnscope", "stats",
         "--model", str(tiny_folder), "--input-file", str(lines_file), "--out", str(out2), "--batch", "8"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    a, meta_a = corpus.read(out1)
    b, meta_b = corpus.read(out2)
    assert (
        meta_b["world"] == 2
        and meta_b["n_inputs"] == meta_a["n_inputs"]
        and meta_b["skipped"] == meta_a["skipped"]
    )
    # rank 1 did its share: the inputs it computed, and lines only it read among the extremes
    assert meta_a["per_rank"] == [meta_a["n_inputs"]]
    assert len(meta_b["per_rank"]) == 2 and sum(meta_b["per_rank"]) == meta_b["n_inputs"]
    assert min(meta_b["per_rank"]) >= meta_b["n_inputs"] // 2 - 2
    odd = [d["line"] % 2 for col in ("top_high", "top_low") for cell in b[col] for d in json.loads(cell)]
    assert 1 in odd and 0 in odd  # line i goes to rank i mod 2
    assert (
        (a[["kind", "layer", "head", "stat", "n"]] == b[["kind", "layer", "head", "stat", "n"]]).all().all()
    )
    for col in ("mean", "std", "min", "max"):
        np.testing.assert_allclose(a[col].to_numpy(float), b[col].to_numpy(float), atol=1e-6, equal_nan=True)
    for col in ("top_high", "top_low"):  # the same inputs (repeated lines tie: compare values and texts)
        for x, y in zip(a[col], b[col], strict=True):
            x, y = json.loads(x), json.loads(y)
            np.testing.assert_allclose([d["value"] for d in x], [d["value"] for d in y], atol=1e-6)
            # inputs tied with the cut-off (within float noise: another batch's padding) may be either;
            # the ones clearly past it must be the same (a sink share of 1.0 ties across many inputs)
            cut = x[-1]["value"]
            assert sorted(d["text"] for d in x if abs(d["value"] - cut) > 1e-6) == sorted(
                d["text"] for d in y if abs(d["value"] - cut) > 1e-6
            )


def test_bad_arguments_and_files_get_one_line(tiny_folder, lines_file, tmp_path):
    done = _cli(
        "--model", str(tiny_folder), "--input-file", str(lines_file), "--out", str(tmp_path / "x.csv")
    )
    assert done.returncode == 2 and "must end in .parquet" in done.stderr
    done = _cli(
        "--model",
        str(tiny_folder),
        "--input-file",
        str(tmp_path / "nope.txt"),
        "--out",
        str(tmp_path / "x.parquet"),
    )
    assert done.returncode == 2 and "does not exist" in done.stderr and "Traceback" not in done.stderr
    not_stats = tmp_path / "other.parquet"
    pd.DataFrame({"a": [1]}).to_parquet(not_stats)
    with pytest.raises(ValueError, match="not an attnscope stats file"):
        corpus.read(not_stats)
    (tmp_path / "cut.parquet").write_bytes(not_stats.read_bytes()[:20])
    with pytest.raises(ValueError, match="not a readable Parquet file"):
        corpus.read(tmp_path / "cut.parquet")
