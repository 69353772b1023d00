"""Any PyTorch model through one Python file: the adapter.

An adapter file defines exactly these names (see docs/your-model.md, "Your own model in 20 lines")::

    ARCH = "encoder-decoder"      # or "encoder" or "decoder" (decoder-only)
    def load(): ...               # -> torch.nn.Module with its weights (``load(device)`` gets the device)
    VOCAB = [...]                 # id -> token string, or a dict token -> id (source side, and target
                                  # side unless TGT_VOCAB)
    TGT_VOCAB = None              # optional: the decoder side's, in the same forms
    PAD, BOS, EOS = 0, 1, 2       # ids (BOS/EOS may be None when the model has none; PAD may be EOS)
    def encode(text): ...         # -> ids with the model's specials (a list, a 1-D or (1, L) tensor or
                                  # array, or a tokenizer's encoding with input_ids); decoder input =
                                  # [BOS] + encode_target(t)
    def encode_target(text): ...  # optional, default encode
    MAX_LEN = 64                  # optional
    MAX_BATCH = 8                 # optional: most sequences forward takes per call (a cache sized for a batch)
    EXAMPLES = ["..."]            # optional: inputs the dashboard offers (and the load check uses)
    LABELS = ["neg", "pos"]       # optional, "encoder" only: a classifier; forward returns [B, len(LABELS)]
    def forward(model, src, tgt): ...  # LongTensor [B, S], [B, T] right-padded with PAD (src None for
                                       # "decoder", tgt None for "encoder") -> logits, log-probabilities or
                                       # probabilities [B, L, V] (V may exceed the vocabulary: padded
                                       # rows), alone, first in a tuple, or as .logits / ["logits"]

``load_adapter(path)`` runs the file (it is code: the dashboard only does so with
``ATTNSCOPE_ALLOW_CODE=1``), builds the model, and checks it once on an example: the names,
their types, the output shape and that attention was found. Every problem is one sentence
(``ModelLoadError``) naming what is wrong. Attention comes from ``attnscope.core.families.capture`` around the
user's ``forward``; the model's code is never changed. The model computes its masks from the ids
itself, so the audit uses batch invariance and future invariance (``masks_from_ids``).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import inspect
import operator
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnscope.core.errors import InputError, ModelLoadError
from attnscope.core.families.capture import (
    Captured,
    Record,
    capture_attention,
    kind_maps,
    stack_groups,
    stack_note,
)
from attnscope.core.families.interface import (
    Family,
    ModelFacts,
    PositionTable,
    Side,
    find_position_table,
    package_trace,
    pad_rows,
    prediction_fields,
    prepare_targets,
)
from attnscope.core.families.native import Prepared, check_trace_budget, resolve_device, trace_bytes
from attnscope.core.traces.trace import KINDS, AttentionTrace
from attnscope.core.transformer.checkpoint import _one_line

# nn.TransformerEncoder in eval mode announces its prototype nested-tensor fast path on every first
# call, and PyTorch's own translation tutorial (sequence-first, a bool src_mask beside float masks)
# draws two more: noise about the user's model, not something they can act on here.
for _noise in (
    r"The PyTorch API of nested tensors",
    r"enable_nested_tensor is True, but self.use_nested_tensor is False",
    r"Support for mismatched key_padding_mask and attn_mask is deprecated",
):
    warnings.filterwarnings("ignore", message=_noise, category=UserWarning)

ARCHS = {"encoder-decoder": "seq2seq", "encoder": "encoder", "decoder": "decoder"}
REQUIRED = ("ARCH", "load", "VOCAB", "PAD", "BOS", "EOS", "encode", "forward")
MAX_NEW_TOKENS = 64  # greedy generation bound when MAX_LEN does not set a smaller one
SPECIAL_SHAPES = ("<", "[")  # tokens like <pad>, [CLS] are not offered as example text


class AdapterTokens:
    """An adapter's vocabulary shaped like core's Tokenizer (itos, encode, tokens, decode)."""

    def __init__(self, itos: list[str], encode, specials: set[int]):
        self.itos = list(itos)
        self._encode = encode
        self.specials = specials
        plain = [t for i, t in enumerate(self.itos) if i not in specials and not t.startswith(SPECIAL_SHAPES)]
        self.kind = "char" if plain and all(len(t) == 1 for t in plain) else "word"

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, strict: bool = False) -> list[int]:
        return list(self._encode(text))

    def tokens(self, ids) -> tuple[str, ...]:
        return tuple(self.itos[int(i)] if 0 <= int(i) < len(self.itos) else f"<{int(i)}?>" for i in ids)

    def decode(self, ids) -> str:
        sep = "" if self.kind == "char" else " "
        return sep.join(
            self.itos[int(i)] for i in ids if int(i) not in self.specials and 0 <= int(i) < len(self)
        )


def _import(path: Path):
    """Run the adapter file as a module (its folder on sys.path, so it can import its own code)."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"attnscope_adapter_{digest}", path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"{path} cannot be read as a Python file")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    # Registered while it runs, as ``import`` does: @dataclass, typing and pickle look the module up
    # in sys.modules by the __module__ of the classes it defines.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        sys.modules.pop(spec.name, None)
        raise ModelLoadError(f"{path.name}: running the file {_exited(exc)}") from None
    except Exception as exc:
        sys.modules.pop(spec.name, None)
        raise ModelLoadError(
            f"{path.name}: running the file raised {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    return module


def _exited(exc: SystemExit) -> str:
    """An adapter's code that called sys.exit (or raised SystemExit), for a message."""
    return f"called sys.exit({exc.code!r}); an adapter's code must return or raise, never exit the program"


def _as_int(value: Any) -> int | None:
    """An integer id (int, numpy or 0-d torch integer), else None (bools and floats are not ids)."""
    if isinstance(value, (bool, np.bool_)) or isinstance(value, (float, np.floating)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _id(value: Any) -> int:
    """``_as_int`` of a value already checked to be an id."""
    i = _as_int(value)
    if i is None:
        raise TypeError(f"{value!r} is not an integer id")
    return i


def _vocab(value: Any, name: str, vname: str) -> list[str]:
    """VOCAB/TGT_VOCAB as a list id -> token: a list of token strings, a dict token -> id
    (``stoi``, ``get_vocab()``, ``get_stoi()``) or a dict id -> token (``itos``)."""
    if isinstance(value, Mapping) and value:
        items = list(value.items())
        if all(isinstance(k, str) and _as_int(v) is not None for k, v in items):
            pairs = [(_id(v), k) for k, v in items]
        elif all(_as_int(k) is not None and isinstance(v, str) for k, v in items):
            pairs = [(_id(k), v) for k, v in items]
        else:
            raise ModelLoadError(
                f"{name}: {vname} is a dict but not token -> id (str -> int) nor id -> token (int -> str)"
            )
        by_id: dict[int, str] = {}
        for i, tok in pairs:
            if i in by_id:
                raise ModelLoadError(f"{name}: {vname} gives id {i} to both {by_id[i]!r} and {tok!r}")
            by_id[i] = tok
        missing = next((i for i in range(len(by_id)) if i not in by_id), None)
        if missing is not None:
            raise ModelLoadError(
                f"{name}: {vname} must number its {len(by_id)} tokens 0 to {len(by_id) - 1}; "
                f"id {missing} has no token (largest id {max(by_id)})"
            )
        return [by_id[i] for i in range(len(by_id))]
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, str) for t in value):
        return list(value)
    raise ModelLoadError(
        f"{name}: {vname} must be a non-empty list of token strings (id -> token) or a dict token -> id"
    )


@dataclass(frozen=True)
class Spec:
    """An adapter file's names, checked and normalized: vocabularies as lists, ids as ints."""

    arch: str  # encoder | decoder | seq2seq
    vocab: list[str]
    tgt_vocab: list[str] | None
    pad: int
    bos: int | None
    eos: int | None
    max_len: int | None
    max_batch: int | None
    labels: list[str]

    @property
    def specials(self) -> set[int]:
        return {i for i in (self.pad, self.bos, self.eos) if i is not None}

    @property
    def start(self) -> int:
        """The decoder's first input (BOS): an encoder-decoder must have one (checked at load)."""
        if self.bos is None:
            raise InputError("this model has no BOS id, so its decoder cannot start")
        return self.bos


def _check_names(module, name: str) -> Spec:
    missing = [n for n in REQUIRED if not hasattr(module, n)]
    if missing:
        raise ModelLoadError(
            f"{name} lacks {', '.join(missing)}: an adapter file defines {', '.join(REQUIRED)} "
            "(see docs/your-model.md, 'Your own model in 20 lines')"
        )
    if not isinstance(module.ARCH, str) or module.ARCH not in ARCHS:
        raise ModelLoadError(
            f"{name}: ARCH is {module.ARCH!r}; it must be one of {', '.join(map(repr, ARCHS))}"
        )
    arch = ARCHS[module.ARCH]
    for fn in ("load", "encode", "forward"):
        if not callable(getattr(module, fn)):
            raise ModelLoadError(f"{name}: {fn} must be a function")
    vocab = _vocab(module.VOCAB, name, "VOCAB")
    tgt_given = getattr(module, "TGT_VOCAB", None)
    tgt_vocab = None if tgt_given is None else _vocab(tgt_given, name, "TGT_VOCAB")
    n = max(len(vocab), len(tgt_vocab or ()))
    ids: dict[str, int | None] = {}
    for iname in ("PAD", "BOS", "EOS"):
        value = getattr(module, iname)
        if value is None and iname == "PAD":
            raise ModelLoadError(
                f"{name}: PAD is None, but attnscope right-pads batches with PAD, so it needs a token id "
                "(a decoder-only model without a pad token can use its EOS id: the causal mask hides "
                "right padding)"
            )
        ids[iname] = token_id = None if value is None else _as_int(value)
        if value is not None and (token_id is None or not 0 <= token_id < n):
            raise ModelLoadError(f"{name}: {iname} must be a token id between 0 and {n - 1}, got {value!r}")
    labels = getattr(module, "LABELS", None)
    if labels is not None:
        if arch != "encoder":
            raise ModelLoadError(f"{name}: LABELS is for encoder classifiers (ARCH = 'encoder')")
        if not isinstance(labels, (list, tuple)) or not labels or not all(isinstance(t, str) for t in labels):
            raise ModelLoadError(f"{name}: LABELS must be a non-empty list of class names")
    if arch == "seq2seq" and ids["BOS"] is None:
        raise ModelLoadError(f"{name}: an encoder-decoder model needs BOS (the decoder input starts with it)")
    limits: dict[str, int | None] = {}
    for lname, least in (("MAX_LEN", 2), ("MAX_BATCH", 1)):
        value = getattr(module, lname, None)
        limits[lname] = limit = None if value is None else _as_int(value)
        if value is not None and (limit is None or limit < least):
            raise ModelLoadError(f"{name}: {lname} must be an integer of at least {least}, got {value!r}")
    pad = ids["PAD"]
    assert pad is not None  # None was refused above
    return Spec(arch, vocab, tgt_vocab, pad, ids["BOS"], ids["EOS"], limits["MAX_LEN"], limits["MAX_BATCH"],
                list(labels or []))  # fmt: skip


def _id_list(out: Any) -> list[int]:
    """What ``encode`` returned as a list of ids: a list, tuple, 1-D tensor or array, a (1, L) one
    (``return_tensors="pt"``), or a tokenizer's encoding (``["input_ids"]``, ``.input_ids``, ``.ids``)."""
    if isinstance(out, Mapping) and "input_ids" in out:
        out = out["input_ids"]
    elif not isinstance(out, (list, tuple, torch.Tensor, np.ndarray)):
        for attr in ("input_ids", "ids"):
            if hasattr(out, attr) and not callable(getattr(out, attr)):
                out = getattr(out, attr)
                break
    if isinstance(out, (torch.Tensor, np.ndarray)):
        shape = tuple(out.shape)
        if len(shape) == 2 and shape[0] == 1:
            out = out[0]
        elif len(shape) != 1:
            raise TypeError(f"returned an array of shape {shape}; it must return one sequence of ids")
        integral = (
            not (out.is_floating_point() or out.is_complex() or out.dtype == torch.bool)
            if isinstance(out, torch.Tensor)
            else out.dtype.kind in "iu"
        )
        if not integral:
            raise TypeError(f"returned {out.dtype} values; token ids are integers")
        out = out.tolist()
    elif isinstance(out, (list, tuple)) and len(out) == 1 and isinstance(out[0], (list, tuple)):
        out = out[0]  # [[ids]]: a batch of one
    if isinstance(out, (str, bytes)) or not isinstance(out, (list, tuple)):
        raise TypeError(f"returned {type(out).__name__}; it must return a list of token ids")
    ids = []
    for v in out:
        i = _as_int(v)
        if i is None:
            raise TypeError(f"returned {v!r} among its ids; it must return token ids (integers), not tokens")
        ids.append(i)
    return ids


def _logits(out: Any) -> Any:
    """The tensor in what ``forward`` returned: itself, ``.logits`` / ``["logits"]`` (a Hugging Face
    output, a dataclass, a dict), or the first item of a tuple or list (``(logits, attention)``)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        if "logits" in out:
            return out["logits"]
        tensors = [v for v in out.values() if isinstance(v, torch.Tensor)]
        return tensors[0] if len(tensors) == 1 else out
    if isinstance(getattr(out, "logits", None), torch.Tensor):
        return out.logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return out


def _returned(out: Any) -> str:
    """What forward returned, for a message."""
    if isinstance(out, torch.Tensor):
        return str(tuple(out.shape))
    if isinstance(out, Mapping):
        return f"a dict without 'logits' (keys {', '.join(map(repr, list(out)[:5]))})"
    if isinstance(out, (tuple, list)):
        first = type(out[0]).__name__ if out else "nothing"
        return f"a {type(out).__name__} whose first item is {first}"
    return type(out).__name__


def _shape(t: torch.Tensor | None) -> str:
    return "None" if t is None else str(list(t.shape))


@dataclass
class AdapterModel:
    """A user's model run through its adapter file, with the common model interface."""

    name: str
    folder: Path | None
    path: Path
    module: Any
    model: nn.Module
    src_tok: AdapterTokens
    tgt_tok_: AdapterTokens
    spec: Spec
    facts: ModelFacts | None = None
    card: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    # what forward returned that is not a number (NaN, infinity), one sentence each, until read
    output_notes: list[str] = field(default_factory=list)

    family: Family = "adapter"
    injectable = False  # masks and interventions go into core's own forward pass only
    thread_safe = False  # a user's module may keep state between calls (caches, counters)
    masks_from_ids = True  # the model builds its masks from the ids: PAD content cannot be changed

    # -- facts ------------------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return self.spec.arch

    @property
    def cfg(self) -> ModelFacts:
        assert self.facts is not None, "checked at load"
        return self.facts

    @property
    def has_decoder(self) -> bool:
        return self.arch != "encoder"

    @property
    def tgt_tok(self) -> AdapterTokens | None:
        return self.tgt_tok_ if self.has_decoder else None

    @property
    def out_tok(self) -> AdapterTokens:
        """The vocabulary of forward's last axis."""
        return self.tgt_tok_ if self.has_decoder or self.spec.tgt_vocab else self.src_tok

    @property
    def max_len(self) -> int | None:
        return self.spec.max_len

    @property
    def max_src_tokens(self) -> int:
        return self.max_len or 10**9

    @property
    def labels(self) -> list[str]:
        """Class names of an encoder classifier (LABELS), else []."""
        return list(self.spec.labels)

    @property
    def summary(self) -> str:
        return str(self.meta.get("summary", ""))

    @property
    def device(self) -> str:
        return str(next(self.model.parameters(), torch.empty(0)).device)

    def position_table(self) -> PositionTable:
        cfg = self.cfg
        return find_position_table(self.model, cfg.pos_encoding, cfg.d_model, cfg.pos_offset)

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return self.model.named_parameters()

    def to(self, device: str) -> AdapterModel:
        other = copy.copy(self)
        other.model = copy.deepcopy(self.model).to(resolve_device(device)).eval()
        other.output_notes = []
        return other

    def audit_facts(self) -> dict[str, Any]:
        return {
            "pad_id": self.spec.pad,
            "skip_ids": self.spec.specials,
            "vocab": (
                len(self.src_tok) if self.arch != "decoder" else None,
                len(self.out_tok) if self.has_decoder else None,
            ),
            "max_len": self.max_len,
        }

    # -- input ------------------------------------------------------------------------------------
    def _ids(self, fn, text: str, what: str, vocab: int, truncate: bool) -> Prepared:
        if text is None or not str(text).strip():
            raise InputError(f"the {what} text is empty: type some text for the model to read")
        try:
            out = fn(text)
        except SystemExit as exc:
            fname = "encode" if fn is self.module.encode else "encode_target"
            raise InputError(f"{fname}({str(text)[:40]!r}) {_exited(exc)}") from None
        except Exception as exc:  # the user's encode: any error is a message about the text
            raise InputError(f"the {what} cannot be encoded: {type(exc).__name__}: {_one_line(exc)}") from exc
        try:
            ids = _id_list(out)
        except TypeError as exc:
            name = "encode" if fn is self.module.encode else "encode_target"
            raise InputError(f"{name}({str(text)[:40]!r}) {exc}") from exc
        if not ids:
            raise InputError(f"the {what} has no tokens the model can read")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise InputError(f"encode returned id {bad[0]}, outside the vocabulary of {vocab} tokens")
        warnings = []
        limit = self.max_len - (1 if what == "target" else 0) if self.max_len else None
        if limit and len(ids) > limit:
            if not truncate:
                raise InputError(f"the {what} has {len(ids)} tokens; this model takes at most {limit}")
            warnings.append(f"{what} truncated from {len(ids)} to {limit} tokens (MAX_LEN)")
            ids = ids[:limit]
        return Prepared(ids, warnings)

    def prepare(self, text: str, truncate: bool = False) -> Prepared:
        return self._ids(self.module.encode, text, "input", len(self.src_tok), truncate)

    def prepare_target(self, text: str, truncate: bool = False) -> Prepared:
        if not self.has_decoder:
            raise InputError("this model has no decoder, so it takes no target text")
        fn = getattr(self.module, "encode_target", None) or self.module.encode
        return self._ids(fn, text, "target", len(self.tgt_tok_), truncate)

    # -- running ----------------------------------------------------------------------------------
    def _forward(self, src, tgt) -> torch.Tensor:
        """The user's forward -> probabilities (B, L, V), at most MAX_BATCH sequences per call."""
        parts = self._parts((tgt if tgt is not None else src).shape[0])
        if len(parts) == 1:
            return self._call(src, tgt)
        return torch.cat([self._call(_rows(src, p), _rows(tgt, p)) for p in parts])

    def _parts(self, n: int) -> list[slice]:
        """The batch rows of each call to forward: all at once, or MAX_BATCH at a time."""
        step = self.spec.max_batch or n
        return [slice(i, min(i + step, n)) for i in range(0, n, step)]

    def _call(self, src, tgt) -> torch.Tensor:
        """One call of the user's forward -> probabilities (B, L, V), or (B, len(LABELS)); shape checked."""
        try:
            out = _logits(self.module.forward(self.model, src, tgt))
        except SystemExit as exc:
            raise InputError(f"forward(model, {_shape(src)}, {_shape(tgt)}) {_exited(exc)}") from None
        except Exception as exc:
            raise self._forward_error(exc, src, tgt) from exc
        ref = tgt if tgt is not None else src
        b = ref.shape[0]
        if self.labels:  # a classifier: one distribution over LABELS per sequence
            want = f"[{b}, {len(self.labels)}] (one score per LABELS entry)"
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (b, len(self.labels)):
                raise InputError(f"forward returned {_returned(out)}; a classifier must return {want}")
            return self._checked_probs(out.detach())
        want = f"[{b}, {ref.shape[1]}, {len(self.out_tok)}]"
        if not isinstance(out, torch.Tensor) or out.dim() != 3 or tuple(out.shape[:2]) != tuple(ref.shape):
            if (
                isinstance(out, torch.Tensor)
                and out.dim() == 2
                and out.shape[0] == b
                and self.arch == "encoder"
            ):
                raise InputError(
                    f"forward returned {_returned(out)}, one row per sequence: a classifier sets LABELS "
                    f"(one name per class), a model with an output per token returns {want}"
                )
            hint = ""
            if (
                isinstance(out, torch.Tensor)
                and out.dim() == 3
                and tuple(out.shape[:2]) == tuple(ref.shape)[::-1]
            ):
                hint = " (sequence-first? transpose it to batch-first)"
            raise InputError(
                f"forward returned {_returned(out)}{hint}; it must return logits or probabilities {want}: "
                "a tensor, a tuple with it first, or an output with .logits"
            )
        if out.shape[2] < len(self.out_tok):  # more is fine: a vocabulary padded to a multiple of 64
            raise InputError(
                f"forward returned {_returned(out)}: its last axis must be the vocabulary, {want}"
            )
        return self._checked_probs(out.detach())

    def _checked_probs(self, out: torch.Tensor) -> torch.Tensor:
        """forward's float output as probabilities; values that are not numbers (NaN, infinity) are
        kept, and said once in ``output_notes`` (the command line prints them)."""
        if not out.is_floating_point():
            raise InputError(
                f"forward returned {str(out.dtype).removeprefix('torch.')} values; it must return float "
                "logits, log-probabilities or probabilities"
            )
        probs = _as_probs(out)
        if not bool(torch.isfinite(probs).all()):  # NaN or +infinity (-infinity alone: probability 0)
            what = " and ".join(w for w, bad in (("NaN", bool(out.isnan().any())),
                                                 ("infinite", bool(out.isinf().any()))) if bad)  # fmt: skip
            note = (f"forward returned {what} values: the model's output probabilities are not numbers, so "
                    "the answer it gives means nothing")  # fmt: skip
            if note not in self.output_notes:
                self.output_notes.append(note)
        return probs

    def _forward_error(self, exc: Exception, src, tgt) -> InputError:
        """forward raised: one sentence, and MAX_BATCH suggested when one sequence alone runs."""
        what = f"forward(model, {_shape(src)}, {_shape(tgt)}) raised {type(exc).__name__}: {_one_line(exc)}"
        if (tgt if tgt is not None else src).shape[0] > 1:
            try:
                with torch.no_grad():
                    self.module.forward(self.model, _rows(src, slice(0, 1)), _rows(tgt, slice(0, 1)))
            except (Exception, SystemExit):
                pass
            else:
                return InputError(
                    f"{what}; one sequence alone runs: if the model takes at most N sequences per call "
                    "(a cache sized for a batch), set MAX_BATCH = N in the adapter file"
                )
        if isinstance(exc, IndexError) and self.spec.max_len is None:
            return InputError(
                f"{what}; if the model takes at most N tokens (a table of positions), set MAX_LEN = N"
            )
        return InputError(what)

    def forward_outputs(self, src, tgt, src_real=None, tgt_real=None) -> dict[str, torch.Tensor]:
        """Output probabilities at every position (the model builds its masks from the ids)."""
        with torch.no_grad():
            probs = self._forward(src if self.arch != "decoder" else None, tgt if self.has_decoder else None)
        if self.labels:  # one output per sequence: seen from every position, so position checks apply
            probs = probs[:, None, :].expand(-1, src.shape[1], -1)
        return {"dec" if self.has_decoder else "enc": probs}

    @torch.no_grad()
    def _greedy(self, src: torch.Tensor) -> list[list[int]]:
        """Seq2seq: decoder inputs of greedy decoding ([BOS] + every generated token but the last)."""
        m = self.spec
        limit = min(MAX_NEW_TOKENS, (self.max_len or MAX_NEW_TOKENS + 1) - 1)
        rows = [[m.start] for _ in range(src.shape[0])]
        done = [False] * src.shape[0]
        for _ in range(limit):
            tgt, _ = pad_rows(rows, m.pad, src.device)
            nxt = self._forward(src, tgt)[:, -1].argmax(-1).tolist()
            for i, t in enumerate(nxt):
                rows[i].append(m.pad if done[i] else t)
                done[i] = done[i] or t in (m.eos, m.pad)  # PAD: the model says it is done
            if all(done):
                break
        out = []
        for r in rows:
            new = r[1:]
            if m.pad in new:  # a generated PAD ends the output (it is not kept: the model would mask it)
                new = new[: new.index(m.pad)] + [m.pad]
            if m.eos in new:
                new = new[: new.index(m.eos) + 1]
            out.append([m.start] + new[:-1])
        return out

    @torch.no_grad()
    def _continue(self, ids: list[int]) -> list[int]:
        """Decoder only: greedy continuation of one prompt (up to and including EOS)."""
        m = self.spec
        room = min(MAX_NEW_TOKENS, (self.max_len or 10**9) - len(ids))
        new: list[int] = []
        for _ in range(max(room, 0)):
            seq = torch.tensor([ids + new], device=self.device)
            t = int(self._forward(None, seq)[0, -1].argmax())
            if t == m.pad:  # the model says it is done; PAD is never part of a sequence
                break
            new.append(t)
            if t == m.eos:
                break
        return new

    def trace(self, sources, targets=None, truncate=False, masks=None, interv=None) -> list[AttentionTrace]:
        if not sources:
            raise InputError("no input text given")
        if masks is not None or (interv is not None and interv.active):
            raise InputError("custom masks and interventions work on core models only, not on adapter models")
        check_trace_budget(0, len(sources))
        prepared = [self.prepare(s, truncate) for s in sources]
        tp = None if targets is None else prepare_targets(self, prepared, targets, truncate)
        return self._trace_ids(prepared, tp, teacher=tp is not None)

    def trace_continuation(self, sources: list[str], truncate: bool = False) -> list[AttentionTrace]:
        if self.arch != "decoder":
            raise InputError("only decoder-only models continue a prompt; use trace() for this model")
        if not sources:
            raise InputError("no input text given")
        check_trace_budget(0, len(sources))
        prepared = [self.prepare(s, truncate) for s in sources]
        conts = [Prepared(self._continue(p.ids)) for p in prepared]
        traces = self._trace_ids(prepared, conts, teacher=False)
        return [
            t.replace(meta={**t.meta, "generated": len(c.ids)}) for t, c in zip(traces, conts, strict=True)
        ]

    def _trace_ids(
        self, prepared: list[Prepared], tp: list[Prepared] | None, teacher: bool
    ) -> list[AttentionTrace]:
        m, dev = self.spec, self.device
        src = src_real = tgt = tgt_real = None
        if self.arch == "decoder":
            rows = [p.ids + (tp[i].ids if tp else []) for i, p in enumerate(prepared)]
            if self.max_len and max(map(len, rows)) > self.max_len:
                raise InputError(f"prompt and target together exceed the model's {self.max_len} tokens")
            tgt, tgt_real = pad_rows(rows, m.pad, dev)
        else:
            src, src_real = pad_rows([p.ids for p in prepared], m.pad, dev)
            if self.arch == "seq2seq":
                rows = [[m.start] + t.ids for t in tp] if tp else self._greedy(src)
                tgt, tgt_real = pad_rows(rows, m.pad, dev)
        s_len = 0 if src is None else src.shape[1]
        t_len = 0 if tgt is None else tgt.shape[1]
        n_enc, n_dec, heads = (
            (self.facts.n_enc_layers, self.facts.n_dec_layers, self.facts.n_heads)
            if self.facts
            else (1, 1, 1)
        )
        check_trace_budget(trace_bytes(n_enc, n_dec, heads, len(prepared), s_len, t_len), len(prepared))
        start = time.perf_counter()
        lengths = [n for n in (s_len, t_len) if n]
        first, outs, parts = None, [], []
        dropped: list[str] = []  # records left out of the trace, said in its capture notes
        for part in self._parts(len(prepared)):  # one capture per call of forward (MAX_BATCH)
            with torch.no_grad(), capture_attention(self.model, lengths=lengths) as cap:
                outs.append(self._call(_rows(src, part), _rows(tgt, part)))
            first = cap if first is None else first
            parts.append(self._stacks(cap, s_len, t_len, dropped, rows=part.stop - part.start))
        ms = (time.perf_counter() - start) * 1000
        if first is None:  # _parts of a non-empty batch has one part at least
            raise InputError("no input text given")
        probs, joined_stacks, cap = torch.cat(outs), _join_stacks(parts), first
        labels = joined_stacks.pop("sides")
        stacks = {k: (*v[:3], v[8]) for k, v in joined_stacks.items()}
        learned = {k: (v[3], v[4]) for k, v in joined_stacks.items() if v[3] is not None}
        norms = {k: (v[5], v[6]) for k, v in joined_stacks.items() if v[5] is not None}
        residual = {k: v[7] for k, v in joined_stacks.items() if v[7] is not None}
        src_side = (
            None
            if src is None or src_real is None
            else _side(src, src_real, self.src_tok.tokens, labels["src"])
        )
        tgt_side = (
            None
            if tgt is None or tgt_real is None
            else _side(tgt, tgt_real, self.tgt_tok_.tokens, labels["tgt"])
        )
        real_rows = tgt_real if tgt_real is not None else src_real
        if real_rows is None:
            raise InputError("the model read neither a source nor a target")
        sources = {k: s for k, s in self._mask_sources(cap).items() if k in stacks}
        differ = cap.head_masks_differ()  # heads masked differently: the masks shown are all heads' share
        traces = []
        for i, p in enumerate(prepared):
            meta = {"forward_ms": round(ms, 3), "teacher_forced": teacher, "warnings": list(p.warnings),
                    "kind": "adapter", "arch": self.arch, "has_scores": True, "mask_sources": sources}  # fmt: skip
            if cap.notes or dropped:
                meta["capture_notes"] = [*cap.notes, *dropped][:20]
            if differ:
                meta["head_masks_differ"] = differ
            if learned:
                meta["learned_keys"] = {k: list(labs) for k, (_, labs) in learned.items()}
            if norms:
                meta["value_norms"] = {k: scope for k, (_, scope) in norms.items()}
            if self.labels:  # a classifier: the class and its distribution, like core classifiers
                k = int(probs[i].argmax())
                meta["labels"] = self.labels
                text = self.labels[k]
                fields: dict[str, Any] = {
                    "out_tokens": (self.labels[k],),
                    "out_probs": probs[i].cpu().numpy(),
                }
            else:
                fields = prediction_fields(probs[i], self.out_tok.tokens)
                guesses = fields["topk_ids"][:, 0]
                n_real = int(real_rows[i].sum())
                if self.arch == "decoder":
                    n_prompt = len(p.ids)
                    meta.update(prompt_len=n_prompt, decoder_only=True)
                    if tp and teacher:
                        text = self.out_tok.decode(guesses[n_prompt - 1 : n_real - 1])
                    elif tp:  # a continuation: the generated tokens
                        text = self.out_tok.decode(tp[i].ids)
                    else:
                        text = self.out_tok.decode(guesses[n_prompt - 1 : n_prompt])
                else:
                    ids = list(guesses[:n_real])
                    if self.arch == "seq2seq" and m.eos is not None and m.eos in ids:
                        ids = ids[: ids.index(m.eos)]
                    text = self.out_tok.decode(ids)
            for kind, (weights, _) in learned.items():
                fields[f"{kind}_learned"] = weights[i].detach().float().cpu().numpy()
            for kind, (vn, _) in norms.items():
                fields[f"{kind}_value_norms"] = vn[i].detach().float().cpu().numpy()
            for kind, rn in residual.items():
                fields[f"{kind}_residual_norms"] = rn[i].detach().float().cpu().numpy()
            traces.append(
                package_trace(
                    i,
                    model=self.name,
                    config_name="adapter",
                    device=dev,
                    src=src_side,
                    tgt=tgt_side,  # None for encoders
                    maps=stacks,
                    output_text=text,
                    meta=meta,
                    **fields,
                )  # fmt: skip
            )
        return traces

    def _mask_sources(self, cap: Captured) -> dict[str, str]:
        out: dict[str, str] = {}
        for r in cap.records:
            kind = self._kind(r)
            out.setdefault(kind, r.mask_source or "none")
        return out

    def _kind(self, record) -> str:
        return {"encoder": "enc_self", "decoder": "dec_self"}.get(self.arch, record.kind)

    def _stacks(
        self, cap: Captured, s_len: int, t_len: int, dropped: list[str] | None = None, rows: int | None = None
    ) -> dict[str, Any]:
        """kind -> (probs (B, layer, H, q, k), scores or None, mask (B, q, k), learned (B, layer, H, q, M)
        or None, their labels), checked against the lengths and (``rows``) the batch of the call;
        "src"/"tgt" -> the labels of learned positions joined to that side's tokens (a [CLS]), None
        where there are none."""
        records = cap.records
        joined = cap.joined_labels()
        sides: dict[str, tuple[str | None, ...] | None] = {"src": None, "tgt": None}
        for r in records:
            side = "src" if self._kind(r) == "enc_self" else "tgt"
            # (the labels of a sequence's positions, its tokens among them: a learned query that only asks, a
            # pooling head's seed, is no position of it)
            if r.query_labels and None in r.query_labels and sides[side] is None:
                sides[side] = r.query_labels
        s_full = s_len + sum(lab is not None for lab in sides["src"] or ())
        t_full = t_len + sum(lab is not None for lab in sides["tgt"] or ())
        want = {"enc_self": (s_full, s_full), "dec_self": (t_full, t_full), "cross": (t_full, s_full)}
        stepwise = self.arch == "decoder" and all(
            tuple(r.probs.shape[-2:]) != want["dec_self"] for r in records
        )
        if stepwise and records:  # no full map: perhaps a forward that runs its KV cache step by step
            records = _decode_steps(records, t_len) or records
        if self.arch == "seq2seq" and records:  # a decoder run a step at a time (an RNN's): its cross
            records = _cross_steps(records, want["cross"], self._kind)  # attention step by step
        by_kind: dict[str, list] = {}
        for r in records:
            kind = self._kind(r)
            n_keys = sum(
                lab is None or lab in joined for lab in (r.key_labels or (None,) * r.probs.shape[-1])
            )
            note = None
            if (r.probs.shape[-2], n_keys) != want[kind]:  # attention over something that is not the tokens
                note = (f"{r.name or '(model)'} {tuple(r.probs.shape)}: left out of the trace, its "
                        f"{r.probs.shape[-2]} x {n_keys} map is not the {want[kind][0]} x "
                        f"{want[kind][1]} of this input's tokens")  # fmt: skip
            elif rows is not None and r.probs.shape[0] != rows:  # blocks or slices of the sequences
                note = (f"{r.name or '(model)'} {tuple(r.probs.shape)}: left out of the trace, it holds "
                        f"{r.probs.shape[0]} maps per head where this call has {rows} sequence(s) (attention "
                        "over blocks or slices of the sequences, each map a piece)")  # fmt: skip
            if note is not None:
                if dropped is not None and note not in dropped:
                    dropped.append(note)
                continue
            by_kind.setdefault(kind, []).append(r)
        if not by_kind and records:  # attention was found, over other positions than the tokens
            raise InputError(
                f"the forward pass computed {len(records)} attention map(s), none of them over this input's "
                "tokens, so there is nothing to draw: " + "; ".join([*(dropped or []), *cap.notes][:2])
            )
        if not by_kind:
            raise InputError(
                "no attention found in the forward pass: attnscope records nn.MultiheadAttention, "
                "F.scaled_dot_product_attention and every softmax over query-key scores; attention "
                "inside TorchScript or a compiled extension cannot be seen"
                + (f" ({'; '.join([*cap.notes, *(dropped or [])][:2])})" if cap.notes or dropped else "")
            )
        out: dict[str, Any] = {}
        for kind in KINDS:
            recs = by_kind.get(kind)
            if not recs:
                continue
            groups = stack_groups(recs, joined)  # layers with other head counts: the most calls drawn
            if len(groups) > 1:
                best = max(range(len(groups)), key=lambda i: (len(groups[i]), -i))
                for i, g in enumerate(groups):
                    note = stack_note(kind, g, groups[best])
                    if i != best and dropped is not None and note not in dropped:
                        dropped.append(note)
                recs = groups[best]
            try:
                km = kind_maps(recs, joined)
            except ValueError as exc:
                raise InputError(f"{kind}: {exc}") from None
            b, (q, k) = km.probs.shape[0], want[kind]
            mask = torch.ones(b, q, k, dtype=torch.bool) if km.mask is None else km.mask.cpu()
            out[kind] = (
                km.probs,
                km.scores,
                mask,
                km.learned,
                km.learned_labels,
                km.value_norms,
                km.value_scope,
                km.residual_norms,
                None if km.layer_masks is None else km.layer_masks.cpu(),
            )
        out["sides"] = sides
        return out

    @torch.no_grad()
    def predict(self, sources: list[str]) -> list[str]:
        if self.arch == "decoder":
            return [self.out_tok.decode(self._continue(self.prepare(s).ids)) for s in sources]
        return [t.output_text for t in self.trace(sources)]


def _side(ids: torch.Tensor, real: torch.Tensor, tokens, labels: tuple[str | None, ...] | None) -> Side:
    """One side of the batch, with the learned positions the model joins to it (a [CLS]) put in
    where they sit: id -1, real, shown under their labels."""
    if not labels or sum(lab is None for lab in labels) != ids.shape[1]:
        return Side(ids, real, tokens)
    at = torch.tensor([lab is not None for lab in labels], device=ids.device)
    full_ids = torch.full((ids.shape[0], len(labels)), -1, dtype=ids.dtype, device=ids.device)
    full_real = torch.ones(ids.shape[0], len(labels), dtype=torch.bool, device=real.device)
    full_ids[:, ~at] = ids
    full_real[:, ~at] = real.bool()

    def named(row: list[int]) -> list[str]:
        plain = iter(tokens([t for t, lab in zip(row, labels, strict=True) if lab is None]))
        return [lab if lab is not None else next(plain) for lab in labels]

    return Side(full_ids, full_real, named, vocab=tokens)


def _rows(t: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return None if t is None else t[rows]


def _decode_steps(records: list[Record], n: int) -> list[Record] | None:
    """A decoder-only forward that runs its KV cache step by step (a prefix, then a token at a time)
    records each layer once per step, (B, H, q, past + q): joined into one (B, H, n, n) record per
    layer, 0 (and masked) at the keys that did not exist yet. None unless the steps tile [0, n)."""
    steps: list[list[Record]] = []
    for r in records:  # a step is a run of records of one shape (its layers); k grows every step
        if steps and steps[-1][0].probs.shape[-2:] == r.probs.shape[-2:]:
            steps[-1].append(r)
        else:
            steps.append([r])
    end, n_layers = 0, len(steps[0])
    for step in steps:
        q, k = step[0].probs.shape[-2:]
        if k != end + q or len(step) != n_layers:
            return None
        end = k
    if len(steps) < 2 or end != n or len({r.probs.shape[:2] for r in records}) != 1:
        return None
    joined = []
    for layer in range(n_layers):
        first = steps[0][layer]
        b, h = first.probs.shape[:2]
        probs = first.probs.new_zeros(b, h, n, n)
        mask = torch.zeros(b, n, n, dtype=torch.bool)
        for step in steps:
            r = step[layer]
            q, k = r.probs.shape[-2:]
            probs[:, :, k - q : k, :k] = r.probs
            mask[:, k - q : k, :k] = True if r.mask is None else r.mask.cpu()
        joined.append(replace(first, kind="dec_self", probs=probs, scores=None, mask=mask))
    return joined


def _cross_steps(records: list[Record], want: tuple[int, int], kind_of) -> list[Record]:
    """A decoder that runs a step at a time (an RNN decoder with attention, teacher-forced) records
    each attention module's cross-attention once per step, (B, H, q, S) with a few queries each: one
    module's steps, in call order, are joined along the queries into its (B, H, T, S) map when they
    cover exactly the target's T positions. Anything else is left as it is."""
    t, s = want
    steps: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        if kind_of(r) == "cross" and r.probs.shape[-2] < t and r.probs.shape[-1] == s:
            steps.setdefault(r.name, []).append(i)
    out = list(records)
    drop: set[int] = set()
    for at in steps.values():
        parts = [records[i] for i in at]
        if len(parts) < 2 or sum(int(r.probs.shape[-2]) for r in parts) != t:
            continue
        if len({(tuple(r.probs.shape[:2]), r.key_labels) for r in parts}) != 1:
            continue
        first = parts[0]
        masks = [r.mask if r.mask is not None else torch.ones(r.probs.shape[0], *r.probs.shape[2:], dtype=torch.bool)
                 for r in parts]  # fmt: skip
        scores = None if any(r.scores is None for r in parts) else torch.cat([r.scores for r in parts], dim=2)  # type: ignore[misc]
        out[at[0]] = replace(first, probs=torch.cat([r.probs for r in parts], dim=2), scores=scores,
                             mask=torch.cat([m.cpu() for m in masks], dim=1), residual_of=None)  # fmt: skip
        # (the values are the keys' and the same at every step: the first step's stand for all)
        drop.update(at[1:])
    return [r for i, r in enumerate(out) if i not in drop]


def _join_stacks(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The stacks of consecutive calls of forward (MAX_BATCH rows each) as one batch."""
    if len(parts) == 1:
        return parts[0]
    shapes = [{k: (tuple(v[0].shape[1:]), v[4]) for k, v in p.items() if k != "sides"} for p in parts]
    if any(sh != shapes[0] for sh in shapes):
        raise InputError(
            f"forward recorded other attention layers or heads in each call of MAX_BATCH sequences "
            f"({shapes[0]} then {next(sh for sh in shapes if sh != shapes[0])})"
        )
    out: dict[str, Any] = {"sides": parts[0]["sides"]}
    for kind in parts[0]:
        if kind == "sides":
            continue
        probs = torch.cat([p[kind][0] for p in parts])
        scores = [p[kind][1] for p in parts]
        mask = torch.cat([p[kind][2] for p in parts])
        learned = [p[kind][3] for p in parts]
        vn = [p[kind][5] for p in parts]
        rn = [p[kind][7] for p in parts]
        # each layer's masks where some part's layers were masked differently (the others' one mask repeated)
        lm = None
        if any(p[kind][8] is not None for p in parts):
            lm = torch.cat([p[kind][8] if p[kind][8] is not None
                            else p[kind][2][:, None].expand(-1, p[kind][0].shape[1], -1, -1) for p in parts])  # fmt: skip
        same_scope = len({p[kind][6] for p in parts}) == 1
        out[kind] = (probs, None if any(x is None for x in scores) else torch.cat(scores), mask,
                     None if any(x is None for x in learned) else torch.cat(learned), parts[0][kind][4],
                     None if any(x is None for x in vn) or not same_scope else torch.cat(vn),
                     parts[0][kind][6], None if any(x is None for x in rn) else torch.cat(rn), lm)  # fmt: skip
    return out


def _as_probs(out: torch.Tensor) -> torch.Tensor:
    """Logits, log-probabilities or probabilities (B, L, V) -> float32 probabilities. Probabilities
    sum to 1 within the precision of their dtype (bfloat16 sums are off by up to ~4e-3)."""
    tol = max(1e-3, float(torch.finfo(out.dtype).eps)) if out.is_floating_point() else 1e-3
    out = out.float()
    sums = out.sum(-1)
    if bool(((out >= 0) & (out <= 1)).all()) and bool(torch.allclose(sums, torch.ones_like(sums), atol=tol)):
        return out
    return torch.softmax(out, dim=-1)  # logits; log-probabilities give the same probabilities


def _examples(module, tok: AdapterTokens, name: str) -> list[str]:
    given = getattr(module, "EXAMPLES", None)
    if given is not None and not isinstance(given, (str, list, tuple)):
        raise ModelLoadError(
            f"{name}: EXAMPLES is {type(given).__name__}; it must be a list of texts (inputs the model takes)"
        )
    given = given or []
    given = [str(e) for e in ([given] if isinstance(given, str) else given) if str(e).strip()]
    if given:
        return given
    plain = [
        t
        for i, t in enumerate(tok.itos)
        if i not in tok.specials and t.strip() and not t.startswith(SPECIAL_SHAPES)
    ]
    sep = "" if tok.kind == "char" else " "
    return [sep.join(plain[:5]), sep.join(plain[5:8] or plain[:3])]


def _load_model(module, name: str, device: str) -> nn.Module:
    """``load()``, or ``load(device=...)`` when it takes a ``device`` argument."""
    params: Mapping[str, Any]
    try:
        params = inspect.signature(module.load).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        params = {}
    try:
        model = module.load(device=torch.device(device)) if "device" in params else module.load()
    except SystemExit as exc:
        raise ModelLoadError(f"{name}: load() {_exited(exc)}") from None
    except Exception as exc:
        raise ModelLoadError(f"{name}: load() raised {type(exc).__name__}: {_one_line(exc)}") from exc
    if not isinstance(model, nn.Module):
        raise ModelLoadError(
            f"{name}: load() returned {type(model).__name__}; it must return a torch.nn.Module"
        )
    return model


def load_adapter(path: str | Path, name: str | None = None, device: str = "cpu") -> AdapterModel:
    """Run an adapter file, build its model and check it once on its examples."""
    path = Path(path).expanduser().resolve()
    if not path.is_file() or path.suffix != ".py":
        raise ModelLoadError(f"{path} is not a Python adapter file")
    module = _import(path)
    spec = _check_names(module, path.name)
    device = resolve_device(device)
    model = _load_model(module, path.name, device).eval().to(device)
    src_tok = AdapterTokens(spec.vocab, module.encode, spec.specials)
    tgt_tok = AdapterTokens(spec.tgt_vocab or spec.vocab, getattr(module, "encode_target", None) or module.encode,
                            spec.specials)  # fmt: skip
    doc = (module.__doc__ or "").strip()
    examples = _examples(module, src_tok, path.name)
    meta = {
        "kind": "adapter",
        "arch": spec.arch,
        "source": str(path),
        "summary": (doc.splitlines()[0] if doc else f"adapter {path.name} ({module.ARCH})")[:200],
        "examples": examples,
    }
    lm = AdapterModel(name or path.stem, path.parent, path, module, model, src_tok, tgt_tok, spec,
                      card=f"# {path.name}\n\n{doc}\n" if doc else f"# {path.name}\n", meta=meta)  # fmt: skip
    try:
        probe = lm.trace(examples[:2], truncate=True)
    except InputError as exc:
        raise ModelLoadError(f"{path.name}: checking the model on {examples[:2]!r} failed: {exc}") from exc
    tr = probe[0]
    n_heads = max(tr.probs(k).shape[1] for k in tr.kinds)
    d_model = next((mod.embedding_dim for mod in model.modules() if isinstance(mod, nn.Embedding)), 0)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    lm.facts = ModelFacts(
        name=lm.name,
        model_type="adapter",
        arch=spec.arch,
        d_model=int(d_model),
        n_heads=int(n_heads),
        n_enc_layers=tr.probs("enc_self").shape[0] if "enc_self" in tr.kinds else 0,
        n_dec_layers=max((tr.probs(k).shape[0] for k in ("dec_self", "cross") if k in tr.kinds), default=0),
        src_vocab_size=len(src_tok),
        tgt_vocab_size=len(tgt_tok),
        max_len=int(lm.max_len or 0),
        pad_id=spec.pad,
        bos_id=-1 if spec.bos is None else spec.bos,
        eos_id=-1 if spec.eos is None else spec.eos,
        dtype=str(dtype).removeprefix("torch."),
        pos_encoding="unknown",
        n_classes=len(lm.labels),
    )
    lm.meta["kinds_found"] = list(tr.kinds)
    if tr.meta.get("capture_notes"):  # the loading check says what capture could not verify
        lm.meta["capture_notes"] = list(tr.meta["capture_notes"])
    return lm
