"""AttentionTrace: tokens and the attention they produced, carried together.

One trace describes one input sequence (in a batch, each sequence keeps the
batch's padded length so PAD positions stay visible). Tensors are numpy,
read-only, shaped ``[layer, head, query, key]``; masks are bool ``[query, key]``,
True = may attend (``[layer, query, key]`` too where a kind's layers were masked differently). Query/key tokens for each kind come from ``axes(kind)``, so a
plot can never label rows with tokens from another tensor.

Kinds and their axes:
- ``enc_self``: query = source, key = source
- ``dec_self``: query = decoder input (BOS + target), key = the same
- ``cross``:    query = decoder input, key = source
Decoder-only models (GPT-2 family, attnscope.core.families.hf) have ``dec_self`` only: src_tokens is empty and
tgt_tokens is the whole sequence (prompt, then target), so ``axes`` stays as above.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

KINDS = ("enc_self", "dec_self", "cross")
KIND_LABELS = {
    "enc_self": "encoder self-attention",
    "dec_self": "decoder self-attention",
    "cross": "cross-attention",
}
_ARRAYS = (
    "src_ids", "tgt_ids",
    "enc_self", "dec_self", "cross",
    "enc_self_scores", "dec_self_scores", "cross_scores",
    "enc_self_mask", "dec_self_mask", "cross_mask",
    "out_probs", "topk_ids", "topk_probs",
    "src_real", "tgt_real", "topk_tokens",
    "enc_self_learned", "dec_self_learned", "cross_learned",
    "enc_self_value_norms", "dec_self_value_norms", "cross_value_norms",
    "enc_self_residual_norms", "dec_self_residual_norms", "cross_residual_norms",
    "enc_self_layer_masks", "dec_self_layer_masks", "cross_layer_masks",
)  # fmt: skip
LEARNED = ("enc_self_learned", "dec_self_learned", "cross_learned")  # trace format 2
VALUE_NORMS = (  # trace format 3: what attention moves
    "enc_self_value_norms", "dec_self_value_norms", "cross_value_norms",
    "enc_self_residual_norms", "dec_self_residual_norms", "cross_residual_norms",
)  # fmt: skip
# trace format 4: every layer's mask, where the layers of a kind were masked differently
LAYER_MASKS = ("enc_self_layer_masks", "dec_self_layer_masks", "cross_layer_masks")
_TOKENS = ("src_tokens", "tgt_tokens", "out_tokens")


def head_masks_differ(meta: Any) -> dict[str, list[str]]:
    """A trace's meta ``head_masks_differ`` (kind -> modules whose heads were masked differently), read
    as a file from outside may hold it: only known kinds with a non-empty list of names."""
    differ = meta.get("head_masks_differ") if isinstance(meta, dict) else None
    if not isinstance(differ, dict):
        return {}
    return {k: [str(n) for n in v] for k, v in differ.items() if k in KINDS and isinstance(v, list) and v}


def meta_texts(meta: Any, key: str) -> list[str]:
    """``meta[key]``, a list of sentences (warnings, capture notes), as a trace's meta may hold it: its strings
    (one string: that one), and nothing for anything else. The trace reader refuses a file whose list is no list
    of strings; a trace made in memory (an adapter's own meta) is taken as it comes, and never raises here."""
    value = meta.get(key) if isinstance(meta, dict) else None
    if isinstance(value, str):
        return [value] if value else []
    if not isinstance(value, list | tuple):
        return []
    return [v for v in value if isinstance(v, str) and v]


def _readonly(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        a.setflags(write=False)
    return a


@dataclass(frozen=True)
class AttentionTrace:
    model: str  # zoo name or path of the model
    config_name: str  # config.name
    device: str  # device the forward pass ran on, e.g. "cpu", "cuda:0"
    src_tokens: tuple[str, ...]  # source tokens (specials and PAD included)
    tgt_tokens: tuple[str, ...] = ()  # decoder input tokens, BOS first (empty: encoder-only)
    src_ids: np.ndarray | None = None  # (S,)
    tgt_ids: np.ndarray | None = None  # (T,)
    enc_self: np.ndarray | None = None  # probs (layer, head, S, S)
    dec_self: np.ndarray | None = None  # probs (layer, head, T, T)
    cross: np.ndarray | None = None  # probs (layer, head, T, S)
    enc_self_scores: np.ndarray | None = None  # q.k/sqrt(d), before mask and softmax
    dec_self_scores: np.ndarray | None = None
    cross_scores: np.ndarray | None = None
    enc_self_mask: np.ndarray | None = None  # bool (S, S), True = may attend
    dec_self_mask: np.ndarray | None = None  # bool (T, T)
    cross_mask: np.ndarray | None = None  # bool (T, S)
    out_tokens: tuple[str, ...] = ()  # argmax token at each decoder position (or class label)
    out_probs: np.ndarray | None = None  # (T,) probability of out_tokens (or (n_classes,))
    topk_ids: np.ndarray | None = None  # (T, k) ids of the k most likely next tokens
    topk_probs: np.ndarray | None = None  # (T, k) their probabilities
    output_text: str = ""  # the model's answer as text
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. forward_ms, teacher_forced, labels
    src_real: np.ndarray | None = None  # (S,) bool, True = a real source token (False = PAD)
    tgt_real: np.ndarray | None = None  # (T,) bool, True = a real decoder position
    topk_tokens: np.ndarray | None = None  # (T, k) str: topk_ids as tokens (a trace file has no vocabulary)
    # weights on learned keys that are not positions of the sequence (memory key/values, a null key):
    # (layer, head, query, M), labelled by meta["learned_keys"][kind]; the kind's map holds the rest
    enc_self_learned: np.ndarray | None = None
    dec_self_learned: np.ndarray | None = None
    cross_learned: np.ndarray | None = None
    # ||f_h(x_j)||: the norm of what head h moves from key j per unit of weight, (layer, head, key), with
    # f_h(x) = (x W_V,h + b_V,h) W_O,h (meta["value_norms"][kind] says when W_O could not be included)
    enc_self_value_norms: np.ndarray | None = None
    dec_self_value_norms: np.ndarray | None = None
    cross_value_norms: np.ndarray | None = None
    # ||x_i||: the residual stream each query's attention output is added to, (layer, query)
    enc_self_residual_norms: np.ndarray | None = None
    dec_self_residual_norms: np.ndarray | None = None
    cross_residual_norms: np.ndarray | None = None
    # bool (layer, query, key): each layer's mask, only where some layer's differs from the first's
    # (sliding-window layers between global ones, a layer that forgot the padding mask); the kind's
    # ``_mask`` is then the first layer's
    enc_self_layer_masks: np.ndarray | None = None
    dec_self_layer_masks: np.ndarray | None = None
    cross_layer_masks: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name in _ARRAYS:
            _readonly(getattr(self, name))
        for name in _TOKENS:
            object.__setattr__(self, name, tuple(getattr(self, name)))

    # -- access -----------------------------------------------------------------
    @property
    def kinds(self) -> tuple[str, ...]:
        """Kinds this trace holds, in canonical order."""
        return tuple(k for k in KINDS if getattr(self, k) is not None)

    @property
    def n_layers(self) -> int:
        """Layers of the first kind present (decoder-only models have dec_self only)."""
        return getattr(self, self.kinds[0]).shape[0]

    @property
    def n_heads(self) -> int:
        return getattr(self, self.kinds[0]).shape[1]

    def probs(self, kind: str) -> np.ndarray:
        """(layer, head, query, key) post-softmax attention of one kind."""
        self._check(kind)
        return getattr(self, kind)

    def scores(self, kind: str) -> np.ndarray:
        self._check(kind)
        return getattr(self, f"{kind}_scores")

    def mask(self, kind: str, layer: int | None = None) -> np.ndarray:
        """(query, key) bool mask used by that kind, True = may attend: the first layer's where its layers
        were masked differently (``layer``: that layer's; ``layer_masks`` gives every layer's)."""
        self._check(kind)
        per_layer = getattr(self, f"{kind}_layer_masks")
        if layer is not None and per_layer is not None:
            return per_layer[layer]
        return getattr(self, f"{kind}_mask")

    def layer_masks(self, kind: str) -> np.ndarray | None:
        """(layer, query, key) bool masks of that kind, one per layer (the kind's one mask repeated where
        every layer used it, as a read-only view); None where the trace has no mask for it."""
        self._check(kind)
        per_layer = getattr(self, f"{kind}_layer_masks")
        if per_layer is not None:
            return per_layer
        mask = getattr(self, f"{kind}_mask")
        if mask is None:
            return None
        return np.broadcast_to(mask, (getattr(self, kind).shape[0], *mask.shape))

    def masks_differ(self, kind: str) -> bool:
        """Whether the layers of ``kind`` were masked differently (the trace holds each layer's mask)."""
        self._check(kind)
        return getattr(self, f"{kind}_layer_masks") is not None

    def learned(self, kind: str) -> tuple[tuple[str, ...], np.ndarray] | None:
        """(labels, weights (layer, head, query, M)) of the learned keys outside the sequence that
        ``kind`` attends to besides its tokens (memory key/values, a null key), or None."""
        self._check(kind)
        weights = getattr(self, f"{kind}_learned")
        if weights is None:
            return None
        labels = (self.meta.get("learned_keys") or {}).get(kind) or []
        return tuple(str(x) for x in labels), weights

    def asks(self, kind: str) -> np.ndarray:
        """(query,) bool: True at the rows of ``kind``'s map whose position asks. Every row, except in
        self-attention where only some of the sequence's positions are queries (agents among entities):
        there meta["query_rows"] names the rows that ask, and the others are empty (no query, no mask)."""
        n = int(self.probs(kind).shape[2])
        rows = (self.meta.get("query_rows") or {}).get(kind)
        if rows is None:
            return np.ones(n, dtype=bool)
        out = np.zeros(n, dtype=bool)
        out[np.asarray(rows, dtype=np.int64)] = True
        return out

    def value_norms(self, kind: str) -> np.ndarray | None:
        """(layer, head, key) norms ||f_h(x_j)|| of the value vectors the weights multiply, or None."""
        self._check(kind)
        return getattr(self, f"{kind}_value_norms")

    def residual_norms(self, kind: str) -> np.ndarray | None:
        """(layer, query) norms ||x_i|| of the residual stream each query's attention output joins, or None."""
        self._check(kind)
        return getattr(self, f"{kind}_residual_norms")

    def moves(self, kind: str, normalize: bool = False) -> np.ndarray | None:
        """What attention moves: ||alpha_ij f_h(x_j)|| = alpha_ij ||f_h(x_j)||, (layer, head, query, key),
        or None where the model gave no values. ``normalize``: each row scaled to sum 1 (rows that move
        nothing stay 0)."""
        norms = self.value_norms(kind)
        if norms is None:
            return None
        m = (
            np.asarray(self.probs(kind), dtype=np.float32)
            * np.asarray(norms, dtype=np.float32)[:, :, None, :]
        )
        if normalize:
            total = m.sum(axis=-1, keepdims=True)
            m = np.divide(m, total, out=np.zeros_like(m), where=total > 0)
        return m

    def value_norms_scope(self, kind: str) -> str:
        """How the norms were taken: "with the output projection" (exact contributions) or "without the
        output projection" (||v_j||: the model's W_O could not be found)."""
        scope = (self.meta.get("value_norms") or {}).get(kind)
        return str(scope) if scope else "with the output projection"

    def axes(self, kind: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(query tokens, key tokens) of one kind."""
        self._check(kind)
        if kind == "enc_self":
            return self.src_tokens, self.src_tokens
        if kind == "dec_self":
            return self.tgt_tokens, self.tgt_tokens
        return self.tgt_tokens, self.src_tokens

    def _check(self, kind: str) -> None:
        if kind not in KINDS:
            raise KeyError(f"unknown attention kind {kind!r}; expected one of {KINDS}")
        if getattr(self, kind) is None:
            why = {
                "enc_self": "no encoder",
                "dec_self": "no decoder",
                "cross": "no encoder-decoder attention",
            }[kind]
            held = ", ".join(self.kinds) or "none"
            raise KeyError(f"this trace has no {kind} attention (the model has {why}, or the trace left it out; "
                           f"it holds {held})")  # fmt: skip

    # -- conversion ---------------------------------------------------------------
    def to_numpy(self) -> dict[str, np.ndarray]:
        """Flat dict of numpy arrays using the documented file names (None fields left out)."""
        out: dict[str, np.ndarray] = {}
        for name in _TOKENS:
            out[name] = np.array(getattr(self, name), dtype=str)
        for name in _ARRAYS:
            value = getattr(self, name)
            if value is not None:
                out[name] = np.asarray(value)
        return out

    def header(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "config_name": self.config_name,
            "device": self.device,
            "output_text": self.output_text,
            "meta": self.meta,
        }

    def save(self, path: str | Path) -> Path:
        """Write ``.npz`` (numpy, no pickle) or ``.json`` (nested lists), chosen by extension
        (core/traces/trace_io.py writes every trace file)."""
        from attnscope.core.traces import trace_io

        return trace_io.write_path(self, path)

    def to_json(self) -> str:
        from attnscope.core.traces import trace_io

        return trace_io.to_json(self)

    def to_npz_bytes(self) -> bytes:
        from attnscope.core.traces import trace_io

        return trace_io.to_npz_bytes(self)

    @classmethod
    def load(cls, path: str | Path, *, max_bytes: int | None = None) -> AttentionTrace:
        """Read a ``.npz`` / ``.json`` trace, checked field by field (core/traces/trace_io.py): never unpickled;
        a bad file raises TraceFormatError with one sentence naming it."""
        from attnscope.core.traces import trace_io

        return trace_io.read_path(path, trace_io.MAX_TRACE_BYTES if max_bytes is None else max_bytes)

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> AttentionTrace:
        """The same from a file's bytes (an upload); ``name``'s extension picks the format."""
        from attnscope.core.traces import trace_io

        return trace_io.read_bytes(data, name)

    def problems(self) -> list[str]:
        """What opens but must be said: NaN, attention on keys the trace's own mask forbids, rows
        that do not sum to 1 (one sentence each, naming kind, layer and head)."""
        from attnscope.core.traces import trace_io

        return trace_io.problems(self)

    def replace(self, **changes: Any) -> AttentionTrace:
        return dataclasses.replace(self, **changes)
