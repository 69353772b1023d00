"""Corpus statistics: what every head does over many inputs, streamed, resumable, and sharded.

``python -m attnscope stats --model X --input-file lines.txt --out stats.parquet`` runs every line through
the model in batches and keeps, per (kind, layer, head, statistic), running sums: count, sum, sum of
squares, min, max (float64), and the ``TOP_K`` inputs with the highest and the lowest value (the ones
where the head behaves most atypically). No trace is kept, so memory is flat in the number of lines.

Statistics per input (attnscope.core.analysis.analytics.head_stats over real positions): entropy, mean distance, the
head-type scores (diagonal/self, previous, next, first, last, monotonic for cross-attention), the
attention mass on special tokens (``<bos>``, ``[CLS]``, ...) and on punctuation keys, the share of
weight on sinks (first token, specials, punctuation) and, for traces that carry value norms, the
share of what moves from them and the value-weighted entropy (analytics.trace_sink_stats).

Resumable: every ``checkpoint_every`` batches the running state goes to ``OUT.partial.json`` (one per
process under torchrun); ``--resume`` continues from it after an interrupt and gives the same result.
Under ``torchrun --nproc_per_node=N`` each process takes every N-th line (line i goes to rank
i mod N) and the sums are reduced with ``torch.distributed`` (gloo on CPU, nccl on GPU); rank 0
writes the file. Lines the model cannot read (outside its vocabulary, too long, empty) are counted
and reported, never fatal.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.core.analysis.analytics import (
    CROSS_STATS,
    SINK_RATIO,
    SINK_WEIGHT,
    SPECIAL,  # noqa: F401  (re-exported: corpus.SPECIAL, corpus.is_special as before)
    WORD_MARKS,  # noqa: F401
    head_stats,
    is_punctuation,
    is_special,
    parked,
    trace_sink_stats,
)
from attnscope.core.analysis.audit import kind_sides, real_positions
from attnscope.core.errors import InputError
from attnscope.core.traces.trace import KINDS, AttentionTrace

TOP_K = 5
VALUE_STATS = ("vw_entropy", "sink_weight", "sink_moves")  # what attention moves (needs value norms)
STATS = (*CROSS_STATS, "specials", "punctuation", *VALUE_STATS)
STAT_LABELS = {
    "specials": "mass on special tokens",
    "punctuation": "mass on punctuation",
    "vw_entropy": "value-weighted entropy (nats)",
    "sink_weight": "share of weight on sinks",
    "sink_moves": "share of what moves from sinks",
}
FORMAT = "attnscope-corpus-stats/1"


def trace_stats(trace: AttentionTrace, pad_id: int | None) -> dict[str, dict[str, np.ndarray]]:
    """{kind: {stat: (layer, head)}} for one input: attnscope.core.analysis.analytics.head_stats plus the mass on special
    and punctuation keys (mean over real query rows)."""
    out = {}
    for kind in trace.kinds:
        qside, kside = kind_sides(kind)
        q_ok, k_ok = real_positions(trace, qside, pad_id), real_positions(trace, kside, pad_id)
        q_ok = q_ok & trace.asks(kind)
        probs = trace.probs(kind)
        stats = head_stats(probs, q_ok, k_ok, cross=kind == "cross")
        _, keys = trace.axes(kind)
        p = np.asarray(probs, dtype=np.float64)[..., q_ok, :]  # (L, H, Q', K)
        for name, test in (("specials", is_special), ("punctuation", is_punctuation)):
            sel = np.array([test(t) for t in keys]) & k_ok
            stats[name] = p[..., sel].sum(-1).mean(-1) if q_ok.any() else np.full(p.shape[:2], np.nan)
        sinks = trace_sink_stats(trace, kind, pad_id)
        stats["sink_weight"] = sinks["sink_weight"]
        if trace.value_norms(kind) is not None:  # traces without values (other families) leave them out
            stats["vw_entropy"], stats["sink_moves"] = sinks["vw_entropy"], sinks["sink_moves"]
        out[kind] = stats
    return out


def parked_heads(frame) -> list[dict]:
    """The heads parked over the corpus: mean share of weight on sinks >= SINK_WEIGHT and mean share
    of what moves from them <= SINK_RATIO x that (analytics.parked), by kind then weight share."""
    found = []
    for kind in (k for k in KINDS if k in set(frame["kind"])):
        have = set(frame[frame["kind"] == kind]["stat"])
        if not {"sink_weight", "sink_moves"} <= have:
            continue
        weight, moves = stat_matrix(frame, kind, "sink_weight"), stat_matrix(frame, kind, "sink_moves")
        for ly, h in zip(*np.nonzero(parked(weight, moves)), strict=True):
            found.append({"kind": kind, "layer": int(ly), "head": int(h),
                          "sink_weight": float(weight[ly, h]), "sink_moves": float(moves[ly, h])})  # fmt: skip
    return sorted(found, key=lambda r: (KINDS.index(r["kind"]), -r["sink_weight"]))


def parked_summary(frame) -> str:
    """One line for ``attnscope stats``: the parked heads, or that there are none (or no value norms)."""
    if "sink_moves" not in set(frame["stat"]):
        return "parked heads: not measured (the model's traces hold no value norms)"
    heads = parked_heads(frame)
    rule = f"weight on sinks >= {SINK_WEIGHT:.0%}, what moves from them <= {SINK_RATIO:g} x that"
    if not heads:
        return f"parked heads ({rule}): none"
    listed = ", ".join(
        f"{r['kind']} L{r['layer']} H{r['head']} ({r['sink_weight']:.2f} weight, {r['sink_moves']:.2f} moves)"
        for r in heads
    )
    return f"parked heads ({rule}): {len(heads)}: {listed}"


@dataclass
class Accumulator:
    """Running per-head sums; ``add`` one input's stats, ``merge`` another process's, ``frame`` the result."""

    top_k: int = TOP_K
    sums: dict[str, dict[str, dict[str, np.ndarray]]] = field(default_factory=dict)  # kind -> stat -> part
    top: dict[str, list] = field(default_factory=dict)  # "kind/stat" -> [L][H] -> {"hi": [...], "lo": [...]}
    n_inputs: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    skipped_lines: list[tuple[int, str]] = field(default_factory=list)  # the first few, (line, reason)
    per_rank: list[int] = field(default_factory=list)  # inputs each process computed (reduce fills it)

    def add(self, stats: dict[str, dict[str, np.ndarray]], line: int) -> None:
        self.n_inputs += 1
        for kind, per in stats.items():
            parts = self.sums.setdefault(kind, {})
            for stat, v in per.items():
                v = np.asarray(v, dtype=np.float64)
                ok = np.isfinite(v)
                if stat not in parts:
                    parts[stat] = {
                        "n": np.zeros(v.shape), "sum": np.zeros(v.shape), "sumsq": np.zeros(v.shape),
                        "min": np.full(v.shape, np.inf), "max": np.full(v.shape, -np.inf),
                    }  # fmt: skip
                part = parts[stat]
                x = np.where(ok, v, 0.0)
                part["n"] += ok
                part["sum"] += x
                part["sumsq"] += x * x
                part["min"] = np.where(ok, np.minimum(part["min"], v), part["min"])
                part["max"] = np.where(ok, np.maximum(part["max"], v), part["max"])
                self._keep_extremes(f"{kind}/{stat}", v, line)

    def _keep_extremes(self, key: str, v: np.ndarray, line: int) -> None:
        cells = self.top.get(key)
        if cells is None:
            cells = self.top[key] = [
                [{"hi": [], "lo": []} for _ in range(v.shape[1])] for _ in range(v.shape[0])
            ]
        for (ly, h), x in np.ndenumerate(v):
            if not math.isfinite(x):
                continue
            cell = cells[ly][h]
            cell["hi"] = _best([*cell["hi"], [float(x), line]], self.top_k, high=True)
            cell["lo"] = _best([*cell["lo"], [float(x), line]], self.top_k, high=False)

    def skip(self, line: int, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if len(self.skipped_lines) < 20:
            self.skipped_lines.append((line, reason))

    def merge(self, other: Accumulator) -> None:
        self.n_inputs += other.n_inputs
        for reason, n in other.skipped.items():
            self.skipped[reason] = self.skipped.get(reason, 0) + n
        self.skipped_lines = sorted([*self.skipped_lines, *other.skipped_lines])[:20]
        for kind, per in other.sums.items():
            for stat, part in per.items():
                mine = self.sums.setdefault(kind, {}).get(stat)
                if mine is None:
                    self.sums[kind][stat] = {k: v.copy() for k, v in part.items()}
                    continue
                for k in ("n", "sum", "sumsq"):
                    mine[k] = mine[k] + part[k]
                mine["min"] = np.minimum(mine["min"], part["min"])
                mine["max"] = np.maximum(mine["max"], part["max"])
        for key, cells in other.top.items():
            if key not in self.top:
                self.top[key] = json.loads(json.dumps(cells))
                continue
            for row_a, row_b in zip(self.top[key], cells, strict=True):
                for a, b in zip(row_a, row_b, strict=True):
                    a["hi"] = _best([*a["hi"], *b["hi"]], self.top_k, high=True)
                    a["lo"] = _best([*a["lo"], *b["lo"]], self.top_k, high=False)

    # -- state (resume, gather) -----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "top_k": self.top_k, "n_inputs": self.n_inputs, "skipped": self.skipped,
            "skipped_lines": self.skipped_lines, "top": self.top,
            "sums": {kind: {stat: {k: v.tolist() for k, v in part.items()} for stat, part in per.items()}
                     for kind, per in self.sums.items()},
        }  # fmt: skip

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Accumulator:
        acc = cls(top_k=int(state["top_k"]))
        acc.n_inputs = int(state["n_inputs"])
        acc.skipped = {str(k): int(v) for k, v in state["skipped"].items()}
        acc.skipped_lines = [(int(a), str(b)) for a, b in state["skipped_lines"]]
        acc.top = state["top"]
        acc.sums = {
            kind: {
                stat: {k: np.asarray(v, dtype=np.float64) for k, v in part.items()}
                for stat, part in per.items()
            }
            for kind, per in state["sums"].items()
        }
        return acc

    # -- result -----------------------------------------------------------------------------------------
    def frame(self, lines: Callable[[int], str] | None = None):
        """A pandas DataFrame, one row per (kind, layer, head, stat): n, mean, std, min, max, and
        top_high / top_low (JSON lists of {"line", "value", "text"}), plain columns for pandas/DuckDB."""
        import pandas as pd

        rows = []
        for kind in (k for k in KINDS if k in self.sums):
            for stat in (s for s in STATS if s in self.sums[kind]):
                part = self.sums[kind][stat]
                n = part["n"]
                with np.errstate(invalid="ignore", divide="ignore"):
                    mean = np.where(n > 0, part["sum"] / np.maximum(n, 1), np.nan)
                    var = np.where(n > 1, (part["sumsq"] - n * mean * mean) / np.maximum(n - 1, 1), np.nan)
                std = np.sqrt(np.maximum(var, 0.0))
                cells = self.top[f"{kind}/{stat}"]
                for (ly, h), count in np.ndenumerate(n):
                    cell = cells[ly][h]
                    rows.append({
                        "kind": kind, "layer": ly, "head": h, "stat": stat, "n": int(count),
                        "mean": float(mean[ly, h]), "std": float(std[ly, h]),
                        "min": float(part["min"][ly, h]) if count else float("nan"),
                        "max": float(part["max"][ly, h]) if count else float("nan"),
                        "top_high": _describe(cell["hi"], lines), "top_low": _describe(cell["lo"], lines),
                    })  # fmt: skip
        return pd.DataFrame(rows)


def _best(items: list, k: int, high: bool) -> list:
    """The k highest (or lowest) [value, line] pairs, ties broken by the earlier line (deterministic,
    whatever order the lines were seen in)."""
    return sorted(items, key=lambda it: (-it[0] if high else it[0], it[1]))[:k]


def _describe(items: list, lines: Callable[[int], str] | None) -> str:
    return json.dumps(
        [{"line": int(i), "value": float(v), **({"text": lines(int(i))} if lines else {})} for v, i in items],
        ensure_ascii=False,
    )


# -- running over a file --------------------------------------------------------------------------------


def read_lines(path: str | Path) -> list[str]:
    """The input file's lines (line numbers are 1-based in messages, 0-based in the output)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]


def _reason(exc: Exception) -> str:
    text = str(exc)
    if "empty" in text:
        return "empty"
    if "tokens; this model takes at most" in text or "too long" in text:
        return "too long"
    if "unknown characters" in text or "vocabulary" in text:
        return "outside the vocabulary"
    return "unreadable"


@dataclass
class Shard:
    rank: int = 0
    world: int = 1

    def mine(self, n: int) -> list[int]:
        return list(range(self.rank, n, self.world))


def run(
    lm,
    lines: Sequence[str],
    *,
    batch: int = 32,
    shard: Shard | None = None,
    partial: Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 10,
    progress: Callable[[int, int], None] | None = None,
    stop_after: int | None = None,
    meta: dict[str, Any] | None = None,
    top_k: int = TOP_K,
) -> Accumulator:
    """Statistics of this process's share of ``lines`` (every line when not sharded).

    partial: where the running state is saved every ``checkpoint_every`` batches (and read back
    with ``resume``); stop_after: stop after that many batches (tests use it as an interrupt)."""
    shard = shard or Shard()
    mine = shard.mine(len(lines))
    acc, start = Accumulator(top_k=top_k), 0
    if resume and partial is not None and partial.is_file():
        saved = json.loads(partial.read_text(encoding="utf-8"))
        if (
            saved.get("format") != FORMAT
            or saved.get("meta") != (meta or {})
            or saved.get("shard")
            != [
                shard.rank,
                shard.world,
            ]
        ):
            raise ValueError(
                f"{partial} was written by another run (model, input file or process count differ); "
                "delete it or run without --resume"
            )
        acc, start = Accumulator.from_state(saved["acc"]), int(saved["next"])
    pad = lm.cfg.pad_id
    done_batches = 0
    for b0 in range(start, len(mine), batch):
        chunk = mine[b0 : b0 + batch]
        ok_lines, texts = [], []
        for i in chunk:
            try:
                lm.prepare(lines[i])
            except (InputError, ValueError) as exc:
                acc.skip(i, _reason(exc))
                continue
            ok_lines.append(i)
            texts.append(lines[i])
        if texts:
            for i, tr in zip(ok_lines, lm.trace(texts), strict=True):
                acc.add(trace_stats(tr, pad), i)
        done_batches += 1
        next_start = b0 + len(chunk)
        if progress is not None:
            progress(next_start, len(mine))
        if partial is not None and (done_batches % checkpoint_every == 0 or next_start >= len(mine)):
            save_partial(partial, acc, next_start, shard, meta)
        if stop_after is not None and done_batches >= stop_after:
            if partial is not None:
                save_partial(partial, acc, next_start, shard, meta)
            raise KeyboardInterrupt(f"stopped after {done_batches} batches")
    return acc


def save_partial(path: Path, acc: Accumulator, next_start: int, shard: Shard, meta: dict | None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    state = {"format": FORMAT, "meta": meta or {}, "shard": [shard.rank, shard.world], "next": next_start,
             "acc": acc.state(), "saved": time.time()}  # fmt: skip
    tmp.write_text(json.dumps(state), encoding="utf-8")
    os.replace(tmp, path)


def reduce(acc: Accumulator, shard: Shard) -> Accumulator | None:
    """Under torch.distributed: every process's sums merged on rank 0 (None elsewhere)."""
    import torch.distributed as dist

    if shard.world == 1:
        acc.per_rank = [acc.n_inputs]
        return acc
    gathered: list[dict | None] = [None] * shard.world
    dist.all_gather_object(gathered, acc.state())
    if shard.rank != 0:
        return None
    total = Accumulator(top_k=acc.top_k)
    for state in gathered:  # rank order: the same merge on every run
        if state is None:
            raise RuntimeError("a process sent no statistics to rank 0")
        total.merge(Accumulator.from_state(state))
    total.per_rank = [int(state["n_inputs"]) for state in gathered if state is not None]
    return total


def write(acc: Accumulator, lines: Sequence[str], out: Path, meta: dict[str, Any]) -> Any:
    """The Parquet file (and its meta in the file's key-value metadata); returns the DataFrame."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = acc.frame(lambda i: lines[i][:300])
    table = pa.Table.from_pandas(frame, preserve_index=False)
    info = {**meta, "format": FORMAT, "n_inputs": acc.n_inputs, "skipped": acc.skipped,
            "skipped_lines": acc.skipped_lines, "top_k": acc.top_k,
            "per_rank": acc.per_rank or [acc.n_inputs]}  # fmt: skip
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), b"attnscope": json.dumps(info).encode()}
    )
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, out)
    return frame


MAX_ROWS = 2_000_000  # (kinds x layers x heads x statistics): far beyond any model we can run


def read(source: str | Path | bytes, name: str | None = None):
    """(DataFrame, meta) of a stats file written by ``write``, from a path or the file's bytes
    (ValueError with one sentence if it is not one). Parquet holds no code: nothing is unpickled."""
    import io

    import pyarrow.parquet as pq

    name = name or (Path(source).name if not isinstance(source, bytes) else "the file")
    try:
        table = pq.read_table(io.BytesIO(source) if isinstance(source, bytes) else source)
        raw = (table.schema.metadata or {}).get(b"attnscope")
        meta = json.loads(raw) if raw is not None else None
    except Exception as exc:  # pyarrow raises many types for a bad file
        raise ValueError(f"{name} is not a readable Parquet file ({type(exc).__name__})") from exc
    if not isinstance(meta, dict):
        raise ValueError(f"{name} is not an attnscope stats file (no attnscope metadata)")
    if meta.get("format") != FORMAT:
        raise ValueError(f"{name} has stats format {meta.get('format')!r}; expected {FORMAT}")
    if table.num_rows > MAX_ROWS:
        raise ValueError(f"{name} has {table.num_rows:,} rows; at most {MAX_ROWS:,} are read")
    needed = {"kind", "layer", "head", "stat", "n", "mean", "std", "min", "max", "top_high", "top_low"}
    if not needed <= set(table.column_names):
        raise ValueError(f"{name} lacks columns {sorted(needed - set(table.column_names))}")
    frame = table.select(sorted(needed)).to_pandas()
    bad_kind = set(frame["kind"]) - set(KINDS)
    bad_stat = set(frame["stat"]) - set(STATS)
    if bad_kind or bad_stat or (frame["layer"] < 0).any() or (frame["head"] < 0).any():
        raise ValueError(f"{name} has unknown kinds, statistics or negative layer/head numbers")
    if frame["layer"].max() > 1000 or frame["head"].max() > 1000:
        raise ValueError(f"{name} claims more than 1,000 layers or heads")
    return frame, meta


def stat_matrix(frame, kind: str, stat: str, column: str = "mean") -> np.ndarray:
    """(layer, head) of one column for one kind and statistic."""
    sub = frame[(frame["kind"] == kind) & (frame["stat"] == stat)]
    if sub.empty:
        raise KeyError(f"no {stat} for {kind}")
    out = np.full((int(sub["layer"].max()) + 1, int(sub["head"].max()) + 1), np.nan)
    out[sub["layer"].to_numpy(), sub["head"].to_numpy()] = sub[column].to_numpy(dtype=np.float64)
    return out
