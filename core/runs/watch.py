"""``attnscope.watch``: watch a model's attention form while it trains, from inside any training loop.

    w = attnscope.watch(model, probe=ids, every=100, run_dir="runs/x", vocab=itos)
    for step, batch in enumerate(loader):
        ...
        w.step(step, loss=loss)          # every call logs the scalars; every ``every`` steps it probes
    w.close()

At a watched step the model runs the probe once in eval mode without gradients, under
``capture_attention``; the traces go to the run folder (``attnscope.core.runs.runfile``) in float16.
Then every module's own ``training`` flag and the random number generators (CPU and CUDA) are put back
as they were, so training with and without watching computes the same weights, bit for bit.

The probe is a tensor (``model(probe)``), a tuple of tensors (``model(*probe)``), a dict
(``model(**probe)``), or texts with ``adapter=`` (an adapter file or module: its encode turns them into
ids and its forward runs them). ``forward=(model, probe) -> output`` replaces the call.

Distributed training: under DDP only rank 0 probes, on the unwrapped module, so no collective starts on
one rank alone; under FSDP every rank runs the probe (the forward gathers the shards) and rank 0
writes. Other ranks' ``step`` does nothing else.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import re
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from attnscope.core.errors import InputError, ModelLoadError
from attnscope.core.runs import runfile
from attnscope.core.traces.trace import AttentionTrace

_SIZE = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def parse_size(value: int | float | str) -> int:
    """Bytes from 1_000_000, "500MB", "1 GB" (binary units: 1 GB = 2**30 bytes)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0 or not math.isfinite(value):
            raise ValueError(f"a size must be positive, got {value!r}")
        return int(value)
    if isinstance(value, str):
        text = value.strip().upper().replace(" ", "").removesuffix("IB").removesuffix("B")
        unit = text.lstrip("0123456789.")
        number = text[: len(text) - len(unit)]
        if (unit + "B" if unit else "") in _SIZE or unit == "":
            try:
                n = float(number) * _SIZE[unit + "B" if unit else ""]
            except ValueError:
                n = -1
            if n > 0:
                return int(n)
    raise ValueError(f"cannot read {value!r} as a size: give bytes or e.g. '500MB', '1GB'")


def size_text(n: int) -> str:
    """Bytes as people read them, never rounded to 0: "512 bytes", "100 KB", "1.5 GB" (binary units)."""
    for unit in ("TB", "GB", "MB", "KB"):
        if n >= _SIZE[unit]:
            return f"{n / _SIZE[unit]:,.1f}".removesuffix(".0") + f" {unit}"
    return f"{n:,} byte" + ("" if n == 1 else "s")


def _steps(value: Any) -> bool:
    """A positive whole number of steps (numpy's integers too; not a bool)."""
    return _is_int(value) and int(value) >= 1


def unwrap(model: nn.Module) -> nn.Module:
    """The module under DistributedDataParallel / DataParallel and torch.compile's wrapper."""
    seen = 0
    while seen < 8:
        seen += 1
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod  # type: ignore[assignment]
        else:
            break
    return model


def is_fsdp(model: nn.Module) -> bool:
    """FSDP (the wrapper, or fully_shard's modules): its forward gathers shards on every rank."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # a build without distributed
        return False
    return any(
        isinstance(m, FullyShardedDataParallel) or type(m).__name__.startswith("FSDP")
        for m in model.modules()
    )


def _dist() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def step_number(step: Any) -> int:
    """A training step as ``step`` and ``log`` take it: a whole number, 0 or more (an int, numpy's and
    torch's integers, a one-element tensor, a float with nothing after the point such as 3.0); else a
    ValueError in one sentence (a fraction is not rounded: 2.9 is not step 2)."""
    value = step
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    elif isinstance(value, (np.ndarray, np.generic)) and value.size == 1:
        value = value.item()
    if _is_int(value):
        n = int(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        v = float(value)
        if not math.isfinite(v) or v != math.floor(v):
            raise ValueError(
                f"step must be a whole number of training steps, got {value!r}: watch does not round it "
                "(for a fraction of an epoch, pass the optimizer step, e.g. epoch * steps_per_epoch + i)"
            )
        n = int(v)
    else:
        got = f"a {type(step).__name__}" + (f" ({step!r})" if isinstance(step, (str, bool)) else "")
        if isinstance(step, (torch.Tensor, np.ndarray)):
            got = f"a {type(step).__name__} of shape {tuple(step.shape)}"
        raise ValueError(f"step must be a whole number of training steps (an int), not {got}")
    if n < 0:
        raise ValueError(f"step must be 0 or more (the run counts training steps from 0), got {n}")
    return n


def _itos(vocab: Mapping[Any, Any]) -> dict[int, str]:
    """A vocab dict as id -> token, whichever way it maps: ids to tokens ({0: '<pad>'}; also with the ids
    as strings, as JSON keeps them) or tokens to ids ({'<pad>': 0})."""
    keys, values = list(vocab.keys()), list(vocab.values())
    if all(_is_int(k) for k in keys):
        return {int(k): str(t) for k, t in vocab.items()}
    if all(_is_int(v) for v in values):
        return {int(i): str(t) for t, i in vocab.items()}
    if all(isinstance(k, str) and k.strip().lstrip("-").isdigit() for k in keys):
        return {int(k): str(t) for k, t in vocab.items()}
    raise ValueError(
        "a vocab dict maps ids to tokens ({0: '<pad>', 1: 'a'}) or tokens to ids ({'<pad>': 0, 'a': 1}); "
        "this one has neither all-integer keys nor all-integer values"
    )


class _Labels:
    """Token ids -> the strings a trace shows: a list (id -> token), a dict (id -> token or token -> id),
    a tokenizer (``convert_ids_to_tokens``) or a callable; without one, the ids themselves."""

    def __init__(self, vocab: Any):
        self.fn: Callable[[list[int]], list[str]]
        if vocab is None:
            self.fn = lambda ids: [str(i) for i in ids]
        elif hasattr(vocab, "convert_ids_to_tokens"):
            self.fn = lambda ids: [str(t) for t in vocab.convert_ids_to_tokens(ids)]
        elif isinstance(vocab, Mapping):
            itos = _itos(vocab)
            self.fn = lambda ids: [itos.get(i, f"<{i}>") for i in ids]
        elif isinstance(vocab, Sequence) and not isinstance(vocab, str):
            items = [str(t) for t in vocab]
            self.fn = lambda ids: [items[i] if 0 <= i < len(items) else f"<{i}>" for i in ids]
        elif callable(vocab):
            self.fn = lambda ids: [str(vocab(i)) for i in ids]
        else:
            raise ValueError(
                f"vocab must be a list (id -> token), a dict (id -> token or token -> id), a tokenizer "
                f"or a function, "
                f"not {type(vocab).__name__}"
            )

    def __call__(self, ids: torch.Tensor) -> list[str]:
        return self.fn([int(i) for i in ids.tolist()])


_NOT_IDS = re.compile(r"mask|token_type|segment|position|pos_ids", re.IGNORECASE)


def _id_tensors(probe: Any) -> list[tuple[str, torch.Tensor]]:
    """The probe's token-id tensors (2-D integer), named, in order (a dict's masks, token types and
    positions by their names left out)."""
    if isinstance(probe, torch.Tensor):
        items: list[tuple[str, Any]] = [("0", probe)]
    elif isinstance(probe, Mapping):
        items = [(str(k), v) for k, v in probe.items() if not _NOT_IDS.search(str(k))]
    elif isinstance(probe, (tuple, list)):
        items = [(str(i), v) for i, v in enumerate(probe)]
    else:
        items = []
    return [
        (name, t)
        for name, t in items
        if isinstance(t, torch.Tensor)
        and t.dim() == 2
        and not t.is_floating_point()
        and t.dtype != torch.bool
    ]


def _device(model: nn.Module) -> torch.device | None:
    p = next(model.parameters(), None)
    return None if p is None else p.device


def _to_device(probe: Any, device: torch.device | None) -> Any:
    """The probe's tensors on the model's device (the probe is often made on the CPU)."""
    if device is None:
        return probe
    if isinstance(probe, torch.Tensor):
        return probe.to(device)
    if isinstance(probe, Mapping):
        return {k: _to_device(v, device) for k, v in probe.items()}
    if isinstance(probe, (tuple, list)):
        return type(probe)(_to_device(v, device) for v in probe)
    return probe


def _has_tensor(value: Any, depth: int = 0) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if depth < 4 and isinstance(value, Mapping):
        return any(_has_tensor(v, depth + 1) for v in value.values())
    if depth < 4 and isinstance(value, (tuple, list)):
        return any(_has_tensor(v, depth + 1) for v in value)
    return False


def _check_probe(probe: Any) -> None:
    """The probe as the default call takes it: a tensor, a tuple (or list) or dict holding tensors."""
    if isinstance(probe, torch.Tensor) or (isinstance(probe, (tuple, list, Mapping)) and _has_tensor(probe)):
        return
    got = type(probe).__name__ if probe is not None else "None"
    if isinstance(probe, (tuple, list, Mapping)):
        got = f"a {got} without tensors" if probe else f"an empty {got}"
    elif isinstance(probe, np.ndarray):
        got = "a numpy array (torch.as_tensor(probe) makes it a tensor)"
    elif isinstance(probe, str):
        got = "a str (texts need adapter=, as a list)"
    raise TypeError(
        "probe must be a tensor (model(probe)), a tuple of tensors (model(*probe)), a dict of tensors "
        f"(model(**probe)), or a list of texts with adapter= (or give forward=), not {got}"
    )


def _default_forward(model: nn.Module, probe: Any) -> Any:
    if isinstance(probe, Mapping):
        return model(**probe)
    if isinstance(probe, (tuple, list)):
        return model(*probe)
    return model(probe)


def probe_digest(probe: Any, targets: Any = None) -> str | None:
    """A hash of the probe's tensors (their place in it, shapes and values; integers as int64, floats as
    float64, so a dtype alone changes nothing) and texts: the run header keeps it, so a run continued in
    its folder is known to read the same probe. None: the probe holds neither (a ``forward=`` object)."""
    h = hashlib.sha256()
    found = False

    def walk(x: Any, name: str, depth: int) -> None:
        nonlocal found
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu()
            x = (
                x.double()
                if x.is_floating_point()
                else x.to(torch.complex128)
                if x.is_complex()
                else x.long()
            ).numpy()
        if isinstance(x, np.ndarray) and x.dtype.kind in "biufc":
            kind = "c" if x.dtype.kind == "c" else "f" if x.dtype.kind == "f" else "i"
            dtype = {"c": np.complex128, "f": np.float64, "i": np.int64}[kind]
            a: np.ndarray = np.ascontiguousarray(x, dtype=dtype)
            h.update(f"{name}:{kind}{a.shape};".encode())
            h.update(a.tobytes())
            found = True
        elif isinstance(x, str):
            h.update(f"{name}:s{len(x)};".encode())
            h.update(x.encode("utf-8", "surrogatepass"))
            found = True
        elif isinstance(x, Mapping) and depth < 4:
            for k, v in x.items():
                walk(v, f"{name}.{k}", depth + 1)
        elif isinstance(x, (tuple, list)) and depth < 4:
            for i, v in enumerate(x):
                walk(v, f"{name}.{i}", depth + 1)

    walk(probe, "probe", 0)
    if targets is not None:
        walk(list(targets), "targets", 0)
    return "sha256:" + h.hexdigest() if found else None


MapShapes = tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]  # per probe input: (kind, map shape)...


def map_shapes(traces: Sequence[AttentionTrace]) -> MapShapes:
    """Each probe input's maps: ((kind, (layers, heads, queries, keys)), ...) per input."""
    return tuple(tuple((k, tuple(int(n) for n in tr.probs(k).shape)) for k in tr.kinds) for tr in traces)


def _maps_text(kind: str, shape: tuple[int, ...] | None) -> str:
    """ "dec_self maps of 2 layers × 4 heads over 6×6 tokens" ("no dec_self maps")."""
    if shape is None:
        return f"no {kind} maps"
    layers, heads, nq, nk = shape
    return (
        f"{kind} maps of {layers} layer{'s' * (layers != 1)} × {heads} head{'s' * (heads != 1)} "
        f"over {nq}×{nk} tokens"
    )


def _shape_change(old: MapShapes, new: MapShapes) -> tuple[str, str]:
    """The first maps shaped otherwise, in words: (as they were, as they are)."""
    for a, b in zip(old, new, strict=False):
        was, now = dict(a), dict(b)
        for kind in [*was, *(k for k in now if k not in was)]:
            if was.get(kind) != now.get(kind):
                return _maps_text(kind, was.get(kind)), _maps_text(kind, now.get(kind))
    return f"{len(old)} probe inputs", f"{len(new)} probe inputs"


def _inputs_text(n: int | None, shapes: MapShapes | None) -> str:
    """ "2 inputs of 6 tokens", "3 inputs of 6 to 9 tokens", "2 inputs" (shapes not known)."""
    text = f"{n} input{'s' * (n != 1)}" if n is not None else "a probe"
    lengths = sorted({max(max(shape[-2:]) for _, shape in kinds) for kinds in shapes or () if kinds})
    if lengths:
        tokens = f"{lengths[0]}" if len(lengths) == 1 else f"{lengths[0]} to {lengths[-1]}"
        text += f" of {tokens} tokens"
    return text


def probe_difference(
    old: Mapping[str, Any], old_shapes: MapShapes | None, new: Mapping[str, Any], new_shapes: MapShapes
) -> str | None:
    """How a run's probe (its header's ``probe``, its latest step's map shapes when it holds steps) and a
    new one differ, in words ("2 inputs of 6 tokens there, 3 inputs of 8 tokens here"); None: the same
    as far as the run tells (the number of inputs, each input's token counts, the texts, the digest).
    The layers and heads are not the probe's: a model that grew a layer still reads the same probe."""
    old_n = old.get("n") if _is_int(old.get("n")) else (len(old_shapes) if old_shapes is not None else None)
    new_n = new.get("n")

    def tokens(shapes: MapShapes | None) -> list[dict[str, tuple[int, ...]]]:
        return [{k: shape[-2:] for k, shape in kinds} for kinds in shapes or ()]

    differ = old_n is not None and old_n != new_n
    if not differ and old_shapes is not None:
        for a, b in zip(tokens(old_shapes), tokens(new_shapes), strict=False):
            if any(a[k] != b[k] for k in a.keys() & b.keys()):
                differ = True
    if differ:
        return f"{_inputs_text(old_n, old_shapes)} there, {_inputs_text(new_n, new_shapes)} here"
    for field in ("texts", "targets"):
        if isinstance(old.get(field), list) and old.get(field) != new.get(field):
            return f"other {field}"
    if isinstance(old.get("digest"), str) and isinstance(new.get("digest"), str):
        if old["digest"] != new["digest"]:
            return "the same shapes, but other token ids or values"
    return None


# scalar-line fields the watcher writes itself: a metric of one of these names is kept under another
RESERVED = frozenset({"step", "audit", "not_finite", "watch_error"})


class Watcher:
    """What ``attnscope.watch`` returns: call ``step`` in the training loop, ``close`` at the end (or use
    it as a context manager). See the module's doc and docs/watch.md."""

    def __init__(
        self,
        model: nn.Module,
        probe: Any,
        every: int = 100,
        run_dir: str | Path = "runs/watch",
        *,
        vocab: Any = None,
        tgt_vocab: Any = None,
        adapter: Any = None,
        targets: list[str] | None = None,
        forward: Callable[[nn.Module, Any], Any] | None = None,
        arch: str | None = None,
        pad: int | None = None,
        bos: int | None = None,
        audit_every: int | None = None,
        keep_weights: bool = False,
        budget: int | float | str = runfile.DEFAULT_BUDGET,
        title: str | None = None,
        capture: Mapping[str, Any] | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch needs the torch.nn.Module being trained, got {type(model).__name__}")
        if not _steps(every):
            raise ValueError(f"every must be a positive number of steps, got {every!r}")
        if audit_every is not None and not _steps(audit_every):
            raise ValueError(f"audit_every must be a positive number of steps, got {audit_every!r}")
        every = int(every)
        audit_every = int(audit_every) if audit_every is not None else None
        self.model = model
        self.every = every
        self.audit_every = audit_every
        self.keep_weights = bool(keep_weights)
        self.forward = forward or _default_forward
        self.capture_kw = dict(capture or {})
        self.rank, self.world = _dist()
        self.fsdp = is_fsdp(model)
        if self.fsdp and self.keep_weights:
            raise ValueError(
                "keep_weights is not supported under FSDP (the weights are sharded across ranks); "
                "save full checkpoints with FSDP's own state-dict API instead"
            )
        # DDP: rank 0 alone probes, on the module under the wrapper (no collective starts on one rank)
        self.net = model if self.fsdp else unwrap(model)
        self.probes = (self.rank == 0) or self.fsdp
        self.writes = self.rank == 0
        self.probe = probe
        self.targets = list(targets) if targets is not None else None
        self.labels = _Labels(vocab)
        self.tgt_labels = _Labels(tgt_vocab) if tgt_vocab is not None else self.labels
        self.arch, self.pad, self.bos = arch, pad, bos
        self._said: set[str] = set()
        self.lm: Any = None  # an AdapterModel over the live model: texts, the audit
        if adapter is not None:
            self.lm = self._adapter_model(adapter)
            if (
                not isinstance(probe, (list, tuple))
                or not probe
                or not all(isinstance(t, str) for t in probe)
            ):
                raise ValueError(
                    "with adapter=, probe is a list of texts (the adapter's encode makes the ids)"
                )
        elif isinstance(probe, (list, tuple)) and probe and all(isinstance(t, str) for t in probe):
            raise ValueError("a probe of texts needs adapter= (an adapter file or module that encodes them)")
        else:
            if forward is None:
                _check_probe(probe)  # before any step, not as an error from inside the model
            if audit_every is not None:
                self.lm = self._probe_model()
        if audit_every is not None and self.lm is None:
            raise ValueError("audit_every needs arch= and pad= (or an adapter) to audit the masks")
        if self.writes:
            runfile.check_run_dir(run_dir)  # a file in the way: said now, before the probe runs
        self.run: runfile.RunWriter | None = None
        self.kinds: tuple[str, ...] = ()
        first: list[AttentionTrace] = []
        if self.probes:
            first = self._traces()  # the probe is checked now, not 100 steps into training
            self.kinds = tuple(first[0].kinds) if first else ()
            if not self.kinds:
                raise ValueError(
                    "the probe ran but no attention was captured: "
                    + "; ".join(first[0].meta.get("capture_notes", []) if first else [])
                )
        # the maps' shapes at the last step written (a run continued: its latest step's), to say once
        # when a step's differ (a model that grew a layer)
        self._shapes: tuple[int, MapShapes] | None = None
        self._shape_said = False
        if self.writes:
            probe_head = {
                "n": len(first),
                "texts": list(probe) if self.lm is not None and adapter is not None else None,
                "targets": self.targets,
                "digest": probe_digest(probe, self.targets),
            }
            if runfile.is_run(run_dir):  # continued: the same probe, or refused before anything is written
                self._shapes = self._same_probe(Path(run_dir), probe_head, first)
            header = {
                "model": type(self.net).__name__,
                "title": title or Path(run_dir).name,
                "arch": self.lm.arch if self.lm is not None else arch,
                "pad": pad if self.lm is None else self.lm.spec.pad,
                "every": every,
                "audit_every": audit_every,
                "kinds": list(self.kinds),
                "probe": probe_head,
                "adapter": str(self.lm.path)
                if adapter is not None and getattr(self.lm, "path", None)
                else None,
                "weights": self.keep_weights,
                "world_size": self.world,
            }
            self.run = runfile.RunWriter(run_dir, header, parse_size(budget))
        # a run continued in its folder: steps up to its last are not written again
        self._floor = self.run.last_step if self.run is not None and self.run.resumed else -1
        self._last = self._floor  # the last step given to step() (steps go up: a restarted counter would
        self._backwards = False  # write over earlier ones), and whether that was said
        self._not_finite: set[str] = set()  # scalars said to be NaN or infinite
        self._not_numbers: set[str] = set()  # metrics said not to be a single number (not recorded)
        self._probe_failed = False  # a failing probe is said once per run (each step records watch_error)
        self.closed = False

    def _same_probe(
        self, run_dir: Path, probe_head: dict[str, Any], first: list[AttentionTrace]
    ) -> tuple[int, MapShapes] | None:
        """A run continued in ``run_dir``: a ValueError when this probe is not the run's (every step of a
        run reads the same probe); else (its latest step, that step's map shapes), or None (no step)."""
        try:
            run = runfile.Run.open(run_dir)
        except runfile.RunFormatError:
            return None  # the writer says why, in one sentence
        old = run.header.get("probe")
        steps = run.steps()
        old_shapes: MapShapes | None = None
        if steps:
            try:
                old_shapes = map_shapes(run.traces(steps[-1]))
            except (runfile.RunFormatError, ValueError):
                old_shapes = None
        why = probe_difference(
            old if isinstance(old, dict) else {}, old_shapes, probe_head, map_shapes(first)
        )
        if why is not None:
            raise ValueError(
                f"run_dir {run_dir} holds a run watched on another probe ({why}): every step of a run "
                "reads the same probe, so give this probe a new run_dir (or pass the run's own probe to "
                "continue it)"
            )
        return (steps[-1], old_shapes) if steps and old_shapes is not None else None

    # -- the models that texts and the audit go through ------------------------------------------------
    def _adapter_model(self, adapter: Any) -> Any:
        from attnscope.core.families import adapter as A

        if isinstance(adapter, (str, Path)):
            path = Path(adapter).expanduser().resolve()
            if not path.is_file() or path.suffix != ".py":
                raise ModelLoadError(f"{path} is not a Python adapter file")
            module = A._import(path)
        elif isinstance(adapter, types.ModuleType) or hasattr(adapter, "ARCH"):
            module, path = adapter, Path(getattr(adapter, "__file__", "adapter.py") or "adapter.py")
        else:
            raise ValueError(
                "adapter must be an adapter file's path or its module (ARCH, PAD, encode, forward)"
            )
        spec = A._check_names(module, path.name)
        return self._wrap(A, module, spec, path)

    def _wrap(self, A: Any, module: Any, spec: Any, path: Path) -> Any:
        src_tok = A.AdapterTokens(spec.vocab, module.encode, spec.specials)
        tgt_tok = A.AdapterTokens(
            spec.tgt_vocab or spec.vocab,
            getattr(module, "encode_target", None) or module.encode,
            spec.specials,
        )
        lm = A.AdapterModel(path.stem, path.parent, path, module, self.net, src_tok, tgt_tok, spec,
                            meta={"kind": "adapter", "arch": spec.arch})  # fmt: skip
        return lm

    def _probe_model(self) -> Any:
        """An adapter over the probe's own ids (texts "probe 0", "probe 1", ...) for the audit."""
        from attnscope.core.families import adapter as A

        if self.arch is None or self.pad is None:
            raise ValueError("audit_every needs arch= ('encoder', 'decoder' or 'encoder-decoder') and pad=")
        tensors = [t for _, t in _id_tensors(self.probe)]
        seq2seq = self.arch in ("encoder-decoder", "seq2seq")
        if not tensors or (seq2seq and len(tensors) < 2):
            raise ValueError(
                "the audit needs the probe's token ids: a [batch, length] integer tensor "
                + ("for the source and one for the decoder input" if seq2seq else "")
            )
        src, tgt = tensors[0], (tensors[1] if seq2seq else None)
        pad = self.pad

        def rows(t: torch.Tensor) -> list[list[int]]:
            out = []
            for r in t.tolist():
                while r and r[-1] == pad:
                    r = r[:-1]
                out.append(r)
            return out

        src_rows = rows(src)
        bos = self.bos
        tgt_rows: list[list[int]] = []
        if tgt is not None:
            firsts = {int(x) for x in tgt[:, 0].tolist()}
            if bos is None and len(firsts) == 1:
                bos = firsts.pop()
            if bos is None:
                raise ValueError("the audit needs bos= (the decoder inputs do not all start with one id)")
            tgt_rows = [r[1:] for r in rows(tgt)]
        n = 1 + max(int(t.max()) for t in tensors)
        emb = next((m for m in self.net.modules() if isinstance(m, nn.Embedding)), None)
        n = max(n, emb.num_embeddings if emb is not None else 0, pad + 1, (bos or 0) + 1)
        fwd = self.forward

        def index(text: str) -> int:
            return int(text.rsplit(" ", 1)[-1])

        def forward(model: nn.Module, s: Any, t: Any) -> Any:
            if seq2seq:
                return fwd(model, (s, t))
            return fwd(model, s if s is not None else t)

        module = types.SimpleNamespace(
            ARCH=self.arch,
            VOCAB=[f"<{i}>" for i in range(n)],
            PAD=pad,
            BOS=bos,
            EOS=None,
            load=lambda: self.net,
            encode=lambda text: src_rows[index(text)],
            encode_target=lambda text: tgt_rows[index(text)],
            forward=forward,
        )
        spec = A._check_names(module, "the watched model")
        lm = self._wrap(A, module, spec, Path("watched.py"))
        lm.audit_texts = [f"probe {i}" for i in range(len(src_rows))]
        lm.audit_targets = [f"probe {i}" for i in range(len(src_rows))] if seq2seq else None
        return lm

    # -- the probe ----------------------------------------------------------------------------------
    def _isolated(self, fn: Callable[[], Any]) -> Any:
        """fn() in eval mode without gradients; then each module's training flag and the RNGs as before."""
        flags = [(m, m.training) for m in self.net.modules()]
        cpu = torch.get_rng_state()
        cuda = (
            torch.cuda.get_rng_state_all()
            if torch.cuda.is_available() and torch.cuda.is_initialized()
            else None
        )
        try:
            self.net.eval()
            with torch.no_grad():
                return fn()
        finally:
            for m, was in flags:
                m.training = was
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)

    def _traces(self) -> list[AttentionTrace]:
        return self._isolated(self._trace_probe)

    def _trace_probe(self) -> list[AttentionTrace]:
        if self.lm is not None and all(isinstance(t, str) for t in self.probe):
            return list(self.lm.trace(list(self.probe), self.targets, truncate=True))
        from attnscope.core.families.capture import capture_attention

        probe = _to_device(self.probe, _device(self.net))
        with capture_attention(self.net, **self.capture_kw) as cap:
            self.forward(self.net, probe)
        kinds = cap.kinds()
        if not kinds:
            note = "; ".join([*cap.notes, *(str(n) for n in cap.skipped)]) or "no softmax met the rules"
            raise ValueError(f"the probe ran but no attention was captured ({note})")
        ids = [t for _, t in _id_tensors(probe)]
        # the ones the model looked up in an embedding (a 0/1 mask handed in beside them is not)
        ids = [t for t in ids if cap.embedded(t)] or ids
        has_src = "enc_self" in kinds or "cross" in kinds
        src = ids[0] if has_src and ids else None
        tgt = (ids[1] if len(ids) > 1 else None) if has_src else (ids[0] if ids else None)
        b = cap.records[0].probs.shape[0]
        title = type(self.net).__name__
        out = []
        for i in range(b):
            src_tok = self.labels(src[i]) if src is not None and i < len(src) else ()
            tgt_tok = self.tgt_labels(tgt[i]) if tgt is not None and i < len(tgt) else ()
            out.append(self._probe_trace(cap, i, src_tok, tgt_tok, title))
        return out

    def _probe_trace(self, cap: Any, i: int, src_tok, tgt_tok, title: str) -> AttentionTrace:
        """Sequence ``i``'s trace, labelled by the probe's ids where they are its maps' tokens, its
        positions numbered (``#0``, ``#1``, ...) where they are not (a float input, positions the model
        made); a kind over other positions is left out, and said in its capture notes."""
        best: AttentionTrace | None = None
        why = ""
        for src, tgt in ((src_tok, tgt_tok), (src_tok, ()), ((), tgt_tok), ((), ())):  # labelled sides first
            try:
                tr = cast(AttentionTrace, cap.trace(i, src, tgt, model=title))
            except ValueError as exc:  # the ids are no map's tokens
                why = str(exc)
                continue
            if best is None or len(tr.kinds) > len(best.kinds):
                best = tr  # (a decoder fed its target shifted inside forward: that side numbered)
            if len(best.kinds) == len(cap.kinds()):
                break
        if best is None:
            raise ValueError(f"the probe's attention could not be drawn over its positions: {why}")
        return best

    # -- the loop's calls ------------------------------------------------------------------------------
    @property
    def last_step(self) -> int:
        """The last step this run folder holds (-1: none): a restarted run continues after it."""
        return self.run.last_step if self.run is not None else -1

    @property
    def run_dir(self) -> Path | None:
        return self.run.path if self.run is not None else None

    def step(self, step: int, loss: Any = None, **metrics: Any) -> bool:
        """Log ``loss`` and ``metrics`` for ``step``; at every ``every``-th step also probe (and audit at
        every ``audit_every``-th). Returns True when this call probed. Steps at or before the run's last
        step (a run continued in the same folder) are not written again. ``step`` is a whole number, 0 or
        more (a negative or fractional one is a ValueError); a metric that is not one number is said once
        per name and not recorded."""
        if self.closed:
            raise RuntimeError("this watcher is closed")
        step = step_number(step)
        if self.run is not None and step <= self._floor:
            self._say(
                f"the run folder {self.run.path} already holds steps up to {self._floor}; "
                "steps up to there are not written again (a new run: a new run_dir)"
            )
            return False
        if step <= self._last:
            self._went_back(step)
            return False
        self._last = step
        record = self._record(step, {"loss": loss, **metrics} if loss is not None else metrics)
        due = step % self.every == 0
        audit_due = self.audit_every is not None and step % self.audit_every == 0
        probed = False
        if (due or audit_due) and self.probes:
            if due:
                try:
                    traces = self._traces()
                except Exception as exc:  # noqa: BLE001 (training goes on; the run says why)
                    record["watch_error"] = f"{type(exc).__name__}: {exc}"[:500]
                    if not self._probe_failed:
                        self._probe_failed = True
                        self._say(
                            f"attnscope.watch could not probe step {step}: {record['watch_error']} "
                            "(said once: training goes on, and each step the probe fails at records "
                            "watch_error in the run's scalars)"
                        )
                else:
                    self._check_shapes(step, traces)
                    if self.run is not None:
                        weights = self._weights() if self.keep_weights else None
                        self.run.write_step(step, [runfile.slim(t) for t in traces], weights)
                        if self.run.over_budget:
                            self._say(
                                f"the run's first and latest steps alone are over its budget "
                                f"({size_text(self.run.budget)}): raise budget= or probe fewer inputs"
                            )
                    probed = True
            if audit_due:
                record["audit"] = self._audit()
        if self.run is not None and (len(record) > 1 or probed):
            self.run.append_scalars(record, sync=probed)
        return probed

    def log(self, step: int, **scalars: Any) -> None:
        """Scalars only (no probe), e.g. from a logging callback."""
        if self.closed:
            raise RuntimeError("this watcher is closed")
        step = step_number(step)
        if self.run is None or step <= self._floor:
            return
        if step < self._last:  # (the step step() was given last, or a later one, is fine)
            self._went_back(step)
            return
        record = self._record(step, scalars)
        if len(record) > 1:
            self.run.append_scalars(record)

    def _went_back(self, step: int) -> None:
        """A step at or before one already given: said once (an epoch's counter restarting at 0)."""
        if not self._backwards:
            self._backwards = True
            self._say(
                f"step {step} came after step {self._last}: watch keeps steps that go up, and this one would "
                f"write over what step {step} already holds, so it is not written, nor any later step at or "
                "before the last one (a counter that restarts each epoch: pass epoch * steps_per_epoch + i)",
                depth=1,
            )

    def _record(self, step: int, scalars: dict[str, Any]) -> dict[str, Any]:
        """A scalar line: the numbers given; a NaN or infinite one (a loss that diverged) as null, named
        under ``not_finite``, and said once per name."""
        record: dict[str, Any] = {"step": step}
        bad = []
        for key, value in scalars.items():
            name, v = str(key), runfile.scalar_value(value, finite=False)
            if v is None:
                if value is not None:  # (None: nothing to log at this step)
                    self._not_a_number(name, value, step)
                continue
            if name in RESERVED:
                name = self._renamed(name, scalars)
            if math.isfinite(v):
                record[name] = v
                continue
            record[name] = None
            bad.append(name)
            if name not in self._not_finite:
                self._not_finite.add(name)
                self._say(f"{name} is not finite at step {step} (the training diverged?): the run keeps it "
                          "as null, named under not_finite", depth=1)  # fmt: skip
        if bad:
            record["not_finite"] = bad
        return record

    def _not_a_number(self, name: str, value: Any, step: int) -> None:
        """A metric that is not one number (a per-sample loss, a string) is not recorded; said once per name."""
        if name in self._not_numbers:
            return
        self._not_numbers.add(name)
        hint = ""
        shape = getattr(value, "shape", None)
        if isinstance(value, (torch.Tensor, np.ndarray)) and shape is not None:
            what = (
                f"a {'tensor' if isinstance(value, torch.Tensor) else 'numpy array'} of shape {tuple(shape)}"
            )
            size = value.numel() if isinstance(value, torch.Tensor) else value.size
            if size > 1:
                hint = " (a loss with reduction='none'? reduce it first, e.g. loss.mean())"
            elif size == 1:  # one element, but not a real number: a bool or a complex
                what += f" holding {value.item()!r}"
        elif isinstance(value, str):
            what = f"a string ({value[:40]!r})"
            hint = " (convert it with float() if it holds a number)"
        elif isinstance(value, (bool, np.bool_)):
            what = f"a bool ({value!r})"
            hint = " (log it as 0 or 1)"
        else:
            what = f"a {type(value).__name__}"
        self._say(f"{name} at step {step} is {what}, not a single number, so it is not recorded{hint}; "
                  f"said once for {name}", depth=2)  # fmt: skip

    def _check_shapes(self, step: int, traces: list[AttentionTrace]) -> None:
        """Say once when a step's maps are shaped unlike the last step written (a model that grew a layer
        or a head): the run keeps both, and the Training page's curves draw the steps shaped as the latest."""
        shapes = map_shapes(traces)
        if self._shapes is not None and shapes != self._shapes[1] and not self._shape_said:
            self._shape_said = True
            before, then = self._shapes
            was, now = _shape_change(then, shapes)
            self._say(
                f"the probe's maps changed shape at step {step}: {now}, where step {before} had {was} "
                "(the model gained or lost a layer or head?); the run keeps both, and the Training page's "
                "curves over steps draw only the steps shaped as the latest (said once)",
                depth=1,
            )
        self._shapes = (step, shapes)

    def _renamed(self, name: str, scalars: Mapping[str, Any]) -> str:
        """A metric named as one of the run's own fields (``audit``...), kept as ``NAME_metric``; said once."""
        new = f"{name}_metric"
        while new in scalars or new in RESERVED:
            new += "_"
        self._say(f"a metric named {name!r} would collide with the run's own field {name!r}: it is kept "
                  f"as {new!r}", depth=2)  # fmt: skip
        return new

    def _audit(self) -> dict[str, Any]:
        from attnscope.core.analysis.audit import run_audit

        lm = self.lm
        texts = getattr(lm, "audit_texts", None) or list(self.probe)
        targets = getattr(lm, "audit_targets", None) if hasattr(lm, "audit_texts") else self.targets
        try:
            report = self._isolated(lambda: run_audit(lm, texts, targets, concurrent=False))
        except (InputError, ValueError) as exc:
            return {"passed": True, "failed": [], "lines": [f"the audit could not run: {exc}"], "error": True}
        return {
            "passed": bool(report.passed),
            "failed": sorted({v.name for v in report.failed}),
            "lines": [v.line() for v in report.failed][:20],  # what failed, in the audit's words
        }

    def _weights(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, t in self.net.state_dict().items():
            t = t.detach()
            out[name] = (t.half() if t.is_floating_point() else t).cpu().contiguous().clone()
        return out

    def _say(self, message: str, depth: int = 0) -> None:
        """Warn once, pointing at the training loop's call (``depth``: helpers between it and here)."""
        if message not in self._said:
            self._said.add(message)
            warnings.warn(message, stacklevel=3 + depth)

    def close(self) -> None:
        if self.run is not None and not self.closed:
            self.run.close()
        self.closed = True

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def watch(
    model: nn.Module, probe: Any, every: int = 100, run_dir: str | Path = "runs/watch", **kw: Any
) -> Watcher:
    """Watch ``model``'s attention on ``probe`` every ``every`` steps while it trains; see ``Watcher``."""
    return Watcher(model, probe, every, run_dir, **kw)
