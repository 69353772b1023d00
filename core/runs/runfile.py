"""Run folders: what ``attnscope.watch`` writes while a model trains, and what the dashboard reads.

A run folder (format ``attnscope-run``, version 1; docs/run-format.md)::

    run.json                  the header: format, version, model, arch, probe, every, budget...
    scalars.jsonl             one JSON object per line: {"step": 120, "loss": 2.31, ...}; appended,
                              never thinned (loss, metrics and audit verdicts of every step logged)
    steps/step-0000000100/    one folder per watched step, complete or absent:
        step.json             {"step": 100, "time": ..., "probe": 8, "weights": true}
        probe-0.npz ...       the probe's traces, one trace file each (float16 maps, trace format)
        weights.safetensors   optional: the weights at that step (float16), for replaying any input

Crash safety: a step is written into a hidden folder and renamed into place (an atomic rename), so a
reader sees a step whole or not at all; a scalar line is one ``write`` of a full line, and a last
line without its newline (the writer was killed mid-line) is ignored on reading and cut off when the
run is opened again for writing. The header is replaced atomically.

Size: when the steps together pass the run's budget, old steps are thinned log-spaced (like the
zoo's snapshots): the first step and the latest ``KEEP_LATEST`` are kept, and of the others the one
whose removal leaves the smallest gap in log(step) goes first. Scalars are never thinned.

Reading is for files from anywhere: the header and scalar lines are size- and depth-checked JSON,
traces go through ``attnscope.core.traces.trace_io`` (checked, never unpickled), weights are
safetensors. Every problem is a ``RunFormatError`` with one sentence.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.core.errors import TraceFormatError
from attnscope.core.traces import trace_io
from attnscope.core.traces.trace import KINDS, LEARNED, AttentionTrace

FORMAT = "attnscope-run"
VERSION = 1  # the newest this reader knows
HEADER = "run.json"
SCALARS = "scalars.jsonl"
STEPS = "steps"
STEP_JSON = "step.json"
WEIGHTS = "weights.safetensors"
STEP_DIR = re.compile(r"step-(\d{10})")
KEEP_LATEST = 3  # the latest watched steps are never thinned
DEFAULT_BUDGET = 1 << 30  # 1 GB of steps
MAX_HEADER_BYTES = 1 << 20
MAX_LINE_BYTES = 1 << 16  # one scalar line
MAX_SCALARS_BYTES = 256 << 20
MAX_JSON_DEPTH = 8
MAX_PROBE = 64  # probe inputs a step may hold


class RunFormatError(ValueError):
    """A run folder (or a part of one) that cannot be read; the message is one sentence."""


# -- small pieces --------------------------------------------------------------------------------


def step_dir_name(step: int) -> str:
    return f"step-{step:010d}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # a platform without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: written beside it, synced, renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _json(text: str, what: str) -> Any:
    if trace_io._json_depth(text) > MAX_JSON_DEPTH:
        raise RunFormatError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RunFormatError(f"{what} is not JSON ({type(exc).__name__})") from None


def _read_small(path: Path, limit: int, what: str) -> str:
    try:
        size = path.stat().st_size
        if size > limit:
            raise RunFormatError(
                f"{what} is {size / 2**20:,.1f} MB, more than the {limit / 2**20:,.1f} MB it may be"
            )
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RunFormatError(f"cannot read {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise RunFormatError(f"{what} is not UTF-8 text") from None


def check_header(doc: Any, where: str) -> dict[str, Any]:
    """The header's fields, checked: a dict with format ``attnscope-run`` and a version this reader knows."""
    if not isinstance(doc, dict):
        raise RunFormatError(f"{where}: {HEADER} must hold a JSON object")
    if doc.get("format") != FORMAT:
        raise RunFormatError(f"{where} is not an attnscope run ({HEADER} says format {doc.get('format')!r})")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RunFormatError(f"{where}: {HEADER} has no valid version")
    if version > VERSION:
        raise RunFormatError(
            f"{where} is run format version {version}; this attnscope reads version {VERSION} and older "
            "(upgrade attnscope)"
        )
    for key, kind in (("every", int), ("budget_bytes", int)):
        if key in doc and (not isinstance(doc[key], kind) or isinstance(doc[key], bool) or doc[key] < 0):
            raise RunFormatError(f"{where}: {HEADER} field {key!r} must be a non-negative integer")
    for key in ("model", "arch", "title"):
        if key in doc and doc[key] is not None and not isinstance(doc[key], str):
            raise RunFormatError(f"{where}: {HEADER} field {key!r} must be a string")
    return doc


def parse_scalar_lines(text: str, where: str) -> list[dict[str, Any]]:
    """The scalar records of ``scalars.jsonl``: complete lines only (a last line cut off by a crash is
    left out); a line that is not a JSON object with an integer ``step`` is refused."""
    lines = text.split("\n")
    lines.pop()  # after the last newline: empty, or a line the writer did not finish
    out: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise RunFormatError(
                f"{where}: line {n} of {SCALARS} is longer than {MAX_LINE_BYTES:,} characters"
            )
        rec = _json(line, f"{where}: line {n} of {SCALARS}")
        step = rec.get("step") if isinstance(rec, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise RunFormatError(f"{where}: line {n} of {SCALARS} is not an object with a step")
        out.append(rec)
    return out


def scalar_value(value: Any, finite: bool = True) -> float | None:
    """A number fit for a scalar line (tensors and numpy numbers included), else None; ``finite``: NaN
    and infinities are None too."""
    if hasattr(value, "item"):  # a tensor, a numpy array or number: of one element only
        numel = getattr(value, "numel", None)
        size = numel() if callable(numel) else getattr(value, "size", 1)
        if size != 1:
            return None  # (a numpy array of several: its item() would raise, in the training loop)
        try:
            value = value.item()
        except (ValueError, TypeError, RuntimeError):
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    try:
        value = float(value)
    except OverflowError:  # an integer past a float's range: infinite as a float
        value = math.inf if value > 0 else -math.inf
    return value if math.isfinite(value) or not finite else None


# -- reading ------------------------------------------------------------------------------------


@dataclass
class Run:
    """A run folder opened for reading (a run still being written can be read at any time)."""

    path: Path
    header: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path) -> Run:
        path = Path(path)
        if not path.is_dir():
            raise RunFormatError(f"{path} is not a folder")
        head = path / HEADER
        if not head.is_file():
            raise RunFormatError(f"{path} is not an attnscope run: it has no {HEADER}")
        doc = _json(_read_small(head, MAX_HEADER_BYTES, f"{path.name}/{HEADER}"), f"{path.name}/{HEADER}")
        return cls(path, check_header(doc, path.name))

    @property
    def name(self) -> str:
        return str(self.header.get("title") or self.path.name)

    def steps(self) -> list[int]:
        """The watched steps whose folders are complete, in order."""
        root = self.path / STEPS
        if not root.is_dir():
            return []
        found = []
        for entry in os.scandir(root):
            m = STEP_DIR.fullmatch(entry.name)
            if m and entry.is_dir(follow_symlinks=False):
                found.append(int(m.group(1)))
        return sorted(found)

    def step_info(self, step: int) -> dict[str, Any]:
        where = f"{self.path.name} step {step}"
        doc = _json(_read_small(self._dir(step) / STEP_JSON, MAX_HEADER_BYTES, where), where)
        if not isinstance(doc, dict) or doc.get("step") != step:
            raise RunFormatError(f"{where}: {STEP_JSON} does not describe step {step}")
        n = doc.get("probe", 0)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_PROBE:
            raise RunFormatError(f"{where}: {STEP_JSON} field 'probe' must be 0 to {MAX_PROBE}")
        return doc

    def _dir(self, step: int) -> Path:
        return self.path / STEPS / step_dir_name(step)

    def traces(self, step: int) -> list[AttentionTrace]:
        """The probe's traces at ``step`` (each file checked by the trace reader)."""
        n = self.step_info(step)["probe"]
        out = []
        for i in range(n):
            try:
                out.append(trace_io.read_path(self._dir(step) / f"probe-{i}.npz"))
            except TraceFormatError as exc:
                raise RunFormatError(f"{self.path.name} step {step}: {exc}") from None
        return out

    def weights(self, step: int) -> Path | None:
        """The step's weight file (safetensors), or None when the run kept no weights there."""
        path = self._dir(step) / WEIGHTS
        return path if path.is_file() else None

    def scalars(self) -> list[dict[str, Any]]:
        """Every scalar record, in the order written (a step may have several: merge with ``by_step``)."""
        path = self.path / SCALARS
        if not path.is_file():
            return []
        return parse_scalar_lines(
            _read_small(path, MAX_SCALARS_BYTES, f"{self.path.name}/{SCALARS}"), self.path.name
        )

    def by_step(self) -> dict[int, dict[str, Any]]:
        """The scalar records merged per step (later keys win), in step order."""
        merged: dict[int, dict[str, Any]] = {}
        for rec in self.scalars():
            merged.setdefault(rec["step"], {}).update(rec)
        return dict(sorted(merged.items()))

    def not_finite(self) -> dict[str, int]:
        """name -> the first step where that scalar was NaN or infinite (the watcher writes it as null and
        names it under ``not_finite``): what the curves leave out."""
        out: dict[str, int] = {}
        for step, rec in self.by_step().items():
            names = rec.get("not_finite")
            for name in names if isinstance(names, list) else ():
                if isinstance(name, str) and rec.get(name) is None:
                    out.setdefault(name, step)
        return out

    def series(self) -> dict[str, tuple[list[int], list[float]]]:
        """name -> (steps, values) of every numeric scalar (loss, metrics), audits left out."""
        out: dict[str, tuple[list[int], list[float]]] = {}
        for step, rec in self.by_step().items():
            for key, value in rec.items():
                v = scalar_value(value) if key != "step" else None
                if v is not None:
                    xs, ys = out.setdefault(key, ([], []))
                    xs.append(step)
                    ys.append(v)
        return out

    def audits(self) -> dict[int, dict[str, Any]]:
        """step -> {"passed": bool, "failed": [check names], "lines": [...]} where an audit ran."""
        out = {}
        for step, rec in self.by_step().items():
            audit = rec.get("audit")
            if isinstance(audit, dict) and isinstance(audit.get("passed"), bool):
                failed = audit.get("failed")
                lines = audit.get("lines")
                out[step] = {
                    "passed": audit["passed"],
                    "failed": [str(f) for f in failed] if isinstance(failed, list) else [],
                    "lines": [str(x) for x in lines] if isinstance(lines, list) else [],
                }
        return out

    def first_failed_audit(self) -> tuple[int, dict[str, Any]] | None:
        """(step, audit) of the first audit that failed, or None."""
        return next(((s, a) for s, a in self.audits().items() if not a["passed"]), None)

    def version(self) -> tuple[int, ...]:
        """Changes whenever the run gains a step or a scalar line (a cache key for readers)."""
        stamps = []
        for name in (SCALARS, STEPS, HEADER):
            try:
                st = (self.path / name).stat()
                stamps += [st.st_mtime_ns, st.st_size]
            except OSError:
                stamps += [0, 0]
        return tuple(stamps)


def check_run_dir(path: str | Path) -> Path:
    """``path`` as a run folder can be: a folder, or a path not there yet whose nearest existing parent is
    a folder; else a ValueError naming it (checked before a run starts, not at its first write)."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"run_dir {path} is a file, not a folder: give a folder for the run")
        return path
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"run_dir {path} cannot be made: {parent} is a file, not a folder")
            break
    return path


def is_run(path: str | Path) -> bool:
    return (Path(path) / HEADER).is_file()


# -- writing ------------------------------------------------------------------------------------


def slim(trace: AttentionTrace, dtype: Any = np.float16) -> AttentionTrace:
    """The trace as a run keeps it: maps (and learned keys) in ``dtype``, scores left out."""
    changes: dict[str, Any] = {}
    for kind in KINDS:
        p = getattr(trace, kind)
        if p is not None:
            changes[kind] = np.asarray(p, dtype=dtype)
        changes[f"{kind}_scores"] = None
    for name in LEARNED:
        w = getattr(trace, name)
        if w is not None:
            changes[name] = np.asarray(w, dtype=dtype)
    return trace.replace(**changes)


def thin_choice(steps: list[int], keep_latest: int = KEEP_LATEST) -> int | None:
    """The step to drop next: never the first or the latest ``keep_latest``; of the others, the one
    whose removal leaves the smallest gap in log(1 + step) between its neighbours. None: nothing to drop."""
    if len(steps) <= keep_latest + 1:
        return None
    best, best_gap = None, math.inf
    for i in range(1, len(steps) - keep_latest):
        gap = math.log1p(steps[i + 1]) - math.log1p(steps[i - 1])
        if gap < best_gap:
            best, best_gap = steps[i], gap
    return best


def _tree_bytes(path: Path) -> int:
    total = 0
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            total += entry.stat(follow_symlinks=False).st_size
    return total


class RunWriter:
    """Appends steps and scalars to a run folder; a folder that already holds a run is continued."""

    def __init__(self, path: str | Path, header: dict[str, Any], budget_bytes: int = DEFAULT_BUDGET):
        self.path = check_run_dir(path)
        self.budget = int(budget_bytes)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / STEPS).mkdir(exist_ok=True)
        self._clean_partial()
        if (self.path / HEADER).is_file():
            old = Run.open(self.path)
            self.header = {**old.header, **{k: v for k, v in header.items() if k not in ("created",)}}
            self.header["version"] = VERSION
            self.resumed = True
        else:
            self.header = {"format": FORMAT, "version": VERSION, "created": time.time(), **header}
            self.resumed = False
        self.header["budget_bytes"] = self.budget
        write_atomic(self.path / HEADER, json.dumps(self.header, ensure_ascii=False, indent=1))
        self._repair_scalars()
        run = Run(self.path, self.header)
        self._sizes = {s: _tree_bytes(run._dir(s)) for s in run.steps()}
        scalar_steps = [r["step"] for r in run.scalars()]
        self.last_step = max([*self._sizes, *scalar_steps], default=-1)
        self._scalars = open(self.path / SCALARS, "a", encoding="utf-8")  # noqa: SIM115 (held for the run)
        self.thinned: list[int] = []
        self.over_budget = False

    def _clean_partial(self) -> None:
        """Remove step folders a killed writer left half-written (hidden names: never read)."""
        for entry in os.scandir(self.path / STEPS):
            if entry.name.startswith(".tmp-"):
                shutil.rmtree(entry.path, ignore_errors=True)

    def _repair_scalars(self) -> None:
        """Cut a last line that a killed writer did not finish, so the next line starts clean."""
        path = self.path / SCALARS
        if not path.is_file():
            return
        with open(path, "rb+") as fh:
            data = fh.read()
            if data and not data.endswith(b"\n"):
                fh.truncate(data.rfind(b"\n") + 1)
                fh.flush()
                os.fsync(fh.fileno())

    def append_scalars(self, record: dict[str, Any], sync: bool = False) -> None:
        """One line; ``sync`` also forces it to disk (done at watched steps)."""
        line = json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
        self._scalars.write(line)
        self._scalars.flush()
        if sync:
            os.fsync(self._scalars.fileno())
        self.last_step = max(self.last_step, int(record["step"]))

    def write_step(
        self, step: int, traces: list[AttentionTrace], weights: dict[str, Any] | None = None
    ) -> None:
        """The step's folder, whole: written hidden, synced, renamed into place; then thinning."""
        final = self.path / STEPS / step_dir_name(step)
        tmp = self.path / STEPS / f".tmp-{step_dir_name(step)}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for i, tr in enumerate(traces):
            trace_io.write_path(tr, tmp / f"probe-{i}.npz")
        if weights is not None:
            from safetensors.torch import save_file

            save_file(weights, str(tmp / WEIGHTS))
        info = {"step": step, "time": time.time(), "probe": len(traces), "weights": weights is not None}
        (tmp / STEP_JSON).write_text(json.dumps(info))
        for entry in os.scandir(tmp):
            with open(entry.path, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():  # the same step again (a run restarted from an earlier checkpoint)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        self._sizes[step] = _tree_bytes(final)
        self.last_step = max(self.last_step, step)
        self.thin()

    def size(self) -> int:
        return sum(self._sizes.values())

    def thin(self) -> list[int]:
        """Drop steps, log-spaced, until the steps fit the budget; returns the steps dropped."""
        dropped = []
        while self.size() > self.budget:
            victim = thin_choice(sorted(self._sizes))
            if victim is None:
                self.over_budget = True  # the first and latest steps alone are over it: said by the watcher
                break
            shutil.rmtree(self.path / STEPS / step_dir_name(victim), ignore_errors=True)
            del self._sizes[victim]
            dropped.append(victim)
        self.thinned += dropped
        return dropped

    def close(self) -> None:
        if not self._scalars.closed:
            self._scalars.flush()
            os.fsync(self._scalars.fileno())
            self._scalars.close()
