"""Per-head attention from any PyTorch model, without changing its code.

    with capture_attention(model) as cap:
        out = model(src, tgt)
    cap.stacks()          # {"enc_self": (B, layer, head, q, k), "dec_self": ..., "cross": ...}
    cap.trace(0, src_tokens=..., tgt_tokens=...)  # an AttentionTrace for sequence 0

What is recorded, whatever module or function wrote it:
- ``nn.MultiheadAttention`` (through ``F.multi_head_attention_forward``): the call runs exactly as
  the caller asked (its own code, with a pass-through mode around it that keeps the q and k it hands
  to SDPA, so they are not projected a second time; where that cannot be, they are projected again
  from the call's weights the way it projects them); the scores are their product and the weights
  their softmax with the call's masks. With ``bias_k``, zero attention, static keys or dropout
  in training, the call runs once more without gradients with ``need_weights=True,
  average_attn_weights=False`` instead (that output is discarded; the RNG state is restored around
  it, so dropout draws do not move).
- ``F.scaled_dot_product_attention``: it returns no weights, so they are recomputed from q, k,
  ``attn_mask``, ``is_causal``, ``scale`` and grouped query heads (``record.check`` is the largest
  difference between ``probs @ v`` and the output SDPA returned, on 16 query rows spread over every
  sequence and head: a wrong scale, mask or head mapping moves nearly every row).
- a softmax over query-key scores (``torch.softmax``, ``F.softmax``, ``Tensor.softmax``,
  ``nn.Softmax``, ``torch.special.softmax``), split into (batch, head, query, key) from lineage
  (attnscope.core.families.lineage): every activation carries codes of its source positions and
  projected features, replayed through data-movement ops, so batch-major, head-major and
  ``chunk`` + ``cat`` folds, keys-first layouts (``k @ q.T`` softmaxed over ``dim=-2``) and einsum
  layouts are all exact; learned keys and queries (a prepended ``[CLS]``, memory key/values, a null
  key) are recorded and labelled (``record.key_labels``: ``"<mem_k 0>"``). Where lineage cannot place
  a softmax, the shape rules decide and the record is flagged (``record.exact`` False,
  ``record.flag`` the reason, a warning in ``cap.notes``). When the weights are then multiplied by a
  0/1 mask and divided by their sums (AllenNLP's ``masked_softmax``), the record holds the
  renormalized weights; when they are cast down to a lower precision (LLaMA's
  ``softmax(scores.float()).type_as(q)`` in bfloat16), the record holds the cast weights, the ones
  the model multiplies the values with.

Speed: the codes of an op are a pure function of its operands' codes (which are never written
to) and its other arguments, so they are remembered (``lineage.remember``) under the identity of
those codes and the value of the rest: the next layers, and later captures of the model on inputs
of the same shape, get the same code tensors back for a dict lookup, and the layouts decoded from
them are found by identity. An argument that has no such key (a tensor of indices, whose values can
change in place) is never remembered; the op is replayed each time.

How: a ``torch.overrides.TorchFunctionMode`` sees every torch call made in the ``with`` block
*by this thread* (modes are thread-local), so sessions running the same model in other threads
are never recorded and the model is never modified (no patched methods; global module hooks held for
the block only). Every call is passed on unchanged, so outputs are bit-identical with and without
capture: torch.nn's own encoder layers and MultiheadAttention, as torch ships them, run with the mode
set aside (their fused fast paths where torch takes them) and are recorded from their arguments. A
subclass of them is followed under the mode, where torch leaves its fused fast path: the Python path
computes the same math but not bit for bit (and returns values where the nested-tensor path writes 0
at PAD); ``capture_call`` runs the model once normally (that output is returned) and once under
capture. Modes set before the block (torch's default device, a mode of the user's) apply to the
model's ops alone: capture's own work runs with them set aside.

Which softmax is attention: one over scores made by a product of two activations. A softmax over
a projection (the vocabulary softmax at a model's end, a router made by an ``nn.Linear``) is not, and
is noted in ``cap.skipped`` (information, once per module and reason); every other softmax that is
not recorded is a warning in ``cap.notes``. Without lineage the key length must be a sequence length
of this call (either dimension of a token-id tensor that went through an embedding, one given in
``lengths=``, or keys that extend the queries' own sequence). ``include=``/``exclude=`` (glob
patterns on module paths) override the rules. A bilinear pointer scorer (a biaffine parser's
``(x W) @ y.T``) is two activations multiplied, like ``q @ k.T``, and is recorded unless excluded.
A model (or module) that is TorchScript is said in one sentence in ``cap.notes``.

Masks and scores. A ``masked_fill`` with a very negative value (or ``-inf``), a ``torch.where``
against one, an index assignment ``scores[~mask] = -1e6`` (d2l's ``sequence_mask``), or an
additive mask (values <= -1e4 added, also as ``baddbmm``'s ``input``; or >= 1e4 subtracted,
``scores - 1e30 * mask``) applied to scores before the softmax is kept as the record's mask
(True = may attend), and the scores before it as ``record.scores``; a 0/1 mask the weights are
multiplied by before a renormalization is one too (``mask_source == "multiplied"``); without
one, keys that got exactly zero in every head count as masked where their scores say a fill
(``mask_source == "zeros"``); zeros of scores of many values (underflow) make up no mask.

Kinds (``kinds={module_pattern: kind}`` overrides): ``nn.Transformer*Layer`` attributes; from
lineage, queries and keys from different inputs -> cross (whatever their lengths), keys that extend
the queries' own positions (a KV cache, a Transformer-XL memory) -> dec_self; without lineage, module
paths (cross/context/src_attn/enc_attn/encoder_attn -> cross) and lengths (q != k -> cross); a causal
mask -> dec_self; paths with "decoder" -> dec_self, else enc_self. Layers are numbered in call order
per kind; a module called twice (self, then context attention) is two records. One module per head
(``heads = nn.ModuleList([Head() ...])``, as in "Let's build GPT"): consecutive single-head calls of
``*head*.0``, ``.1``, ... are joined into one layer's record.
"""

from __future__ import annotations

import bisect
import builtins
import contextlib
import fnmatch
import functools
import hashlib
import inspect
import itertools
import math
import operator
import re
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from types import FrameType
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from attnscope.core.families import lineage
from attnscope.core.families import values as values_
from attnscope.core.families.lineage import Layout, ScoreMap
from attnscope.core.traces import trace_io
from attnscope.core.traces.trace import KINDS, AttentionTrace

NEG = -1e4  # a fill / additive value at or below this masks a key
# an additive mask of 0s and one negative value at or below this (Swin's 0 / -100) masks its keys too: a bias
# of many values (ALiBi's, far keys of a long sequence reach it) does not
SOFT_NEG = -50.0
MAX_PARAM_CODES = 1 << 20  # parameters larger than this are weights, never followed as learned positions
CHECK_ROWS = 16  # SDPA: query rows (evenly spread, first and last included) whose probs @ v is checked
# a decoder by its module path: "decoder", "text_decoder", "dec", "dec1", "dec_layers" (not "decomposable",
# "deconv_head", "decision")
_DECODER = re.compile(r"decoder|(?:^|[._])dec(?:s|\d*)(?:[._]|$)")
CROSS_WORDS = ("cross", "context", "src_attn", "enc_attn", "encoder_attn", "enc_dec", "encdec", "memory_attn")
SOFTMAX = frozenset({"softmax", "special_softmax"})
_FUNCTORCH_WRAPPED = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)
_IN_VMAP = (
    "attention computed inside torch.vmap (or another torch.func transform) is not recorded: there the model "
    "sees one example's tensors, wrapped, which capture cannot follow; run the batch without vmap to see it"
)
# calls that are attention (or may be): recorded only where a module of the model captured runs them
ATTENTION_CALLS = SOFTMAX | {
    "softmin",
    "gumbel_softmax",
    "scaled_dot_product_attention",
    "multi_head_attention_forward",
    "flex_attention",
}
DROPOUT = frozenset(
    {"dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d"}
)
MATMUL = frozenset({"matmul", "bmm", "einsum", "baddbmm", "__matmul__", "__rmatmul__", "mm"})
LINEAR = frozenset({"linear", "addmm", "bilinear"})
ADD = frozenset({"add", "add_", "__add__", "__radd__", "__iadd__"})
SUB = frozenset({"sub", "sub_", "__sub__", "__isub__", "subtract"})
MUL = frozenset({"mul", "mul_", "__mul__", "__rmul__", "__imul__", "multiply"})
DIV = frozenset({"div", "div_", "__truediv__", "__itruediv__", "true_divide", "divide"})
# weights plus a constant, their sum over a dim, and the division by it (_Session._renormalized)
RENORM_STEPS = frozenset({"add", "__add__", "__radd__", "sub", "__sub__", "sum", "div", "__truediv__", "true_divide",
                          "divide", "mul", "__mul__", "__rmul__"})  # fmt: skip
CAT = frozenset({"cat", "concat", "concatenate", "hstack", "vstack"})
TRIANGLES = frozenset({"tril", "triu", "tril_", "triu_"})
CONV = frozenset({"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"})
# (B, C, *space) pools: each channel stays itself, the positions are new ones pooled from the input's
POOL = frozenset(
    {f"{kind}_pool{d}d" for kind in ("max", "avg", "adaptive_max", "adaptive_avg", "lp") for d in (1, 2, 3)}
    | {f"max_pool{d}d_with_indices" for d in (1, 2, 3)}
)
# ops through which a tensor from outside the call (features, an image, hidden states) enters the model
ENTRY = LINEAR | CONV | MATMUL | ADD | MUL | CAT | frozenset({"layer_norm", "stack"})
IN_PLACE = frozenset({"masked_fill_", "__iadd__", "add_", "__isub__", "sub_", "__setitem__", "exp_"})
RESCALE = frozenset({"mul", "__mul__", "__rmul__", "mul_", "__imul__", "div", "__truediv__", "div_",
                     "__itruediv__"})  # fmt: skip
# ops that write into their first argument (besides every ``name_`` method and ``out=``)
WRITES = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__idiv__", "__ipow__",
                    "__ifloordiv__", "__imod__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"})  # fmt: skip
FILL = frozenset({"masked_fill", "masked_fill_"})
# ops that fold or move a tensor's axes without changing its values: followed on a tensor from outside before it
# enters (a KV cache folded into the batch, ``_folded_cache``)
FOLDS = frozenset({"view", "reshape", "transpose", "permute", "flatten", "contiguous", "swapaxes", "movedim",
                   "__getitem__", "narrow"})  # fmt: skip
# reductions over the positions of a tensor from outside: a pooled token where it is joined to them (CLIP's mean)
OUTSIDE_POOLS = frozenset({"mean", "sum", "amax", "max"})
# moves of 2-D token ids followed to the embedding (a time-first batch sorted by length: ``src[:, idx]``)
ID_MOVES = frozenset(
    {"__getitem__", "index_select", "t", "T", "mT", "transpose", "swapaxes", "swapdims", "permute"}
)
# moves of such a pool before it is joined (``x.mean(1).unsqueeze(1)``)
POOL_MOVES = FOLDS | {"unsqueeze", "squeeze", "expand"}
# ops that keep scores scores (logits): a key they give a score above FILL_NEG again is no longer hidden
RESCORE = (
    ADD | SUB | MUL | DIV | FILL | {"where", "clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_min_"}
)
ROW_REDUCE = frozenset({"max", "amax", "min", "amin", "mean"})  # over one axis of scores: a score per row
HAND_STEPS = frozenset({"exp", "exp_", "log_softmax", "logsumexp", "sum", "unsqueeze"})  # a softmax by hand
PACKING = frozenset({"_pack_padded_sequence", "_pad_packed_sequence"})  # nn.utils.rnn's packed sequences
CELLS = frozenset({"gru_cell", "lstm_cell", "rnn_tanh_cell", "rnn_relu_cell"})
RNN = frozenset({"gru", "lstm", "rnn_tanh", "rnn_relu"}) | CELLS  # recurrent layers and their cells
# new tensors made from no other tensor's values (``k_pe.new_empty(...)`` takes its dtype and device alone:
# DeepSeek's query and key states assembled in one, head slices written in)
FACTORIES = frozenset({"zeros", "empty", "ones", "full", "new_empty", "new_zeros", "new_ones", "new_full"})
# norms over channels and space, with learned scales: of a tensor from outside, still from outside
OUTSIDE_NORMS = frozenset({"group_norm", "batch_norm", "instance_norm"})
# new tensors that take a shape (and dtype) from another: its positions, none of its values
LIKE_FACTORIES = frozenset(
    {"zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like", "randint_like"}
)
# integer tensors made inside the call (positions, indices of learned rows): never a batch's token ids
INT_FACTORIES = frozenset(
    {"arange", "range", "tensor", "as_tensor", "zeros", "ones", "full", "empty", "randint", "randperm",
     "tril_indices", "triu_indices", "zeros_like", "ones_like", "full_like", "empty_like"}
)  # fmt: skip
SCATTER_SUM = frozenset(
    {"index_add", "index_add_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_"}
)
# rows written at the places an index names: their codes move with them (index_add: into a buffer made in the call)
INDEXED_WRITES = frozenset({"index_add", "index_add_", "index_copy", "index_copy_"})
# ops that move, view or cast values without computing new ones (weights through them stay as they were)
KEEPS_VALUES = frozenset(
    {"view", "reshape", "transpose", "permute", "contiguous", "clone", "float", "to", "type_as", "double",
     "half", "bfloat16", "type", "detach", "__getitem__", "select", "narrow", "unsqueeze", "squeeze",
     "flatten", "unflatten", "expand", "expand_as", "view_as", "reshape_as", "movedim", "moveaxis",
     "swapaxes", "swapdims", "t", "mT", "T", "chunk", "split", "unbind", "cpu", "cuda", "repeat",
     "repeat_interleave", "cat", "stack", "dropout", "feature_alpha_dropout", "alpha_dropout"}
)  # fmt: skip
# ops whose tensor arguments after the first give only a dtype, a device or a shape
RANDOM = frozenset(
    {"rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "randperm", "multinomial",
     "bernoulli", "normal", "poisson"}
)  # fmt: skip
PICKS = frozenset({"topk", "sort", "msort", "kthvalue"})  # some of a tensor's values, by their size
ORDERING = frozenset(
    {"argsort", "sort", "msort", "topk", "argmax", "argmin", "max", "min", "kthvalue", "multinomial"}
)  # an order of floats: indices that depend on their values
# ops that combine two tensors element by element (beside ADD, SUB, MUL and DIV): two maps' weights so combined
COMBINES = frozenset({"lerp", "maximum", "minimum", "fmax", "fmin", "where", "addcmul", "addcdiv"})
# losses: weights that go into one and multiply nothing are a target, not attention (a distillation loss)
LOSSES = frozenset({"kl_div", "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                    "binary_cross_entropy", "binary_cross_entropy_with_logits", "poisson_nll_loss"})  # fmt: skip
# ops that make a sparse tensor of given values
SPARSE_MAKERS = frozenset({"sparse_coo_tensor", "sparse_csr_tensor", "sparse_compressed_tensor"})
# ops of lineage.REPLAY that put elements in another order or join them (the rest keep them, or some, in order)
REORDERS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack", "roll", "flip", "gather",
                      "index_select", "take_along_dim"})  # fmt: skip
# ops that reduce an axis away (a sum of weights is their normalizer, not weights)
REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "norm", "logsumexp", "prod", "std", "var",
                        "argmax", "argmin", "cumsum", "nansum", "count_nonzero", "all", "any"})  # fmt: skip
GATHERS = frozenset({"__getitem__", "index_select", "gather", "take_along_dim", "masked_select"})
SHAPED_LIKE = frozenset({"to", "type_as", "expand_as", "view_as", "reshape_as"})
CASTS = frozenset({"to", "type_as", "type", "half", "bfloat16"})  # a dtype cast (of the weights, say)
COPIES = frozenset({"clone", "contiguous", "detach"})  # the same values (in memory of their own, for two)
TRANSPOSES = frozenset({"transpose", "swapaxes", "swapdims", "mT", "permute"})
MOVES = frozenset(
    {"transpose", "permute", "movedim", "moveaxis", "swapaxes", "swapdims", "t", "T", "mT", "H", "mH", "adjoint",
     "flip", "roll"}
)  # fmt: skip
ROW_MAJOR = frozenset(
    {"view", "reshape", "flatten", "unflatten", "view_as", "reshape_as", "squeeze", "unsqueeze"}
)  # the elements keep their row-major order
SHAPE_OPS = frozenset(
    {"view", "reshape", "transpose", "permute", "contiguous", "clone", "float", "to", "type_as", "double",
     "half", "bfloat16", "type", "flatten", "unflatten", "squeeze", "unsqueeze", "expand", "__getitem__"}
)  # fmt: skip
# One module per head in a ModuleList ("Let's build GPT": ``self.heads = nn.ModuleList([Head(...)])``):
# consecutive single-head calls of ``<...head...>.0``, ``.1``, ... are the heads of one layer, not
# layers (a list named like ``multi_head_layers`` holds whole layers and is left alone).
_HEAD_ITEM = re.compile(r"^(?P<parent>(?:.*\.)?(?![^.]*multi)[^.]*head[^.]*)\.(?P<i>\d+)$", re.IGNORECASE)
_MHA_SIG = inspect.signature(F.multi_head_attention_forward)
_MHA_NAMES = tuple(_MHA_SIG.parameters)
_MHA_POSITIONAL = [frozenset(_MHA_NAMES[:n]) for n in range(len(_MHA_NAMES) + 1)]  # given by position
_MHA_DEFAULTS = {
    n: q.default for n, q in _MHA_SIG.parameters.items() if q.default is not inspect.Parameter.empty
}
_SIDES = {"enc_self": ("src", "src"), "dec_self": ("tgt", "tgt"), "cross": ("tgt", "src")}  # (queries, keys)
_LAYOUTS: dict[tuple, list] = {}  # decoded layouts by shape, chain, dim and sources (see _Session._decoded)
_LAYOUTS_LOCK = threading.Lock()
MAX_LAYOUTS = 64
# id(code) -> (code, whether its frames can name a module) (path): keyed by id, as a code object's hash is
# computed from its bytecode and constants on every lookup; the entry holds the code, so its id stays its own
_HAS_SELF: dict[int, tuple[types.CodeType, bool]] = {}
_OWN_FILE = (lambda: None).__code__.co_filename  # capture's own frames never do
_LOCAL = threading.local()  # .busy > 0 while a capture does its own torch calls (nested captures skip them)


class _Reordered(str):
    """A flag of a batch put in another order, which knows the caller's sequence each record row holds."""

    order: tuple[int, ...] = ()


@dataclass(frozen=True)
class Record:
    """One attention call: per-head weights (B, H, q, k), scores or None, allowed mask (B, q, k) or None."""

    name: str  # module path inside the model ("" for the model itself)
    kind: str  # enc_self | dec_self | cross
    probs: torch.Tensor
    scores: torch.Tensor | None
    mask: torch.Tensor | None  # bool, True = may attend (our convention)
    source: str = "nn.MultiheadAttention"  # nn.MultiheadAttention | sdpa | softmax
    mask_source: str | None = (
        None  # arguments | masked_fill | where | additive | index | multiplied | zeros | lengths | None
    )
    check: float | None = None  # SDPA: max |probs @ v - output| (how exactly the weights were recomputed)
    head_masks_differ: bool = False  # the mask was not the same for every head of a sequence
    exact: bool = True  # the (batch, head, query, key) layout is known, not inferred
    flag: str | None = None  # why the layout could not be verified (exact is False)
    key_labels: tuple[str | None, ...] | None = None  # "<mem_k 0>" at learned keys, None at the tokens
    query_labels: tuple[str | None, ...] | None = None  # the same for learned queries
    # what the weights multiply, (B, H, k, dv), and the output projection's slice per head where lineage
    # found it: ||f_h(x_j)|| for what attention moves (attnscope.core.families.values)
    values: values_.HeadValues | None = None
    # the residual stream the attention's output projection is added to, where lineage saw that sum
    residual_of: _Residual | None = None
    seq: int = -1  # the capture's op count when the record was made (what existed before the attention ran)
    # (B, q) the lineage position of every query row, where lineage has it: layers of one forward read the
    # same positions; a decoder's steps inside one forward read new ones (they are not deeper layers)
    query_positions: torch.Tensor | None = None
    # (B, k) the lineage position of every key (-1 at learned ones), where lineage has it (a record of its own)
    key_positions: torch.Tensor | None = None
    # the caller's sequence each row holds, where the model put its batch in another order or picked some of its
    # rows before this attention (Show, Attend and Tell's sorted, shrinking batch); the record is flagged then
    batch_rows: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.flag, _Reordered):  # (a batch put in another order: the rows it says, kept)
            object.__setattr__(self, "batch_rows", self.batch_rows or self.flag.order)
            object.__setattr__(self, "flag", str(self.flag))

    @property
    def residual(self) -> torch.Tensor | None:
        """||x_i|| (B, q) of the residual stream (the identity term of the norm-based rollout), or None."""
        return None if self.residual_of is None else self.residual_of.get()


_RECORD_FIELDS = frozenset(Record.__dataclass_fields__)


def _replaced(rec: Record, **changes: Any) -> Record:
    """dataclasses.replace(rec, **changes) for a Record, without re-running its generated __init__
    (a record is updated a few times per attention call: replace is ~20x slower)."""
    if not changes.keys() <= _RECORD_FIELDS:
        raise TypeError(f"Record has no field {sorted(changes.keys() - _RECORD_FIELDS)[0]!r}")
    flag = changes.get("flag")
    if isinstance(flag, _Reordered):  # (a batch put in another order: the rows it says, kept with the record)
        changes = {"batch_rows": flag.order, **changes, "flag": str(flag)}
    new = object.__new__(Record)
    fields = new.__dict__
    fields.update(rec.__dict__)
    fields.update(changes)
    return new


class _Residual:
    """A record's residual norms, taken on first use from the stream it kept (None if the stream was
    changed in place since), or given."""

    __slots__ = ("_stream", "_version", "_index", "_shape", "_norms")

    def __init__(self, stream, index, shape, norms=None):
        self._stream, self._index, self._shape, self._norms = stream, index, shape, norms
        self._version = None if stream is None else _version_of(stream)
        if stream is not None and self._version is None:  # an inference tensor (no version counter): now
            self.get()

    def get(self) -> torch.Tensor | None:
        stream, self._stream = self._stream, None
        if self._norms is None and stream is not None and _version_of(stream) == self._version:
            with torch.no_grad():
                n = stream.detach().float().norm(dim=-1).reshape(-1)
            self._norms = n[self._index.to(n.device)].view(self._shape)
        return self._norms


class _NoCode(Exception):
    """An argument of a replayed op has no lineage codes."""


@dataclass(frozen=True)
class Note:
    """A softmax (or attention call) that was not recorded, or a record that could not be verified."""

    level: str  # "info" (not attention) | "warning" (could not verify)
    module: str
    shape: tuple[int, ...]
    reason: str

    def __str__(self) -> str:
        return f"{self.module or '(model)'} {tuple(self.shape)}: {self.reason}"


@dataclass
class Captured:
    records: list[Record] = field(default_factory=list)
    lengths: set[int] = field(default_factory=set)  # sequence lengths seen (token ids' dims, lengths=)
    notes: list[str] = field(default_factory=list)  # warnings: what the capture could not follow or verify
    skipped: list[Note] = field(default_factory=list)  # softmaxes that were not recorded, and why
    # the op count at which each call of the model itself began (a forward of its own, not one made inside
    # a module that holds it): a record belongs to the last call begun before it (Record.seq)
    calls: list[int] = field(default_factory=list)
    # the memory of the token ids the model looked up in an embedding (or a view of it): which of the
    # tensors handed in were token ids, and which only looked like them (a 0/1 padding mask)
    id_storages: set[int] = field(default_factory=set)
    # the positions lineage numbered in the block (what ``rows_of`` reads), and its answers by record
    _sources: Any = field(default=None, repr=False, compare=False)
    _rows: dict[int, tuple[Record, tuple[torch.Tensor, int] | None]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def rows_of(self, record: Record) -> tuple[torch.Tensor, int] | None:
        """((B,) the sequence of the input each row of ``record`` asks from, that input's number of sequences),
        where every row's queries lie in one sequence of one input: rows that are windows, chunks or documents of
        the sequences given, or beams, say which sequence each is part of. None where lineage does not say."""
        held = self._rows.get(id(record))
        if held is not None and held[0] is record:
            return held[1]
        qp = record.query_positions
        found = None
        if self._sources is not None and qp is not None and qp.dim() == 2 and qp.numel():
            try:
                found = _sequence_rows(self._sources, qp)
            except Exception:  # (the rows are simply not said)
                found = None
        self._rows[id(record)] = (record, found)
        return found

    def _sequence_row(self, records: list[Record], index: int) -> int | str | None:
        """The row of every record that holds sequence ``index`` of the input (the same in each), where lineage
        says each row's sequence and no record has more rows than there are sequences (windows, chunks and beams
        are parts or copies of them: ``_part_of`` says those); why none does; or None where lineage does not
        say."""
        if records and all(_stream_piece(r) for r in records):  # pieces of one stream, a sequence each
            if all(r.batch_rows == (index,) for r in records):
                return 0
            return f"sequence {index} is not the piece of the stream each of these maps is over"
        found = [self.rows_of(r) for r in records]
        if not found or any(f is None for f in found):
            orders = {r.batch_rows for r in records}
            if not records or None in orders:
                return None
            if len(orders) > 1:
                return (f"sequence {index} is at different rows of its layers' maps (the model put its batch in "
                        "another order, or picked some of its rows, otherwise before each)")  # fmt: skip
            order = orders.pop()
            assert order is not None
            hits = [i for i, s in enumerate(order) if s == index]
            if len(hits) != 1:
                return (f"sequence {index} is {'in no row' if not hits else 'in several rows'} of these maps (the "
                        f"model put its batch in another order or picked some of its rows: record row b holds the "
                        f"caller's sequence {list(order)}[b])")  # fmt: skip
            return hits[0]
        picks: set[int] = set()
        for f in found:
            assert f is not None
            rows, n = f
            if int(rows.numel()) > n:
                return None
            hit = (rows == index).nonzero().flatten().tolist()
            if len(hit) != 1:
                return (f"sequence {index} is {'in no row' if not hit else 'in several rows'} of some of its maps "
                        "(a layer run on some of the batch's sequences: layers skipped per sample, an early "
                        "exit)")  # fmt: skip
            picks.add(int(hit[0]))
        if len(picks) > 1:
            return (f"sequence {index} is at different rows of its layers' maps (each layer ran over other "
                    "sequences of the batch, or in another order), so its layers do not stack")  # fmt: skip
        return picks.pop()

    def _sides_swapped(self, cross: list[Record]) -> bool:
        """Cross-attention whose queries are all positions an exact encoder self-attention asked from and whose
        keys are all positions an exact decoder self-attention asked from: the reverse of target over source."""

        def asked(kind: str) -> set[int]:
            return {
                int(p)
                for r in self.of(kind)
                if r.exact and r.query_positions is not None
                for p in r.query_positions.reshape(-1).tolist()
                if p >= 0
            }

        enc, dec = asked("enc_self"), asked("dec_self")
        if not enc or not dec or enc & dec:
            return False
        for r in cross:
            qp, kp = r.query_positions, r.key_positions
            if qp is None or kp is None:
                return False
            q = {int(p) for p in qp.reshape(-1).tolist() if p >= 0}
            k = {int(p) for p in kp.reshape(-1).tolist() if p >= 0}
            if not q or not k or not q <= enc or not k <= dec:
                return False
        return True

    def _token_spots(
        self, records: list[Record], b: int, labels: tuple[str | None, ...]
    ) -> tuple[list[int], int] | None:
        """Where the token columns of row ``b`` (``labels``: None at a token) lie among its sequence's ids:
        each column's index in the sequence (-1 at a position the model made or learned) and the sequence's
        length, where every record agrees, the indices rise and they are not the whole sequence (a decoder
        input shifted right by a vector the model made, ``cat([start, emb(ids)[:, :-1]], 1)``: the start
        vector and the first n - 1 tokens); else None."""
        sources, found = self._sources, None
        for r in records:
            kp = r.key_positions
            if sources is None or kp is None or kp.dim() != 2 or b >= int(kp.shape[0]):
                return None
            keys = kp[b].cpu()
            if len(labels) != int(keys.numel()):
                return None
            token = torch.tensor([lab is None for lab in labels], dtype=torch.bool)
            if not bool((keys[token] >= 0).all()) or not bool(token.any()):
                return None
            own = keys[token]
            row = _row_of(sources, own)
            if row is None or row[0].kind != "tokens":
                return None
            _, size, lo = row
            within = own - lo
            if int(within.numel()) >= size or (
                within.numel() > 1 and not bool((within[1:] > within[:-1]).all())
            ):
                return None
            spots = [-1] * len(labels)
            for j, at in zip(token.nonzero().flatten().tolist(), within.tolist(), strict=True):
                spots[j] = int(at)
            if found is not None and found != (spots, size):
                return None
            found = (spots, size)
        return found

    def _keys_picked(self, r: Record, b: int) -> bool:
        """Self-attention whose row ``b`` reads keys of its queries' own sequence that are not that whole
        sequence in order, and not the queries themselves (a window's): neighbours gathered for each query
        (a kNN graph's, a ring's), a window of keys around a block. Drawn over the sequence's tokens, each
        weight would stand under the wrong one."""
        kp, qp, sources = r.key_positions, r.query_positions, self._sources
        if kp is None or qp is None or sources is None or kp.dim() != 2 or qp.dim() != 2:
            return False
        if b >= int(kp.shape[0]) or b >= int(qp.shape[0]):
            return False
        keys, queries = kp[b].cpu(), qp[b].cpu()
        token = keys >= 0
        if r.key_labels is not None and len(r.key_labels) == int(keys.numel()):
            token &= torch.tensor([lab is None for lab in r.key_labels], dtype=torch.bool)
        asks = queries >= 0
        if r.query_labels is not None and len(r.query_labels) == int(queries.numel()):
            asks &= torch.tensor([lab is None for lab in r.query_labels], dtype=torch.bool)
        keys, queries = keys[token], queries[asks]
        if keys.numel() < 2 or not queries.numel():
            return False
        if int(keys.unique().numel()) < int(keys.numel()):
            # a position among the keys more than once (each query's kNN memories joined before the keys): the
            # columns are not the tokens in order
            return True
        if set(keys.tolist()) == set(queries.tolist()):
            return False
        lo, hi = int(keys[0]), int(keys[-1])
        if hi - lo + 1 > int(keys.numel()) and bool((keys[1:] > keys[:-1]).all()):
            # keys in order, with positions between them missing that queries of this kind read in this row (a
            # StreamingLLM cache that evicted them, its sinks then its recent window; keys dilated): drawn over the
            # tokens, the keys after the gap would stand under the tokens the gap held
            held = set(keys.tolist())
            if any(lo < p < hi and p not in held for p in self._asked_positions(r.kind, b)):
                return True
        row = _row_of(sources, queries)
        if row is None or row[0].kind in lineage.LABELLED:
            return False
        _, size, lo = row
        mine = keys[(keys >= lo) & (keys < lo + size)]
        return bool(mine.numel()) and not torch.equal(mine, torch.arange(lo, lo + size, dtype=mine.dtype))

    def _asked_positions(self, kind: str, b: int) -> set[int]:
        """The lineage positions the queries of row ``b`` of every record of ``kind`` read."""
        seen: set[int] = set()
        for o in self.records:
            qp = o.query_positions
            if o.kind == kind and qp is not None and qp.dim() == 2 and b < int(qp.shape[0]):
                seen.update(p for p in qp[b].tolist() if p >= 0)
        return seen

    def embedded(self, t: torch.Tensor) -> bool:
        """Whether the model looked ``t`` (or a view of it) up in an embedding in this block."""
        try:
            return t.untyped_storage().data_ptr() in self.id_storages
        except (RuntimeError, NotImplementedError):  # (a tensor with no storage of its own)
            return False

    def call_of(self, record: Record) -> int:
        """Which of the block's calls of the model made ``record`` (0 where the model was never called
        itself: its parts called one by one, ``model.encode`` then ``model.decode``)."""
        return max(bisect.bisect_right(self.calls, record.seq) - 1, 0)

    def kinds(self) -> tuple[str, ...]:
        found = {r.kind for r in self.records}
        return tuple(k for k in KINDS if k in found)

    def of(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind]

    def stacks(self, what: str = "probs") -> dict[str, torch.Tensor]:
        """kind -> (B, layer, head, q, k) of probs (or "scores"), layers in call order."""
        out = {}
        for kind in self.kinds():
            tensors = [getattr(r, what) for r in self.of(kind)]
            if any(t is None for t in tensors):
                continue
            runs = {self.call_of(r) for r in self.of(kind)}
            if len(runs) > 1:
                raise ValueError(
                    f"{kind} calls come from {len(runs)} runs of the model in this capture block: their maps "
                    "are not one forward's layers. Use a block per forward, or .records for the individual calls"
                )
            segments = query_segments(self.of(kind))
            if len(segments) > 1:
                why = (
                    "come from modules called again inside one forward, whose queries lineage does not place (a "
                    "decoder's steps, or a layer whose weights are shared): capture cannot tell whether they are "
                    "steps or layers"
                    if _steps_unplaced(segments)
                    else "read other query positions from one call to the next (a decoder's steps run one after "
                    "another inside one forward): their maps are not one forward's layers"
                )
                raise ValueError(f"{kind} calls {why}. Use .records for the individual calls")
            shapes = {tuple(t.shape) for t in tensors}
            if len(shapes) > 1:
                raise ValueError(
                    f"{kind} calls have different shapes {sorted(shapes)}: was the model run more than once "
                    "(e.g. step-by-step decoding), or do layers have different head counts? "
                    "Use .records for the individual calls"
                )
            out[kind] = torch.stack(tensors, dim=1)
        return out

    def _cross_drawn(self, index: int, joined: set[str], src_tokens, tgt_tokens) -> list[Record] | None:
        """The cross-attention records of the step a trace draws for sequence ``index`` (the group ``trace``
        picks, its last run and last step), or None."""
        records = self.of("cross")
        if not records:
            return None
        groups = stack_groups(records, joined)
        best = _drawn_group(groups, "cross", index, joined, src_tokens, tgt_tokens)
        if index >= int(groups[best][0].probs.shape[0]):
            return None
        calls = sorted({self.call_of(r) for r in groups[best]})
        steps = query_segments([r for r in groups[best] if self.call_of(r) == calls[-1]])
        return steps[-1] if steps else None

    def _read_elsewhere(self, encoder: list[Record], index: int) -> tuple[str | None, str | None]:
        """Where no cross-attention says which row of an encoder's self-attention is sequence ``index``'s input
        but a decoder's self-attention reads encoder rows as its keys (image features spliced into the text,
        LLaVA's): (why row ``index`` is left out, where the decoder's sequence ``index`` reads none of its
        positions; what to say where it reads other rows too). (None, None) where the decoder reads no row of
        it (towers that read nothing of each other stay as they were)."""
        qp = encoder[0].query_positions
        if qp is None or index >= int(qp.shape[0]):
            return None, None
        rows_of = [{int(p) for p in qp[b].tolist()} for b in range(int(qp.shape[0]))]
        read: set[int] = set()
        anywhere = False
        for r in self.of("dec_self"):
            kp = r.key_positions
            if not r.exact or kp is None:
                continue
            for b in range(int(kp.shape[0])):
                keys = {int(p) for p in kp[b].tolist() if p >= 0}
                anywhere = anywhere or any(keys & own for own in rows_of)
                if b == index:
                    read |= keys
        if not anywhere:
            return None, None
        reads = [b for b, own in enumerate(rows_of) if read & own]
        which = f"rows {', '.join(map(str, reads))}" if len(reads) > 1 else f"row {reads[0]}" if reads else ""
        if index not in reads:
            what = f"none of its row {index}'s positions but {which} of it" if reads else "no row of it"
            return (f"the decoder's sequence {index} reads {what} (inputs spliced into the sequences, as LLaVA's "
                    f"images), so its row {index} is not this sequence's input"), None  # fmt: skip
        if len(reads) > 1:
            return None, (f"the decoder's sequence {index} reads {which} of it (inputs spliced into the sequence, "
                          f"as LLaVA's images): row {index} is drawn")  # fmt: skip
        return None, None

    def joined_labels(self) -> set[str]:
        """Labels of learned positions joined to a sequence (a [CLS], registers): they are queries too. A learned
        query that only ever asks (a Set Transformer's seed pooling the tokens) is among no map's keys: not
        joined (learned positions attending to each other, a Perceiver's latents, are a sequence of their own)."""
        keyed = {lab for r in self.records for lab in (r.key_labels or ()) if lab}
        return {
            lab
            for r in self.records
            for lab in (r.query_labels or ())
            if lab and (None in (r.query_labels or ()) or (lab in keyed and not _pooled_asks(r)))
        }

    def kind_maps(self, kind: str) -> KindMaps:
        """A kind's layers as one stack over its sequence's positions, learned keys apart."""
        return kind_maps(self.of(kind), self.joined_labels())

    def head_masks_differ(self) -> dict[str, list[str]]:
        """kind -> the modules whose heads were masked differently (their record's mask is what every
        head may see; each head's own shows in its map, 0 where it was masked): a per-head top-k, or an
        ``attn_mask`` repeated over the heads in the wrong order."""
        out: dict[str, list[str]] = {}
        for r in self.records:
            if r.head_masks_differ and r.name not in out.setdefault(r.kind, []):
                out[r.kind].append(r.name)
        return {k: v for k, v in out.items() if v}

    def masks(self) -> dict[str, torch.Tensor | None]:
        """kind -> (B, q, k) bool mask of its first layer (None when the call had no mask)."""
        return {k: self.of(k)[0].mask for k in self.kinds()}

    def trace(
        self,
        index: int = 0,
        src_tokens: tuple[str, ...] | list[str] = (),
        tgt_tokens: tuple[str, ...] | list[str] = (),
        model: str = "torch.nn",
        output_text: str = "",
    ) -> AttentionTrace:
        """An AttentionTrace of sequence ``index``: probs, scores, masks (all-True where no mask was given).
        Learned positions joined to a sequence (a [CLS] token) are put among its tokens under their
        labels; learned keys outside it (memory key/values, a null key) go to ``{kind}_learned``.
        Tokens given for a side no kind uses are the other side's (a decoder-only model's, given as
        ``src_tokens``); a side given none is numbered ``#0``, ``#1``, ... A kind whose maps are over
        other positions than the tokens is left out and said in the capture notes."""
        if not self.records:
            said = [*self.notes, *(str(n) for n in self.skipped)][:2]
            hint = "" if self.notes else (  # (every softmax was no attention: a vocabulary's, a router's)
                ": no softmax over query-key scores ran, and attention written without one (linear attention's "
                "feature maps) has no weights to record")  # fmt: skip
            raise ValueError("no attention was captured, so there is no trace to make" + hint
                             + (f" ({'; '.join(said)})" if said else ""))  # fmt: skip
        used = {side for kind in self.kinds() for side in _SIDES[kind]}
        src_tokens, tgt_tokens = tuple(src_tokens), tuple(tgt_tokens)
        if src_tokens and not tgt_tokens and used == {"tgt"}:
            src_tokens, tgt_tokens = (), src_tokens
        elif tgt_tokens and not src_tokens and used == {"src"}:
            src_tokens, tgt_tokens = tgt_tokens, ()
        kw: dict[str, Any] = {}
        labels: dict[str, list[str | None]] = {}  # side -> labels of its positions (None: a token)
        learned_keys: dict[str, list[str]] = {}
        key_labs: dict[str, tuple[str | None, ...] | None] = {}  # kind -> labels of its keys in the sequence
        scopes: dict[str, str | None] = {}
        probs: dict[str, torch.Tensor] = {}
        query_rows: dict[str, list[int]] = {}  # self-attention where only some positions ask: their rows
        # side -> where its token columns lie among the sequence's ids, where they are not the whole sequence
        spots: dict[str, tuple[list[int], int] | None] = {}
        left_out: list[str] = []
        joined = self.joined_labels()
        # the queries of the cross-attention step drawn: a decoder's self-attention is drawn at the same step
        # (a KV cache makes each step's self-attention a group of its own, while the cross-attention's steps
        # stack: without this, the first step's self-attention stood beside the last step's cross-attention)
        cross_drawn = self._cross_drawn(index, joined, src_tokens, tgt_tokens)
        asked = _last_step_queries(cross_drawn, index) if cross_drawn else None
        # (the encoder self-attention drawn is over none of the cross-attention's keys)
        apart_from_cross = False
        # two inputs of as many positions attending to each other (co-attention): which of them the tokens given
        # are, nothing tells; their cross-attention and their own self-attention are left out and said
        both = [
            r
            for g in stack_groups(self.of("cross"), joined)
            if _both_ways(segs := query_segments(g)) and len(segs) > 1
            for r in g
        ]
        for kind in self.kinds():
            if (
                both
                and kind != "cross"
                and (_on_side(self.of(kind), both, keys=True) or _on_side(self.of(kind), both, keys=False))
            ):
                left_out.append(f"{kind} ({_modules(self.of(kind))}) left out of the trace: self-attention of one "
                                "of two inputs of as many positions that attend to each other (co-attention: "
                                "ViLBERT's, LXMERT's), so which input the tokens given are the trace cannot tell "
                                "(cap.records has them)")  # fmt: skip
                continue
            # calls of one kind whose maps do not stack (a decoder run a step at a time, layers with other head
            # counts): the group over the tokens given is drawn (else the most calls), the others said
            groups = stack_groups(self.of(kind), joined)
            has = [_holds(g, index) for g in groups]  # (maps over fewer sequences: blocks)
            best = _drawn_group(
                groups,
                kind,
                index,
                joined,
                src_tokens,
                tgt_tokens,
                asked if kind == "dec_self" else None,
                [r for r in self.of("cross") if r.exact] if kind != "cross" else [],
            )
            for i, g in enumerate(groups):
                if i != best:
                    left_out.append(stack_note(kind, g, groups[best]))
            calls = sorted({self.call_of(r) for r in groups[best]})
            if len(calls) > 1:  # maps of the same shape from separate forwards: one forward's layers, not
                last = [r for r in groups[best] if self.call_of(r) == calls[-1]]  # all stacked as deeper ones
                runs = max(len(self.calls), len(calls))
                same = len({tuple(r.probs.shape) for r in groups[best]}) == 1
                which = (
                    "each run's maps of the same shape"
                    if runs == len(calls) and same
                    else f"{len(calls)} of its runs with maps of this {'shape' if same else 'kind'}"
                )
                left_out.append(
                    f"{kind} ({_modules(groups[best])}): the model ran {runs} times in the capture block, "
                    f"{which}; this trace draws the last of them, its {len(last)} layer(s), not every run's "
                    f"stacked as deeper layers (the earlier runs' {len(groups[best]) - len(last)} call(s) are in "
                    "cap.records; a block per forward gives a trace of each)"
                )
                groups[best] = last
            if all(_stream_piece(r) for r in groups[best]):  # pieces of one stream: sequence ``index``'s
                groups[best] = [r for r in groups[best] if index in (r.batch_rows or ())] or groups[best]
            steps = query_segments(groups[best])
            if kind == "cross" and self._sides_swapped(groups[best]):
                left_out.append(f"cross ({_modules(groups[best])}) left out of the trace: its queries are the positions "
                                "the encoder's self-attention reads and its keys the decoder's (an encoder's "
                                "representations asking the decoder's tokens, as MAT's decoder block does), the "
                                "reverse of a trace's cross, target rows over source columns (cap.records has it)")  # fmt: skip
                continue
            if kind == "cross" and len(steps) > 1 and _both_ways(steps):
                left_out.append(f"cross ({_modules(groups[best])}) left out of the trace: its calls run both ways "
                                "between two inputs of as many positions (co-attention: ViLBERT's and LXMERT's, each "
                                "input's queries over the other's keys), so which input the tokens given are the "
                                "trace cannot tell (cap.records has them)")  # fmt: skip
                continue
            cross = [r for r in self.of("cross") if r.exact] if kind != "cross" else []
            sided = [s for s in steps if _on_side(s, cross, keys=kind == "enc_self")] if cross else []
            if len(steps) > 1 and sided and len(sided) < len(steps):
                # self-attention of one kind over both sides of a cross-attention (a decoder's with no causal
                # mask taken for an encoder's): the side this kind is drawn over, the other said
                other = [r for s in steps if not any(s is t for t in sided) for r in s]
                left_out.append(
                    f"{kind} ({_modules(other)}): {len(other)} call(s) over the positions on the other side of the "
                    f"cross-attention ({'those that ask it: a decoder' if kind == 'enc_self' else 'those it reads as keys: an encoder'}"
                    f"'s self-attention, recorded as {kind} by its mask) are not drawn over these tokens (they are in "
                    "cap.records)"
                )
                steps = sided
                groups[best] = [r for s in sided for r in s]
            if len(steps) > 1:  # a decoder's steps inside one forward (a generation loop in the model): each
                last = steps[-1]  # step's layers read its new positions, and are not deeper layers
                left, mods = len(groups[best]) - len(last), _modules(groups[best])
                if _steps_unplaced(steps):  # (modules called again, their queries unplaced)
                    left_out.append(
                        f"{kind} ({mods}): {left} call(s) of modules called again inside one forward, whose queries "
                        "lineage does not place (a decoder's steps, or a layer whose weights are shared: capture "
                        "cannot tell them apart), are not stacked as deeper layers: this trace draws the last "
                        f"{len(last)} (the others are in cap.records)"
                    )
                else:
                    left_out.append(
                        f"{kind} ({mods}): {left} call(s) read other query positions than the {len(last)} drawn (a "
                        "decoder's steps run one after another inside one forward, or another stream of queries "
                        "through the same modules; not deeper layers): this trace draws the last of them (the "
                        "others are in cap.records)"
                    )
                groups[best] = last
            at = index  # the row of this kind's maps that is sequence ``index``'s
            reordered_row = False  # (said already where the batch was put in another order)
            if kind == "enc_self" and not cross_drawn and has[best]:
                elsewhere, also = self._read_elsewhere(groups[best], index)
                if also is not None:
                    left_out.append(f"enc_self ({_modules(groups[best])}): {also}")
                if elsewhere is not None:
                    left_out.append(f"enc_self ({_modules(groups[best])}) left out of the trace: {elsewhere} (its maps are "
                                    "in cap.records)")  # fmt: skip
                    continue
            if kind == "enc_self" and cross_drawn:
                row, why_row = _encoder_row(groups[best], cross_drawn, index)
                if row is None:
                    left_out.append(f"enc_self ({_modules(groups[best])}) left out of the trace: {why_row}, so which "
                                    f"of its rows is sequence {index}'s the trace cannot tell (its maps are in "
                                    "cap.records)")  # fmt: skip
                    continue
                if why_row is not None:
                    left_out.append(f"enc_self ({_modules(groups[best])}): {why_row}")
                at = row
                has[best] = at < int(groups[best][0].probs.shape[0])
                # no self-attention over the positions the cross-attention reads as keys (a text's over itself,
                # then the text asking an image's features): those keys are not the tokens this one is over
                apart_from_cross = has[best] and _keys_apart(groups[best][0], at, cross_drawn[0], index)
            if at == index:  # the row that holds sequence ``index``, where lineage says each row's sequence
                moved = self._sequence_row(groups[best], index)
                if isinstance(moved, str):
                    left_out.append(f"{kind} ({_modules(groups[best])}) left out of the trace: {moved} (its maps "
                                    "are in cap.records)")  # fmt: skip
                    continue
                if moved is not None and moved != at:
                    left_out.append(f"{kind} ({_modules(groups[best])}): sequence {index} is row {moved} of its "
                                    "maps (the model ran them over its batch in another order), drawn here")  # fmt: skip
                    at, has[best] = moved, True
                    reordered_row = True
            if kind != "cross" and has[best] and any(_keys_not_queries(r, at) for r in groups[best]):
                left_out.append(f"{kind} ({_modules(groups[best])}) left out of the trace: the keys of sequence {index} "
                                "are as many of its positions as its queries, but other ones or in another order "
                                "(key blocks gathered, one of them twice: BigBird's random blocks), so drawn over "
                                "its tokens the weights would stand under the wrong ones (cap.records has them, "
                                "each key's position in record.key_positions)")  # fmt: skip
                continue
            if kind != "cross" and has[best] and any(self._keys_picked(r, at) for r in groups[best]):
                left_out.append(f"{kind} ({_modules(groups[best])}) left out of the trace: the keys of row {at} are "
                                "some of its sequence's positions, other than its queries (neighbours gathered for "
                                "each query, a window of keys around a block), so drawn over the tokens the "
                                "weights would stand under the wrong ones (cap.records has them, each key's "
                                "position in record.key_positions)")  # fmt: skip
                continue
            unordered = [
                r
                for r in groups[best]
                if kind == "cross" and has[best] and _keys_out_of_order(r, at, self._sources)
            ]
            if unordered:
                left_out.append(f"cross ({_modules(unordered)}) left out of the trace: the keys of row {at} are "
                                "positions of its input in another order, or some of them twice (instances sorted "
                                "by a score and picked: DTFD-MIL's), so drawn over the tokens the weights would "
                                "stand under the wrong ones (cap.records has them, each key's position in "
                                "record.key_positions)")  # fmt: skip
                groups[best] = [r for r in groups[best] if not any(r is u for u in unordered)]
                if not groups[best]:
                    continue
            if not has[best]:
                left_out.append(f"{kind} left out of the trace: its maps are over {groups[best][0].probs.shape[0]} "
                                f"sequence(s), and this trace is of sequence {index}")  # fmt: skip
                continue
            streams = _row_streams(groups[best], at)
            # the same positions folded another way at this row: not one sequence's layers
            if len(streams) > 1:
                keep = max(streams, key=len)
                other = [r for r in groups[best] if not any(r is k for k in keep)]
                left_out.append(
                    f"{kind} ({_modules(other)}): {len(other)} call(s) whose row {at} holds other positions than the "
                    f"{len(keep)} drawn (the same positions folded another way: an axial attention's columns beside "
                    "its rows, a video's frames beside its patches, shifted windows beside unshifted ones) are not "
                    "deeper layers of one sequence: this trace draws the calls that read the same positions (the "
                    "others are in cap.records)"
                )
                groups[best] = keep
            part = None if reordered_row else _part_of(self, groups[best], at)
            if part is not None:
                left_out.append(f"{kind} ({_modules(groups[best])}): {part}")
            km = kind_maps(groups[best], joined)
            p = km.probs[at]  # (layer, head, q, k)
            q_side, k_side = _SIDES[kind]
            # self-attention where only some of the sequence's positions ask (agents among entities): drawn
            # at their rows, the others empty, where lineage places every query at one key of the sequence
            rows = _asking_rows(groups[best], at, joined) if q_side == k_side else None
            n_rows = int(p.shape[-1]) if rows is not None else int(p.shape[-2])
            if (
                kind == "cross"
                and "dec_self" in query_rows
                and len(query_rows["dec_self"]) == int(p.shape[-2])
                and _equal_positions(_last_step_queries(groups[best], at), asked)
                and (not tgt_tokens or len(tgt_tokens) == int(probs["dec_self"].shape[-1]))
            ):  # a decoder's step drawn at its row of the target: its cross-attention at the same row (where the
                # target tokens given are that step's only, it is drawn over them and its self-attention left out)
                rows, n_rows = query_rows["dec_self"], int(probs["dec_self"].shape[-1])
            kw[kind] = _at_rows(p.float().cpu().numpy(), rows, n_rows, 0.0)
            # (only its shape and device are read: the rows drawn over the keys, held by no memory)
            probs[kind] = p if rows is None else p.new_zeros(()).expand(*p.shape[:-2], n_rows, p.shape[-1])
            if km.scores is not None:
                kw[f"{kind}_scores"] = _at_rows(km.scores[at].float().cpu().numpy(), rows, n_rows, -np.inf)
            kw[f"{kind}_mask"] = _at_rows(
                np.ones(p.shape[-2:], dtype=bool)
                if km.mask is None
                else km.mask[at].cpu().numpy().astype(bool),
                rows,
                n_rows,
                False,
            )
            if km.layer_masks is not None and not bool((km.layer_masks[at] == km.layer_masks[at, :1]).all()):
                # layers masked differently (sliding-window layers between global ones): each layer's mask,
                # the kind's mask being the first layer's
                per_layer = _at_rows(km.layer_masks[at].cpu().numpy(), rows, n_rows, False)
                kw[f"{kind}_layer_masks"] = per_layer
                kw[f"{kind}_mask"] = per_layer[0]
            if km.learned is not None:
                kw[f"{kind}_learned"] = _at_rows(km.learned[at].float().cpu().numpy(), rows, n_rows, 0.0)
                learned_keys[kind] = list(km.learned_labels)
            value, residual, dropped = values_.finite_norms(
                kind,
                None if km.value_norms is None else km.value_norms[at].float().cpu().numpy(),
                None
                if km.residual_norms is None or rows is not None  # (the stream of rows that ask only)
                else km.residual_norms[at].float().cpu().numpy(),
            )
            if dropped:
                left_out.append(dropped)
            if value is None and any(r.values is not None and not r.values.intact() for r in groups[best]):
                left_out.append(f"{kind} ({_modules(groups[best])}): what attention moves (its value norms) is left "
                                "out: the values or the output projection it is read from were written in place "
                                "since the forward (an optimizer step, a cache's next step), so they are no longer "
                                "what moved; make the trace before changing the model")  # fmt: skip
            if rows is not None and kind == "cross":
                query_rows[kind] = rows
                left_out.append(f"cross ({_modules(groups[best])}): drawn at the target row{'s' if len(rows) > 1 else ''} "
                                f"{', '.join(map(str, rows))} of {n_rows}, the decoder's position{'s' if len(rows) > 1 else ''} "
                                "asking at the step drawn (as its self-attention is); the other rows are empty")  # fmt: skip
            elif rows is not None:
                query_rows[kind] = rows
                n = int(p.shape[-1])
                names = {r.name for r in groups[best]}
                unrecorded = [
                    w for w in self.notes if any(w.startswith(f"{m or '(model)'} (") for m in names)
                ]
                why = ("their softmax in these modules was not recorded (the capture's notes say why), so they are "
                       "not drawn" if unrecorded else "no softmax ran for them in these calls (whatever the model gives "
                       "those positions, such as Informer's mean of the values, is not attention weights)")  # fmt: skip
                left_out.append(f"{kind} ({_modules(groups[best])}): {len(rows)} of the sequence's {n} positions "
                                f"{'asks' if len(rows) == 1 else 'ask'} and all {n} answer (queries that are some of "
                                "the keys: agents among entities, a pooled token, the last positions of a window or a "
                                f"step): drawn at the rows of the positions that ask; the other rows are empty: {why}")  # fmt: skip
            if value is not None:
                kw[f"{kind}_value_norms"] = value
                scopes[kind] = km.value_scope
            if residual is not None:
                kw[f"{kind}_residual_norms"] = residual
            key_labs[kind] = km.key_labels
            if km.key_labels and None in km.key_labels and (k_side != q_side or rows is None):
                spots.setdefault(k_side, self._token_spots(groups[best], at, km.key_labels))
            for side, labs in (
                (q_side, None if rows is not None else km.query_labels),
                (k_side, km.key_labels),
            ):
                if labs and side not in labels:
                    labels[side] = list(labs)
        sizes: dict[str, int] = {}  # side -> its length in the first kind drawn that uses it
        for kind, p in probs.items():
            for side, n in zip(_SIDES[kind], p.shape[-2:], strict=True):
                sizes.setdefault(side, int(n))
        src = _placed(src_tokens, sizes.get("src", 0), labels.get("src"), spots.get("src"), left_out)
        tgt = _placed(tgt_tokens, sizes.get("tgt", 0), labels.get("tgt"), spots.get("tgt"), left_out)
        # a kind whose maps are not over the tokens given (keys that are some of them, ``x[:, 1:]``, or
        # positions the model made), or over the labels another kind gave a side: left out, and said,
        # rather than drawn under tokens they are not
        given = {"src": len(src) if src else None, "tgt": len(tgt) if tgt else None}  # (None: no kind's)

        def drop(kind: str) -> None:  # a kind left out of the trace: its maps and what goes with them
            for name in [kind, *(f"{kind}_{what}" for what in ("scores", "mask", "learned", "value_norms",
                                                               "residual_norms"))]:  # fmt: skip
                kw.pop(name, None)
            learned_keys.pop(kind, None)
            scopes.pop(kind, None)
            query_rows.pop(kind, None)
            del probs[kind]

        for kind in list(probs):
            q, k = (int(n) for n in probs[kind].shape[-2:])
            want = tuple(given[side] for side in _SIDES[kind])
            fit = (want[0] is None or want[0] == q) and (want[1] is None or want[1] == k)
            where = _modules(self.of(kind))
            if fit and kind == "cross" and apart_from_cross and "enc_self" in probs:
                # as many keys as the source's tokens, but lineage places them elsewhere: another input's
                left_out.append(f"cross ({where}) left out of the trace: its keys are as many as the tokens, but "
                                "other positions than those the encoder self-attention drawn is over (another "
                                "input's: an image's features, a memory the model made), so they are not these "
                                "tokens (cap.records has them, each key's position in record.key_positions)")  # fmt: skip
                drop(kind)
                continue
            if fit:
                continue
            extra = learned_keys.get(kind, [])  # keys outside the sequence (pooled, learned): counted, said
            cols = (
                _key_columns(k, want[1], key_labs.get(kind), labels.get(_SIDES[kind][1])) if extra else None
            )
            if cols is not None and (want[0] is None or want[0] == q):
                # the keys are positions the model made (PVT's and SegFormer's keys pooled by a strided conv),
                # and learned positions of the sequence (CvT's [CLS]) at their columns: drawn beside the
                # tokens, which no query weighs where they are no keys (no mask hides them there)
                n = int(want[1] or 0)
                kw[kind] = _at_columns(kw[kind], cols, n, 0.0)
                if f"{kind}_scores" in kw:
                    kw[f"{kind}_scores"] = _at_columns(kw[f"{kind}_scores"], cols, n, -np.inf)
                kw[f"{kind}_mask"] = _at_columns(kw[f"{kind}_mask"], cols, n, True)
                kw.pop(f"{kind}_value_norms", None)  # (the values of positions the model made: not drawn)
                scopes.pop(kind, None)
                probs[kind] = probs[kind].new_zeros((*probs[kind].shape[:-1], n))
                own = f"{k} of the {n} positions" if k else f"none of the {n} tokens"
                left_out.append(f"{kind} ({where}): its keys are {own} and {len(extra)} positions the model made "
                                f"or learned ({', '.join(extra[:2])}{' …' if len(extra) > 2 else ''}): drawn beside "
                                "the tokens, which weigh 0 where they are no keys")  # fmt: skip
                continue
            tokens = " x ".join("any" if n is None else str(n) for n in want)
            made = (f", {f'{len(extra)} of them' if k else 'all'} positions the model made or learned "
                    f"({', '.join(extra[:2])}{' …' if len(extra) > 2 else ''})") if extra else ""  # fmt: skip
            side = _SIDES[kind][0]
            if side == _SIDES[kind][1] and not (src_tokens if side == "src" else tgt_tokens) and q != k:
                # no tokens given, and the side's length is this map's own query axis: only some positions ask
                left_out.append(f"{kind} ({where}) left out of the trace: its maps are {q} x {k + len(extra)} "
                                f"(queries x keys{made}): {q} of the sequence's positions {'asks' if q == 1 else 'ask'} and {k + len(extra)} answer, "
                                "and a trace draws self-attention over the same positions on both axes")  # fmt: skip
            else:
                left_out.append(f"{kind} ({where}) left out of the trace: its maps are {q} x {k + len(extra)} (queries "
                                f"x keys{made}), the tokens make {tokens}, so they are over other positions than "
                                "these tokens")  # fmt: skip
            drop(kind)
        if left_out and not probs:
            over = "the tokens given" if src_tokens or tgt_tokens else "its sequences' positions"
            more = f"; and {len(left_out) - 2} more (cap.records has every map)" if len(left_out) > 2 else ""
            raise ValueError(
                f"none of the attention captured can be drawn over {over}: " + "; ".join(left_out[:2]) + more
            )
        drawn = [a for k in probs for a in (kw[k], kw.get(f"{k}_learned")) if isinstance(a, np.ndarray)]
        top = max((float(np.nanmax(a)) for a in drawn if _some_finite(a)), default=0.0)
        if top > 1 + trace_io.PROB_TOL:  # dropout while training (kept weights times 1 / (1 - p)), a mix
            left_out.append(f"weights up to {top:.3g}: these maps are the weights the values were multiplied with, "
                            "changed after the softmax (dropout while training keeps each weight it does not drop "
                            "times 1 / (1 - p); heads mixed by a learned map, a scale)")  # fmt: skip
        sources = sorted({r.source for r in self.records})
        meta: dict[str, Any] = {"kind": "torch.nn", "capture": ", ".join(sources)}
        if top > 1 + trace_io.PROB_TOL:
            meta["weights_rescaled"] = float(np.nextafter(np.float32(top), np.float32(np.inf)))
        if self.notes or left_out:
            meta["capture_notes"] = [*self.notes, *left_out]
        if self.skipped:
            meta["capture_skipped"] = [str(n) for n in self.skipped]
        differ = self.head_masks_differ()
        if differ:
            meta["head_masks_differ"] = differ
        if learned_keys:
            meta["learned_keys"] = learned_keys
        if scopes:
            meta["value_norms"] = scopes
        if query_rows:
            meta["query_rows"] = query_rows
        return AttentionTrace(
            model=model,
            config_name="torch.nn",
            device=str(next(iter(probs.values())).device) if probs else "cpu",
            src_tokens=src,
            tgt_tokens=tgt,
            output_text=output_text,
            meta=meta,
            **kw,
        )


@dataclass
class KindMaps:
    """One kind's layers over its sequence's positions (B, layer, head, q, k), learned keys apart."""

    probs: torch.Tensor
    scores: torch.Tensor | None
    mask: torch.Tensor | None  # (B, q, k), the first layer's
    learned: torch.Tensor | None  # (B, layer, head, q, M): weights on learned keys outside the sequence
    learned_labels: tuple[str, ...]  # their labels (a layer without one of them has 0 there)
    query_labels: tuple[str | None, ...] | None  # learned positions joined to the queries' sequence
    key_labels: tuple[str | None, ...] | None  # the same among the keys
    value_norms: torch.Tensor | None = None  # (B, layer, head, k): ||f_h(x_j)|| of the sequence's keys
    value_scope: str | None = None  # values_.WITH_WO or values_.WITHOUT_WO
    residual_norms: torch.Tensor | None = None  # (B, layer, q): ||x_i|| of the stream each layer adds to
    # (B, layer, q, k): every layer's mask, where some layer's differs from the first's (else None)
    layer_masks: torch.Tensor | None = None


def _seq_columns(r: Record, joined: set[str]) -> list[int]:
    """The key columns of a record that are positions of its sequence (tokens, learned positions joined)."""
    kl = r.key_labels or (None,) * r.probs.shape[-1]
    return [j for j, lab in enumerate(kl) if lab is None or lab in joined]


def _stack_key(r: Record, joined: set[str]) -> tuple:
    """Records stack as layers of one kind where these agree: batch and heads, queries, the sequence's
    keys and their labels, the queries' labels."""
    seq = _seq_columns(r, joined)
    labels = tuple(r.key_labels[j] if r.key_labels else None for j in seq)
    return (tuple(r.probs.shape[:2]), int(r.probs.shape[-2]), len(seq), labels, r.query_labels)


def _own_keys(seen: torch.Tensor | None, labels) -> torch.Tensor | None:
    """The columns of a mask over the sequence's own keys (learned keys, always seen, are not ahead of
    anyone: the sequence's keys decide causality); ``seen`` itself where no key is labelled."""
    if seen is None or not labels or len(labels) != seen.shape[-1] or None not in labels:
        return seen
    return seen[..., [i for i, label in enumerate(labels) if label is None]]


def _own_block(seen: torch.Tensor | None, key_labels, query_labels, rows_too: bool) -> torch.Tensor | None:
    """A mask over the sequence's own keys (``_own_keys``) and, where a learned position is joined to the
    sequence (a learned [SOS] before a causal text, a class token after it: CoCa's), over its own queries
    too: those decide whether it is causal. ``rows_too``: drop learned query rows whatever the keys left
    (MultiheadAttention's)."""
    own = _own_keys(seen, key_labels)
    if own is None or own is seen:
        return seen
    rows = query_labels
    if rows and len(rows) == own.shape[-2] and None in rows:
        keep = [i for i, label in enumerate(rows) if label is None]
        if rows_too or len(keep) == own.shape[-1]:
            if (
                seen is not None
                and len(keep) < 2 <= min(int(seen.shape[-2]), int(seen.shape[-1]))
                and len(keep) < len(rows)
            ):
                # one token and the learned positions joined to it (a task token before a one-token target):
                # the whole mask decides ([[1, 0], [1, 1]] is causal; a [CLS] and its token see each other)
                return seen
            return own[..., keep, :]
    return own


def _keys_apart(encoder: Record, row: int, cross: Record, index: int) -> bool:
    """Lineage places the encoder self-attention's row ``row`` and the cross-attention's keys of row ``index``, and
    they share no position: the cross-attention reads another input than the one the encoder attends over."""
    qp, kp = encoder.query_positions, cross.key_positions
    if qp is None or kp is None or row >= int(qp.shape[0]) or index >= int(kp.shape[0]):
        return False
    return _disjoint(qp[row : row + 1], kp[index : index + 1])


def _encoder_row(encoder: list[Record], cross: list[Record], index: int) -> tuple[int | None, str | None]:
    """The row of an encoder's self-attention that is the input the cross-attention's row ``index`` reads, and
    what a trace says of it: ``index`` where both have as many rows; where the encoder's are fewer and the
    cross-attention's are k per encoder row (a memory repeated over beams), row ``index // k`` where lineage
    shows that row's positions among the keys read; None (left out, with why) where the encoder's rows are
    more (passages or neighbours encoded apart and joined into one memory: Fusion-in-Decoder's, RETRO's) or
    lineage does not show which."""
    ne, nc = int(encoder[0].probs.shape[0]), int(cross[0].probs.shape[0])
    if ne == nc:
        return index, None
    apart = (f"its maps are over {ne} sequences and the cross-attention's over {nc} (inputs encoded apart and "
             "joined into one memory, as Fusion-in-Decoder's passages or RETRO's neighbours, or a memory "
             "repeated over beams)")  # fmt: skip
    if ne > nc or nc % ne:
        return None, apart
    row = index // (nc // ne)
    qp, kp = encoder[0].query_positions, cross[0].key_positions
    if qp is None or kp is None or index >= int(kp.shape[0]) or row >= int(qp.shape[0]):
        return None, apart
    keys = {int(p) for p in kp[index].tolist() if p >= 0}
    if not keys & {int(p) for p in qp[row].tolist()}:
        return None, apart
    return row, (f"its row {row} is drawn: the cross-attention's rows are {nc // ne} for each of its {ne} (a "
                 "memory repeated over beams, or one passage read by several questions), and row "
                 f"{index} reads row {row}'s positions")  # fmt: skip


def _drawn_group(
    groups: list[list[Record]],
    kind: str,
    index: int,
    joined: set[str],
    src_tokens,
    tgt_tokens,
    asked: torch.Tensor | None = None,
    cross: list[Record] | None = None,
) -> int:
    """Which of a kind's groups (calls whose maps stack) a trace of sequence ``index`` draws: with ``asked``, the
    query positions of the cross-attention step drawn, a decoder's self-attention at that step; then one that
    holds the sequence and can be drawn over the tokens given; then one that holds the sequence (a group whose
    records are flagged, as rows that hold other sequences of the caller's batch than their place says, does not
    hold it by its row: exact ones first, in each); then one over the tokens given; then the most calls; then the
    first."""
    has = [_holds(g, index) for g in groups]
    sure = [has[i] and all(r.exact for r in g) for i, g in enumerate(groups)]
    step = [asked is not None and has[i] and _equal_positions(_last_step_queries(g, index), asked)
            for i, g in enumerate(groups)]  # fmt: skip
    # (with a cross-attention: an encoder's self-attention over the positions it reads as keys, a decoder's over
    # those that ask it: ALBEF's text self-attention, the queries' side, is no encoder of the image it reads)
    side = [
        bool(cross) and kind != "cross" and _on_side(g, cross or [], keys=kind == "enc_self") for g in groups
    ]
    fits = [_fits(g[0], kind, joined, src_tokens, tgt_tokens) for g in groups]
    # (self-attention whose keys are the tokens given, some of them asking: a decoder's step over its cache, drawn
    # at the rows that ask, before a step over fewer keys than the tokens)
    keyed = [
        not fits[i] and _keys_fit(g[0], kind, joined, src_tokens, tgt_tokens) for i, g in enumerate(groups)
    ]
    # (tokens given that are exactly the sequence's other positions, its learned ones put in under their labels,
    # before tokens as many as every position: a decoder's step over a task token and one token fewer)
    besides = [
        fits[i] and _tokens_besides_learned(g[0], kind, src_tokens, tgt_tokens) for i, g in enumerate(groups)
    ]
    # (after the decoder's step the cross-attention drawn asks at: a group that holds the sequence and can be
    # drawn over the tokens given, before one that cannot: an MSA's tied row attention over the columns given,
    # though flagged, before its exact column attention over the rows)
    drawn = [has[i] and (fits[i] or keyed[i]) for i in range(len(groups))]
    return max(
        range(len(groups)),
        key=lambda i: (
            step[i],
            drawn[i] and sure[i],
            drawn[i],
            sure[i],
            has[i],
            side[i],
            fits[i],
            besides[i],
            keyed[i],
            len(groups[i]),
            -i,
        ),
    )


def _sums_over_one(a: Any, b: Any) -> bool:
    """``a @ b`` sums over an axis of one (``bmm(w.unsqueeze(2), v.unsqueeze(1))``): an outer product."""
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dim() >= 2
        and b.dim() >= 2
        and int(a.shape[-1]) == 1
        and int(b.shape[-2]) == 1
    )


def _order_unplaced(orders: tuple[tuple[int, torch.Tensor], ...], rows: int) -> str | None:
    """Why a record of ``rows`` rows whose queries and keys lineage does not place may hold the caller's
    sequences in another order: the model put its batch of that many rows in another order before it, and had not
    put it back; or None."""
    for n, order in orders:
        if n == rows:
            return (f"the model put its batch in another order before this attention (x[perm], perm={order.tolist()}: "
                    "sorted by length, as for pack_padded_sequence) and had not put it back, and lineage does not "
                    "place this map's rows (its queries and keys hold no position of the caller's inputs): record row b may be "
                    "the caller's sequence perm[b], not b")  # fmt: skip
    return None


def _stream_piece(r: Record) -> bool:
    """``r`` is a map over one piece of a 1-D stream of tokens, the sequence ``r.batch_rows`` names (requests
    packed into a stream and attended a call each), not a batch the model put in another order (flagged)."""
    return r.batch_rows is not None and r.flag is None


def _holds(group: list[Record], index: int) -> bool:
    """A group of records holds sequence ``index``: among the caller's sequences its rows hold, where the model
    reordered or picked its batch (``batch_rows``), else where it has that many rows."""
    orders = {r.batch_rows for r in group}
    if all(_stream_piece(r) for r in group):  # (pieces of one stream: a sequence each)
        return any(index in o for o in orders if o is not None)
    order = next(iter(orders)) if len(orders) == 1 else None
    if order is not None:
        return index in order
    return index < int(group[0].probs.shape[0])


def _tokens_besides_learned(r: Record, kind: str, src_tokens, tgt_tokens) -> bool:
    """Where ``r``'s queries or keys hold learned positions, the tokens given for that side are as many as its
    other positions (they are put in beside them)."""
    q_side, k_side = _SIDES[kind]
    tokens = {"src": tuple(src_tokens), "tgt": tuple(tgt_tokens)}
    for side, labels in ((q_side, r.query_labels), (k_side, r.key_labels)):
        given = tokens[side]
        if given and labels and any(labels) and sum(lab is None for lab in labels) != len(given):
            return False
    return True


def _last_step_queries(group: list[Record], index: int) -> torch.Tensor | None:
    """(q,) the query positions of sequence ``index`` in the last step of ``group`` (a decoder's steps inside
    one forward), or None where lineage has none."""
    steps = query_segments(group)
    qp = steps[-1][0].query_positions if steps else None
    return None if qp is None or index >= int(qp.shape[0]) else qp[index]


def query_segments(records: list[Record]) -> list[list[Record]]:
    """Records that stack, in runs that read the same query positions: a new run begins where a record
    of a module already in the current one reads other positions (a decoder's next step inside one forward),
    or where lineage does not say which positions one of the two reads (a decoder state's step of additive
    attention, or a layer whose weights are shared: capture cannot tell them apart, and does not stack
    them as deeper layers)."""
    if len(records) < 2:
        return [records] if records else []
    runs: list[list[Record]] = [[records[0]]]
    for r in records[1:]:
        run = runs[-1]
        same = next((x for x in run if x.name == r.name), None)
        if (same is not None and not _equal_positions(same.query_positions, r.query_positions)) or _disjoint(
            run[0].query_positions, r.query_positions
        ):  # (a module of the run asked again over new positions; or another input's positions altogether)
            runs.append([r])
        else:
            run.append(r)
    return runs


def _broadcasts_to(a: torch.Tensor, t: torch.Tensor) -> bool:
    """``a`` broadcasts to ``t``'s shape (a factor over fewer axes: TorchMD-Net's cosine cutoff of the
    distances, ``(B, 1, N, N)`` over the heads)."""
    try:
        return tuple(torch.broadcast_shapes(a.shape, t.shape)) == tuple(t.shape)
    except RuntimeError:
        return False


def _iterable(x: Any) -> list:
    """``x``'s items, or ``[x]`` where it has none (a number given for a list)."""
    try:
        return list(x)
    except TypeError:
        return [x]


def _row_of(sources: lineage.Sources, pos: torch.Tensor) -> tuple[lineage.Source, int, int] | None:
    """The source every position of ``pos`` (1-D, not empty) came from, the length of its sequences (a source of
    one row: one sequence) and the first position of the one sequence they all lie in; None where they lie in
    several sources or sequences, or lineage does not say."""
    try:
        src = sources.index(pos)
    except Exception:  # (lineage does not say the positions' sequence)
        return None
    if not bool((src == src[0]).all()):
        return None
    source = sources.items[int(src[0])]
    size = _sequence_size(source) or source.n
    if not size:
        return None
    rows = (pos - source.start) // size
    if not bool((rows == rows[0]).all()):
        return None
    return source, size, source.start + int(rows[0]) * size


def _sequence_rows(sources: lineage.Sources, qp: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """(the sequence of its input each row's queries lie in, that input's number of sequences), or None."""
    own = qp >= 0
    if not bool(own.any(-1).all()):
        return None
    safe = qp.clamp_min(0).cpu()
    own = own.cpu() & ~sources.learned(safe)
    if not bool(own.any(-1).all()):
        return None
    src = sources.index(safe)
    first = src[own][:1]
    if not bool(((src == first) | ~own).all()):
        return None
    source = sources.items[int(first)]
    # (a source of one batch row, by the shape it came from: one sequence, an image's windows its parts; or
    # of positions with no batch axis, (N, C): one sequence, a flat point cloud's patches its parts)
    size = _sequence_size(source) or (
        source.n if source.lead and (source.lead[0] == 1 or tuple(source.lead) == (source.n,)) else 0
    )
    if not size or source.n < size:
        return None
    rows = (safe - source.start) // size
    big = torch.iinfo(rows.dtype).max
    lo = torch.where(own, rows, big).amin(-1)
    if not bool((lo == torch.where(own, rows, -1).amax(-1)).all()):
        return None
    return lo, source.n // size


def _sequence_size(source: lineage.Source) -> int:
    """Positions per sequence of a source: a row of the tensor they came from (0: the source is one row); an
    image's rows together, where it has more leading dims than (batch, positions): (B, H, W, C) holds B
    sequences of H * W; token ids of more dims than two, each first index's rows together."""
    if source.kind == "external" and len(source.lead) >= 3 and source.lead[0] > 0:
        return source.n // source.lead[0]
    if source.kind == "tokens" and len(source.lead) >= 2 and source.lead[0] > 0:
        # ids of more dims than (batch, positions): (B, chunks, neighbours, n), RETRO's retrieved neighbours, are B
        # sequences' rows
        return source.n // source.lead[0]
    return source.row


def _pooled_asks(r: Record) -> bool:
    """Every query of ``r`` is a position pooled from a sequence that is not among its keys (Nystromformer's
    landmarks asking each other or the tokens): not joined to the sequence's tokens as a [CLS], or a mean token
    prepended to them (among its keys), is; so the tokens' maps over those positions stay maps over pooled
    keys."""
    labels = r.query_labels or ()
    keys = set(r.key_labels or ())
    return bool(labels) and all(
        lab is not None and lab.startswith("<pooled ") and lab not in keys for lab in labels
    )


def _part_of(cap: Captured, records: list[Record], at: int) -> str | None:
    """Where the maps' rows are not the sequences given one for one (windows, chunks or documents the model
    folded into its batch, beams), which sequence row ``at`` reads; None where row ``at`` is sequence ``at``."""
    found = cap.rows_of(records[0]) if records else None
    if found is None:
        return None
    rows, n = found
    if at >= int(rows.numel()) or (int(rows.numel()) == n and int(rows[at]) == at):
        return None
    return (f"its maps are over {int(rows.numel())} rows for the {n} sequence(s) given (windows, chunks, documents "
            f"or beams the model folded into its batch, in its order): row {at}, drawn here, reads positions of "
            f"sequence {int(rows[at])}")  # fmt: skip


def _row_streams(records: list[Record], at: int) -> list[list[Record]]:
    """Records that stack, grouped by the query positions their row ``at`` holds (in the order of their first
    call): one group where they all read the same (a forward's layers over one sequence), or where lineage
    does not say for one of them."""
    streams: dict[tuple[int, ...], list[Record]] = {}
    for r in records:
        qp = r.query_positions
        if qp is None or qp.dim() != 2 or at >= int(qp.shape[0]):
            return [records]
        streams.setdefault(tuple(qp[at].tolist()), []).append(r)
    if len(streams) > 1:  # (padding cells made anew in each layer: the same positions besides them)
        unpadded: dict[tuple[int, ...], list[Record]] = {}
        for r in records:
            unpadded.setdefault(tuple(_unpadded_queries(r, at).tolist()), []).append(r)
        if len(unpadded) < len(streams):
            return list(unpadded.values())
    return list(streams.values())


def _unpadded_queries(r: Record, at: int) -> torch.Tensor:
    """The query positions of row ``at`` of a self-attention record, less those whose keys no query may attend
    (padding cells, which a model that pads in every layer, as PyG's ``to_dense_batch`` does, makes anew each
    time: the same sequence's layers, though those cells are new positions in each)."""
    assert r.query_positions is not None
    qp, m, kp = r.query_positions[at], r.mask, r.key_positions
    n = int(qp.shape[0])
    if (
        m is None
        or m.dim() != 3
        or tuple(m.shape[-2:]) != (n, n)
        or at >= int(m.shape[0])
        or (kp is not None and (kp.dim() != 2 or not torch.equal(kp[at].to(qp.device), qp)))
    ):
        return qp
    seen = m[at].any(0).to(qp.device)
    return qp[seen] if bool(seen.any()) else qp


def _disjoint(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Query positions of two records with no position in common: other inputs' (an encoder's and a
    decoder's self-attention, two towers), never layers over one sequence."""
    if a is None or b is None or a.device != b.device:
        return False
    a, b = a[a >= 0], b[b >= 0]
    return bool(a.numel()) and bool(b.numel()) and not bool(torch.isin(b, a).any())


def _both_ways(steps: list[list[Record]]) -> bool:
    """Cross-attention calls of which some ask over the positions others ask from, and the other way round:
    two inputs attending to each other (co-attention), which a source and a target cannot tell apart."""
    return any(
        _on_side(a, b, keys=True) and _on_side(b, a, keys=True)
        for i, a in enumerate(steps)
        for b in steps[i + 1 :]
    )


def _on_side(records: list[Record], cross: list[Record], keys: bool) -> bool:
    """The records' queries are positions the cross-attention reads as keys (``keys``: an encoder's memory)
    or asks from (a decoder's)."""
    own = records[0].query_positions
    if own is None:
        return False
    held = own[own >= 0]
    for c in cross:
        side = c.key_positions if keys else c.query_positions
        if side is not None and side.device == own.device and bool(torch.isin(side[side >= 0], held).any()):
            return True  # (a position both hold: learned keys, -1, say nothing of which input they are)
    return False


def _key_positions(probs: torch.Tensor, layout: Layout | None) -> torch.Tensor | None:
    """(B, k) the position of each key of a record laid out by ``layout`` (-1 at learned ones), or None."""
    kp = layout.seq_keys if layout is not None else None
    if kp is None or tuple(kp.shape) != (int(probs.shape[0]), int(probs.shape[-1])):
        return None
    return kp


# the kinds of positions that are the caller's inputs: token ids, tensors handed in
_CALLERS = ("tokens", "external")


def _keys_out_of_order(r: Record, b: int, sources: lineage.Sources | None) -> bool:
    """The keys of row ``b`` of ``r`` hold positions of one of the caller's inputs (token ids, a tensor handed in)
    out of their order, or one twice (instances sorted by a score, then picked), where lineage has them: drawn over
    that input's tokens in order, weights would stand under the wrong tokens."""
    kp = r.key_positions
    if kp is None or sources is None or kp.dim() != 2 or b >= kp.shape[0]:
        return False
    keys = kp[b][kp[b] >= 0]
    # (positions the model made are numbered in the order it made them: sentence vectors pooled in a packed order
    # are no tokens out of their order)
    keys = keys[sources.of_kind(keys, _CALLERS)]
    if keys.numel() < 2:
        return False
    at = sources.index(keys)
    for src in at.unique().tolist():
        own = keys[at == src]
        if own.numel() > 1 and not bool((own[1:] > own[:-1]).all()):
            return True
    return False


def _keys_not_queries(r: Record, b: int) -> bool:
    """Self-attention whose keys in sequence ``b`` are as many of its positions as its queries, but other
    ones or in another order (key blocks gathered, one twice: BigBird's random blocks), so that a trace
    drawing them over the tokens would put weights under the wrong tokens."""
    kp, qp = r.key_positions, r.query_positions
    if kp is None or qp is None or b >= kp.shape[0] or b >= qp.shape[0] or kp.device != qp.device:
        return False
    keys, queries = kp[b][kp[b] >= 0], qp[b][qp[b] >= 0]
    return keys.numel() == queries.numel() > 1 and not bool(torch.equal(keys, queries))


def _steps_unplaced(runs: list[list[Record]]) -> bool:
    """Runs split where lineage did not say the queries of some record (not where positions differ)."""
    return any(r.query_positions is None for run in runs for r in run)


def _equal_positions(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (
        a is not None
        and b is not None
        and a.shape == b.shape
        and a.device == b.device
        and bool(torch.equal(a, b))
    )


def stack_groups(records: list[Record], joined: set[str]) -> list[list[Record]]:
    """A kind's records in groups that stack, each in call order, groups in the order of their first call."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault(_stack_key(r, joined), []).append(r)
    return list(groups.values())


def _fits(r: Record, kind: str, joined: set[str], src_tokens, tgt_tokens) -> bool:
    """Whether record ``r``'s map can be drawn over the tokens given on each side that has them (learned
    positions joined to a sequence, a [CLS], counted where the tokens are its other positions), its
    queries and keys one sequence's positions where both are one side's (self-attention)."""
    q_side, k_side = _SIDES[kind]
    tokens = {"src": tuple(src_tokens), "tgt": tuple(tgt_tokens)}
    seq = _seq_columns(r, joined)
    if q_side == k_side and int(r.probs.shape[-2]) != len(seq):  # (keys pooled, or learned ones alone)
        return False
    key_labels = [r.key_labels[j] if r.key_labels else None for j in seq]
    for side, n, labels in ((q_side, int(r.probs.shape[-2]), r.query_labels), (k_side, len(seq), key_labels)):
        given = tokens[side]
        if given and len(_with_labels(given, list(labels) if labels else None)) != n:
            return False
    return True


def _keys_fit(r: Record, kind: str, joined: set[str], src_tokens, tgt_tokens) -> bool:
    """Self-attention whose keys are the tokens given for its side (learned positions joined to the sequence counted
    where the tokens are its other positions) and whose queries are fewer: some of the positions ask."""
    q_side, k_side = _SIDES[kind]
    given = {"src": tuple(src_tokens), "tgt": tuple(tgt_tokens)}[k_side]
    if q_side != k_side or not given:
        return False
    seq = _seq_columns(r, joined)
    labels = [r.key_labels[j] if r.key_labels else None for j in seq]
    return int(r.probs.shape[-2]) < len(seq) == len(_with_labels(given, labels if r.key_labels else None))


def _modules(records: list[Record]) -> str:
    """The modules of ``records`` as a note names them: the first three, and how many more."""
    names = sorted({r.name or "(model)" for r in records})
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def stack_note(kind: str, group: list[Record], drawn: list[Record]) -> str:
    """What a trace says of calls of a kind it leaves out for others that stack differently."""
    where = _modules(group)
    return (f"{kind} ({where}): {len(group)} call(s) left out of the trace, their maps "
            f"{tuple(int(n) for n in group[0].probs.shape)} do not stack with the "
            f"{tuple(int(n) for n in drawn[0].probs.shape)} of the {len(drawn)} kept (a decoder run a step at "
            "a time, layers with another head count, or attention over other positions)")  # fmt: skip


def kind_maps(records: list[Record], joined: set[str]) -> KindMaps:
    """Stack records of one kind: the key columns that are positions of the sequence (tokens, and
    learned positions in ``joined``), and the learned keys outside it by label."""
    if not records:
        raise ValueError("no records to stack")
    seqs: list[list[int]] = []
    extras: list[list[tuple[int, str]]] = []
    labels: list[str] = []
    for r in records:
        kl = r.key_labels or (None,) * r.probs.shape[-1]
        seqs.append(_seq_columns(r, joined))
        extras.append([(j, lab) for j, lab in enumerate(kl) if lab is not None and lab not in joined])
        labels.extend(lab for _, lab in extras[-1] if lab not in labels)
    seq_labels = {
        tuple(r.key_labels[j] if r.key_labels else None for j in seq)
        for r, seq in zip(records, seqs, strict=True)
    }
    shapes = {
        (tuple(r.probs.shape[:2]), r.probs.shape[-2], len(seq)) for r, seq in zip(records, seqs, strict=True)
    }
    if len(seq_labels) > 1 or len(shapes) > 1 or len({r.query_labels for r in records}) > 1:
        raise ValueError(
            f"{records[0].kind} calls have different shapes {sorted(tuple(r.probs.shape) for r in records)}: was the "
            "model run more than once (e.g. step-by-step decoding), or do layers have different head counts? "
            "Use .records for the individual calls"
        )
    probs = torch.stack([r.probs[..., seq] for r, seq in zip(records, seqs, strict=True)], dim=1)
    scores = None
    if all(r.scores is not None for r in records):
        scores = torch.stack([r.scores[..., seq] for r, seq in zip(records, seqs, strict=True)], dim=1)  # type: ignore[index]
    first = records[0]
    mask = None if first.mask is None else first.mask[..., seqs[0]]
    layer_masks = _layer_masks(records, seqs, probs)
    learned = None
    if labels:
        learned = probs.new_zeros(*probs.shape[:-1], len(labels))
        for i, (r, extra) in enumerate(zip(records, extras, strict=True)):
            for j, lab in extra:
                learned[:, i, ..., labels.index(lab)] = r.probs[..., j]
    (key_labels,) = seq_labels
    norms, scope = kind_value_norms(records, seqs)
    residual = None
    if (
        norms is not None
        and scope == values_.WITH_WO
        and all(
            r.residual is not None and tuple(r.residual.shape) == (r.probs.shape[0], r.probs.shape[-2])
            for r in records
        )
    ):
        residual = torch.stack(
            [r.residual.to(probs.device) for r in records if r.residual is not None], dim=1
        )
    return KindMaps(probs, scores, mask, learned, tuple(labels), first.query_labels,
                    key_labels if any(key_labels) else None, norms, scope, residual, layer_masks)  # fmt: skip


def _layer_masks(records: list[Record], seqs: list[list[int]], probs: torch.Tensor) -> torch.Tensor | None:
    """(B, layer, q, k) every layer's mask over its sequence's keys (all True where a layer had none), where
    some layer's differs from the first's (sliding-window layers between global ones, a layer that forgot
    the padding mask); None where every layer's is the first's."""
    b, _, _, q, k = probs.shape
    masks = [
        None if r.mask is None else r.mask[..., seq].to(probs.device).expand(b, q, k)
        for r, seq in zip(records, seqs, strict=True)
    ]
    first = masks[0]
    if all(
        (m is None and first is None) or (m is not None and first is not None and torch.equal(m, first))
        for m in masks[1:]
    ):
        return None
    every = torch.ones(b, q, k, dtype=torch.bool, device=probs.device)
    return torch.stack([every if m is None else m.bool() for m in masks], dim=1)


def kind_value_norms(records: list[Record], seqs: list[list[int]]) -> tuple[torch.Tensor | None, str | None]:
    """(B, layer, head, k) value norms of a kind's sequence keys, and their scope: with the output
    projection where every layer's was found, else the values' own norms for every layer (one scope
    per kind); None when a layer's values were not seen."""
    if not records or any(r.values is None for r in records):
        return None, None
    hvs = [r.values for r in records if r.values is not None]
    with_wo = all(hv.w_o is not None for hv in hvs)
    norms = []
    for r, hv, seq in zip(records, hvs, seqs, strict=True):
        n = hv.norms(with_projection=with_wo)
        if n is None or tuple(n.shape) != (*r.probs.shape[:2], r.probs.shape[-1]):  # e.g. heads joined
            return None, None  # from per-head calls, or values that could not be confirmed
        norms.append(n[..., seq].to(r.probs.device))
    try:
        return torch.stack(norms, dim=1), values_.WITH_WO if with_wo else values_.WITHOUT_WO
    except RuntimeError:  # layers of other shapes
        return None, None


def _asking_rows(records: list[Record], b: int, joined: set[str]) -> list[int] | None:
    """Self-attention where only some of its sequence's positions ask (REFIL's agents among the entities):
    the key column of the sequence at which each query row of sequence ``b`` sits, the same in every layer;
    None where every position asks, or where lineage does not place each query at one distinct key."""
    found: list[int] | None = None
    for r in records:
        seq = _seq_columns(r, joined)
        q = int(r.probs.shape[-2])
        if q >= len(seq):
            return None
        qp, kp = r.query_positions, r.key_positions
        if qp is None or kp is None or b >= qp.shape[0] or b >= kp.shape[0] or qp.shape[-1] != q:
            return None
        all_keys = kp[b].tolist()
        key_labels = [r.key_labels[j] if r.key_labels else None for j in seq]
        column: dict[Any, int] = {}  # a key's position (or a learned one's label) -> its column, -1: twice
        for j, (at_j, lab) in enumerate(zip((all_keys[i] for i in seq), key_labels, strict=True)):
            name = lab if lab is not None else at_j if at_j >= 0 else None
            if name is not None:
                column[name] = -1 if name in column else j
        cols: list[int] = []
        for i, pos in enumerate(qp[b].tolist()):
            label = r.query_labels[i] if r.query_labels and len(r.query_labels) == q else None
            at = column.get(label if label is not None else pos, -1)  # (a learned position: by its label)
            if at < 0 or (label is None and isinstance(pos, int) and pos < 0):
                return None
            cols.append(at)
        if len(set(cols)) != len(cols) or (found is not None and cols != found):
            return None
        found = cols
    return found


def _at_rows(a: np.ndarray, rows: list[int] | None, n: int, fill: Any) -> np.ndarray:
    """``a`` (..., q, k) with its q rows spread over ``n`` rows: at ``rows``, ``fill`` elsewhere (``a``
    itself where ``rows`` is None)."""
    if rows is None:
        return a
    out = np.full((*a.shape[:-2], n, a.shape[-1]), fill, dtype=a.dtype)
    out[..., rows, :] = a
    return out


def _some_finite(a: np.ndarray) -> bool:
    return a.size > 0 and bool(np.isfinite(a).any())


def _key_columns(k: int, n: int | None, keys: Any, side: list[str | None] | None) -> list[int] | None:
    """Where the ``k`` keys of a map over the sequence's positions sit among the side's ``n`` positions: none
    (every key outside the sequence), or each a learned position of it under a label the side holds once;
    None where that cannot be told (keys that are some of its tokens)."""
    if not n or k >= n:
        return None
    if not k:
        return []
    if not keys or len(keys) != k or not side or len(side) != n or any(lab is None for lab in keys):
        return None
    if any(side.count(lab) != 1 for lab in keys):
        return None
    return [side.index(lab) for lab in keys]


def _at_columns(a: np.ndarray, cols: list[int], n: int, fill: Any) -> np.ndarray:
    """``a`` (..., k) spread over ``n`` columns: its k columns at ``cols``, ``fill`` elsewhere."""
    out = np.full((*a.shape[:-1], n), fill, dtype=a.dtype)
    out[..., cols] = a
    return out


def _numbered(n: int, labels: list[str | None] | None) -> tuple[str, ...]:
    """Positions ``#0``, ``#1``, ... of a side ``n`` long that was given no tokens (its learned positions
    keep their labels)."""
    if labels and len(labels) == n:
        n = sum(lab is None for lab in labels)
    return tuple(f"#{j}" for j in range(n))


def _placed(
    given: tuple[str, ...],
    size: int,
    labels: list[str | None] | None,
    spots: tuple[list[int], int] | None,
    left_out: list[str],
) -> tuple[str, ...]:
    """A side's tokens for the trace: those given (numbered where none are) with its learned positions put in
    under their labels. Where the tokens given are the whole sequence of ids and the maps hold some of them
    with positions the model made (``spots``: a decoder input shifted right by a start vector), each column
    gets the token it holds, and the tokens at no column are said."""
    if (
        given
        and spots is not None
        and labels
        and len(given) == spots[1]
        and len(labels) == len(spots[0])
        and sum(lab is None for lab in labels) != len(given)
        and all((lab is None) == (at >= 0) for lab, at in zip(labels, spots[0], strict=True))
    ):
        cols = spots[0]
        missing = sorted(set(range(len(given))) - set(cols))
        made = [lab for lab in labels if lab is not None]
        left_out.append(
            f"the {len(given)} tokens given are the sequence's ids, and the maps' columns are {len(made)} position(s) "
            f"the model made or learned ({', '.join(made[:2])}{' …' if len(made) > 2 else ''}) and {len(given) - len(missing)} "
            f"of these tokens (a decoder input shifted right): each token is drawn at its own column, and "
            f"{', '.join(repr(given[i]) for i in missing[:3])}{' …' if len(missing) > 3 else ''} (token"
            f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing[:3]))}{' …' if len(missing) > 3 else ''}) at none"
        )
        return tuple(lab if lab is not None else given[at] for lab, at in zip(labels, cols, strict=True))
    return _with_labels(given or _numbered(size, labels), labels)


def _with_labels(tokens: tuple[str, ...], labels: list[str | None] | None) -> tuple[str, ...]:
    """The sequence's tokens with its learned positions put in under their labels (when the given
    tokens are exactly its other positions)."""
    if not labels or not any(labels) or sum(lab is None for lab in labels) != len(tokens):
        return tokens
    it = iter(tokens)
    return tuple(lab if lab is not None else next(it) for lab in labels)


# -- lineage tags ---------------------------------------------------------------------------------
@dataclass(slots=True)
class _Tag:
    """What the capture knows about one tensor made inside the block."""

    role: str | None = None  # scores (matmul of activations) | linear (a projection) | param
    origin: frozenset = frozenset()  # the embedding calls it derives from
    split: tuple[int, int] | None = None  # 3-D (a*b, ...) made from 4-D (a, b, ...): the two factors
    scores: torch.Tensor | None = None  # the tensor before a mask was applied
    allowed: torch.Tensor | None = None  # bool, broadcastable to the tensor, True = may attend
    mask_source: str | None = None
    cross: bool | None = None  # scores: queries and keys came from different embedding calls
    heads: int | None = None  # the head count of the view that split the features into (heads, d)
    cache: bool = False  # joined along a sequence axis with other positions (a KV cache, a memory)
    ext: bool = False  # scores: the keys extend the queries' own sequence (a KV cache): self-attention
    axes: tuple[str, ...] | None = None  # einsum scores: each dim's letter is in q (q), k (k) or both (s)
    probs: _Probs | None = None  # a recorded softmax's output (followed to a masked renormalization)
    code: torch.Tensor | None = None  # lineage codes (same shape): source position and feature per element
    smap: ScoreMap | None = None  # scores: which query and key every element holds (lineage)
    rowq: torch.Tensor | None = None  # weights: the query code of every row (the key dim kept as 1)
    attn_out: str | None = None  # weights times values: the module whose attention made it
    moved: bool = False  # weights times values, then only moved (views, transposes, cat): no arithmetic
    wo: _Probs | None = None  # the output projection's output (then moved or dropped out) of these weights
    # weights changed since the softmax by an op on their values (a head mask, dropout while training,
    # NaN rows set to 0): the record takes them as they are multiplied with the values
    touched: bool = False
    # weights viewed into a shape whose rows lineage no longer reads (``w.view(B, H, 2, T, S)``): the
    # record they came from; ``changed``: their values changed since (the record is not what they are)
    lost: _Probs | None = None
    changed: bool = False
    made_by: _Probs | None = None  # weights times values: the record of the weights (then moved or changed)
    # ``lost`` weights that only went through row-major reshapes (view, reshape, flatten) and ops on their values
    # that keep the shape since the softmax: reshaped back to its output's shape they are the weights in its
    # layout (Megatron's and BLOOM's ``probs.view(b * np, sq, sk)`` then ``bmm``)
    flat: bool = False
    # weights changed since the softmax (their ``probs`` dropped): the record they are the weights of. Two
    # softmaxes of one layout share their ``rowq``, so it cannot say which one
    owner: _Probs | None = None
    # scores a softmax already made a record of, then only viewed, sliced or scaled (``qk.detach()[..., :n]``):
    # that softmax's weights. A softmax of them again elsewhere reads that map again (Whisper's alignment heads)
    softmaxed: _Probs | None = None

    def copy(self) -> _Tag:
        """A copy of this tag (copy.copy reduces a slotted dataclass through pickle's protocol: slower)."""
        return _Tag(*(getattr(self, f) for f in _TAG_FIELDS))

    def derived(self, origin: frozenset) -> _Tag:
        """The tag of a tensor an op made from this one (dataclasses.replace is slower, on every op)."""
        return _Tag(self.role, origin, self.split, self.scores, self.allowed, self.mask_source, self.cross,
                    self.heads, self.cache, self.ext, self.axes, None, None, self.smap, self.rowq,
                    self.attn_out, False, None, self.touched, self.lost, self.changed, self.made_by, False,
                    self.probs if self.probs is not None else self.owner, self.softmaxed)  # fmt: skip


_TAG_FIELDS = tuple(f.name for f in fields(_Tag))
_PARAM_TAG = _Tag(role="param")  # every parameter's (shared: tags are replaced, never changed in place)


@dataclass
class _Probs:
    """How a softmax output maps onto its record, to follow ``p * mask / (p * mask).sum(-1)``."""

    record: Record | None
    heads: tuple[int, int]
    transpose: bool  # a head-major (H, B) fold
    cross: bool | None
    ext: bool
    shape: tuple[int, ...] = ()  # the softmax output's
    allowed: torch.Tensor | None = None  # the 0/1 mask it was multiplied by (True = kept)
    layout: Layout | None = None  # from lineage: exact, whatever the fold
    qpos: torch.Tensor | None = None  # (B, q) each query's position code, where no layout says it (SDPA)
    joined: tuple[int, int] | None = None  # a head joined into the layer's record: (its place, head offset)

    def bhqk(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor shaped like the softmax output -> (B, H, q, k) as in the record."""
        if self.layout is not None:
            return self.layout.bhqk(t)
        q, k = t.shape[-2], t.shape[-1]
        t4 = t.reshape(*self.heads, q, k) if t.dim() == 3 else t.reshape(t.shape[0], -1, q, k)
        return t4.transpose(0, 1) if self.transpose else t4


def _mixes_one_axis(equation: Any, ops: list[torch.Tensor], i: int) -> bool:
    """An einsum of ``ops[i]`` and a square matrix that maps one of its axes to an axis of the same size at the
    same place and leaves every other axis where it was (``"bhij,hg->bgij"``)."""
    sides = _two_operands(
        lineage._explicit(equation, [o.dim() for o in ops]) if isinstance(equation, str) else None
    )
    if sides is None or len(ops) != 2:
        return False
    mine, other, out = sides[i], sides[1 - i], sides[2]
    moved = [a for a, b in zip(mine, out, strict=False) if a != b]
    return (
        len(mine) == len(out)
        and len(moved) == 1
        and ops[1 - i].dim() == 2
        and sorted(other) == sorted({moved[0], out[mine.index(moved[0])]})
        and int(ops[1 - i].shape[0]) == int(ops[1 - i].shape[1])
    )


def _two_operands(equation: Any) -> tuple[str, str, str] | None:
    """An explicit einsum of two operands ("ibnd,jbnd->ijbn") as (first, second, output) letters, or None
    (no "->", an ellipsis, another operand count)."""
    if not isinstance(equation, str):
        return None
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, out = eq.split("->")
    ops = lhs.split(",")
    return (ops[0], ops[1], out) if len(ops) == 2 else None


def _einsum_contracts_last(equation: Any) -> int | None:
    """For an einsum of an activation and a kernel ("abcd,cde->abe"): how many trailing dims of the
    activation it contracts with the kernel's leading dims, in order, the kernel keeping one output
    dim; None for any other form."""
    letters = _two_operands(equation)
    if letters is None or len(letters[1]) < 2:
        return None
    x, w, out = letters
    contracted = w[:-1]
    n = len(contracted)
    if len(set(x)) != len(x) or not x.endswith(contracted) or out != x[:-n] + w[-1] or w[-1] in x:
        return None
    return n


def _same_view(code: torch.Tensor, what: tuple, make: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``make(code)`` (a view of codes or of a kernel), the same object every time for ``code`` and ``what``:
    later ops' memo keys are the identities of their operands' codes."""
    key = ("view", id(code), what)
    hit = lineage.recall(key)
    return hit if hit is not lineage.MISS else lineage.remember(key, (code,), make(code))


def _flat_codes(code: torch.Tensor, n: int) -> torch.Tensor:
    """``code`` with its last ``n`` dims flattened into one."""
    return _same_view(code, ("flat", n), lambda c: c.reshape(*c.shape[:-n], -1))


def _permutation(name: str, args, kwargs, n: int) -> list[int] | None:
    """The dims order a transpose / swapaxes / mT / permute call makes, or None."""
    try:
        if name == "mT":
            a, b = n - 2, n - 1
        elif name == "permute":
            dims = args[1:] if len(args) > 2 or (len(args) == 2 and isinstance(args[1], int)) else args[1]
            perm = [int(d) % n for d in dims]
            return perm if sorted(perm) == list(range(n)) else None
        else:
            a = int(args[1] if len(args) > 1 else kwargs.get("dim0", kwargs.get("axis0")))
            b = int(args[2] if len(args) > 2 else kwargs.get("dim1", kwargs.get("axis1")))
        perm = list(range(n))
        perm[a % n], perm[b % n] = perm[b % n], perm[a % n]
        return perm
    except (TypeError, ValueError, IndexError):
        return None


def _permuted(code: torch.Tensor, perm: list[int]) -> torch.Tensor:
    """``code.permute(perm)``."""
    return _same_view(code, ("permute", tuple(perm)), lambda c: c.permute(perm))


def _einsum_product(equation: Any) -> tuple[list[int], list[int], list[int]] | None:
    """An einsum of weights and values that sums over the keys, e.g. "bhqk,bkhd->bqhd" or Transformer-XL's
    "ijbn,jbnd->ibnd": (the permutation of the weights to (lead, q, k), of the values to (lead, k, d),
    and of (lead, q, d) to the output's order), or None for any other einsum. The leading letters are
    those of all three operands, in the weights' order."""
    letters = _two_operands(equation)
    if letters is None or len(letters[0]) < 2:
        return None
    w, v, out = letters
    if len(set(w)) != len(w) or len(set(v)) != len(v) or len(set(out)) != len(out):
        return None
    qs = [c for c in w if c in out and c not in v]
    ks = [c for c in w if c in v and c not in out]
    ds = [c for c in v if c in out and c not in w]
    lead = "".join(c for c in w if c in v and c in out)
    if len(qs) != 1 or len(ks) != 1 or len(ds) != 1 or len(lead) + 2 != len(w):
        return None
    q, k, d = qs[0], ks[0], ds[0]
    plain_w, plain_v, plain_out = lead + q + k, lead + k + d, lead + q + d
    if sorted(v) != sorted(plain_v) or sorted(out) != sorted(plain_out):
        return None
    return [w.index(c) for c in plain_w], [v.index(c) for c in plain_v], [plain_out.index(c) for c in out]


MAX_TYPES = 4  # ids the model writes itself with at most this many values are token types (segments)


def _by_tensor(index: Any) -> bool:
    """Whether an index picks places by a tensor (``buf[..., perm]``, ``index_copy_``), not by slices alone."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype != torch.bool for i in parts)


def _channels_first(c: torch.Tensor) -> bool:
    """Whether codes (B, C, *space) are a feature map's: one position per cell along the channels (dim 1),
    the channels its features."""
    pos = c >> lineage.SHIFT
    if not bool((pos == pos[:, :1]).all()):
        return False
    feat = c & lineage.FEATURES  # (heads split off features, (B, H, n, d), hold features along the last dim)
    return bool((feat != feat[:, :1]).any()) and bool((feat == feat[..., :1]).all())


def _broadcast_values(
    equation: Any, w: torch.Tensor, v: torch.Tensor, vcode: torch.Tensor | None
) -> tuple | None:
    """An einsum of weights and values whose values lack axes of the weights that the output keeps (one key and
    value head for every query head: ``"bhij,bjd->bhid"``): (the equation with those axes put before the
    values' own, the values expanded over them, their codes expanded alike), or None. The last such axis of
    the weights is their queries'; the ones before it are broadcast."""
    letters = _two_operands(equation)
    if letters is None:
        return None
    ws, vs, outs = letters
    if len(set(ws)) != len(ws) or len(set(vs)) != len(vs) or w.dim() != len(ws) or v.dim() != len(vs):
        return None
    missing = [c for c in ws if c in outs and c not in vs]
    if len(missing) < 2:
        return None
    extra = missing[:-1]
    sizes = [int(w.shape[ws.index(c)]) for c in extra]
    shape = (*sizes, *v.shape)
    wide = v.reshape((1,) * len(extra) + tuple(v.shape)).expand(shape)
    code = None
    if vcode is not None and tuple(vcode.shape) == tuple(v.shape):
        code = vcode.reshape((1,) * len(extra) + tuple(v.shape)).expand(shape)
    return f"{ws},{''.join(extra)}{vs}->{outs}", wide, code


def _digest(t: torch.Tensor) -> bytes:
    """A short key of an integer tensor's values (positions), for memos keyed by what they hold."""
    return hashlib.blake2b(t.detach().cpu().contiguous().numpy().tobytes(), digest_size=16).digest()


def _beams(order: torch.Tensor, n_rows: int) -> bool:
    """Whether ``order`` (the caller's row each record row holds, some twice) is all ``n_rows`` rows of a
    batch each k times, side by side (``repeat_interleave``: beams) or tiled (``repeat``). One row many
    times (``img[[1, 1, 1]]``) is not: with one row alone, a batch of one is."""
    rows, counts = torch.unique(order, return_counts=True)
    k = int(counts[0])
    if k < 2 or int(rows.numel()) != n_rows or not bool((counts == k).all()):
        return False
    return torch.equal(order, rows.repeat_interleave(k)) or torch.equal(order, rows.repeat(k))


def _row_heads(layout: Layout, shape: tuple[int, ...]) -> torch.Tensor | None:
    """The head of each row of weights shaped ``shape`` (..., q, k), flat over (lead..., q), from the
    layout's rows (B, H, q'); None unless every row belongs to one (batch, head)."""
    key = ("row heads", id(layout), shape)
    hit = lineage.recall(key)
    if hit is not lineage.MISS:
        return hit
    n_rows = math.prod(int(n) for n in shape[:-1])
    rows = layout.rows
    heads = None
    if rows.numel() == n_rows:
        heads = torch.full((n_rows,), -1, dtype=torch.int64, device=rows.device)
        h = torch.arange(rows.shape[1], device=rows.device).view(1, -1, 1).expand(rows.shape)
        heads[rows.reshape(-1)] = h.reshape(-1)
        heads = None if bool((heads < 0).any()) else heads
    return lineage.remember(key, (layout,), heads)


def _sdpa_out_codes(qc: torch.Tensor, shape: tuple[int, ...], unsq: bool, hq: int, b: int):
    """(codes of SDPA's output, its feature numbers (H or 1, dv), (B, q) query positions or None), or
    None: rows are the queries' positions, features numbered head by head."""
    dv = shape[-1]
    qpos, _ = lineage.reduced(qc, -1)  # (..., lq): each query row's code
    feat = torch.arange((1 if unsq else hq) * dv, device=qc.device).view(-1, dv)  # (H or 1, dv)
    try:
        code = ((qpos >> lineage.SHIFT) << lineage.SHIFT).unsqueeze(-1) | feat.unsqueeze(-2)
        code = code.expand(shape) if tuple(code.shape) != shape else code
    except RuntimeError:
        return None
    qrows = None
    if not unsq and qpos.numel() == b * hq * shape[-2]:
        qrows = qpos.reshape(b, hq, -1)[:, 0] >> lineage.SHIFT
    return code, feat, qrows


def _rows_of(pc: torch.Tensor, qpos: torch.Tensor) -> torch.Tensor | None:
    """The flat row of ``pc`` (codes (..., D)) that holds each query position of ``qpos`` (B, q), or
    None when one is missing or a position sits on two rows."""
    rows = (pc.select(-1, 0) >> lineage.SHIFT).reshape(-1)
    if not rows.numel():
        return None
    order = torch.argsort(rows)
    ranked = rows[order]
    want = qpos.reshape(-1).to(rows.device)
    at = torch.searchsorted(ranked, want).clamp_max(ranked.numel() - 1)
    if not bool((ranked[at] == want).all()) or bool((ranked[1:] == ranked[:-1]).any()):
        return None
    return order[at]


def _query_positions(p: _Probs) -> torch.Tensor | None:
    """(B, q) the position code of each query of the record ``p``'s weights were recorded as."""
    if p.qpos is not None:
        return p.qpos
    lay = p.layout
    if lay is None:
        return None
    key = ("query positions", id(lay))
    hit = lineage.recall(key)
    if hit is lineage.MISS:
        hit = lineage.remember(key, (lay,), lay.qcode.to(lay.rows.device)[lay.rows[:, 0, :]] >> lineage.SHIFT)
    return hit


def _very_negative(v: Any, limit: float = NEG) -> bool:
    if isinstance(v, torch.Tensor):
        return v.numel() == 1 and float(v) <= limit
    return isinstance(v, (int, float)) and v <= limit


def _all_very_negative(v: Any, limit: float) -> bool:
    """A number, or a tensor of numbers, all at or below ``limit`` (Kyubyong's ``torch.where(key_masks == 0,
    paddings, outputs)``, ``paddings = torch.ones_like(outputs) * (-2 ** 32 + 1)``)."""
    if isinstance(v, torch.Tensor) and v.numel() > 1:
        return v.is_floating_point() and not v.requires_grad and bool((v <= limit).all())
    return _very_negative(v, limit)


_NOT_MOVED = (
    "what attention moves is left out of this record: between the weights times the values and the output "
    "projection, the heads' output went through an op that is no move (a gate, a second term added as Shaw's "
    "relative values, or an op capture does not follow as one, F.fold), so what moves from a key cannot be "
    "said to be its value vector alone"
)
_PER_ROW = "a 2-D softmax is a distribution per row, not per-head attention"
_PROJECTED = "a softmax over a projection's output (a vocabulary, class or router distribution), not over query-key scores"
FILL_NEG = SOFT_NEG  # a score replaced by this (or less) is hidden (Zipformer fills -1000, Swin-style -100)


def _added_hides(m: torch.Tensor) -> torch.Tensor:
    """Where a float tensor added to the scores hides a key: at or below NEG (-inf, -1e9, finfo.min), and
    where the rest of it holds 0s and one value at or below SOFT_NEG alone, there too (Swin's windows add
    0 / -100; with -inf for padding beside them, both)."""
    m = m.detach()
    if not m.numel() or not m.is_floating_point():
        return m <= NEG
    low = float(m.amin())
    if math.isnan(low):  # (a NaN in it: what is at or below NEG still hides)
        return m <= NEG
    if low > SOFT_NEG:  # a bias (T5's, a relative one): one pass, nothing hidden
        return torch.zeros(m.shape, dtype=torch.bool, device=m.device)
    if low > NEG:  # 0s and one value alone (Swin's 0 / -100)?
        return (m == low) if bool(((m == 0) | (m == low)).all()) else m <= NEG
    hidden = m <= NEG
    rest = m.masked_fill(hidden, 0)
    low = float(rest.amin())
    if NEG < low <= SOFT_NEG and bool(((rest == 0) | (rest == low)).all()):
        hidden = hidden | (rest == low)
    return hidden


def _version_of(t: torch.Tensor) -> int | None:
    """``t._version``; None for an inference tensor (torch.inference_mode keeps no version counter)."""
    return None if t.is_inference() else int(t._version)


def _expanded(t: torch.Tensor) -> bool:
    """A tensor the model ``expand``-ed (stride 0 along a dim of more than one): one value repeated there."""
    return any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape, strict=True))


def _is_param(t: Any) -> bool:
    """isinstance(t, nn.Parameter) without its metaclass hook for the common types (a plain tensor
    is never one: Parameter's own constructor gives every parameter its class or a subclass)."""
    cls = type(t)
    return cls is nn.Parameter or (cls is not torch.Tensor and isinstance(t, nn.Parameter))


HELD = 256  # tensors a registry keeps: a few are pending at a time, and older ones were never used


_PICKED_BY_DATA = (
    "the keys are some of a sequence's positions, picked by indices the model computed from its data (a "
    "router's choice, a score's top-k, a sort into buckets, a random sample: routed, pruned, merged, chunked or "
    "masked tokens), so the map's keys name no tokens a trace could label"
)
_QUERIES_PICKED_BY_DATA = (
    "the queries are some of a sequence's positions, picked by indices the model computed from its data (a "
    "score's top-k, tokens merged before cross-attention: tomesd, EViT), so the map's rows name no tokens a "
    "trace could label"
)
ROW_PICKS = frozenset({"__getitem__", "index_select", "roll", "flip", "narrow"})


def _picked_rows(name: str, args, kwargs, src: torch.Tensor) -> torch.Tensor | None:
    """The rows of ``src`` (along its first axis) an op over that axis alone returns, in their order, or None
    (an op over other axes too, or that picks no rows: a pick of positions, ``ids[:, 1:]``)."""
    n = int(src.shape[0])
    if name == "index_select":
        if len(args) < 3 or args[1] not in (0, -src.dim()):
            return None
        return args[2] if isinstance(args[2], torch.Tensor) and not args[2].is_floating_point() else None
    if name == "narrow":
        if len(args) < 4 or args[1] not in (0, -src.dim()) or not all(isinstance(a, int) for a in args[2:4]):
            return None
        start = args[2] % n if n else 0
        return torch.arange(start, start + args[3])
    if name == "roll":
        shifts = args[1] if len(args) > 1 else kwargs.get("shifts")
        dims = args[2] if len(args) > 2 else kwargs.get("dims")
        shifts = shifts[0] if isinstance(shifts, (tuple, list)) and len(shifts) == 1 else shifts
        dims = dims[0] if isinstance(dims, (tuple, list)) and len(dims) == 1 else dims
        if not isinstance(shifts, int) or dims not in (0, -src.dim()):
            return None
        return torch.arange(n).roll(shifts)
    if name == "flip":
        dims = args[1:] if len(args) > 1 else kwargs.get("dims")
        dims = (
            dims[0]
            if isinstance(dims, tuple) and len(dims) == 1 and isinstance(dims[0], (tuple, list))
            else dims
        )
        dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
        if tuple(d % src.dim() for d in dims if isinstance(d, int)) != (0,):
            return None
        return torch.arange(n).flip(0)
    idx = args[1] if len(args) > 1 else None  # __getitem__
    if isinstance(idx, tuple):
        if not idx or not all(isinstance(i, slice) and i == slice(None) for i in idx[1:]):
            return None
        idx = idx[0]
    if isinstance(idx, slice):
        return None if idx == slice(None) else torch.arange(n)[idx]
    if type(idx) is not torch.Tensor or idx.dim() != 1:
        return None
    if idx.dtype == torch.bool:
        return idx.nonzero().view(-1) if int(idx.shape[0]) == n else None
    return idx


def _hold(registry: dict[int, tuple], t: torch.Tensor, *rest: Any) -> None:
    """Keep ``t`` (weakly, by identity) in ``registry`` with ``rest``; a full registry starts over."""
    if len(registry) >= HELD:
        registry.clear()
    registry[id(t)] = (weakref.ref(t), *rest)


def _held(registry: dict[int, tuple], t: Any) -> tuple | None:
    """``t``'s entry in a registry of ``_hold`` (its weak reference first), or None: not held, or
    another tensor now has its id."""
    entry = registry.get(id(t))
    return entry if entry is not None and entry[0]() is t else None


def _held_or_base(registry: dict[int, tuple], t: torch.Tensor) -> tuple | None:
    """``t``'s entry in a registry of ``_hold``, or that of the tensor it is a view of (``w.unsqueeze(-1)``)."""
    entry = _held(registry, t)
    return entry if entry is not None or t._base is None else _held(registry, t._base)


class _Ref(weakref.ref):
    __slots__ = ("key",)
    key: int


def _dropper(tags: dict):
    """The weakref callback of a session's tags: drops a tensor's entry when it is freed."""

    def drop(ref: _Ref) -> None:
        if tags.get(ref.key, (None,))[0] is ref:
            del tags[ref.key]

    return drop


_NOKEY = object()  # an argument with no hashable key (lineage.remember is not used)
_CODE = object()  # marks a code operand's identity in a key (never one of the model's own values)


def _ints(args: tuple) -> bool:
    """Every argument after the first is an int."""
    for a in args[1:]:
        if type(a) is not int:
            return False
    return True


def _arg_key(a: Any) -> Any:
    """A hashable key of an op's non-tensor argument that tells apart every value (True from 1,
    1.0 from 1), or _NOKEY."""
    t = type(a)
    if t is int or t is str or a is None or a is Ellipsis:
        return a
    if t is float:
        return (t, a.hex())  # -0.0 apart from 0.0
    if t is bool or isinstance(a, (torch.dtype, torch.device, torch.memory_format)):
        return (t, a)
    if t is slice:
        parts = (_arg_key(a.start), _arg_key(a.stop), _arg_key(a.step))
        return _NOKEY if _NOKEY in parts else (slice, parts)
    if t is tuple or t is list or t is torch.Size:
        keys = tuple(_arg_key(x) for x in a)
        return _NOKEY if _NOKEY in keys else (t, keys)
    return _NOKEY


def _linear_arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """F.linear's arguments by position (input, weight, bias), whichever were given by name."""
    given = dict(zip(("input", "weight", "bias"), args, strict=False))
    rest = {k: v for k, v in kwargs.items() if k not in ("input", "weight", "bias")}
    for k in ("input", "weight", "bias"):
        if k in kwargs and k not in given:
            given[k] = kwargs[k]
    names = [k for k in ("input", "weight", "bias") if k in given]
    if names != ["input", "weight", "bias"][: len(names)]:
        return args, kwargs
    return tuple(given[k] for k in names), rest


def _tensordot_matmul(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, bool, bool] | None:
    """(a, b, a transposed, b transposed) where ``torch.tensordot(a, b, dims)`` is ``a @ b``: a's last dim
    contracted with the first of a matrix or vector b; or, of matrices, ``a.T`` or ``b.T`` for the other dim
    (``tensordot(q, k, dims=([1], [1]))`` is ``q @ k.T``: scores); else None."""
    a = args[0] if args else kwargs.get("a")
    b = args[1] if len(args) > 1 else kwargs.get("b")
    dims = args[2] if len(args) > 2 else kwargs.get("dims", 2)
    if (
        not isinstance(a, torch.Tensor)
        or not isinstance(b, torch.Tensor)
        or a.dim() < 1
        or b.dim() not in (1, 2)
    ):
        return None
    if isinstance(dims, torch.Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        return (a, b, False, False) if dims == 1 else None
    try:
        da, db = ([int(d)] if isinstance(d, int) else [int(i) for i in d] for d in dims)
    except (TypeError, ValueError):
        return None
    if len(da) != 1 or len(db) != 1:
        return None
    ta = a.dim() == 2 and da[0] % 2 == 0  # (a matrix's first dim contracted: a.T @ ...)
    tb = b.dim() == 2 and db[0] % 2 == 1  # (... @ b.T)
    if (da[0] % a.dim() == a.dim() - 1 or ta) and (db[0] % b.dim() == 0 or tb):
        return a, b, ta, tb
    return None


def _tensors(args, kwargs) -> list[torch.Tensor]:
    out = []
    for a in args:
        if type(a) is torch.Tensor or isinstance(a, torch.Tensor):
            out.append(a)
        elif type(a) is int or type(a) is float:  # (the common non-tensor arguments: dims, sizes, scales)
            continue
        elif isinstance(a, (list, tuple)):
            out.extend(t for t in a if isinstance(t, torch.Tensor))
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, torch.Tensor):
                out.append(a)
            elif isinstance(a, (list, tuple)):
                out.extend(t for t in a if isinstance(t, torch.Tensor))
    return out


def _torch_names(kwargs: dict) -> dict:
    """Keyword arguments with numpy's names (``axis=``, ``keepdims=``, which torch takes for ``dim=`` and
    ``keepdim=``: a softmax ported from numpy) under torch's, for the bookkeeping that reads them."""
    kwargs = dict(kwargs)
    if "axis" in kwargs and "dim" not in kwargs:
        kwargs["dim"] = kwargs.pop("axis")
    if "keepdims" in kwargs and "keepdim" not in kwargs:
        kwargs["keepdim"] = kwargs.pop("keepdims")
    return kwargs


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or p == name for p in patterns or ())


def _einsum_axes(equation: str, ndim: int) -> tuple[str, ...] | None:
    """ "ibnd,jbnd->ijbn" -> ("q", "k", "s", "s"): whether each output letter is the first operand's
    only (queries), the second's only (keys) or both (batch, heads)."""
    letters = _two_operands(equation)
    if letters is None or len(letters[2]) != ndim:
        return None
    a, b, rhs = letters
    return tuple("s" if c in a and c in b else "q" if c in a else "k" if c in b else "?" for c in rhs)


def _cat_dim(name: str, args, kwargs, out: torch.Tensor) -> int:
    """The (non-negative) dim a cat / hstack / vstack joined along."""
    if name in ("hstack", "vstack"):
        return 1 if name == "hstack" and out.dim() > 1 else 0
    d = args[1] if len(args) > 1 else kwargs.get("dim", kwargs.get("axis", 0))
    if not isinstance(d, int) or not out.dim():
        return out.dim() - 1
    return d % out.dim()


class _Session:
    """The state of one capture: tags by tensor identity, and the records."""

    def __init__(self, cap: Captured, model: nn.Module, kinds, include, exclude, lengths, modules=None,
                 scores: bool = True):  # fmt: skip
        self.cap = cap
        self.keep_scores = scores
        modules = list(model.named_modules()) if modules is None else modules
        self.names = {id(m): n for n, m in modules}
        self.fixed = {**_layer_kinds(model, modules), **(kinds or {})}
        self.given = dict(kinds or {})  # kinds= from the caller: they decide, whatever the mask
        self.model = model
        self.include, self.exclude = tuple(include or ()), tuple(exclude or ())
        self.batch: int | None = None
        self.n_embed = 0
        self.first_len: int | None = None  # length of the first token sequence (the encoder input)
        self.head_group: tuple[str, int] | None = None  # (parent, index) of the last per-head module recorded
        self._tags: dict[int, tuple[weakref.ref, _Tag, int]] = {}  # id -> (ref, tag, op count when tagged)
        self._drop = _dropper(self._tags)
        cap.lengths.update(int(n) for n in (lengths or ()))
        self.sources = lineage.Sources()
        self._src_key: tuple[int, tuple] = (-1, ())
        self._param_names: dict[int, str] | None = None  # read when a parameter is first followed
        self._fixed_codes: dict[int, tuple[Any, torch.Tensor]] = {}  # params and tensors from outside
        self.n_inputs = 0
        self._seen: set[tuple[str, str]] = set()  # (module, reason) of notes given
        self.n_ops = 0  # torch calls seen
        self.n_attention = 0  # softmax / SDPA / MultiheadAttention calls among them
        # log_softmax calls among them (log-probabilities: a loss's, a pointer network's output)
        self.n_log_softmax = 0
        # module path -> (the weights' _Probs, the values' codes (B, H, k, dv) on demand, a memo key for
        # them): a product's values wait for the projection that reads the heads merged back
        self._pending: dict[str, tuple[_Probs, Callable[[], torch.Tensor | None], tuple]] = {}
        # the module calls that may run each pending entry's output projection (_pend), and projections taken
        self._pending_at: dict[str, tuple[weakref.ref | None, weakref.ref | None, int | None]] = {}
        self._wo_taken: dict[int, tuple] = {}  # the heads merged back -> (their _Probs, the weight taken)
        # single-head maps' outputs joined along their features (a list of head modules, ``torch.cat([h(x) for h
        # in self.heads], -1)``): the join -> (a ref to it, each head's path and the columns its features hold)
        self._merged_heads: dict[int, tuple[weakref.ref, list[tuple[str, torch.Tensor, _Probs]]]] = {}
        # every pending entry by its weights (id of their _Probs): a loop over the heads inside one module pends
        # each head's under the same path, the next replacing it there
        self._pended: dict[int, tuple] = {}
        self._last_wo: _Probs | None = None  # the weights whose W_O the op being followed just applied
        self._rowq_owner: dict[int, tuple[torch.Tensor, _Probs]] = {}  # the record whose rows rowq holds
        self._consumed: dict[int, _Probs] = {}  # weights already multiplied by values (held: ids stay theirs)
        self._consumed_at: dict[int, str] = {}  # the module that multiplied them first
        # (place, queries, layout) of the calls over the current queries of one module in one frame, and of
        # those over the queries before them: a loop over the sequences of calls a sequence (its heads)
        self._same_q: list[tuple[int, torch.Tensor | None, Layout | None]] = []
        self._before_q: list[tuple[int, torch.Tensor | None, Layout | None]] = []
        # (weights, module) of a map reused there, recorded or told
        self._reuses: set[tuple[int, str]] = set()
        # memory of the model's that records hold (the weights a softmax wrote, its scores, a mask) and, of
        # it, what the values have multiplied since: a later write there (a buffer reused by the next
        # layer, maps edited for display) must not reach the record, which is what the model used
        self._aliased: set[int] = set()
        self._sealed: set[int] = set()
        self._pad_start: int | None = None
        # a softmax written by hand: id(tensor) -> (its weakref, what it is, the tensor it was made of,
        # the scores, the dim): the exp of scores, its sum over a dim, log_softmax of scores, the weights
        self._hand: dict[int, tuple] = {}  # _hold: (what, exp, scores, dim)
        # the exp (or log_softmax) of scores not yet followed into weights: id -> (module, shape)
        self._unfinished: dict[int, tuple[str, tuple[int, ...]]] = {}
        self._frame: FrameType | None = None  # the module call path() found last
        # the last record's module call (held, so a later call is never taken for it), path, query codes,
        # the record's place in cap.records and its layout
        self._record_call: tuple[FrameType | None, str, torch.Tensor | None, int, Layout | None] = (
            None, "", None, -1, None)  # fmt: skip
        # records that are pieces of one attention call (computed in slices or chunks), by their place in
        # cap.records (records are replaced there, never moved, while the forward runs), joined at finish
        self._runs: list[list[tuple[int, Record, Layout]]] = []
        # weights over positions not made by a product (additive attention), recorded where they multiply
        # values: id of the weights (or a view of them) -> (them, held; the record to make)
        self._positional: dict[int, tuple[torch.Tensor, Callable[..., None], Any, Any, bool]] = {}
        self._positional_shapes: dict[int, tuple[str, tuple[int, ...]]] = {}  # id(record) -> module, shape
        # id(record) -> (record, used, keep, changed, op count): weights over positions times a tensor of their
        # own shape, recorded so where that product is summed (it was the values); a gate otherwise
        self._factor_read: dict[int, tuple] = {}
        # id(record) -> (the sum, the _factor_read entry): such a product summed keeping its axis, pending
        self._factor_kept: dict[int, tuple] = {}
        self._in_pieces: set[int] = set()  # id(record) of such weights whose slices multiplied values
        self._packed_weights: set[int] = set()  # id(record) of such weights packed into a sequence
        # pack_padded_sequence's batch sizes -> (them, held; the positions of the padded input it packed)
        self._packed_slots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._exps: dict[int, tuple] = {}  # _hold: exps of activations (a scatter may sum them per group)
        # _hold: softmax outputs recorded exactly (and those plus a constant): (scores, their tag, path, dim,
        # the weights' _Probs); and their sums over one dim kept (the weights, the dim): renormalized weights
        self._softmaxed: dict[int, tuple] = {}
        self._topk_of: builtins.set[int] = set()  # id(_Probs) of weights some of which top-k picked
        self._mixed_why: dict[int, str] = {}  # id(_Probs) of weights whose heads a learned map mixed -> how
        self._flags_held: list[tuple[_Probs, str]] = []  # _flag_unless_used
        self._sums: dict[int, tuple] = {}
        self._projected: dict[int, tuple] = {}  # _hold: softmaxes over a projection's output (module, shape)
        # _hold: values sampled by F.grid_sample (deformable attention's)
        self._sampled: dict[int, tuple] = {}
        # values moved along their positions by a shift the data picked (a gather by data, a roll), while a left-out
        # softmax's weights may weigh them (Autoformer's time delays)
        self._shifted: dict[int, tuple] = {}
        # features joined with columns the model made (``cat([torch.ones(B, 1), x_num], 1)``): the made columns
        self._made_columns: dict[int, tuple] = {}
        # _hold: products of queries and keys broadcast against each other, ``q.unsqueeze(-2) * k.unsqueeze(-3)``
        # (..., n, m, d): (the queries' codes (..., n), the keys' (..., m), why not, or None), scores once summed
        # over their features
        self._outer_products: dict[int, tuple] = {}
        self._unplaced: dict[int, tuple] = {}  # _hold: other softmaxes left out as not attention (+ reason)
        self._unplaced_products: dict[int, tuple] = {}  # _hold: such weights times values (told, a context)
        # _hold: energies, one number a position made by a projection (``v(tanh(W h + U s))``), and what the
        # model makes of them without a softmax (a sigmoid, a cumprod: monotonic attention's alignment)
        self._energies: dict[int, tuple] = {}
        self._plus: dict[int, tuple] = {}  # _hold: an exp plus a guard -> the exp (whose sum divides it)
        self._loss_fed: set[int] = set()  # Record.seq of weights that went into a loss
        # Record.seq of a softmax again over another module's recorded scores -> that module's path
        self._rereads: dict[int, str] = {}
        # _hold: products of left-out weights and values broadcast over their features, a read once summed over
        # the positions: (entry, whether the values have codes, the axes the weights span)
        self._reads: dict[int, tuple] = {}
        self._positive: dict[int, tuple] = {}  # _hold: exp or sigmoid of activations (weights, it may be)
        self._sparse_weights: dict[int, tuple] = {}  # _hold: sparse matrices of such values (a graph's edges)
        self._made: dict[int, tuple] = {}  # _hold: float tensors made inside the call by a factory (buffers)
        self._merged: dict[int, tuple] = {}  # _hold: outputs of several maps' products added or subtracted
        self._combined: dict[int, tuple] = {}  # _hold: several maps' weights combined after their softmax
        self._stacked: dict[int, tuple] = {}  # _hold: single-head maps' weights joined along a heads axis
        self._stacked_mix: dict[int, tuple] = {}  # _hold: such weights reduced over the heads (a mix)
        # (id, version, grid, batch) of a tensor from outside -> (it, held weakly; the first of the
        # positions a conv over it made): every conv over it that keeps one grid reads those positions
        self._grids: dict[tuple, tuple[weakref.ref, int, torch.Tensor | None]] = {}
        # weights over positions the op being followed multiplies, and whether their rows are the positions
        # of the keys (a self-attention over positions: the product keeps them)
        self._pooled_by: tuple[torch.Tensor, bool] | None = None
        # means (or sums) over the positions of a tensor from outside, by id: (the mean, the tensor, the steps from
        # the tensor to the mean, whether one pooled), so the mean joined to that tensor's positions is a position
        # pooled from them (a mean token); arithmetic on that tensor before it is pooled is held too (not pooled)
        self._outside_pools: dict[int, tuple[weakref.ref, weakref.ref, tuple, bool]] = {}
        # module -> (op, shape, causal, keys) of a mask's keys scored again by arithmetic (``_unhidden``)
        self._unhid: dict[str, tuple[str, tuple[int, ...], bool, torch.Tensor]] = {}
        # a tensor from outside moved by a view, reshape or transpose before it enters, by id: (the result, the
        # tensor, the op, its other arguments), so a KV cache handed in (B, H, T, d) and folded into the batch
        # before it is joined to this call's keys is placed as the cache it is (``_folded_cache``)
        self._outside_moves: dict[
            int, tuple[weakref.ref, weakref.ref, tuple[tuple[Any, tuple, dict], ...]]
        ] = {}
        self._self_weights: set[int] = set()  # records (ids) of such self-attention weights, pending
        self._joined_head: tuple[Record, int, int] | None = None  # the last head _record joined to its layer
        # single-head maps whose outputs were joined along their features: (places, seqs, the layer's name)
        self._head_groups: list[tuple[list[int], list[int], str, int]] = []  # (+ heads per sequence)
        self._model_buffers: list[torch.Tensor] | None = None  # the model's buffers, listed once
        self._buffer_ids: set[int] | None = None  # the model's buffers (indices it keeps are no token ids)
        self._weight_buffers: dict[int, torch.Tensor] | None = None  # the model's 2-D float buffers
        self._pure_ints: dict[
            int, tuple
        ] = {}  # _hold: integer tensors made inside the call from nothing else
        self._kept_storages: set[int] | None = None  # memory of the model's buffers and tensor attributes
        self._constant_lookups: builtins.set[int] = set()  # sources of lookups of one id (token types)
        self._reordered_sources: builtins.set[int] = set()  # sources whose whole batch a model reordered
        # _hold: tensors made from integers the call made alone (a router's one-hot dispatch, ``F.one_hot(
        # argmax).to(x.dtype)``, and comparisons of them): 0/1 masks and counts, not activations from outside
        self._int_floats: dict[int, tuple] = {}
        self._made_ints: dict[int, tuple] = {}  # _hold: integer tensors made inside the call, and from them
        # _hold: tensors that depend on the data (random numbers, and integers or booleans computed from
        # activations: a router's argmax, a score's top-k, a sort), and the positions such indices picked,
        # part of a sequence: keys picked by the data, which even one sequence alone shows
        self._by_data: dict[int, tuple] = {}
        self._picked: set[int] = set()
        self._block_runs: set[int] = set()  # runs of pieces from separate calls of a module (blocks)
        self._head_runs: set[int] = set()  # runs of other heads from separate calls of a module
        # buffers filled a head at a time (``out[:, h] = attention of head h``): id -> (ref, {head: output})
        self._head_slots: dict[int, tuple] = {}
        self._rng: tuple | None = None  # the RNG state an SDPA call with dropout started from
        # record.seq -> the key positions of its sequences (B, K), from lineage: are they whole sequences?
        self._seq_keys: dict[int, list[torch.Tensor]] = {}
        self._queried: dict[str, list[tuple[str, torch.Tensor]]] = {}  # module -> (kind, its queries' codes)
        self._asked: dict[str, dict[int, str]] = {}  # module -> the positions its queries held (read once)
        self.outside = False  # set by path(): the op runs in a module that holds the model, outside it
        self.alien: str | None = None  # set by path(): the class of another model whose code runs this op
        self.n_alien = 0  # attention calls of other models in the block (not recorded, said)
        # weights masked after the softmax (``w.triu(1)``, ``w * m``) -> (the weights, the 0/1 mask kept)
        self._masked_of: dict[int, tuple] = {}
        self._path_at: tuple[int, str] = (-1, "")  # (op count, path) path() found last
        self._holders: dict[int, tuple[weakref.ref, bool]] = {}  # modules outside the model: hold it?
        self._run_frame: FrameType | None = None  # the outermost module call of the run recorded last
        self._sliced = False  # the module call recorded last made slices capture could not join
        self._slice_pending: Record | None = None  # a slice to flag once it is among the records
        # module path -> the TorchScript functions that ran in its calls (their ops, where the mode cannot see)
        self.scripted: dict[str, list[str]] = {}
        self._entered: builtins.set[int] = set()  # the model's parts called from outside it in this run
        # a mask (held) -> is it causal (None: a prefix LM's and an encoder's alike)
        self._causal_masks: dict[tuple, tuple[torch.Tensor, bool | None]] = {}
        self._meant_causal: builtins.set[str] = set()  # modules that added a causal mask of 0s and 1s
        # torch.nn encoder layers as torch ships them: they run as torch runs them (its fused fast path
        # where it takes it), the mode set aside, and their attention is recorded from their input
        self.thread = threading.get_ident()
        self.mode: TorchFunctionMode | None = None
        self.native = {
            id(m): m
            for _, m in modules
            if type(m) in _NATIVE_TYPES and (_native_layer(m) or _native_mha(m) or _native_encoder(m))
        }
        # the modules running now without the mode, and whether it was set aside for them (the layers of
        # an encoder set aside run without it already); the input of the encoder set aside
        self._set_aside: list[tuple[nn.Module, bool]] = []
        # (sequences handed in, times each was repeated) where ids were repeated in a row before the model ran
        self._repeated: tuple[int, int] | None = None
        # torch.nn's own attention outside the model captured: id -> (it, held weakly; whether it runs set aside)
        self._outside_native: dict[int, tuple[weakref.ref, bool]] = {}
        self._aside_only: set[int] = set()  # modules set aside now that are outside the model (not recorded)
        self._encoder_input: torch.Tensor | None = None
        self._rows_zeroed = False  # the last MultiheadAttention record weighed a row with no key 0
        # the TorchFunctionModes set below capture's (``torch.device("cuda")``, ``set_default_device``), set
        # aside while capture's own bookkeeping runs (its tensors are made where it says, not on the user's
        # default device) and put back around each op of the model, which runs under them as it would
        self.lower: list[list[TorchFunctionMode]] = []
        self._grid_sources: builtins.set[int] = set()  # sources a convolution made: an image's grid, a map's
        # integer tensors that are another's rows in another order (``ids[perm_idx]``, a batch sorted by
        # length): id -> (weakref, the tensor whose rows they are, the permutation)
        self._row_picks: dict[int, tuple] = {}  # _hold
        # the caller's batch put in another order inside the model (``docs[doc_sort_ind]``) and not put back yet:
        # (rows, order); and the orders pending when each record was made (record seq -> them)
        self._orders_pending: list[tuple[int, torch.Tensor]] = []
        self._orders_at: dict[int, tuple[tuple[int, torch.Tensor], ...]] = {}
        # 2-D token ids whose columns were put in another order (time-first ``src[:, idx]``, ``src.t()[idx].t()``:
        # a batch sorted by length), by id: (the caller's ids, where each element is among them, flat), _hold
        self._id_moves: dict[int, tuple] = {}
        # the source each row of one ids tensor embedded a row at a time is a row of (a loop over the
        # sentences, ``for s in ids: emb(s)``): (id of the ids, id of the table) -> (weakref, version, start,
        # origin)
        self._row_sources: dict[tuple[int, int], tuple] = {}
        # a tokens source's start -> the memory its ids were in, and their dims
        self._id_memory: dict[int, tuple[int, int]] = {}
        # the module call each map was made in, numbered (maps one after another in one call share it)
        self._call_of: dict[int, int] = {}  # Record.seq -> call number
        self._calls_made = 0
        # records made in the block outside the model's forward (no module of it running: the caller's code,
        # a plain function's attention): kept where their weights multiply values, else dropped at the end
        self._outside: builtins.set[int] = set()  # their seq
        self._weighed: builtins.set[int] = set()  # seq of records whose weights went into a product since
        self._by_name: dict[str, tuple[int, int]] = {}  # decoder-named paths made dec_self by their name
        # paths made enc_self where the mask could not tell (one token per sequence), and their (q, k)
        self._undecided: dict[str, tuple[int, int]] = {}
        # decoder-named paths made dec_self by their name where the mask could not tell (one token per sequence)
        self._named_one: dict[str, tuple[int, int]] = {}
        # paths made enc_self where a prefix LM's mask and an encoder's with padding rows that see themselves
        # read alike (a batch holding a one-token sequence), and their (q, k)
        self._prefix_or_encoder: dict[str, tuple[int, int]] = {}
        # paths made dec_self by a mask causal by blocks, which a streaming encoder's chunk mask is too, and (q, k)
        self._by_blocks: dict[str, tuple[int, int]] = {}
        # paths recorded as cross over two embedding calls of the same ids in one table, and their shape
        self._twice: dict[str, tuple[int, ...]] = {}
        # the model's call (``model(...)``) is not running: code before it or after it returned is the caller's
        # (and so is code that runs the model's parts alone, as Whisper's decoding calls ``model.decoder``)
        self.returned = True

    # -- tags ---------------------------------------------------------------------------------------
    def tag(self, t: Any) -> _Tag | None:
        if type(t) is not torch.Tensor:
            if _is_param(t):
                return _PARAM_TAG
            if not isinstance(t, torch.Tensor):
                return None
        entry = self._tags.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        if self._weight_buffers is None:  # a matrix the model keeps as a buffer (SAM's random Fourier
            self._weight_buffers = {  # features: ``coords @ self.positional_encoding_gaussian_matrix``)
                id(b): b for b in self._buffers() if b.dim() == 2 and b.is_floating_point()
            }  # is a weight, as a parameter is
        held = self._weight_buffers.get(id(t))
        return _PARAM_TAG if held is t else None

    def made_at(self, t: torch.Tensor) -> int:
        """The op count when ``t`` got its tag; -1 for a tensor no followed op made (an input from
        outside the call: every op that reads an activation through a parameter tags its output)."""
        entry = self._tags.get(id(t))
        return entry[2] if entry is not None and entry[0]() is t else -1

    def set(self, t: torch.Tensor, tag: _Tag) -> None:
        ref = _Ref(t, self._drop)
        ref.key = id(t)
        self._tags[ref.key] = (ref, tag, self.n_ops)

    # -- module path ----------------------------------------------------------------------------------
    def path(self) -> str:
        """Module path of the innermost model module whose code is running (from the call stack). Sets
        ``outside``: no module of the model is running, but a module that holds it is (the model is a
        submodule of the one called: ``capture_attention(model.encoder)`` around ``model(src, tgt)``,
        and this op is the decoder's), or another model is (``a(x); b(x)`` in a block that captures ``a``:
        ``alien`` names it)."""
        if self._path_at[0] == self.n_ops:  # asked again for the same op (its handler after call): as found
            return self._path_at[1]
        frame: FrameType | None = sys._getframe(2)
        foreign = False
        alien: nn.Module | None = None
        while frame is not None:
            code = frame.f_code
            entry = _HAS_SELF.get(id(code))
            has = entry[1] if entry is not None and entry[0] is code else None
            if has is None:  # capture's own frames, and frames with no local named self, are passed
                has = code.co_filename != _OWN_FILE and (  # without reading f_locals (a dict built
                    "self" in code.co_varnames or "self" in code.co_freevars or "self" in code.co_cellvars
                )  # per frame)
                if len(_HAS_SELF) >= 4096:
                    _HAS_SELF.clear()
                _HAS_SELF[id(code)] = (code, has)
            if has:
                obj = frame.f_locals.get("self")
                if obj is not None and id(obj) in self.names and isinstance(obj, nn.Module):
                    self._frame = _module_call(frame, obj)
                    self.outside = False
                    self._path_at = (self.n_ops, self.names[id(obj)])
                    return self._path_at[1]
                if isinstance(obj, nn.Module):
                    foreign = foreign or self._holds(obj)
                    if alien is None and _another_model(obj):
                        alien = obj
            frame = frame.f_back
        self._frame = None
        self.outside = foreign or alien is not None
        self.alien = None if foreign or alien is None else type(alien).__qualname__
        self._path_at = (self.n_ops, "")
        return ""

    def _holds(self, module: nn.Module) -> bool:
        """``module`` (not part of the model captured) holds the model among its submodules."""
        held = self._holders.get(id(module))
        if held is None or held[0]() is not module:
            held = (weakref.ref(module), any(m is self.model for m in module.modules()))
            self._holders[id(module)] = held
        return held[1]

    # -- the mode's entry point ------------------------------------------------------------------------
    def run_op(self, func, args, kwargs):
        """The model's own op, under the modes set below capture's (as it runs without capture)."""
        lower = self.lower[-1] if self.lower else None
        if not lower:
            return func(*args, **kwargs)
        with _modes_back(lower):
            return func(*args, **kwargs)

    def call(self, func, args, kwargs):
        if getattr(_LOCAL, "busy", 0):  # torch calls of another capture's bookkeeping: not the model's
            return self.run_op(func, args, kwargs)
        name = getattr(func, "__name__", "")
        if name == "__get__":  # a property: x.mT, x.T, x.H, x.data
            name = getattr(getattr(func, "__self__", None), "__name__", name)
        self.n_ops += 1
        if name in ATTENTION_CALLS:
            path = self.path()
            if self.outside:  # attention of a module outside the model captured (its parent's other parts)
                if self.alien is not None:  # (another model called in the block: said, as it is not recorded)
                    self.n_alien += 1
                    x = args[0] if args else next(iter(kwargs.values()), None)
                    self.skip(
                        self.alien, tuple(x.shape) if isinstance(x, torch.Tensor) else (), _ANOTHER_MODEL
                    )
                elif name == "multi_head_attention_forward":
                    self._off_fast_path(args)
                return self.run_op(func, args, kwargs)
            x = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(x, torch.Tensor) and _FUNCTORCH_WRAPPED(x):
                self.n_attention += 1
                self.warn(path, (), _IN_VMAP)
                return self.run_op(func, args, kwargs)
            if isinstance(x, torch.Tensor) and x.numel() == 0:  # an empty batch or sequence: no weights
                self.n_attention += 1
                self.skip(path, tuple(x.shape), "an attention call over an empty batch or sequence: it has no "
                          "weights to record")  # fmt: skip
                return self.run_op(func, args, kwargs)
        if name == "multi_head_attention_forward":
            self.n_attention += 1
            return self.on_mha(func, args, kwargs)
        if name == "log_softmax":
            self.n_log_softmax += 1
        if name in SOFTMAX or name in ("softmin", "gumbel_softmax", "scaled_dot_product_attention"):
            self.n_attention += 1
        elif name == "flex_attention":
            self.n_attention += 1
            q = args[0] if args else kwargs.get("query")
            self.warn(self.path(), tuple(q.shape) if isinstance(q, torch.Tensor) else (), "flex_attention "
                      "computes its weights inside its kernel (with its score_mod and block_mask): they are "
                      "not recorded")  # fmt: skip
        elif name == "_sparse_softmax":  # torch.sparse.softmax (per-edge scores of a graph)
            path = self.path()
            x = args[0] if args else None
            if not self.outside:  # (a module outside the model captured: not its attention)
                self.n_attention += 1
                self.warn(path, tuple(x.shape) if isinstance(x, torch.Tensor) else (), "a sparse softmax "
                          "(torch.sparse.softmax, attention over a graph's edges): capture records dense maps, so "
                          "these weights are not recorded")  # fmt: skip
        if name == "scaled_dot_product_attention":
            # dropout while training: the RNG state its draws start from
            drop = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
            q = args[0] if args else kwargs.get("query")
            self._rng = _rng_state(q.device) if drop and isinstance(q, torch.Tensor) else None
        if self._sealed and ("out" in kwargs or _writes_first(name)):
            self._unshare(name, args, kwargs)
        if (name == "numpy" or name == "__array__") and self._aliased and args:  # memory numpy may write
            at = _storage_at(args[0])  # without torch knowing (``self.w = attn.detach().cpu().numpy()``, then
            if at in self._aliased:  # edited in place): the records take copies first
                self._copy_records({at})
        if args and type(args[0]) is torch.Tensor and _writes_first(name):
            self._weights_written(args[0])
        pre = None
        if name in IN_PLACE and args and isinstance(args[0], torch.Tensor):
            t = self.tag(args[0])
            if t is not None and t.role == "scores" and (t.scores is None or name == "exp_"):
                pre = args[0].detach().clone()  # in place: keep the scores before the mask
        out = self.run_op(func, args, kwargs)
        if kwargs and ("axis" in kwargs or "keepdims" in kwargs):  # numpy's names, which torch takes too
            kwargs = _torch_names(kwargs)
        if type(out) is torch.Size or (
            type(out) is not torch.Tensor
            and name != "__setitem__"
            and not isinstance(out, (torch.Tensor, tuple, list))
        ):  # x.shape, x.size(), x.dim(), x.dtype: nothing to follow
            return out
        if (
            type(out) is torch.Tensor
            and not out.is_floating_point()
            and (name in INT_FACTORIES or (self._made_ints and self._from_made_ints(args, kwargs)))
        ):
            _hold(self._made_ints, out)
            ints = [t for t in _tensors(args, kwargs) if not t.is_floating_point()]
            if ints and all(_held(self._pure_ints, t) for t in ints):
                _hold(self._pure_ints, out)  # (views of ``arange(P)`` made by the model: no input's data)
            elif name == "arange" and not ints:  # (indices of a table; a start token is made by ``full``)
                self.path()  # (made by the model's own code: not the caller's inputs made in the block)
                if self._frame is not None:
                    _hold(self._pure_ints, out)
        if self._orders_pending and name in ROW_PICKS and type(out) is torch.Tensor and args:
            self._order_put_back(name, args, kwargs, args[0])
        if name in ROW_PICKS and type(out) is torch.Tensor and (not kwargs or name in ("roll", "flip")):
            if out.dim() >= 2 and (not out.is_floating_point() or out.dim() >= 3):
                self._row_pick(name, args, kwargs, out)
        if (
            name == "repeat_interleave"
            and self._repeated is None
            and type(out) is torch.Tensor
            and out.dim() == 2
            and not out.is_floating_point()
        ):
            self._ids_repeated(args, kwargs, out)
        if name in ID_MOVES and type(out) is torch.Tensor and out.dim() == 2 and not out.is_floating_point():
            self._ids_moved(name, func, args, kwargs, out)
        if name in RANDOM or self._by_data or (type(out) is not torch.Tensor or not out.is_floating_point()):
            self._data_step(name, args, kwargs, out)
        if name in FACTORIES and isinstance(out, torch.Tensor):
            if out.is_floating_point() and out.dim() >= 3:  # a buffer (a static KV cache), not a mask
                _hold(self._made, out)
            _hold(self._int_floats, out)  # (made from no data: ``torch.zeros(b, n).long()`` token types)
            return out
        if name in LIKE_FACTORIES and args:  # ``ones_like(scores[0])`` (a mask's start) is no scores, and
            g = self.tag(args[0])  # ``zeros_like(weights)`` no weights; ``zeros_like(query_pos)`` (DETR's
            if g is not None and (g.role == "scores" or g.probs is not None):  # first content) keeps the
                return out  # positions of what it copies the shape of
        if not isinstance(out, (torch.Tensor, tuple, list)) and name != "__setitem__":
            return out  # x.dtype, x.dim(), x.size(): nothing to follow
        if kwargs and name == "linear":  # F.linear(input=x, weight=w, bias=b): followed as given by position
            args, kwargs = _linear_arguments(args, kwargs)
        elif kwargs and (name in CAT or name == "stack") and not args and "tensors" in kwargs:
            kwargs = dict(kwargs)  # torch.cat(tensors=[...], dim=1): followed as given by position
            args = (kwargs.pop("tensors"),)
        elif kwargs and not args and "input" in kwargs:
            # torch.index_select(input=k, dim=0, index=i): followed as given by position
            kwargs = dict(kwargs)
            args = (kwargs.pop("input"),)
        elif name in CAT and args and isinstance(args[0], (list, tuple)) and len(args[0]) > 1:
            parts = [t for t in args[0] if not (isinstance(t, torch.Tensor) and not t.numel())]
            if parts and len(parts) < len(args[0]):  # empty parts add nothing (an empty memory at the
                args = (parts, *args[1:])  # first segment of a stream: ``cat([mems, right_context, ...])``)
        elif name == "baddbmm_" and len(args) >= 3 and self._two_activations(args[1], args[2]):
            # scores written in place into a buffer (Megatron's ``buf.baddbmm_(q, k.T, beta=0)``)
            name = "baddbmm"
        elif name == "addmm" and len(args) >= 3 and self._two_activations(args[1], args[2]):
            # ``addmm(bias, q, k.T, alpha=scale)``: scores plus a bias, as baddbmm makes them
            name = "baddbmm"
        elif (
            name == "softmin" and args and isinstance(args[0], torch.Tensor) and self.tag(args[0]) is not None
        ):
            # softmin(x) is softmax(-x): followed as the softmax of the negated input (``F.softmin(cdist(q, k))``,
            # weights over distances), whose scores are those negated
            try:
                neg = torch.neg(args[0])
                self.propagate("neg", torch.neg, (args[0],), {}, neg, None)
                name, args = "softmax", (neg, *args[1:])
            except Exception:  # (bookkeeping never breaks the forward: followed as the op it is)
                pass
        elif name == "gumbel_softmax" and args and isinstance(args[0], torch.Tensor):
            # a sample over the keys (one-hot with hard=True, the straight-through estimator): the weights the
            # values are multiplied with, recorded as a softmax's are, its logits the scores
            dim = kwargs.get("dim", args[4] if len(args) > 4 else -1)
            name, args, kwargs = "softmax", (args[0], dim), {}
        elif (
            name == "cdist"
            and len(args) >= 2
            and all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in args[:2])
            and any(self.tag(t) is not None for t in args[:2])
        ):
            # distances between the rows of two tensors (``torch.cdist(q, k)``): each element one row of each,
            # followed as the pairs ``q @ k.T`` makes (scores of queries and keys, once negated)
            try:
                name, args, kwargs = "matmul", (args[0], self._transposed(args[1], -2, -1)), {}
            except Exception:  # (bookkeeping never breaks the forward: followed as the op it is)
                pass
        elif name == "tensordot":
            as_matmul = _tensordot_matmul(args, kwargs)
            # x @ W written as tensordot(x, W, dims=1) (DeepCTR's projections); q @ k.T as
            # tensordot(q, k, dims=([1], [1])) (a NumPy port's scores), followed as the transpose it stands for
            if as_matmul is not None:
                a, b, ta, tb = as_matmul
                turned = tuple(self._transposed(t, 0, 1) if turn else t for t, turn in ((a, ta), (b, tb)))
                name, args, kwargs = "matmul", turned, {}
        try:
            _LOCAL.busy = getattr(_LOCAL, "busy", 0) + 1
            if name in CAT and args and type(out) is torch.Tensor and out.dim() >= 3:
                self._cache_joined(
                    name, args, kwargs, out
                )  # (a cache from outside joined to this call's keys)
            if name == "scaled_dot_product_attention":
                self.on_sdpa(args, kwargs, out)
            elif name == "embedding":
                self.on_embedding(args, out)
            elif name in ("__getitem__", "index_select") and self._indexed_embedding(name, args, kwargs, out):
                self.on_embedding((args[1] if name == "__getitem__" else args[2], args[0]), out)
            elif name in SOFTMAX:
                self.on_softmax(args, kwargs, out)
            elif name == "__setitem__":
                self.on_setitem(args, pre)
            elif name == "copy_" and len(args) >= 2 and isinstance(args[0], torch.Tensor):
                if not self._weights_copied(args[0], args[1]) and not self._whole_copied(args[0], args[1]):
                    self._view_copied(args[0], args[1])
            elif name == "index_copy_" and len(args) >= 4 and isinstance(args[2], torch.Tensor):
                self._index_copied(args)
            elif (
                name == "index_put_"
                and len(args) >= 3
                and isinstance(args[1], (tuple, list))
                and not (args[3] if len(args) > 3 else kwargs.get("accumulate", False))
            ):  # ``out.index_put_((batch, pos), h)``: followed as ``out[batch, pos] = h`` (PyG's to_dense_batch)
                self.on_setitem((args[0], tuple(args[1]), args[2]), pre)
            elif (
                name == "scatter_" and args and "reduce" not in kwargs and self._scatter_written(args, kwargs)
            ):
                pass  # a KV cache written by slot, followed as an index assignment
            else:
                weighted = bool(self._projected) and name in MATMUL and self._projected_used(args, kwargs)
                if self._projected and name in MUL:  # (values weighted by a product and a sum: DIIN's)
                    self._projected_used(args, kwargs, broadcast=True)
                # (a read as ``(w[..., None] * m).sum`` too)
                if self._unplaced and (name in MATMUL or name in MUL):
                    self._unplaced_used(args, kwargs, name in MUL, out if type(out) is torch.Tensor else None)
                if self._reads and name in ("sum", "mean", "nansum"):
                    self._read_summed(name, args, kwargs)
                if self._hand and name in MATMUL:
                    self._hand_weights(args, kwargs)  # a softmax by hand: recorded where its weights are used
                elif self._hand and name in MUL:
                    self._hand_weights_read(args, kwargs)
                if self._positional:
                    self._positional_step(name, args, kwargs, out)
                if (name in SCATTER_SUM or name == "segment_reduce") and self._exps:
                    self._scatter_softmax(name, args, kwargs)
                if name in RESCALE and len(args) >= 2:
                    self._rescaled(args)
                if (name in ADD or name in SUB) and len(args) >= 2 and isinstance(out, torch.Tensor):
                    self._outputs_merged(args, out)
                if (
                    (self._unplaced or self._projected)
                    and (name in MUL or name in DIV or name in FILL or name in DROPOUT)
                    and type(out) is torch.Tensor
                    and args
                    and isinstance(args[0], torch.Tensor)
                    and out.shape == args[0].shape
                ):  # weights left out, masked and renormalized (AllenNLP's ``masked_softmax``): still theirs,
                    self._carry_left_out(args[0], out)  # told again if they multiply values
                product = (
                    self._weights_times_values(args, out)
                    if name in MUL and len(args) == 2 and type(out) is torch.Tensor
                    else None
                )
                if (self._stacked or self._stacked_mix) and name in MATMUL:
                    self._stacked_used(args, kwargs)
                elif self._stacked and name in REDUCTIONS:
                    self._stacked_reduced(args, kwargs, out)
                elif self._stacked and (name in MUL or name in DIV):
                    self._stacked_scaled(args, out)
                if (self._outside or self.cap.records) and (name in MATMUL or name in MUL):
                    self.weighed(name, args, out)  # (weights recorded outside the model, or fed to a loss)
                if name in LOSSES and self.cap.records:
                    self._fed_to_loss(args, kwargs)
                self.propagate(name, func, args, kwargs, out, pre)
                if product is not None:
                    self._product_made(out, *product)
                if name in MUL and len(args) == 2 and type(out) is torch.Tensor and out.dim() >= 3:
                    self._outer_product(args, out)
                elif self._outer_products and name == "sum" and type(out) is torch.Tensor and args:
                    self._outer_summed(args, kwargs, out)
                if (
                    name == "masked_fill_"
                    and len(args) >= 3
                    and isinstance(args[0], torch.Tensor)
                    and args[0]._base is not None
                ):
                    self._filled_through_view(args, pre)
                if self._softmaxed and name in RENORM_STEPS and type(out) is torch.Tensor:
                    self._renormalized(name, args, kwargs, out)
                if name in GATHERS and self._by_data and isinstance(out, torch.Tensor):
                    self._gathered_by_data(name, args, kwargs, out)
                if weighted and isinstance(out, torch.Tensor):  # values weighted by no query-key map: no
                    self._tags.pop(id(out), None)  # scores either (what a later op reads, it reads as input)
                if (name in CAT or name == "stack") and isinstance(out, torch.Tensor) and self.cap.records:
                    self._heads_concatenated(name, args, kwargs, out)
                if (name == "exp" or name == "exp_") and isinstance(out, torch.Tensor) and args:
                    g = self.tag(args[0])
                    if g is not None and g.role != "param":
                        _hold(self._exps, out)
                elif (
                    self._exps
                    and type(out) is torch.Tensor
                    and (name in MUL or name in DIV or name in CAT or name in lineage.REPLAY)
                ):
                    self._exps_carried(name, args, out)
                if isinstance(out, torch.Tensor) and (name in HAND_STEPS or self._hand):
                    self._hand_step(name, args, kwargs, out, pre)
                if self._last_wo is not None:  # the output projection of heads merged back: its output
                    wo, self._last_wo = self._last_wo, None  # is followed to the residual it is added to
                    tag = self.tag(out) if isinstance(out, torch.Tensor) else None
                    if tag is not None and tag is not _PARAM_TAG:
                        tag.wo = wo
            if (
                self._unplaced
                and (name not in MATMUL or name == "einsum")
                and name not in LINEAR | REDUCTIONS
            ):
                self._left_out_carried(name, args, kwargs, out)
            if self._projected and name in lineage.REPLAY and name not in REORDERS:
                # (weights of a softmax over a projection, moved: still those weights)
                self._left_out_carried(name, args, kwargs, out, self._projected)
            if name == "grid_sample" and type(out) is torch.Tensor:
                _hold(self._sampled, out)
            elif (
                name in CAT
                and type(out) is torch.Tensor
                and out.is_floating_point()
                and args
                and isinstance(args[0], (list, tuple))
                and self._int_floats
            ):
                self._columns_made(args, kwargs, out)
            elif (
                name == "roll" and self._unplaced and type(out) is torch.Tensor and self._moves_positions(out)
            ):
                _hold(self._shifted, out)  # (``torch.roll(values, -int(delay[i]), -1)``)
            if (
                name in ("exp", "sigmoid")
                and type(out) is torch.Tensor
                and args
                and isinstance(args[0], torch.Tensor)
            ):
                g = self.tag(args[0])
                if g is not None and g.role != "param" and out.is_floating_point():
                    _hold(self._positive, out)  # (weights an edge, once put into a sparse matrix)
            elif name in SPARSE_MAKERS and type(out) is torch.Tensor and self._positive:
                values = args[1] if len(args) > 1 else kwargs.get("values")
                if isinstance(values, torch.Tensor) and _held(self._positive, values) is not None:
                    _hold(self._sparse_weights, out)
            elif self._sparse_weights and (name in MATMUL or name == "_sparse_mm"):
                self._sparse_weights_used(args, kwargs)
            if name in LINEAR and type(out) is torch.Tensor and out.dim() >= 2 and int(out.shape[-1]) == 1:
                self._energies_made(args, out)
            elif self._energies and name in MATMUL and isinstance(out, torch.Tensor):
                self._energies_used(args, kwargs, out)
            elif self._energies and name not in LINEAR and name not in REDUCTIONS and name not in SOFTMAX:
                self._left_out_carried(name, args, kwargs, out, self._energies)
        except Exception as exc:  # bookkeeping must never break the user's forward pass
            try:
                where = self.path() or "(model)"
            except Exception:
                where = "(model)"
            note = (
                f"{where}: capture could not follow its {name} ({type(exc).__name__}: {exc}); attention computed "
                "from what it returned is not recorded"
            )
            # inside torch.vmap: said once, at its attention (_IN_VMAP); an empty tensor: at its attention
            if any(_FUNCTORCH_WRAPPED(t) or not t.numel() for t in _tensors(args, kwargs)):
                note = ""
            if note and note not in self.cap.notes:
                self.cap.notes.append(note)
        finally:
            _LOCAL.busy -= 1
        return out

    def _filled_through_view(self, args, pre: torch.Tensor | None) -> None:
        """``att[:, 0].masked_fill_(m, -inf)``: scores masked in place through a view of them (one head's, a slice
        of the rows) are masked in the tensor the view is of, there alone; the softmax over that tensor keeps the
        mask (the heads masked differently where one head's is)."""
        view, mask, value = args[0], args[1], args[2]
        base = view._base
        g = self.tag(base)
        if (
            g is None
            or g.role != "scores"
            or not isinstance(mask, torch.Tensor)
            or not _very_negative(value, FILL_NEG)
            or not base.is_contiguous()
            or view.device != base.device
        ):
            return
        where = (view.size(), view.stride(), view.storage_offset() - base.storage_offset())
        allowed = torch.ones(base.shape, dtype=torch.bool, device=base.device)
        allowed.as_strided(*where).copy_(~mask.bool().expand(view.shape))
        if g.allowed is not None:
            allowed = allowed & g.allowed
        scores = g.scores
        if scores is None:  # the scores before the fill: the tensor now, with the view's part as it was
            scores = base.detach().clone()
            if pre is not None and tuple(pre.shape) == tuple(view.shape):
                scores.as_strided(*where).copy_(pre)
        self.set(base, replace(g, allowed=allowed, scores=scores, mask_source=g.mask_source or "masked_fill"))

    def _exps_carried(self, name: str, args, out: torch.Tensor) -> None:
        """Exps scaled by a number, or joined (SAN's real and fake edges: ``cat([s_real / (L + 1), L * s_fake /
        (L + 1)])``), are still exps a scatter may sum per group (told if it does, as for the exps themselves)."""
        if name in CAT:
            parts = args[0] if args and isinstance(args[0], (list, tuple)) else ()
            if parts and all(isinstance(t, torch.Tensor) and _held(self._exps, t) is not None for t in parts):
                _hold(self._exps, out)
            return
        if name in lineage.REPLAY:  # a slice or a view of them
            if args and _held(self._exps, args[0]) is not None:
                _hold(self._exps, out)
            return
        if len(args) != 2:
            return
        a, b = args
        if _held(self._exps, a) is not None and type(b) in (int, float):
            _hold(self._exps, out)
        elif name in MUL and _held(self._exps, b) is not None and type(a) in (int, float):
            _hold(self._exps, out)

    def _indexed_embedding(self, name, args, kwargs, out) -> bool:
        """``wte[idx]`` / ``torch.index_select(wte, 0, idx)``: rows of a learned table picked by a tensor of
        token ids (picoGPT and its ports, ``self.emb.weight[idx]``) is an embedding lookup, as
        ``F.embedding(idx, wte)``: each id a token position of its own. (The rows themselves would name
        a repeated token's two positions as one.) Indices the model keeps as a buffer (Swin's relative
        position index into its bias table) are not token ids."""
        if kwargs or not isinstance(out, torch.Tensor) or len(args) < 2 or not _is_param(args[0]):
            return False
        table = args[0]
        if name == "__getitem__":
            idx = args[1]
        elif len(args) == 3 and type(args[1]) is int and args[1] in (0, -table.dim()):
            idx = args[2]
        else:
            return False
        if (
            type(idx) is not torch.Tensor
            or idx.dim() < 1
            or idx.is_floating_point()
            or idx.dtype == torch.bool
            or idx.is_complex()
            or table.dim() != 2
            or tuple(out.shape) != (*idx.shape, table.shape[1])
        ):
            return False
        if self._buffer_ids is None:
            self._buffer_ids = {id(b) for b in self._buffers()}
        if id(idx) in self._buffer_ids or id(idx._base) in self._buffer_ids:
            return False
        # indices made inside the call (``self.mem[torch.arange(M)]``): learned rows picked by position
        return _held(self._made_ints, idx) is None

    def _made_inside(self, t: torch.Tensor) -> bool:
        """Integers or booleans the call made (``arange``, ``one_hot`` of a router's ``argmax``, a comparison
        of activations), or floats made from them alone; not the caller's integers (token ids, an image as
        uint8), which are data from outside."""
        if _held(self._int_floats, t) is not None:
            return True
        return not t.is_floating_point() and (
            _held(self._by_data, t) is not None or _held(self._made_ints, t) is not None
        )

    def _data_step(self, name: str, args, kwargs, out) -> None:
        """Follow what depends on the data: random numbers (and floats computed from them); integers and
        booleans computed from activations (a router's ``argmax``, a comparison), by an order of any floats
        (``topk``, ``argsort``, ``sort``: of scores, of noise handed in), or from such integers. Integers
        from the call's inputs (token ids, padding masks) and from ``arange`` do not."""
        try:
            outs = [out] if isinstance(out, torch.Tensor) else [
                o for o in (out if isinstance(out, (tuple, list)) else ()) if isinstance(o, torch.Tensor)]  # fmt: skip
            if not outs:
                return
            if name in RANDOM:
                for o in outs:
                    _hold(self._by_data, o)
                return
            ins = _tensors(args, kwargs)
            held = [t for t in ins if _held(self._by_data, t) is not None] if self._by_data else []
            noise = any(t.is_floating_point() for t in held)  # random numbers, or floats made from them
            ints = [o for o in outs if not o.is_floating_point()]
            if ints and not held:
                if name in ORDERING:
                    held = [t for t in ins if t.is_floating_point() and not _is_param(t)]
                else:  # (a softmax over a projection, a router's, leaves no tag: it is held)
                    held = [t for t in ins if t.is_floating_point() and (
                        ((g := self.tag(t)) is not None and g.role != "param") or _held(self._projected, t))]  # fmt: skip
            if not held:
                return
            for o in ints:
                _hold(self._by_data, o)
            if noise:  # noise computed on (``noise * 2``): still noise (the max of scores is no noise)
                for o in outs:
                    if o.is_floating_point():
                        _hold(self._by_data, o)
        except Exception:  # (bookkeeping never breaks the forward; the flag it feeds is only ever added)
            return

    def _gathered_by_data(self, name: str, args, kwargs, out: torch.Tensor) -> None:
        """A gather whose indices depend on the data: the positions it picked, where they are part of what it
        gathered from in their row (the tokens a router sends to an expert, those a score keeps), are keys
        picked by the data."""
        if name in ("index_select", "gather"):  # (input, dim, index)
            index = args[2] if len(args) > 2 else kwargs.get("index")
        else:  # x[index], take_along_dim(input, indices), masked_select(input, mask)
            index = args[1] if len(args) > 1 else kwargs.get("indices", kwargs.get("mask"))
        parts = index if isinstance(index, (tuple, list)) else (index,)
        if not any(isinstance(t, torch.Tensor) and _held(self._by_data, t) is not None for t in parts):
            return
        c = self.code_of(out)
        xc = self.code_of(args[0] if args else None)
        if c is None or xc is None or not c.numel():
            return
        pos = torch.unique(c >> lineage.SHIFT)
        pos = pos[~self.sources.learned(pos)]
        if not pos.numel():
            return
        had = torch.unique(xc >> lineage.SHIFT)  # what the gathered tensor held: rows of a batch reordered
        first, _ = self.sources.span(pos)  # whole (a beam search) pick no positions, some of a row's do
        had_first, _ = self.sources.span(had)
        rows, at = torch.unique(first, return_inverse=True)
        counts = torch.bincount(at, minlength=rows.numel())
        part = counts < (had_first[None, :] == rows[:, None]).sum(1)
        if bool(part.any()):
            self._picked.update(pos[part[at]].tolist())
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if name in ("index_select", "gather", "take_along_dim") and isinstance(dim, int) and c.dim():
            self._lines_by_data(c, dim)
        if self._unplaced and out.is_floating_point() and self._moves_positions(out):
            _hold(self._shifted, out)

    def _columns_made(self, args, kwargs, out: torch.Tensor) -> None:
        """A join along the last axis of features and columns the model made from no data (rtdl's
        ``cat([torch.ones(B, 1), x_num], dim=1)``): the made columns held with the output (``_features_tokenized``
        reads them)."""
        parts = args[0]
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if not isinstance(dim, int) or dim % out.dim() != out.dim() - 1:
            return
        made, at = [], 0
        for t in parts:
            if not isinstance(t, torch.Tensor) or t.dim() != out.dim():
                return
            n = int(t.shape[-1])
            if self._constant_made(t):
                made.append((at, at + n))
            at += n
        if made and len(made) < len(parts):
            _hold(self._made_columns, out, made)

    def _moves_positions(self, out: torch.Tensor) -> bool:
        """``out`` (a roll's or a gather's output) is values over several positions (its codes name more than one
        that no learned vector holds)."""
        c = self.code_of(out) if self.tag(out) is not None else None
        if c is None or tuple(c.shape) != tuple(out.shape) or not c.numel():
            return False
        pos = c >> lineage.SHIFT
        return bool((pos != pos.reshape(-1)[:1]).any())

    def _lines_by_data(self, c: torch.Tensor, dim: int) -> None:
        """Along the axis a gather by the data picked from: a line that holds part of its row (each of several
        clusters its own top-w tokens, which together may hold the whole row: routing attention), or its row's
        positions in another order (tokens sorted into buckets, then cut into chunks: LSH attention). The
        positions are picked by the data, so the chunks or clusters a record holds name no sequence."""
        lines = (c >> lineage.SHIFT).movedim(dim, -1).reshape(-1, int(c.shape[dim]))
        if lines.shape[-1] < 2:
            return
        learned = self.sources.learned(lines)
        first, size = self.sources.span(lines.clamp_min(0))
        one_row = ~learned.any(-1) & (first == first[:, :1]).all(-1)  # lines within one row of a sequence
        if not bool(one_row.any()):
            return
        lines, size = lines[one_row], size[one_row][:, 0]
        ordered = lines.sort(-1).values
        distinct = 1 + (ordered[:, 1:] != ordered[:, :-1]).sum(-1)
        back = (lines[:, 1:] < lines[:, :-1]).any(-1)  # (a position before the one met before it)
        # (one position repeated along the whole line: copies of one token, beams started from one start token,
        # no pick of some of its row)
        hit = ((distinct < size) & (distinct > 1)) | back
        if bool(hit.any()):
            self._picked.update(torch.unique(lines[hit]).tolist())

    def _from_made_ints(self, args, kwargs) -> bool:
        """Whether an op read an integer tensor made inside the call (``torch.arange(T)[None]``)."""
        return any(_held(self._made_ints, t) is not None for t in _tensors(args, kwargs))

    def _scatter_softmax(self, name, args, kwargs) -> None:
        """An exp of activations summed into groups by a scatter (``denom.index_add_(0, dst, e)``,
        ``scatter_add``): a softmax over each node's edges (graph attention as PyG computes it), whose
        weights per edge are no (query, key) map capture records: a warning, never silence."""
        # torch._segment_reduce(data, "sum", offsets=ptr): PyG's softmax(src, ptr)
        if name == "segment_reduce":
            src = args[0] if args else kwargs.get("data")
            how = args[1] if len(args) > 1 else kwargs.get("reduce")
            said = ("a softmax over segments summed by torch._segment_reduce (attention over each graph's nodes or "
                    "edges, as PyG's softmax(src, ptr) computes it for a sorted batch): its weights per node are not a "
                    "(query, key) map and are not recorded")  # fmt: skip
        else:
            src = args[3] if len(args) > 3 else kwargs.get("source", kwargs.get("src"))
            how = (
                (args[4] if len(args) > 4 else kwargs.get("reduce"))
                if name.startswith("scatter_reduce")
                else "sum"
            )
            said = ("a softmax over groups summed by a scatter (attention over each node's edges, as PyG's "
                    "softmax(src, index) computes it): its weights per edge are not a (query, key) map and are not "
                    "recorded")  # fmt: skip
        if not isinstance(src, torch.Tensor) or how != "sum" or _held(self._exps, src) is None:
            return
        self.n_attention += 1
        self.warn(self.path(), tuple(int(n) for n in src.shape), said)

    # -- a softmax written by hand ------------------------------------------------------------------------
    def _hand_of(self, t: Any, what: str) -> tuple[torch.Tensor, int | None, torch.Tensor] | None:
        """(the scores, the dim, the exp) where ``t`` is the ``what`` ("exp" | "sum" | "log") of scores."""
        if not isinstance(t, torch.Tensor):
            return None
        entry = _held(self._hand, t)
        if entry is None or entry[1] != what:
            return None
        return entry[3], entry[4], entry[2]

    def _remember_hand(
        self, out: torch.Tensor, what: str, of: torch.Tensor, scores: torch.Tensor, dim
    ) -> None:
        _hold(self._hand, out, what, of, scores, dim)

    def _hand_step(self, name: str, args, kwargs, out: torch.Tensor, pre: torch.Tensor | None) -> None:
        """Note the steps of a softmax written by hand: exp of scores (``s - s.amax(...)`` included), its
        sum over one dim (kept, or unsqueezed back), log_softmax of scores; the weights they make
        (``e / sum``, ``log_softmax(s).exp()``) and those weights changed in place of shape (dropout)."""
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or not out.is_floating_point():
            return
        if name in ("exp", "exp_"):
            found = self._hand_of(x, "log")
            if found is not None and tuple(out.shape) == tuple(x.shape):  # log_softmax(s).exp()
                self._remember_hand(out, "weights", out, found[0], found[1])
                self._unfinished.pop(id(x), None)
                return
            tag = self.tag(x)
            scores = x if name == "exp" else pre  # exp_: the scores as they were before it (kept, with
            if (
                tag is not None
                and tag.role == "scores"
                and scores is not None
                and tuple(out.shape) == tuple(x.shape)
            ):
                if scores is not x:  # what the capture knew of them)
                    self.set(scores, tag)
                self._remember_hand(out, "exp", out, scores, None)
                self._unfinished[id(out)] = (self.path(), tuple(out.shape))
            elif (tag is not None and tag.role in (None, "linear") and tag.code is not None and name == "exp"
                    and (x.dim() >= 2 or x.numel() > 1) and tuple(out.shape) == tuple(x.shape)):  # fmt: skip
                # perhaps a softmax over positions by hand (a learned context vector's scores; one score per
                # word of PackedSequence.data, 1-D): followed, never warned of (the exp of a projection is
                # often no softmax at all)
                self._remember_hand(out, "exp", out, x, None)
        elif name in MUL and len(args) >= 2 and self._hand:
            for e_t, m in ((args[0], args[1]), (args[1], args[0])):  # exp(s) * mask: a masked exp
                e = self._hand_of(e_t, "exp")
                if (e is not None and isinstance(m, torch.Tensor) and tuple(out.shape) == tuple(e_t.shape)
                        and (m.dtype == torch.bool or _zero_one(m))):  # fmt: skip
                    self._remember_hand(out, "exp", out, self._masked_by(e[0], m), None)
                    self._unfinished.pop(id(e_t), None)
                    g = self.tag(e[0])
                    if g is not None and g.role == "scores":
                        self._unfinished[id(out)] = (self.path(), tuple(out.shape))
                    break
        elif (
            name in FILL
            and self._hand
            and len(args) >= 3
            and isinstance(args[1], torch.Tensor)
            and not isinstance(args[2], torch.Tensor)
            and args[2] == 0
            and (e := self._hand_of(x, "exp")) is not None
            and tuple(out.shape) == tuple(x.shape)
        ):  # exp(s).masked_fill(pad, 0): a masked exp, its mask the fill's complement
            self._remember_hand(out, "exp", out, self._masked_by(e[0], ~args[1].bool()), None)
            held = self._unfinished.pop(id(x), None)
            if held is not None:
                self._unfinished[id(out)] = held
        elif (
            name == "where"
            and self._hand
            and len(args) == 3
            and x.dtype == torch.bool
            and isinstance(args[1], torch.Tensor)
            and not isinstance(args[2], torch.Tensor)
            and args[2] == 0
            and (e := self._hand_of(args[1], "exp")) is not None
            and tuple(out.shape) == tuple(args[1].shape)
        ):  # torch.where(mask, exp(s - m), 0.): a masked exp, as exp(s).masked_fill(~mask, 0) is
            self._remember_hand(out, "exp", out, self._masked_by(e[0], x), None)
            held = self._unfinished.pop(id(args[1]), None)
            if held is not None:
                self._unfinished[id(out)] = held
        elif name in ("log_softmax", "logsumexp"):
            tag = self.tag(x)
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            if isinstance(dim, (tuple, list)) and len(dim) == 1:
                dim = dim[0]
            if tag is None or tag.role != "scores" or not isinstance(dim, int) or x.dim() < 2:
                return
            if name == "log_softmax":  # (log-probabilities: weights once exponentiated, a loss's otherwise)
                self._remember_hand(out, "log", out, x, dim % x.dim())
            else:  # s - logsumexp(s) is log_softmax(s)
                keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
                self._remember_hand(out, "lse" if keep else "lse-", x, x, dim % x.dim())
        elif not self._hand:
            return
        elif (
            name in lineage.REPLAY
            and (w := self._hand_of(x, "weights") or self._hand_of(x, "wview")) is not None
            and tuple(out.shape) != tuple(x.shape)
        ):  # a view of the weights (``w.unsqueeze(-1)``, ``w[..., None]``): recorded where it weighs values
            self._remember_hand(out, "wview", w[2], w[0], w[1])
        elif name == "index_select" and len(args) >= 3 and isinstance(args[1], int) and out.dim() == x.dim():
            found = self._hand_of(x, "exp")  # an exp's rows put back in order (pad_packed_sequence's
            d = args[1] % max(x.dim(), 1)  # unsorted_indices): still the exp, its scores with it
            if found is not None and found[1] != d and tuple(found[0].shape) == tuple(x.shape):
                scores = found[0].index_select(d, args[2])
                g = self.tag(out)
                if g is not None:
                    self.set(scores, replace(g))  # (at the exp's positions, as reordered)
                self._remember_hand(out, "exp", out, scores, found[1])
                if self._unfinished.pop(id(x), None) is not None:
                    self._unfinished[id(out)] = (self.path(), tuple(out.shape))
        elif name in SUB and len(args) >= 2 and kwargs.get("alpha", 1) == 1:
            lse = self._hand_of(args[1], "lse")
            if lse is not None and lse[2] is args[0] and tuple(out.shape) == tuple(x.shape):
                self._remember_hand(out, "log", out, lse[0], lse[1])
        elif name == "sum":
            found = self._hand_of(x, "exp")
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            if isinstance(dim, (tuple, list)) and len(dim) == 1:
                dim = dim[0]
            if found is not None and isinstance(dim, int) and x.dim() >= 2:
                keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
                self._remember_hand(out, "sum" if keep else "sum-", x, found[0], dim % x.dim())
        elif name in ADD and len(args) >= 2 and kwargs.get("alpha", 1) == 1:
            entry = _held(self._hand, x)  # sum + 1e-8 (a guard against 0): still the sum to divide by
            eps = args[1]
            if isinstance(eps, torch.Tensor) and eps.numel() == 1 and not eps.requires_grad:
                eps = float(eps)
            small = isinstance(eps, (int, float)) and not isinstance(eps, bool) and 0 <= eps <= 1e-4
            if (entry is not None and entry[1] in ("sum", "sum-") and small
                    and tuple(out.shape) == tuple(args[0].shape)):  # fmt: skip
                self._remember_hand(out, entry[1], entry[2], entry[3], entry[4])
            elif entry is not None and entry[1] == "exp" and small and tuple(out.shape) == tuple(x.shape):
                # the exp plus a guard too (DynamicViT's ``(attn + eps / N) / (attn.sum(-1) + eps)``): divided by
                # the exp's own sum, the weights
                self._remember_hand(out, "exp", out, entry[3], None)
                _hold(self._plus, out, x)
                if self._unfinished.pop(id(x), None) is not None:
                    self._unfinished[id(out)] = (self.path(), tuple(out.shape))
        elif name == "unsqueeze":
            entry = _held(self._hand, x)
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            if (entry is not None and entry[1] in ("sum-", "lse-") and isinstance(dim, int)
                    and entry[4] is not None and dim % out.dim() == entry[4]):  # fmt: skip
                self._remember_hand(out, entry[1][:-1], entry[2], entry[3], entry[4])
        elif name in DIV and len(args) >= 2:
            e = self._hand_of(args[0], "exp")
            total = self._hand_of(args[1], "sum")
            plus = _held(self._plus, args[0])
            if (
                e is not None
                and total is not None
                and (
                    total[2] is args[0]
                    or (plus is not None and total[2] is plus[1])
                    or _same_scores(total[0], e[0])  # (the exp taken twice: ``s.exp() / s.exp().sum(-1)``)
                )
                and tuple(out.shape) == tuple(x.shape)
            ):
                self._unfinished.pop(id(args[0]), None)
                if isinstance(total[2], torch.Tensor):
                    self._unfinished.pop(id(total[2]), None)  # (the exp summed, where it was taken twice)
                g = self.tag(e[0])
                if g is not None and g.role != "scores":  # over positions: its weights followed from here
                    self.n_attention += 1
                    self.on_softmax((e[0], total[1]), {}, out)
                else:
                    self._remember_hand(out, "weights", out, e[0], total[1])
        elif name not in MATMUL:
            found = self._hand_of(x, "weights")  # dropped out, masked, cast: still the weights
            if found is not None and tuple(out.shape) == tuple(x.shape):
                self._remember_hand(out, "weights", out, found[0], found[1])

    def finish(self) -> None:
        """Warn of the exp (or log_softmax) of attention scores never followed into weights: a softmax
        written another way (``exp(s - logsumexp(s))``, a sum plus an epsilon) or one computed block
        by block (an online softmax) is not recorded, and says so."""
        self._held_flags()
        for module, shape in self._unfinished.values():
            self.warn(module, shape, "exp of query-key scores that capture could not follow into a softmax (one "
                      "written another way, or computed block by block): these weights are not recorded")  # fmt: skip
        self._unfinished.clear()
        self._row_picks.clear()  # (the token ids they hold)
        self._id_moves.clear()
        for _, pending in list(self._factor_kept.values()):  # summed keeping the axis, never divided by it:
            factor: tuple = pending  # a read of values one number a position, recorded as at that product
            record = factor[0]
            if self._factor_read.get(id(record)) is not factor or id(record) not in self._positional_shapes:
                continue
            del self._positional_shapes[id(record)]
            n_ops, self.n_ops = self.n_ops, factor[4]
            try:
                record(*factor[1:4])
            finally:
                self.n_ops = n_ops
        self._factor_kept.clear()
        self._factor_read.clear()  # (times a tensor of their shape, never summed: a gate, DA-RNN's input one)
        for weights, (module, shape) in self._positional_shapes.items():
            if weights in self._in_pieces:  # its slices multiplied values one by one (a loop over the batch)
                self.warn(module, shape, "not recorded: weights over positions whose slices multiply values one "
                          "at a time (a loop over the batch or the queries), which capture does not join into "
                          "a map")  # fmt: skip
                continue
            if weights in self._packed_weights:
                self.warn(module, shape, "not recorded: weights over positions packed into a sequence (a recurrent "
                          "layer gated by them, as DIEN's AUGRU), not multiplied with values as capture follows "
                          "them")  # fmt: skip
                continue
            self.skip(module, shape, "a distribution over positions that nothing is weighted by (a pointer "
                      "network's output, a prediction over positions), not attention")  # fmt: skip
        self._in_pieces.clear()
        self._packed_weights.clear()
        self._positional.clear()
        self._self_weights.clear()
        self._positional_shapes.clear()
        self._softmaxed.clear()  # (the scores kept for a renormalization, which the forward has done by now)
        self._sums.clear()
        self._same_q, self._before_q = [], []
        self._frame, self._record_call = None, (None, "", None, -1, None)  # no module call is held on
        records = self.cap.records
        run_joined: set[int] = set()
        joined_runs: list[tuple[list[int], Record]] = []
        unused = self._unused_beside()
        group_of = self._group_places()
        in_groups = group_of.keys()
        for run in self._runs:
            blocks = id(run) in self._block_runs  # (calls of a module one after another)
            if id(run) in self._head_runs and any(piece[0] in in_groups for piece in run):
                continue  # heads a call each whose outputs are joined: joined below, with their sequences
            where = [group_of.get(piece[0]) for piece in run]
            if all(w is not None for w in where) and len({w[1] for w in where if w is not None}) > 1:
                continue  # (other heads of the sequences their outputs say: joined below, by those groups)
            if any(piece[1].seq in unused for piece in run):  # (linked by maps that are no pieces of the
                continue  # call's attention: maps of their own)
            joined = self._run_joined(run)
            if isinstance(joined, str) and any(piece[0] in in_groups for piece in run):
                run = [piece for piece in run if piece[0] not in in_groups]  # heads joined by their outputs
                if len(run) < 2:  # (plain functions making every head of every layer, picoGPT): joined below
                    continue
                joined = self._run_joined(run)
            if joined is None:  # not pieces of one attention: maps of their own
                continue
            if isinstance(joined, str) and blocks:  # blocks that do not make one map (a shorter last block):
                union = [lay.seq_keys for _, _, lay in run if lay.seq_keys is not None]  # maps of their own,
                for _, piece, _ in run:  # which together hold the whole sequence, as windows do
                    self._seq_keys[piece.seq] = union
                continue
            if isinstance(joined, str) and self._stream_of(
                [records[i] for i, _, _ in run if i < len(records)]
            ):
                continue  # (requests packed into one stream: a sequence each, below)
            if isinstance(joined, str):
                first = run[0][1]
                self.warn(first.name, tuple(int(n) for n in first.probs.shape), "several attention maps over "
                          "different queries (other positions or heads) from one call of this module, as "
                          "attention computed in slices or chunks makes them, could not be joined into one "
                          f"layer ({joined}): each piece is recorded as a map of its own, so a trace shows the "
                          "pieces as layers")  # fmt: skip
                continue
            for i, _, _ in run:
                records[i] = joined
                run_joined.add(i)
            self._seq_keys[joined.seq] = [lay.seq_keys for _, _, lay in run if lay.seq_keys is not None]
            joined_runs.append(([i for i, _, _ in run], joined))
        self._heads_over_sequences(joined_runs, group_of)
        for places, seqs, layer, per in self._head_groups:  # heads (and sequences) of one layer from
            now = [records[i] if i < len(records) else None for i in places]  # separate module calls
            if (
                not places
                or any(i in run_joined for i in places)
                or any(r is None or r.seq != seq for r, seq in zip(now, seqs, strict=True))
            ):
                continue  # (joined as pieces of one call already)
            rows: list[Record] = []
            for at in range(0, len(now), per):
                heads = now[at]
                assert heads is not None
                for r in now[at + 1 : at + per]:
                    assert r is not None
                    heads = _heads_joined(heads, r, layer)
                rows.append(heads)
            joined = rows[0] if len(rows) == 1 else _sequences_joined(rows)
            if joined is None:
                continue
            for i in places:
                records[i] = joined
        if self._runs or self._head_groups:  # each run's pieces (each group's heads) are one record now
            seen: set[int] = set()
            records[:] = [r for r in records if not (id(r) in seen or seen.add(id(r)))]  # type: ignore[func-returns-value]
        if len(records) > 1:
            self._rows_joined(records)
            self._stream_sequences(records)
        for r in records:
            if r.seq in unused and r.flag is None:
                self.skip(r.name, tuple(r.probs.shape), "a softmax over query-key scores made in the same call as "
                          "this module's attention, whose weights multiplied no values (a relation kept for "
                          "a loss, MiniLM's value relation): not attention the model computed with")  # fmt: skip
        if unused:
            records[:] = [r for r in records if r.seq not in unused or r.flag is not None]
        self._runs.clear()
        self._call_of.clear()
        self._block_runs.clear()
        self._head_runs.clear()
        self._head_groups.clear()
        # a decoder's first step (one query: with a KV cache, nothing cached yet, or a preallocated cache
        # with one slot written; without one, a one-token prompt) looks like an encoder of one token: it
        # takes the kind of the module's later steps, which read the cache or show their causal mask
        # (not a module whose queries a cross-attention reads as its keys: an encoder's, of a one-token source,
        # where one forward runs the encoder's and the decoder's attention under one path)
        decoding = {r.name for r in records if r.kind == "dec_self"}
        memory = [c for c in records if c.kind == "cross" and c.key_positions is not None]
        for i, r in enumerate(records):
            if (r.kind == "enc_self" and r.name in decoding
                    and not any(fnmatch.fnmatchcase(r.name, p) for p in self.fixed)
                    and (r.probs.shape[-2] == 1 or self._prefill_of(r, records))
                    and not _read_as_memory(r, memory)
                    and not (r.probs.shape[-2] == 1 and self._sees_ahead(r.query_positions, r.key_positions,
                                                                         r.probs.detach().gt(0).any(1)))):  # fmt: skip
                # (one query that weighs later positions of its own input is no decoder's step: Longformer's
                # global token over every token, beside a band the shape alone could not lay out; a prefill's
                # queries see their prefix both ways)
                records[i] = _replaced(r, kind="dec_self")
        # keys that are some of a sequence's positions (pruned, sampled, merged tokens), over the whole
        # record (the blocks of one call together): no map a trace can label by the sequence's tokens
        for i, r in enumerate(records):
            keys = self._seq_keys.get(r.seq)
            if not r.exact:
                continue
            why = None
            if keys:
                # (layouts are cached: the same keys' positions come back for later calls of the same shapes)
                key = ("subset", tuple(id(k) for k in keys), self._sources_key())
                why = lineage.recall(key)
                if why is lineage.MISS:
                    width = max(int(k.shape[-1]) for k in keys)
                    kp = torch.cat(
                        [F.pad(k.to(keys[0].device), (0, width - int(k.shape[-1])), value=-1) for k in keys]
                    )
                    # (and by the positions themselves: keys a module call's arguments hold are new every forward)
                    held = ("subset of", tuple(kp.shape), _digest(kp), self._sources_key())
                    why = lineage.recall(held)
                    if why is lineage.MISS:
                        why = lineage.remember(held, (), lineage.subset(kp, self.sources))
                    why = lineage.remember(key, tuple(keys), why)
                if why is None and self._picked:
                    why = self._picked_by_data(keys)
            cross = r.kind == "cross"
            own_keys = r.key_positions
            for k in (own_keys,) if own_keys is not None and own_keys.dim() == 2 else keys or ():
                # each block's keys (a call's blocks, or a module called a bucket of the batch at a time) over
                # the record's rows. Self-attention: the keys' sequence is the queries'; cross-attention:
                # another input's sequence, which row b of the queries reads (a pure function of codes and sources)
                if why is not None or int(k.shape[0]) != int(r.probs.shape[0]):
                    continue
                why = self._reordered_once(k, cross)
            qp = r.query_positions
            if why is None and cross and self._picked and qp is not None and qp.dim() == 2:
                # (self-attention's queries are its keys' sequence, checked above)
                why = self._picked_by_data([qp], _QUERIES_PICKED_BY_DATA)
            if (
                why is None
                and (cross or not keys)
                and qp is not None
                and qp.dim() == 2
                and int(qp.shape[0]) == int(r.probs.shape[0])
            ):  # the queries' rows (a record made from a call's arguments has no keys' positions)
                # (by the positions themselves: a call's arguments give new ones to every forward)
                why = self._reordered_once(qp, None)
            if why is None and qp is not None and qp.dim() == 2 and r.mask is not None:
                why = self._packed_batch(qp, r.mask)
            if (
                why is None
                and r.seq in self._orders_at
                and qp is None
                and self._rows_unplaced(own_keys, keys)
            ):
                why = _order_unplaced(self._orders_at[r.seq], int(r.probs.shape[0]))
            if why is not None:
                records[i] = _replaced(r, exact=False, flag=why)
                self.warn(r.name, tuple(int(n) for n in r.probs.shape), f"could not verify: {why}")
        self._seq_keys.clear()
        self._queried.clear()
        self._asked.clear()
        self._orders_at.clear()
        self._orders_pending.clear()

    def _rows_unplaced(self, own: torch.Tensor | None, keys: list[torch.Tensor] | None) -> bool:
        """No key of a record is a position of the caller's inputs (token ids or tensors handed in), so lineage
        cannot say which of the caller's sequences its rows hold: keys the model made (sentence vectors pooled
        from words, an RNN's states), or none followed."""
        found = [k for k in ([own] if own is not None else keys or []) if k is not None]
        return not any(bool(self.sources.of_kind(k[k >= 0], _CALLERS).any()) for k in found)

    def _packed_batch(self, qp: torch.Tensor, mask: torch.Tensor) -> str | None:
        """Why a record row holds several sequences of the batch, or None. ``qp`` (B, q): its queries' positions;
        ``mask`` (B, q, k), True = may attend. Queries from several rows of one batch-first input in one record row,
        where queries from different rows see no key in common (a block-diagonal mask: PixArt's captions and
        images packed into one row, varlen attention over a flattened batch): the row is the batch, not one
        sequence. Rows of the input that share keys are one sequence (sequence-first ids, whose rows are steps;
        SAINT's attention across the batch's samples)."""
        if qp.shape[-1] < 2 or mask.dim() != 3 or tuple(mask.shape[:2]) != tuple(qp.shape):
            return None
        # which source row each query is from, where several rows of one input ask in one record row (else None):
        # a function of the positions, remembered by them (a call's arguments give new tensors every forward)
        key = ("packed rows", tuple(qp.shape), _digest(qp), self._sources_key())
        rows = lineage.recall(key)
        if rows is lineage.MISS:
            rows = None
            src = self.sources.index(qp.clamp_min(0))
            s0 = self.sources.items[int(src[0, 0])]
            if bool((qp >= 0).all()) and bool((src == src[:1, :1]).all()) and s0.row:
                # (a grid from outside, (B, H, W, C): a sequence is one of its images, whose rows a window
                # shifted over the grid's edge joins, as Swin's do, masking them apart)
                big = len(s0.lead) >= 3 and s0.lead[0] > 0
                rows = (qp - s0.start) // (s0.n // s0.lead[0]) if big else self.sources.rows(qp)
                if not any(int(torch.unique(r).numel()) > 1 for r in rows):
                    rows = None
            rows = lineage.remember(key, (), rows)
        if rows is None:
            return None
        rows = rows.to(mask.device)
        for b in range(int(qp.shape[0])):
            asks = mask[b].any(-1)  # (queries that see no key say nothing: a padded row)
            r, seen = rows[b][asks], mask[b][asks].float()
            groups, counts = torch.unique(r, return_counts=True)
            if int(groups.numel()) < 2 or int(counts.min()) < 2:
                continue  # (one query from each row is a column of a grid: triangle attention's, axial's)
            shared = (seen @ seen.T) > 0  # (q, q): queries that see a key in common
            if bool((shared & (r[:, None] != r[None, :])).any()):
                continue
            return (f"record row {b} holds queries from {int(groups.numel())} sequences of the batch, "
                    "each seeing keys of its own (a block-diagonal mask: sequences packed into one row, as "
                    "PixArt packs its images and captions, or varlen attention over a flattened batch): the row "
                    "is several sequences, not one")  # fmt: skip
        return None

    def _reordered_once(self, pos: torch.Tensor, cross: bool | None) -> str | None:
        """``_batch_reordered`` of these positions (a record's keys, ``cross`` whether they are another input's; or
        with ``cross`` None its queries), remembered by the positions themselves (a call's arguments give new
        tensors every forward), with the sources it found put in another order, which later records ask for."""
        # (what it reads besides them in the key too: the sources found out of order so far, the ids' layouts)
        state = (
            frozenset(self._reordered_sources),
            tuple(sorted((k, v[1]) for k, v in self._id_memory.items())),
        )
        key = ("reordered", tuple(pos.shape), _digest(pos), cross, self._sources_key(), state)
        hit = lineage.recall(key)
        if hit is lineage.MISS:
            before = set(self._reordered_sources)
            why = self._batch_reordered(pos) if cross is None else self._batch_reordered(pos, cross)
            hit = lineage.remember(key, (), (why, tuple(self._reordered_sources - before)))
        why, reordered = hit
        self._reordered_sources.update(reordered)
        return why

    def _batch_reordered(self, kp: torch.Tensor, keys_only: bool = False) -> str | None:
        """Why a record's sequences are the batch's in another order, or None. ``kp`` (B, K): each record
        sequence's key positions. Where every sequence's keys lie in one row of the one tensor they came
        from (a batch-first input: its sequences), and the record holds all those rows, out of order (the
        batch sorted by length inside the model, ``x[perm_idx]``, for ``pack_padded_sequence``), record row
        b is not the caller's sequence b."""
        own = kp >= 0
        if not bool(own.any(-1).all()):
            return None
        safe = kp.clamp_min(0)
        src = self.sources.index(safe).masked_fill(~own, -1)
        first = src[own][:1]
        if not bool(((src == first) | ~own).all()):
            return None  # keys from several tensors (a cache, a memory): rows name no one batch
        source = self.sources.items[int(first)]
        rows = self.sources.rows(safe).masked_fill(~own, -1)
        big = torch.iinfo(rows.dtype).max
        lo = torch.where(own, rows, big).amin(-1)
        hi = rows.amax(-1)
        one_row = not source.row or bool((lo == hi).all() and (lo == lo[0]).all())
        if one_row and int(kp.shape[0]) > 1:
            # every sequence a run of one row (flat ids split by length and padded inside the model:
            # ``pad_sequence(torch.split(emb(ids), lens))``): the caller's sequences are the runs in their order
            start = torch.where(own, safe, big).amin(-1)
            end = torch.where(own, safe, -1).amax(-1)
            by_start = torch.argsort(start)
            if bool((start[by_start][1:] > end[by_start][:-1]).all()):  # (runs apart: no beams of one row)
                if bool((start[1:] > start[:-1]).all()):
                    return None
                order = torch.empty_like(by_start)
                order[by_start] = torch.arange(int(by_start.numel()), device=by_start.device)
                how = ("the sequences were put in another order inside the model before this attention (the runs "
                       "of one input split into sequences, then sorted by length)")  # fmt: skip
                return _rows_named(how, order, keys_only)
        if not source.row:
            return None
        n_rows = max(source.n // source.row, 1)
        some = False  # (some rows may be picked: the rows are a batch's sequences)
        if bool((lo == hi).all()):
            order = lo - source.start  # the caller's row each record row holds
            ids = self._id_memory.get(source.start)
            some = source.kind == "tokens" and ids is not None and ids[1] == 2
        else:
            # a sequence over several rows: each in one column (sequence-first ids, (T, B)), or no one
            # sequence per row or column (windows)
            cols = (safe - source.start) % source.row
            lo = torch.where(own, cols, big).amin(-1)
            if not bool((lo == torch.where(own, cols, -1).amax(-1)).all()):
                return None
            order, n_rows = lo, source.row
        if int(torch.unique(order).numel()) != int(order.numel()):
            if _beams(order, n_rows):
                return None  # every row k times, side by side or tiled (beams): no one batch order
            # rows picked with some twice (``img[[2, 0, 2]]``: each caption's image): not beams of a batch
            how = f"rows of the batch were picked inside the model, some twice ({order.tolist()} of its {n_rows})"
        else:
            if int(order.numel()) == n_rows:
                if bool((order[1:] > order[:-1]).all()):
                    return None
                self._reordered_sources.add(source.start)
            # some of the rows (a 4-D input's rows are its heads too): not the caller's first sequences only where
            # the rows are a batch of token ids' (rows dropped: ``ids[valid]``, ``emb(ids)[1:]``), or the whole
            # batch was put in another order before (Show, Attend and Tell's shrinking batch)
            elif torch.equal(order, torch.arange(int(order.numel()), device=order.device)) or not (
                some or source.start in self._reordered_sources
            ):
                return None
            how = (
                "the batch was put in another order inside the model before this attention (sorted by length, "
                "x[perm_idx], rolled)"
                if int(order.numel()) == n_rows
                else f"only some of the batch's {n_rows} sequences reach this attention, picked inside the model "
                "(rows dropped or bucketed: ids[valid], x[1:])"
            )
        return _rows_named(how, order, keys_only)

    def _prefill_of(self, rec: Record, records: list[Record]) -> bool:
        """A prompt that sees itself both ways (a prefix LM's prefill that is all prefix) whose positions a
        later causal step of the same module reads again among its keys (its KV cache): a decoder's
        prefill, ``dec_self`` like the steps (the same rule names a prefix LM's mask ``dec_self``)."""
        mine = self._seq_keys.get(rec.seq)
        if not mine:
            return False
        own = {int(p) for k in mine for p in k.reshape(-1).tolist() if p >= 0}
        if not own:
            return False
        for r in records:
            if (
                r.name == rec.name
                and r.kind == "dec_self"
                and r.seq > rec.seq
                and r.probs.shape[-2] < rec.probs.shape[-2]
            ):
                later = {
                    int(p) for k in self._seq_keys.get(r.seq, ()) for p in k.reshape(-1).tolist() if p >= 0
                }
                if own <= later:
                    return True
        return False

    def _picked_by_data(self, keys: list[torch.Tensor], why: str = _PICKED_BY_DATA) -> str | None:
        """Why a record's keys, each sequence's (-1 at learned ones), are no tokens a trace can label: for a
        row of their sequence they hold part of, the positions held, or those left out, were all picked by
        indices that depend on the data (tokens kept by a score or a router; ToMe's unmerged tokens beside
        the ones merged into). Even a run from one end counts: padding is cut by the inputs' mask, which is
        no activation. None otherwise."""
        for kp in keys:
            for seq in kp.reshape(-1, kp.shape[-1]).cpu():
                own = torch.unique(seq[seq >= 0])
                own = own[~self.sources.learned(own)]
                if not own.numel():
                    continue
                first, size = self.sources.span(own)
                col = own - first
                if int(torch.unique(first).numel()) > 1 and bool((col == col[0]).all()):
                    # one position in each of several rows, one column: a sequence of sequence-first ids
                    # (T, B); its whole column kept (finished sentences dropped from a beam search's batch by
                    # ``index_select(1, ...)``) picks no positions of it
                    src = self.sources.at(int(own[0]))
                    held = set(own.tolist())
                    column = {src.start + r * src.row + int(col[0]) for r in range(src.n // max(src.row, 1))}
                    left = column - held
                    if left and (held <= self._picked or left <= self._picked):
                        return why
                    continue
                for f in torch.unique(first).tolist():
                    at = first == f
                    held, n = set(own[at].tolist()), int(size[at][0])
                    if len(held) >= n:
                        continue  # the whole row
                    left = set(range(f, f + n)) - held
                    if held <= self._picked or left <= self._picked:
                        return why
        return None

    def _stream_of(self, rs: list[Record]) -> bool:
        """``rs`` (one pass of a module call, in order) are maps over pieces of one 1-D stream of tokens (ids of
        one dim: requests packed into a stream, whose sequences only the calls over them tell): each a single
        row over every head, self-attention with queries and keys of its own (no position in two pieces)."""
        if len(rs) < 2:
            return False
        heads = int(rs[0].probs.shape[1])
        seen: set[int] = set()
        src: int | None = None
        for r in rs:
            qp, kp = r.query_positions, r.key_positions
            if kp is None:  # (SDPA's and a layout's keys: kept per sequence for finish)
                held = self._seq_keys.get(r.seq, [])
                kp = held[0] if len(held) == 1 else None
            if (r.probs.shape[0] != 1 or int(r.probs.shape[1]) != heads or not r.exact or r.flag is not None
                    or r.batch_rows is not None or r.kind == "cross" or r.key_labels is not None
                    or r.query_labels is not None or qp is None or kp is None or qp.shape[0] != 1
                    or kp.shape[0] != 1 or bool((kp < 0).any())):  # fmt: skip
                return False
            own = set(qp[0].tolist()) | set(kp[0].tolist())
            at = self.sources.index(torch.tensor(sorted(own), dtype=torch.int64)).unique()
            if at.numel() != 1 or (src is not None and int(at) != src) or own & seen:
                return False
            src = int(at)
            seen |= own
        assert src is not None
        source = self.sources.items[src]
        return source.kind == "tokens" and source.row == 0 and source.lead == ()

    def _stream_sequences(self, records: list[Record]) -> None:
        """Maps of one module call over pieces of one 1-D stream of tokens, each over positions and keys of its
        own (requests packed into one stream and attended one at a time: vLLM's and SGLang's reference
        kernels): each a sequence of its own, in the order the calls ran (``batch_rows``), as pieces of one
        length joined by their outputs are rows of one batch. A pass ends where a map asks positions an
        earlier one of the call asked (the next layer, written inline)."""
        passes: dict[tuple[str, int], list[list[int]]] = {}
        held: dict[tuple[str, int], set[int]] = {}  # the positions the current pass of each call asked
        for i, r in enumerate(records):
            call = self._call_of.get(r.seq)
            if call is None or r.query_positions is None:
                continue
            runs = passes.setdefault((r.name, call), [[]])
            asked = set(r.query_positions.reshape(-1).tolist())
            seen = held.setdefault((r.name, call), set())
            if asked & seen:
                runs.append([])
                seen.clear()
            runs[-1].append(i)
            seen |= asked
        for (name, _), runs in passes.items():
            for run in runs:
                rs = [records[i] for i in run]
                if not self._stream_of(rs):
                    continue
                for b, i in enumerate(run):
                    records[i] = _replaced(records[i], batch_rows=(b,))
                self.warn(name, tuple(int(n) for n in rs[0].probs.shape), f"{len(rs)} attention maps from one "
                          "call of this module, each over positions and keys of its own of one stream of tokens "
                          "(a 1-D input: requests packed into one stream and attended one at a time, or chunks of "
                          "one sequence): each is recorded as a sequence of its own, in the order the calls ran "
                          "(record.batch_rows), and trace(b) draws the b-th")  # fmt: skip

    def _run_joined(self, run: list[tuple[int, Record, Layout]]) -> Record | str | None:
        """The pieces of one module call joined into one record; why not; or None (maps of their own)."""
        records = self.cap.records
        now = [records[i] if i < len(records) else None for i, _, _ in run]
        if not all(r is not None and r.seq == made.seq and r.name == made.name for r, (_, made, _) in
                   zip(now, run, strict=True)):  # fmt: skip
            return "the pieces were changed after they were recorded"
        return _join_pieces([(r, lay) for r, (_, _, lay) in zip(now, run, strict=True) if r is not None],
                            self.sources)  # fmt: skip

    def _hand_weights_read(self, args, kwargs) -> None:
        """The weights of a softmax by hand, or a view of them, broadcast over values and multiplied element by
        element (``(w.unsqueeze(-1) * v[:, None]).sum(-2)``, a weighted sum written out): recorded as at a
        product. Not a 0/1 mask multiplied in, nor a tensor of the weights' own shape."""
        ins = _tensors(args, kwargs)
        if len(ins) != 2:
            return
        for t, v in ((ins[0], ins[1]), (ins[1], ins[0])):
            found = self._hand_of(t, "wview") or self._hand_of(t, "weights")
            g = self.tag(v)
            if (
                found is None
                or g is None
                or g is _PARAM_TAG
                or g.role == "param"
                or tuple(v.shape) == tuple(t.shape)
                or not v.is_floating_point()
                or _zero_one(v)
            ):
                continue
            weights = found[2]
            self._hand.pop(id(t), None)
            self._hand.pop(id(weights), None)
            self.n_attention += 1
            self.on_softmax((found[0], found[1]), {}, weights)
            return

    def _masked_by(self, scores: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """Scores whose exp is multiplied by a 0/1 mask (``exp(s - max) * mask``, then divided by its sum): a view
        of them tagged with the mask's zeros hidden, so the softmax by hand is recorded with that mask
        (``"multiplied"``); the scores themselves where they are no scores capture follows."""
        g = self.tag(scores)
        if g is None or g.role not in ("scores", None, "linear") or g.probs is not None:
            return scores  # (scores over positions too: a learned context vector's)
        try:
            keep = (m != 0).expand(scores.shape)
            allowed = keep if g.allowed is None else g.allowed.expand(scores.shape) & keep
        except RuntimeError:
            return scores
        masked = scores.view_as(scores)
        self.set(masked, replace(g, allowed=allowed, mask_source=g.mask_source or "multiplied",
                                 scores=g.scores if g.scores is not None else scores.detach()))  # fmt: skip
        return masked

    def _hand_weights(self, args, kwargs) -> None:
        """A product whose weights a softmax written by hand made: recorded as the softmax of its scores
        over its dim (the weights as the product takes them), before the product is followed."""
        for t in _tensors(args, kwargs):
            found = self._hand_of(t, "weights")
            if found is not None:
                del self._hand[id(t)]
                self.n_attention += 1
                self.on_softmax((found[0], found[1]), {}, t)
                return

    def _buffers(self) -> list[torch.Tensor]:
        """The model's buffers, listed once per capture."""
        if self._model_buffers is None:
            self._model_buffers = list(self.model.buffers())
        return self._model_buffers

    def _constant_ids(self, ids: torch.Tensor) -> bool:
        """One id at every position, made by the model or kept by it (ViLT's and VisualBERT's token types,
        ``torch.full_like(mask, 1)``; BERT's zero ``token_type_ids`` buffer): the lookup is a learned vector
        added at every position, whose positions are not the sequence's (the caller's own ids, even one token
        repeated, are)."""
        if ids.dim() < 2 or ids.shape[-1] < 2:
            return False
        # one id (``full_like(mask, 1)``), or a few the model wrote in itself (segments: ``cat([zeros, ones],
        # 1)``), not computed from the data (a decoder's own predictions are tokens); asked before where the
        # ids come from, which walks the model's modules once a capture
        flat = ids.reshape(-1)
        if not bool((flat == flat[0]).all()) and (
            _held(self._by_data, ids) is not None or int(torch.unique(flat).numel()) > MAX_TYPES
        ):
            return False
        return (
            _held(self._made_ints, ids) is not None
            or _held(self._int_floats, ids) is not None
            or self._kept_by_model(ids)
        )

    def _fixed_ids(self, ids: torch.Tensor) -> bool:
        """Indices of a table's rows that hold no input: ``torch.arange(P)`` made by the model's code (and
        views of it), or an arange the model keeps (a buffer, or a tensor attribute: P-tuning's
        ``prefix_tokens``, BERT's ``position_ids``). A start token made inside (``torch.full(.., BOS)``) is
        a token."""
        if _held(self._pure_ints, ids) is not None:
            return True
        if ids.dim() == 0 or ids.shape[-1] < 2:
            return False
        if not bool((ids == torch.arange(ids.shape[-1], device=ids.device)).all()):
            return False  # (token ids: no walk of the model's modules)
        return self._kept_by_model(ids)

    def _kept_by_model(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is (a view of) a buffer or tensor attribute of the model's modules."""
        if self._kept_storages is None:
            kept = list(self._buffers())
            for m in self.model.modules():
                kept.extend(v for v in vars(m).values() if isinstance(v, torch.Tensor))
            self._kept_storages = {_storage_at(x) for x in kept} - {0}
        return _storage_at(t) in self._kept_storages

    def _row_pick(self, name: str, args, kwargs, out: torch.Tensor) -> None:
        """Integer rows put in another order or some of them kept (``ids[perm_idx]``, ``ids.index_select(0,
        perm_idx)``, ``torch.roll(ids, 1, 0)``, ``ids.flip(0)``, ``ids[1:]``, ``ids[valid]``: a batch of token
        ids sorted by length, rolled for negatives, or rows dropped before the embedding): remembered, so the
        embedding gives each row the positions of the caller's row it is (a pick of a pick maps back to the
        first). A row picked twice (beams) makes rows anew."""
        src = args[0] if args else None
        if not isinstance(src, torch.Tensor) or src.dim() < 2 or _is_param(src):
            return
        if src.is_floating_point() and (
            self.tag(src) is not None  # (an activation: its codes follow the op)
            or (
                name not in ("roll", "flip")
                and not isinstance(args[1] if len(args) > 1 else None, torch.Tensor)
            )
        ):  # features from outside (image patches rolled for negatives, ``img[perm]``), not cut by a slice
            return  # (``pe[:n]`` of a buffer is no batch's rows)
        n = int(src.shape[0])
        idx = _picked_rows(name, args, kwargs, src)
        if (
            type(idx) is not torch.Tensor
            or idx.dim() != 1
            or idx.is_floating_point()
            or tuple(out.shape[1:]) != tuple(src.shape[1:])
            or int(out.shape[0]) != int(idx.shape[0])
        ):
            return
        idx = idx.cpu()
        if idx.numel() and (
            int(idx.min()) < 0 or int(idx.max()) >= n or int(idx.unique().numel()) != idx.numel()
        ):
            return  # (one row twice, as beams are: rows anew)
        self.path()
        if self._frame is None and not self.outside:  # the caller's own code in the block, between calls of
            return  # the model (``model(ids); model(ids.flip(0))``): what the model is given is its batch
        prev = _held(self._row_picks, src)
        if prev is not None:
            src, idx = prev[1], prev[2][idx.to(prev[2].device)]
        elif (
            idx.numel() == n > 1
            and not torch.equal(idx, torch.arange(n))
            and self.tag(src) is None
            and _held(self._made_ints, src) is None
        ):  # the caller's whole batch in another order (sorted by length for pack_padded_sequence)
            self._orders_pending.append((n, idx))
        _hold(self._row_picks, out, src, idx)

    def _order_put_back(self, name: str, args, kwargs, src: torch.Tensor) -> None:
        """A pick of the rows of an activation that puts a pending order of the batch back (``x[doc_unsort_ind]``,
        the inverse of the sort): that order is no longer pending for attention after it."""
        if not isinstance(src, torch.Tensor) or not src.dim() or self.tag(src) is None:
            return  # (only what the model computed after the sort: the same order applied to another of the
            # caller's tensors, ``lengths[sort_idx]``, puts nothing back, even where it is its own inverse)
        try:
            idx = _picked_rows(name, args, kwargs, src)
        except Exception:  # (bookkeeping never breaks the forward)
            return
        if type(idx) is not torch.Tensor or idx.dim() != 1 or idx.is_floating_point():
            return
        idx = idx.cpu()
        for k, (n, order) in enumerate(self._orders_pending):
            if idx.numel() == n == int(src.shape[0]) and torch.equal(order[idx], torch.arange(n)):
                del self._orders_pending[k]
                return

    def _ids_repeated(self, args, kwargs, out: torch.Tensor) -> None:
        """Ids handed in, each sequence repeated k times in a row (Hugging Face's generate expands its batch so for
        beams and num_return_sequences: ``input_ids.repeat_interleave(k, dim=0)``): the model's batch row b is copy
        b % k of sequence b // k. Kept for the note ``capture_attention`` adds."""
        src = args[0] if args else None
        k = args[1] if len(args) > 1 else kwargs.get("repeats")
        dim = args[2] if len(args) > 2 else kwargs.get("dim")
        if (
            not isinstance(src, torch.Tensor)
            or src.dim() != 2
            # (a padding mask repeated over channels folded into the batch, PatchTST's, is no copy of the
            # sequences: generate repeats the ids themselves)
            or src.dtype == torch.bool
            or type(k) is not int
            or k < 2
            or dim not in (0, -2)
            or self.tag(src) is not None
            or _held(self._made_ints, src) is not None
        ):
            return
        self._repeated = (int(src.shape[0]), k)

    def _ids_moved(self, name: str, func, args, kwargs, out: torch.Tensor) -> None:
        """2-D integer ids transposed or picked by a 1-D index along an axis, followed as where each element
        sits among the ids they were moved from; held where some columns were put in another order (the
        batch of a time-first ``src[:, idx]``, sorted by length), so the embedding gives each its own
        position (``_row_pick`` follows the rows of batch-first ids)."""
        src = args[0] if args else None
        if not isinstance(src, torch.Tensor) or src.dim() != 2 or src.is_floating_point() or _is_param(src):
            return
        if name in ("__getitem__", "index_select"):
            idx = args[2] if name == "index_select" and len(args) > 2 else args[1] if len(args) > 1 else None
            if isinstance(idx, tuple):
                idx = idx[1] if len(idx) == 2 and idx[0] == slice(None) else None
            if type(idx) is not torch.Tensor or idx.dim() != 1 or idx.is_floating_point():
                return
        self.path()
        if self._frame is None and not self.outside:  # the caller's own code in the block, between calls of
            return  # the model: what the model is given is its batch
        held = _held(self._id_moves, src)
        pick = _held(self._row_picks, src) if held is None else None
        if held is not None:
            base, where, moved = held[1], held[2], held[3]
        elif pick is not None and pick[1].dim() == 2:
            base, moved = pick[1], True
            where = torch.arange(base.numel()).view(base.shape)[pick[2].cpu()]
        else:
            base, moved = src, False
            where = torch.arange(src.numel()).view(src.shape)
        try:
            at = func(where, *[a.cpu() if isinstance(a, torch.Tensor) else a for a in args[1:]], **kwargs)
        except Exception:  # (an op the places cannot take as the ids did: not followed)
            return
        if not isinstance(at, torch.Tensor) or tuple(at.shape) != tuple(out.shape):
            return
        if name in ("__getitem__", "index_select"):
            if int(at.numel()) != int(base.numel()) or int(at.unique().numel()) != int(at.numel()):
                return  # (some of the ids, or one twice: no reorder of the whole batch)
            moved = moved or not torch.equal(at.sort(1).values, at) or not torch.equal(at.sort(0).values, at)
        _hold(self._id_moves, out, base, at, moved)

    def on_embedding(self, args, out) -> None:
        ids = args[0]
        if (
            isinstance(ids, torch.Tensor)
            and isinstance(out, torch.Tensor)
            and not ids.is_floating_point()
            and len(args) > 1
            and _is_param(args[1])
            and out.dim() == ids.dim() + 1
            and self._fixed_ids(ids)
        ):  # learned vectors picked by fixed indices (a prefix, object queries, a position table): the
            parts = [w for w in self.path().split(".") if w and not w.isdigit()]  # rows of a table, as a
            name = parts[-1] if parts else "embedding"  # parameter's are, named by its module
            start = self.sources.new(ids.numel(), "param", name)
            self.set(
                out,
                _Tag("param", code=lineage.fresh(start, tuple(ids.shape), int(out.shape[-1]), out.device)),
            )
            return
        if isinstance(ids, torch.Tensor) and ids.dim() >= 1 and not ids.is_floating_point():
            self.cap.lengths.add(int(ids.shape[-1]))
            with contextlib.suppress(RuntimeError, NotImplementedError):
                self.cap.id_storages.add(ids.untyped_storage().data_ptr())
            if ids.dim() == 2 and ids.shape[0] > 1:  # (B, L), or (L, B) in sequence-first code (torchtext)
                self.cap.lengths.add(int(ids.shape[0]))
            if ids.dim() >= 2 and self.batch is None:
                self.batch = int(ids.shape[0])
            if self.first_len is None:
                self.first_len = int(ids.shape[-1])
        if isinstance(out, torch.Tensor):
            code = None
            if isinstance(ids, torch.Tensor) and out.dim() == ids.dim() + 1:
                # ids that are the caller's rows in another order (``ids[perm_idx]``): each row the positions
                # of the caller's row it is
                pick = _held(self._row_picks, ids)
                moves = _held(self._id_moves, ids) if pick is None else None
                if moves is not None and moves[3] and self._moved_ids(ids, moves, args, out):
                    return
                row = self._row_of(ids, args[1]) if pick is None and len(args) > 1 else None
                if row is not None:  # a row of ids whose rows are looked up one at a time: that source's row
                    base, start, origin, at = row
                    code = lineage.fresh(start, tuple(base.shape), int(out.shape[-1]), out.device)[at]
                    self.set(out, _Tag(origin=frozenset({origin}), code=code))
                    return
                src = pick[1] if pick is not None else ids
                start = self.sources.new(src.numel(), "tokens", str(self.n_embed), self.n_embed,
                                         int(src.shape[-1]) if src.dim() else 1, table=_table_id(args),
                                         lead=tuple(int(n) for n in src.shape[:-1]))  # fmt: skip
                self._id_memory[start] = (_storage_at(src), src.dim())
                if pick is None and self._constant_ids(ids):
                    self._constant_lookups.add(start)
                code = lineage.fresh(start, tuple(src.shape), int(out.shape[-1]), out.device)
                if pick is not None:
                    code = code[pick[2].to(code.device)]
            self.set(out, _Tag(origin=frozenset({self.n_embed}), code=code))
            self.n_embed += 1

    def _moved_ids(self, ids: torch.Tensor, moves: tuple, args, out: torch.Tensor) -> bool:
        """The embedding of ids moved from the caller's (``_ids_moved``): each element the position it has
        among them, so the rows of a batch sorted inside the model are still the caller's sequences."""
        base, at = moves[1], moves[2]
        if not isinstance(base, torch.Tensor) or base.device != ids.device and base.device.type != "cpu":
            return False
        start = self.sources.new(base.numel(), "tokens", str(self.n_embed), self.n_embed, int(base.shape[-1]),
                                 table=_table_id(args))  # fmt: skip
        self._id_memory[start] = (_storage_at(base), base.dim())
        f = int(out.shape[-1])
        code = lineage.fresh(start, tuple(base.shape), f, out.device).reshape(-1, f)
        code = code[at.reshape(-1).to(code.device)].view(*ids.shape, f)
        self.set(out, _Tag(origin=frozenset({self.n_embed}), code=code))
        self.n_embed += 1
        return True

    def _row_of(self, ids: torch.Tensor, table: Any) -> tuple[torch.Tensor, int, int, int] | None:
        """Where ``ids`` is one sentence, a row of a tensor (a view: ``for s in ids``, ``ids[i]``) that no write
        changed since, looked up in the same table: (that tensor, the start and origin of its source, the row),
        one source for every row of it, so a loop over the sentences reads one input, row by row. The first
        row looked up makes the source; None for ids of their own."""
        base = ids._base
        if (
            not isinstance(base, torch.Tensor)
            or base.dim() != ids.dim() + 1
            or ids.dim() != 1
            or tuple(base.shape[1:]) != tuple(ids.shape)
            or tuple(base.stride()[1:]) != tuple(ids.stride())
            or base.stride(0) <= 0
            or base.device != ids.device
        ):
            return None
        off = ids.storage_offset() - base.storage_offset()
        row = off // base.stride(0)
        if off % base.stride(0) or not 0 <= row < int(base.shape[0]):
            return None
        version = _version_of(base)
        key = (id(base), id(table))
        held = self._row_sources.get(key)
        if held is not None and held[0]() is base and version is not None and held[1] == version:
            return base, held[2], held[3], row
        if version is None:
            return None  # (an inference tensor: no version tells a write since)
        start = self.sources.new(
            base.numel(), "tokens", str(self.n_embed), self.n_embed, int(base.shape[-1]), table=id(table)
        )
        if self._constant_ids(base):
            self._constant_lookups.add(start)
        self._row_sources[key] = (weakref.ref(base), version, start, self.n_embed)
        self._id_memory[start] = (_storage_at(base), base.dim())
        self.n_embed += 1
        return base, start, self.n_embed - 1, row

    # -- lineage codes --------------------------------------------------------------------------------
    def code_of(self, t: Any, columns: bool = False) -> torch.Tensor | None:
        """The lineage codes of a tensor: its tag's; a parameter's rows; a tensor from outside the call (read
        as its rows' positions, or where ``columns``, the batched right operand of a product, its columns': the
        keys of ``q @ k_cached.transpose(-1, -2)``, a cross-attention's keys projected before the call)."""
        if not isinstance(t, torch.Tensor):
            return None
        param = _is_param(t)
        if not param:
            tagged = self._tags.get(id(t))
            if tagged is not None and tagged[0]() is t:
                return tagged[1].code
        entry = self._fixed_codes.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        if not t.is_floating_point() or t.dim() == 0:
            return None
        if param and t.numel() > MAX_PARAM_CODES:
            return None  # a weight matrix (a tied vocabulary projection), not learned positions
        pick = None if param else _held(self._row_picks, t)
        if pick is not None:  # rows of a tensor from outside put in another order (``torch.roll(img, 1, 0)``)
            base = self.code_of(pick[1])
            if base is not None and int(base.shape[0]) == int(pick[1].shape[0]):
                code = base[pick[2].to(base.device)]
                self._fixed_codes[id(t)] = (weakref.ref(t), code)
                return code
        if (
            columns and not param and t.dim() >= 3
        ):  # (batched: a table (d, C) handed in is no sequence's keys)
            turned = self.code_of(t.transpose(-1, -2))
            if turned is not None:
                code = turned.transpose(-1, -2)
                self._fixed_codes[id(t)] = (weakref.ref(t), code)
                return code
        base = None if param else t._base
        if (
            base is not None
            and base.dim() == t.dim() >= 2
            and tuple(base.shape[:-1]) == tuple(t.shape[:-1])
            and base.stride() == t.stride()
            and base.is_floating_point()
        ):  # a run of the features of a tensor from outside (``x.chunk(heads, -1)``, one head's each): its
            # positions, and those features
            at, step = t.storage_offset() - base.storage_offset(), int(base.stride(-1))
            whole = self.code_of(base) if step > 0 and at % step == 0 else None
            if whole is not None and 0 <= at // step <= int(base.shape[-1]) - int(t.shape[-1]):
                code = whole.narrow(-1, at // step, int(t.shape[-1]))
                self._fixed_codes[id(t)] = (weakref.ref(t), code)
                return code
        lead = tuple(t.shape[:-1])
        if param:
            if self._param_names is None:
                self._param_names = {id(p): n for n, p in self.model.named_parameters(remove_duplicate=False)}
            full = self._param_names.get(id(t), "learned")
            path = ".".join(w for w in full.split(".") if w not in ("weight", "bias"))
            start = self.sources.new(math.prod(lead), "param", _param_label(full), path=path)
        else:
            start = self.sources.new(
                math.prod(lead),
                "external",
                "input",
                ("in", self.n_inputs),
                lead[-1] if lead else 0,
                lead=tuple(int(n) for n in lead),
            )
            self.n_inputs += 1
        code = lineage.fresh(start, lead, int(t.shape[-1]), t.device, raw=True)
        self._fixed_codes[id(t)] = (weakref.ref(t), code)
        return code

    def _heads_concatenated(self, name: str, args, kwargs, out: torch.Tensor) -> None:
        """The outputs of the last k single-head maps joined along their features (``torch.cat([h(x) for h in
        self.att_list], -1)``), or stacked just before them (TFT's ``torch.stack(heads, dim=2)`` of one shared
        attention module called per head): heads of one layer, joined into one record at the end."""
        parts = args[0] if args and isinstance(args[0], (list, tuple)) else None
        if parts is None or not parts or not all(isinstance(t, torch.Tensor) for t in parts):
            return
        if len(parts) > 1 and all(_whole_weights(self.tag(t)) is not None for t in parts):
            self._weights_stacked(name, args, kwargs, list(parts), out)
            return
        if name == "stack":
            d = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if isinstance(d, int) and d % out.dim() == 0 and out.dim() >= 3:
                # one sequence each, stacked into a batch (``torch.stack(result)`` after the loop)
                self._sequences_concatenated(parts)
                return
            if not isinstance(d, int) or d % out.dim() == out.dim() - 1:
                return  # (a new last axis: the features' own, no heads' axis)
        else:
            d = _cat_dim(name, args, kwargs, out)
            if d == 0 and out.dim() >= 2 and all(t.shape[0] == 1 for t in parts):
                # one sequence each (a loop over the batch inside the model), joined into a batch
                self._sequences_concatenated(parts)
                return
            if d != out.dim() - 1:
                if not self._features_at(list(parts), d):
                    return  # joined along positions: chunks of a sequence, not heads
                # (heads' outputs laid out features first, joined along them: EfficientViT's cascaded group
                # attention, ``torch.cat(feats_out, 1)`` of (B, d, H, W) outputs)
                self._heads_group(list(parts))
                return
            self._heads_merged(list(parts), out)
        self._heads_group(list(parts))

    def _features_at(self, parts: list[torch.Tensor], d: int) -> bool:
        """Whether lineage shows axis ``d`` of every part holding features of the same positions: each element
        along it from one position, and every part over the same positions (the heads' outputs of one layer,
        laid out features first); False where lineage cannot say."""
        if len(parts) < 2:
            return False
        codes = [self.code_of(t) for t in parts]
        pos = []
        for c, t in zip(codes, parts, strict=True):
            if c is None or tuple(c.shape) != tuple(t.shape) or not 0 <= d < t.dim():
                return False
            p = c >> lineage.SHIFT
            if not torch.equal(p, p.narrow(d, 0, 1).expand_as(p)):
                return False
            pos.append(p.narrow(d, 0, 1))
        return all(torch.equal(p, pos[0]) for p in pos[1:])

    def _heads_merged(self, parts: list[torch.Tensor], out: torch.Tensor) -> None:
        """Single-head maps' outputs joined along their features, each as its product gave it (Karpathy's
        ``torch.cat([h(x) for h in self.heads], dim=-1)``): the columns of the join each head's value features
        hold, for the projection that reads it (``_out_projection``)."""
        if not self._pending:
            return
        heads: list[tuple[str, torch.Tensor, _Probs]] = []
        at = 0
        for t in parts:
            g = self.tag(t)
            width = int(t.shape[-1])
            if g is not None and g.attn_out is not None and g.moved and g.attn_out in self._pending:
                code = self.code_of(t)
                entry = self._pending[g.attn_out]
                if g.made_by is not None:  # (its own product's, where a loop pended several under one path)
                    entry = self._pended.get(id(g.made_by), entry)
                    if entry[0] is not g.made_by:
                        at += width
                        continue
                vcodes = entry[1]()
                cols = None
                if code is not None and vcodes is not None and int(vcodes.shape[1]) == 1:
                    cols = values_.head_columns(vcodes, code)  # (1, dv): the part's own columns
                if cols is not None and int(cols.numel()) == width:
                    heads.append((g.attn_out, cols + at, entry[0]))
            at += width
        if len(heads) != len(parts) or len({id(p) for _, _, p in heads}) < len(heads):
            return  # (a context joined to something else: Luong's [c; h_t] is no heads merged back)
        if heads:
            if len(self._merged_heads) >= HELD:
                self._merged_heads.clear()
            self._merged_heads[id(out)] = (weakref.ref(out), heads)
            self._layer_values([p for _, _, p in heads])  # (the values alone, until a projection reads them)

    def _layer_values(self, ps: list[_Probs]) -> None:
        """Single-head maps joined into their layer's record as they were made (a list of head modules): the
        layer's values, each head's in its place, with their W_O slices where each head has its own."""
        joined = [p.joined for p in ps if p.joined is not None]
        if not joined or len({at for at, _ in joined}) != 1 or joined[0][0] >= len(self.cap.records):
            return
        at = joined[0][0]
        layer = self.cap.records[at]
        order = sorted(ps, key=lambda p: p.joined[1] if p.joined is not None else 0)
        offsets = [p.joined[1] if p.joined is not None else 0 for p in order]
        if offsets != list(range(int(layer.probs.shape[1]))) or any(p.record is None for p in order):
            return
        if order[0].joined is None and order[0].record is not None and order[0].record.seq != layer.seq:
            return  # (the first head: the record the layer's began as)
        parts = [p.record.values if p.record is not None else None for p in order]
        values = parts[0]
        for v in parts[1:]:
            values = _head_values_joined(values, v)
        if values is not None:
            self.cap.records[at] = _replaced(layer, values=values)

    def _weights_stacked(self, name: str, args, kwargs, parts: list[torch.Tensor], out: torch.Tensor) -> None:
        """Single-head maps' weights joined along a new axis before the queries and keys (``torch.stack(ws,
        dim=1)``, ``cat`` of them unsqueezed): held, and where the joined weights multiply values (a loop over
        the heads, each softmaxed alone, then one product) their records are one layer's heads in the order
        joined (a stack of each layer's map returned for display multiplies nothing: layers stay layers)."""
        d = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if not isinstance(d, int) or out.dim() < 3:
            return
        d %= out.dim()
        if d >= out.dim() - 2 or (name != "stack" and any(int(t.shape[d]) != 1 for t in parts)):
            return  # (joined along the queries or keys: chunks, not heads)
        made = [_whole_weights(self.tag(t)) for t in parts]
        group = [p.record for p in made if p is not None and p.record is not None]
        if len(group) != len(parts) or len({id(r) for r in group}) != len(group):
            return
        if any(r.probs.shape[1] != 1 or r.name != group[0].name for r in group):
            return
        if not all(_same_layer(group[0], r) and _same_places(group[0], r) for r in group[1:]):
            return
        _hold(self._stacked, out, [r.seq for r in group], group[0].name, made)

    def _stacked_used(self, args, kwargs) -> None:
        """Weights joined by ``_weights_stacked`` multiplied by values: their records grouped as one layer's heads
        (joined at finish), each one's weights used."""
        ts = _tensors(args, kwargs)
        if not ts:
            return
        mix = _held_or_base(self._stacked_mix, ts[0]) if self._stacked_mix else None
        if mix is not None:
            self._mix_used(mix)
            return
        entry = _held_or_base(self._stacked, ts[0])
        if entry is None:
            return
        _, seqs, layer, _ = entry
        self._stacked.pop(id(entry[0]()), None)
        if self._seqs_as_heads(seqs, layer):
            self._weighed.update(seqs)

    def _seqs_as_heads(self, seqs: list[int], layer: str) -> bool:
        """The records made at ``seqs`` grouped as one layer's heads, in that order (joined at finish); False
        where one of them is gone or already in a group."""
        at = {r.seq: i for i, r in enumerate(self.cap.records)}
        places = [at.get(seq, -1) for seq in seqs]
        if -1 in places or any(i in places for group, _, _, _ in self._head_groups for i in group):
            return False
        self._head_groups.append((places, list(seqs), layer, len(seqs)))
        return True

    def _stacked_reduced(self, args, kwargs, out: Any) -> None:
        """Weights joined by ``_weights_stacked`` reduced (``.mean(1)`` over the heads): held, and where the mix
        multiplies values (``_stacked_used``), no record holds what they are multiplied with, so every head's
        record is flagged (a mix kept for a loss alone leaves them as they are)."""
        t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        entry = _held_or_base(self._stacked, t) if t is not None else None
        if entry is None or not isinstance(out, torch.Tensor):
            return
        _, seqs, layer, made = entry
        _hold(self._stacked_mix, out, seqs, layer, made, _MIXED_HEADS, False)

    def _stacked_scaled(self, args, out: Any) -> None:
        """Weights joined by ``_weights_stacked`` multiplied or divided element by element (a temperature, a
        per-head gate): held, and where they multiply values the heads are one layer's, each flagged as changed."""
        if not isinstance(out, torch.Tensor):
            return
        for t in args[:2]:
            entry = _held_or_base(self._stacked, t) if isinstance(t, torch.Tensor) else None
            if entry is not None and tuple(out.shape) == tuple(t.shape):
                _, seqs, layer, made = entry
                _hold(self._stacked_mix, out, seqs, layer, made, _SCALED_HEADS, True)
                return

    def _mix_used(self, entry) -> None:
        """A mix of joined heads' weights multiplied by values: every head's record flagged, and used."""
        self._stacked_mix.pop(id(entry[0]()), None)
        _, seqs, layer, made, why, join = entry
        self._weighed.update(seqs)
        for p in made:
            self._flag_unless_used(p, why)
        if join:
            self._seqs_as_heads(seqs, layer)

    def _heads_group(self, parts: list[torch.Tensor]) -> None:
        """``parts``, the outputs of single-head maps in their heads' order: one layer's heads, grouped to be
        joined into one record at the end."""
        paths, made = [], []
        for t in parts:
            g = self.tag(t)
            if g is None or g.attn_out is None or g.probs is not None:
                return
            paths.append(g.attn_out)
            made.append(g.made_by.record if g.made_by is not None else None)
        if not self._same_positions(parts):  # each part another query's output (a decoder's steps
            return  # stacked along time after a loop over them), not one query's heads
        records, k = self.cap.records, len(paths)
        at = {id(r): i for i, r in enumerate(records)}
        places = [at.get(id(r), -1) if r is not None else -1 for r in made]
        if -1 in places:  # (weights that no record holds as they are now: the maps just made, in order)
            places = list(range(len(records) - k, len(records)))
        # the records of the parts' own weights, wherever they were made (a loop over the heads outside a
        # loop over the sequences makes one sequence's heads every other map)
        if (
            places[0] < 0
            or len(set(places)) != k
            or any(i in places for group, _, _, _ in self._head_groups for i in group)
        ):
            return
        group = [records[i] for i in places]
        if any(r.name != p or r.probs.shape[1] != 1 for r, p in zip(group, paths, strict=True)):
            return
        if not all(_same_layer(group[0], r) and _same_places(group[0], r) for r in group[1:]):
            return
        words = [p.split(".") for p in paths]
        common = []
        for w in zip(*words, strict=False):
            if len(set(w)) > 1:
                break
            common.append(w[0])
        self._head_groups.append(
            (places, [r.seq for r in group], ".".join(common) if common else paths[0], k)
        )

    def _head_written(self, target: torch.Tensor, index: Any, value: torch.Tensor) -> None:
        """``out[:, h] = attention of head h`` (a buffer filled a head at a time, the heads axis after the
        batch's): once every head of the buffer is written, the heads are grouped as a ``cat`` of them would
        be (``_heads_group``), in the buffer's order, whatever order the calls ran in."""
        if not (
            isinstance(index, tuple)
            and len(index) == 2
            and index[0] == slice(None)
            and type(index[1]) is int
            and target.dim() == value.dim() + 1 >= 3
            and tuple(target.shape[:1]) + tuple(target.shape[2:]) == tuple(value.shape)
        ):
            return
        n, h = int(target.shape[1]), index[1] % int(target.shape[1])
        held = _held(self._head_slots, target)
        slots: dict[int, torch.Tensor] = held[1] if held is not None else {}
        if held is None:
            _hold(self._head_slots, target, slots)
        slots[h] = value
        if len(slots) == n and n > 1:
            self._heads_group([slots[i] for i in range(n)])
            slots.clear()

    def _unused_beside(self) -> builtins.set[int]:
        """``Record.seq`` of the softmax maps whose weights multiplied no values, made in one call of a module
        beside a map that did (its attention): a relation kept for a loss (MiniLM's value relation
        ``softmax(v v^T)`` returned beside the attention), not attention the model computed with, and not
        another head or layer of it."""
        calls: dict[int, list[Record]] = {}
        for r in self.cap.records:
            no = self._call_of.get(r.seq)
            if no is not None:
                calls.setdefault(no, []).append(r)
        unused: builtins.set[int] = set()
        for rs in calls.values():
            used = [r.source != "softmax" or r.seq in self._weighed for r in rs]
            if any(used) and not all(used):
                unused.update(r.seq for r, u in zip(rs, used, strict=True) if not u and r.flag is None)
        return unused

    def _rows_joined(self, records: list[Record]) -> None:
        """Join the records a loop over the sentences left apart: records of one module, each over rows of one
        input that the others of the module do not read (``for s in ids`` calling a layer, or its heads, a
        sentence at a time), made one row after another. Each row's k-th record (its k-th layer, when the
        loop calls the module for several) is joined with the other rows' k-th into one record of the batch,
        rows in the input's order. Records of one row (layers, a decoder's steps) are never joined so."""
        by_name: dict[tuple[str, int], list[int]] = {}  # (one call of the model's: never across its runs)
        for i, r in enumerate(records):
            by_name.setdefault((r.name, self.cap.call_of(r)), []).append(i)
        if all(len(places) < 2 for places in by_name.values()):
            return  # (no module called more than once: nothing to join, and nothing to ask of lineage)
        rows_of: dict[int, tuple[int, tuple[int, ...]]] = {}  # id(record) -> (source, its rows)
        for places in by_name.values():
            for r in (records[i] for i in places) if len(places) > 1 else ():
                kp, qp = r.key_positions, r.query_positions
                # (self-attention recorded from a call's arguments, nn.MultiheadAttention's: its keys are its
                # queries' sequence)
                if kp is None and r.kind != "cross":
                    kp = qp
                if not r.exact or kp is None or qp is None or bool((kp < 0).any()) or bool((qp < 0).any()):
                    continue
                pos = torch.cat([kp, qp], dim=-1)
                src = self.sources.index(pos)
                if not bool((src == src.reshape(-1)[0]).all()):
                    continue
                rows = self.sources.rows(pos)
                if not bool((rows == rows[:, :1]).all()):
                    continue  # (a record row over several rows of its input: no sentence each)
                rows_of[id(r)] = (int(src.reshape(-1)[0]), tuple(rows[:, 0].tolist()))
        joined: dict[int, Record] = {}
        for places in by_name.values():
            if len(places) < 2 or any(id(records[i]) not in rows_of for i in places):
                continue
            segments: list[list[int]] = [[places[0]]]  # one sentence's (rows') records, in order
            for i in places[1:]:
                if rows_of[id(records[i])] == rows_of[id(records[segments[-1][0]])]:
                    segments[-1].append(i)
                else:
                    segments.append([i])
            if len(segments) < 2 or len({len(seg) for seg in segments}) != 1:
                continue
            keys = [rows_of[id(records[seg[0]])] for seg in segments]
            if len({k[0] for k in keys}) != 1 and not self._whole_inputs(keys):
                continue  # (other inputs: not rows of one batch)
            if (
                len({k[0] for k in keys}) == 1
                and self._id_memory.get(self.sources.items[keys[0][0]].start, (None, 0))[1] != 2
            ):
                continue  # (rows of ids (B, L), each a sequence; rows of (B, S, L) are a user's sessions)
            seen_rows = [row for k in keys for row in k[1]]
            if len(set(seen_rows)) != len(seen_rows):
                continue  # (a row read again: not one sentence each)
            order = sorted(range(len(segments)), key=lambda j: keys[j][1][0])
            for k in range(len(segments[0])):
                parts = [records[segments[j][k]] for j in order]
                one = _sequences_joined(parts)
                if one is None or one.probs.shape[0] != len(seen_rows):
                    break
                for seg in segments:
                    joined[seg[k]] = one
        if joined:
            for i, one in joined.items():
                records[i] = one
            seen: set[int] = set()
            records[:] = [r for r in records if not (id(r) in seen or seen.add(id(r)))]  # type: ignore[func-returns-value]

    def _whole_inputs(self, keys: list[tuple[int, tuple[int, ...]]]) -> bool:
        """Whether each (source, rows) is all of an input of its own, a different one each: sentences handed
        in as separate tensors (a list of id tensors, as a tokenizer gives them), one call each."""
        if len({k[0] for k in keys}) != len(keys):
            return False
        memory = set()
        for src, rows in keys:
            item = self.sources.items[src]
            n_rows = max(item.n // item.row, 1) if item.row else 1
            if item.kind != "tokens" or len(rows) != n_rows or n_rows != 1:
                return False
            held = self._id_memory.get(item.start, (None, 0))
            if held[1] != 1:  # (a sentence's ids, 1-D: a batch of one, (1, L), may be one of a user's
                return False  # sessions handed in as tensors of their own, as DSIN's are)
            memory.add(held[0])
        # (ids of their own each: a buffer embedded again at each step of a decoding loop is one memory)
        return not memory & {None, 0} and len(memory) == len(keys)

    def _group_places(self) -> dict[int, tuple[tuple[int, int], int]]:
        """Every place of a head group (heads whose outputs were joined along the features): (group, which of
        its sequences), head."""
        group_of: dict[int, tuple[tuple[int, int], int]] = {}
        for g, (places, _, _, per) in enumerate(self._head_groups):
            for at, i in enumerate(places):
                group_of[i] = ((g, at // per), at % per)
        return group_of

    def _heads_over_sequences(
        self, joined_runs: list[tuple[list[int], Record]], group_of: dict[int, tuple[tuple[int, int], int]]
    ) -> None:
        """Join into one layer the heads of a loop over the heads inside a loop over the sequences (a numpy
        port: each head's weights a matrix of a ``ParameterList``, each call one sequence's ``(T, T)`` map).
        Each run joined one head over the sequences (its maps at the same place in each sequence's calls);
        each sequence's heads were grouped where their outputs are joined along the features. Runs whose
        maps are the same head of the same groups, one run per head, are one record: the runs' heads side by
        side, every run's sequences in the same order."""
        records, groups = self.cap.records, self._head_groups
        by_groups: dict[tuple[tuple[int, int], ...], dict[int, tuple[list[int], Record]]] = {}
        twice: set[tuple[tuple[int, int], ...]] = set()
        for places, rec in joined_runs:
            where = [group_of.get(i) for i in places]
            if any(w is None for w in where) or rec.probs.shape[1] != 1:
                continue
            gs, hs = [w[0] for w in where if w], {w[1] for w in where if w}
            if len(hs) != 1 or len(set(gs)) != len(gs):
                continue
            key, h = tuple(sorted(gs)), hs.pop()
            heads = by_groups.setdefault(key, {})
            if h in heads:
                twice.add(key)  # (a head twice: no one layer)
            heads[h] = (places, rec)
        for key, heads in by_groups.items():
            per = groups[key[0][0]][3]
            whole = {g for g, _ in key}  # (every sequence of each group it takes)
            if (
                key in twice
                or sorted(heads) != list(range(per))
                or any(groups[g][3] != per for g in whole)
                or sum(len(groups[g][0]) for g in whole) != per * len(key)
            ):
                continue
            layer, out = groups[key[0][0]][2], heads[0][1]
            for h in range(1, per):
                r = heads[h][1]
                if not (_same_layer(out, r) and _equal_positions(out.query_positions, r.query_positions)
                        and _equal_positions(out.key_positions, r.key_positions)):  # fmt: skip
                    break  # (the heads' sequences in another order, or other queries or keys)
                out = _heads_joined(out, r, layer)
            else:
                for places, _ in heads.values():
                    for i in places:
                        records[i] = out
                for g in whole:  # (joined: its heads are in this record now)
                    groups[g] = ([], [], groups[g][2], per)

    def _same_positions(self, parts) -> bool:
        """Whether every part holds the same positions, row for row (heads of one layer do; the outputs
        of a decoder's steps each hold their own step's); True where lineage cannot say."""
        codes = [self.code_of(t) for t in parts]
        if any(c is None or tuple(c.shape) != tuple(t.shape) for c, t in zip(codes, parts, strict=True)):
            return True
        pos = [c >> lineage.SHIFT for c in codes if c is not None]
        return all(torch.equal(p, pos[0]) for p in pos[1:])

    def _sequences_concatenated(self, parts) -> None:
        """Outputs of attention run one sequence at a time (a loop over the batch inside the model),
        each sequence's heads grouped by ``_heads_concatenated``, joined along dim 0: the last k groups
        become one record of k sequences at the end."""
        for t in parts:
            g = self.tag(t)
            if g is None or g.attn_out is None or g.probs is not None:
                return
        k, groups, records = len(parts), self._head_groups, self.cap.records
        if k < 2 or len(groups) < k:
            return
        tail = groups[-k:]
        per = tail[0][3]
        places = [i for g in tail for i in g[0]]
        if any(g[3] != per or len(g[0]) != per for g in tail):
            return  # a group of sequences already, or groups of other head counts
        if sorted(places) != list(range(len(records) - len(places), len(records))):
            return  # other maps among them (the groups' maps may be made in another order: heads outer)
        if any(records[i].probs.shape[0] != 1 or records[i].name != records[places[0]].name for i in places):
            return
        del groups[-k:]
        groups.append((places, [records[i].seq for i in places], tail[0][2], per))

    def _view_tag(self, t: torch.Tensor) -> _Tag | None:
        """The tag of an untagged view of a tagged tensor from outside (``x.T`` beside ``x`` in
        ``x @ x.T``): its codes are the base's codes viewed the same way."""
        base = t._base
        g = self.tag(base) if isinstance(base, torch.Tensor) else None
        if (
            g is None
            or g.code is None
            or base is None
            or not base.is_contiguous()
            or not g.code.is_contiguous()
        ):
            return None
        if tuple(g.code.shape) != tuple(base.shape) or t.device != base.device:
            return None
        try:
            code = g.code.as_strided(t.size(), t.stride(), t.storage_offset() - base.storage_offset())
        except RuntimeError:
            return None
        tag = _Tag(origin=g.origin, code=code)
        self.set(t, tag)
        return tag

    def _own_positions(self, codes: list[torch.Tensor]) -> torch.Tensor:
        """Of operands summed position by position that hold different positions (a token shift: FoX's
        ``0.3 * F.pad(k, (0, 0, 1, -1)) + 0.7 * k``, ``torch.lerp(shifted, k, w)``), the codes of the first
        whose positions hold no padding or learned one where another's do: the unshifted operand, whose row
        j is token j (the shifted one's first row is padding). Else the first operand's."""
        key = (
            "own positions",
            *(id(c) for c in codes),
            self._sources_key(),
            tuple(sorted(self._constant_lookups)),
        )
        hit = lineage.recall(key)
        if hit is not lineage.MISS:
            return hit
        pick = codes[0]
        if codes[0].dim() >= 1:
            pos = [c.select(-1, 0) >> lineage.SHIFT for c in codes]
            written = [c for c, p in zip(codes, pos, strict=True) if not bool(self.sources.empty(p).all())]
            if written and len(written) < len(codes):  # (a buffer nothing was written to, zeroed, plus
                codes, pos = written, [c.select(-1, 0) >> lineage.SHIFT for c in written]  # what is added)
                pick = codes[0]
            typed = [self._looked_up_constant(p) for p in pos]
            # a token type's vector added (ViLT's image type onto patches after a [CLS]): the sequence's
            # positions, where another operand holds some (not only learned ones: a position table's)
            seq = [
                c
                for c, t, p in zip(codes, typed, pos, strict=True)
                if not t and not bool(self.sources.learned(p).all())
            ]
            if any(typed) and seq:
                pick = seq[0]
            elif any(not torch.equal(p, pos[0]) for p in pos[1:]) and all(bool((p >= 0).all()) for p in pos):
                made = [bool(self.sources.learned(p).any()) for p in pos]
                clean = [c for c, m in zip(codes, made, strict=True) if not m]
                if clean and any(made):
                    pick = clean[0]
        return lineage.remember(key, tuple(codes), pick)

    def _looked_up_constant(self, pos: torch.Tensor) -> bool:
        """Whether every position of ``pos`` is a lookup of one id the model made or keeps (a token type)."""
        if not self._constant_lookups or not pos.numel():
            return False
        flat = pos.reshape(-1)
        src = self.sources.at(int(flat[0]))
        if src.start not in self._constant_lookups:
            return False
        return bool(((flat >= src.start) & (flat < src.start + max(src.n, 1))).all())

    def _outside_chain(self, x: torch.Tensor) -> tuple[weakref.ref, tuple]:
        """The tensor from outside ``x`` was made from, and the steps that made it: ``x`` itself and none, or
        the chain of moves (``x[:, 1:]``) or arithmetic (``x * mask[..., None]``) from the tensor handed in."""
        held = self._outside_pools.get(id(x))
        if held is not None and held[0]() is x:
            return held[1], held[2]
        moved = self._outside_moves.get(id(x))
        if moved is not None and moved[0]() is x:
            return moved[1], tuple(("move", func, rest, kw) for func, rest, kw in moved[2])
        return weakref.ref(x), ()

    def _hold_pool(self, out: torch.Tensor, root: weakref.ref, steps: tuple, pooled: bool) -> None:
        if len(self._outside_pools) >= HELD:
            self._outside_pools.clear()
        self._outside_pools[id(out)] = (weakref.ref(out), root, steps, pooled)

    def _outside_arithmetic(self, name: str, ins: list[torch.Tensor], out: torch.Tensor) -> None:
        """Two tensors from outside, element by element: a mean over a tensor handed in divided by a count
        (``sum / mask.sum(1)``), or that tensor weighted by a broadcast mask before it is pooled
        (``(x * m[..., None]).sum(1)``): the result keeps the chain, so the mean joined to the tensor is a
        position pooled from it (``_pools_joined``). Two tensors of the result's shape: neither is the one."""
        shape = tuple(out.shape)
        full = [t for t in ins if tuple(t.shape) == shape]
        if len(full) != 1:
            return
        a = full[0]
        held = self._outside_pools.get(id(a))
        if held is not None and held[0]() is a:
            self._hold_pool(out, held[1], (*held[2], ("same",)), held[3])
        elif (
            name in MUL
            and a.is_floating_point()
            and a.dim() >= 3
            and not _is_param(a)
            and _held(self._int_floats, a) is None
        ):
            root, steps = self._outside_chain(a)
            self._hold_pool(out, root, (*steps, ("same",)), False)

    def _pools_joined(self, parts: list[torch.Tensor]) -> None:
        """A mean (or sum) over the positions of a tensor from outside, joined to that tensor's positions
        (CLIP's AttentionPool2d written by hand: ``cat([x.mean(1, keepdim=True), x], 1)`` over features handed
        in; a masked mean, a mean over a slice of them, divided or unsqueezed on the way): the tensor enters
        here, and the mean is a position pooled from it (labelled so), not another input."""
        for p in parts:
            held = self._outside_pools.get(id(p))
            if held is None or held[0]() is not p or not held[3] or self.tag(p) is not None:
                continue
            x = held[1]()
            if x is None or not any(x is q for q in parts):
                continue
            xt = self.tag(x) or self._external(x)
            code = xt.code
            try:
                for step in held[2]:
                    if code is None:
                        break
                    if step[0] == "move":
                        code = step[1](code, *step[2], **step[3])
                    elif step[0] == "pool":
                        shaped = torch.empty(step[3], device="meta")
                        code = self._reduced_code((code, *step[1]), step[2], code, shaped)
            except Exception:  # (a step the codes cannot take as the tensor did: not placed)
                code = None
            if isinstance(code, torch.Tensor) and tuple(code.shape) == tuple(p.shape):
                self.set(p, _Tag(origin=xt.origin, code=code))

    def _features_tokenized(self, ins: list[torch.Tensor], out: torch.Tensor) -> bool:
        """A feature tokenizer: each feature of a row scales a learned vector of its own (``weight[None] *
        x_num[:, :, None]``, rtdl's FT-Transformer and lucidrains' NumericalEmbedder; the features along the
        second-last axis, one position per row, times a parameter (F, d)), so each (row, feature) is a token,
        a position of its own. A column the model made (rtdl's ``torch.ones`` column before the features, its
        [CLS]) is the learned vector itself: its row of the parameter. False for any other product."""
        for a, w in ((ins[0], ins[1]), (ins[1], ins[0])):
            wt = self.tag(w)
            if not (_is_param(w) or (wt is not None and wt.role == "param")) or _is_param(a):
                continue
            n_f = int(a.shape[-2]) if a.dim() >= 2 else 0
            if (
                a.dim() < 2
                or int(a.shape[-1]) != 1
                or n_f < 2
                or w.dim() < 2
                or int(w.shape[-2]) != n_f
                or out.dim() != a.dim()
                or tuple(out.shape[:-1]) != tuple(a.shape[:-1])
                or int(out.shape[-1]) != int(w.shape[-1])
                or int(out.shape[-1]) < 2
                or not a.is_floating_point()
            ):
                continue
            at = self.tag(a)
            if at is not None and (at.role not in (None, "linear") or at.probs is not None):
                continue
            ac = self.code_of(a)
            if ac is None or tuple(ac.shape) != tuple(a.shape):
                continue
            pos = ac[..., 0] >> lineage.SHIFT  # (*rows, F)
            if bool((pos != pos[..., :1]).any()) or bool(
                self.sources.learned(pos[..., :1].reshape(-1)).any()
            ):
                continue  # (features of several positions, or of a learned vector: not one row's features)
            rows, d = tuple(out.shape[:-2]), int(out.shape[-1])
            n = math.prod(rows) * n_f
            start = self.sources.new(n, "external", "input", ("in", self.n_inputs), n_f, lead=(*rows, n_f))
            self.n_inputs += 1
            at_ = (start + torch.arange(n, dtype=torch.int64, device=out.device)).view(*rows, n_f, 1)
            code = (at_ << lineage.SHIFT) | torch.arange(d, dtype=torch.int64, device=out.device)
            made = _held(self._made_columns, a) or _held(self._made_columns, a._base)
            wc = self.code_of(w) if made else None
            if made and wc is not None and tuple(wc.shape[-2:]) == (n_f, d):
                learned = wc.reshape(-1, n_f, d)[0]  # (F, d): the parameter's rows
                for lo, hi in made[1]:
                    code[..., lo:hi, :] = learned[lo:hi]
            origin = frozenset({("in", self.n_inputs - 1)}) | (at.origin if at is not None else frozenset())
            self.set(out, _Tag(None, origin, code=code))
            return True
        return False

    def _constant_joined(self, t: Any) -> None:
        """A constant the model made (``k.new_zeros(bsz, 1, d)``, fairseq's ``add_zero_attn``; ``torch.zeros`` of a
        start or padding slot) joined to activations: its positions along the joined rows are its own, labelled
        ``<zeros i>`` (``<constant i>``), the same for every row before them (the batch, the heads), as a learned
        vector expanded over them is, never a tensor handed in."""
        if not isinstance(t, torch.Tensor) or t.dim() < 2 or _is_param(t):
            return
        held = self._fixed_codes.get(id(t))
        if (held is not None and held[0]() is t) or not self._constant_made(t):
            return
        label = "zeros" if float(t.reshape(-1)[0]) == 0 else "constant"
        n = int(t.shape[-2])
        start = self.sources.new(n, "pad", label)
        pos = (start + torch.arange(n, dtype=torch.int64, device=t.device)).view(n, 1) << lineage.SHIFT
        code = (pos | torch.arange(int(t.shape[-1]), dtype=torch.int64, device=t.device)).expand(t.shape)
        self._fixed_codes[id(t)] = (weakref.ref(t), code)

    def _empty_codes(self, target: torch.Tensor) -> torch.Tensor:
        """Codes of a buffer made in the call: each cell not written a padding position of its own, as F.pad's
        padded cells are."""
        lead = tuple(target.shape[:-1])
        start = self.sources.new(math.prod(lead), "pad", lineage.EMPTY)
        return lineage.fresh(start, lead, int(target.shape[-1]), target.device)

    def _indexed_write_code(self, args, kwargs, out: torch.Tensor) -> torch.Tensor | None:
        """Codes of ``target.index_copy(dim, index, source)``, or of ``index_add`` into a buffer made in the call
        (``torch.zeros``, where adding is copying): the target's (the made buffer's, a padding position per cell,
        as ``buf[idx] = x`` gives it) with the source's rows at the places the index names (MoA's queries put back
        from their experts' order). None where an index names a place twice or the target has no codes."""
        names = ("dim", "index", "source")
        a = dict(zip(names, args[1:], strict=False)) | {k: v for k, v in kwargs.items() if k in names}
        target, dim, index, source = args[0] if args else None, a.get("dim"), a.get("index"), a.get("source")
        if not (
            isinstance(target, torch.Tensor)
            and isinstance(dim, int)
            and isinstance(index, torch.Tensor)
            and isinstance(source, torch.Tensor)
            and index.dim() == 1
            and tuple(target.shape) == tuple(out.shape)
        ):
            return None
        sc = self.code_of(source)
        if sc is None or tuple(sc.shape) != tuple(source.shape) or index.unique().numel() != index.numel():
            return None
        if self._constant_made(target):
            tc = self._empty_codes(target) if target.dim() >= 2 else None
        else:  # (index_copy only: ``_op_code`` leaves a sum into a tensor with positions of its own to the rule of sums)
            tc = self.code_of(target)
        if tc is None or tuple(tc.shape) != tuple(out.shape):
            return None
        try:
            return tc.index_copy(dim, index.to(tc.device), sc.to(tc.device))
        except Exception:  # (an index the codes cannot take: lineage lost)
            return None

    def _constant_made(self, x: Any) -> bool:
        """``x`` is a tensor the model made from no data (``torch.zeros``, ``torch.full``), untagged and holding
        one value: it has no positions, and a sum with it keeps the other operand's."""
        return (
            isinstance(x, torch.Tensor)
            and x.is_floating_point()
            and x.numel() > 0
            and self.tag(x) is None
            and _held(self._int_floats, x) is not None
            and bool((x == x.reshape(-1)[0]).all())
        )

    def _external(self, t: torch.Tensor) -> _Tag:
        """Tag a tensor that enters the model from outside the call (its own origin and positions)."""
        code = self.code_of(t)
        origin: frozenset = frozenset()
        if code is not None and code.numel():  # the source its codes name (it may have been seen before)
            src = self.sources.at(int(code.reshape(-1)[0]) >> lineage.SHIFT)
            if src.kind == "external":
                origin = frozenset({src.origin})
        tag = _Tag(origin=origin, code=code)
        self.set(t, tag)
        return tag

    def _op_code(self, name, func, args, kwargs, out, act) -> torch.Tensor | None:
        """The codes of an op's output: replayed, kept, projected, or lost (None)."""
        if name in LINEAR or name in CONV:
            x = args[1] if name == "addmm" and len(args) > 1 else args[0] if args else None
            if name in LINEAR and self._constant_made(x):
                return None  # a projection of a constant made from no data (DAB-DETR's ``torch.zeros(nq, bs, d)``
                # added to the learned queries): no positions of its own (a conv of one keeps its map's positions)
            xc = self.code_of(x)
            if xc is None or x is None or name == "bilinear":
                return None
            if name in CONV:
                weight = args[1] if len(args) > 1 else kwargs.get("weight")
                groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
                return self._conv_code(x, xc, out, weight, groups if isinstance(groups, int) else 1)
            if tuple(xc.shape[:-1]) != tuple(out.shape[:-1]):
                return None
            x_tag = self.tag(x)
            code, mixed = lineage.projected(xc, int(out.shape[-1]), check=True)
            if mixed and x_tag is not None and x_tag.attn_out is not None:
                self._mixed(x)
            elif mixed:  # rows that mix positions: a projection over the positions themselves (Linformer's
                over = self._over_positions(xc, out)  # E K^T); elsewhere, lineage of the first one
                if over is not None:
                    return over
                patches = self._patches_projected(x, xc, out)
                if patches is not None:
                    return patches
            if x_tag is not None and x_tag.attn_out is not None and (self._pending or self._wo_taken):
                if name == "linear":
                    self._out_projection(x, args[1] if len(args) > 1 else kwargs.get("weight"),
                                         args[2] if len(args) > 2 else kwargs.get("bias"), False)  # fmt: skip
                elif name == "addmm":
                    self._out_projection(x, args[2] if len(args) > 2 else None, args[0], True)
            return code
        if name in POOL and args and isinstance(args[0], torch.Tensor):
            x = args[0]
            c = self.code_of(x)
            if c is None or tuple(c.shape) != tuple(x.shape) or out.dim() != x.dim() or out.dim() < 3:
                return None
            if tuple(out.shape[2:]) == tuple(x.shape[2:]):
                return c  # stride 1 with the same size: each position pooled from its own neighbours
            f = (c.flatten(2)[:, :, :1] & lineage.FEATURES).view(*c.shape[:2], *(1,) * (c.dim() - 2))
            return (self._new_positions(x, c, out) << lineage.SHIFT) | f
        if name in lineage.KEEP and args and isinstance(args[0], torch.Tensor):
            c = self.code_of(args[0])
            if c is not None and tuple(c.shape) == tuple(out.shape):
                return c.to(out.device) if c.device != out.device else c
        if (
            name == "pad"
            and args
            and (kwargs.get("mode", args[2] if len(args) > 2 else "constant") == "constant")
        ):
            c = self.code_of(args[0])  # the padding is a position of its own, never a token's
            pad = args[1] if len(args) > 1 else kwargs.get("pad")
            if c is None or pad is None:
                return None
            if (
                isinstance(pad, (tuple, list))
                and len(pad) >= 4
                and pad[0] == 0
                and pad[1] == 0
                and c.dim() >= 2
                and all(isinstance(n, int) and n >= 0 for n in pad)
                and not (c.dim() >= 3 and int(c.shape[1]) > 1 and _channels_first(c))  # (features last)
            ):  # padding around cells of features (Swin's map padded to whole windows): each padded cell
                padded = F.pad(c, pad, value=-1)  # a position of its own, so a window holding several is
                cells = F.pad(torch.zeros_like(c[..., 0]), pad[2:], value=1) == 1
                n = int(cells.sum())  # no position twice
                if n:
                    start = self.sources.new(n, "pad", "padding")
                    pos = torch.arange(start, start + n, dtype=c.dtype, device=c.device) << lineage.SHIFT
                    # (each padded cell's features are the tensor's own: heads read from them stay apart)
                    padded[cells] = pos[:, None] | _features_of(c, -1)
                return padded if tuple(padded.shape) == tuple(out.shape) else None
            if (
                isinstance(pad, (tuple, list))
                and c.dim() >= 3
                and int(c.shape[1]) > 1
                and len(pad) % 2 == 0
                and 0 < len(pad) // 2 <= c.dim() - 2
                and all(isinstance(n, int) and n >= 0 for n in pad)
                and any(pad)
                and _channels_first(c)
            ):
                # a feature map (B, C, H, W) padded around its cells (ISA's and HaloNet's maps padded to whole
                # groups): each padded cell a position of its own, as above
                padded = F.pad(c, pad, value=-1)
                cells = F.pad(torch.zeros_like(c[:, 0]), pad, value=1) == 1  # (B, *space)
                n = int(cells.sum())
                if n:
                    start = self.sources.new(n, "pad", "padding")
                    pos = torch.arange(start, start + n, dtype=c.dtype, device=c.device) << lineage.SHIFT
                    last = padded.movedim(1, -1)  # (a view: the cells' channels written in place)
                    last[cells] = pos[:, None] | _features_of(c, 1)
                return padded if tuple(padded.shape) == tuple(out.shape) else None
            value = self._pad_code()
            key = ("pad", id(c), _arg_key(pad), value)
            res: Any = lineage.recall(key) if key[2] is not _NOKEY else lineage.MISS
            if res is lineage.MISS:
                res = F.pad(c, pad, value=value)
                if key[2] is not _NOKEY:
                    lineage.remember(key, (c,), res)
            return res if tuple(res.shape) == tuple(out.shape) else None
        if name in ("view_as_complex", "view_as_real") and args:
            c = self.code_of(args[0])
            if c is None:
                return None
            res = c[..., 0] if name == "view_as_complex" else torch.stack([c, c], -1)
            return res if tuple(res.shape) == tuple(out.shape) else None
        if func is F.unfold or func is F.fold:
            return self._im2col_code(func, args, kwargs, out)
        if name == "pad_sequence" and args and isinstance(args[0], (list, tuple)):
            return self._pad_sequence_code(args, kwargs, out)
        if name in lineage.REPLAY:
            try:
                res = self._replay(name, func, args, kwargs, None)
            except Exception:  # _NoCode, or an op its arguments do not replay on codes
                return self._features_joined(name, args, kwargs, out) if name in CAT else None
            if isinstance(res, torch.Tensor) and res.shape == out.shape:
                if name in CAT and res.dim() >= 2 and _cat_dim(name, args, kwargs, out) == out.dim() - 1:
                    pos = res >> lineage.SHIFT  # features joined from parts at other positions in a row
                    if bool((pos != pos[..., :1]).any()):  # one part a state repeated over the others'
                        joined = self._features_joined(name, args, kwargs, out)  # positions: theirs
                        return res if joined is None else joined
                return res
            return None
        shape = out.shape
        if name in ("sum", "mean") and len(act) == 1 and act[0][1].code is not None:
            return self._reduced_code(args, kwargs, act[0][1].code, out)
        if name in INDEXED_WRITES and (
            name.startswith("index_copy") or (args and self._constant_made(args[0]))
        ):
            # (``x.index_add(0, dst, msg)`` into a tensor with positions of its own is a sum: the rule of sums below)
            return self._indexed_write_code(args, kwargs, out)
        # position-wise: an operand whose codes have the output's shape (not one broadcast or expanded over
        # it: a bias, a query added to every key), else the first with codes
        full = [
            g.code
            for t, g in act
            if g.code is not None and g.code.shape == shape and not (len(act) > 1 and _expanded(t))
        ]
        if full:
            return full[0] if len(full) == 1 or full[1] is full[0] else self._own_positions(full)

        def spread(t: torch.Tensor, c: torch.Tensor) -> int:  # the dims an operand fills (not expanded
            lead = len(shape) - c.dim()  # over by the model), later dims weighing more (keys are laid out
            return sum(1 << (lead + i) for i, n in enumerate(c.shape)  # after queries: (B, T, 1, d) + (B, 1, S, d))
                       if n == shape[lead + i] and n > 1 and (t.dim() != c.dim() or t.stride(i) != 0))  # fmt: skip

        coded = [(t, g) for t, g in act if g.code is not None and g.code.dim() <= len(shape)]
        if len(coded) > 1:
            coded.sort(key=lambda tg: -spread(tg[0], tg[1].code))
        for _t, g in coded:
            c = g.code
            ekey = ("expand", id(c), tuple(shape))
            hit = lineage.recall(ekey)
            if hit is not lineage.MISS:
                return hit
            try:
                return lineage.remember(ekey, (c,), c.expand(shape))
            except RuntimeError:
                continue
        return None

    def _learned_onto_made(self, ins: list[torch.Tensor], out: torch.Tensor) -> bool:
        """A learned vector added to a tensor a factory made in the call and nothing wrote since (OpenAI
        CLIP's ``class_embedding + torch.zeros(B, 1, C)``, its class token per sequence): the sum holds
        the learned vector's positions, broadcast, as ``class_embedding.expand(B, 1, C)`` would."""
        for learned, made in ((ins[0], ins[1]), (ins[1], ins[0])):
            if (
                (_is_param(learned) or self.tag(learned) is _PARAM_TAG)
                and self.tag(made) is None
                and _held(self._made, made) is not None
            ):
                code = self.code_of(learned)
                if code is None or code.dim() > out.dim():
                    return False
                try:
                    code = code.expand(out.shape)
                except RuntimeError:
                    return False
                self.set(out, _Tag(origin=frozenset(), code=code))
                return True
        return False

    def _outer_sum(self, ins, tags, out: torch.Tensor) -> bool:
        """A column of per-query scores plus a row of per-key scores, ``(..., N, 1) + (..., 1, M)``: additive
        scores of every query against every key, as a graph attention layer makes them (``Wh1 + Wh2.T``).
        Tagged as scores with the queries' and keys' positions, so their softmax is placed by lineage
        exactly as after ``q @ k.T``."""
        if out.dim() < 2 or any(g is None or g.code is None or g.role in ("scores", "param") or g.probs is not None
                                for g in tags):  # fmt: skip
            return False
        a, b = (g.code for g in tags)
        if a is None or b is None or a.dim() < 2 or b.dim() < 2 or len(ins) != 2:
            return False
        ta, tb = ins
        if ta.dim() < 2 or tb.dim() < 2:
            return False

        # one value per row, broadcast or expanded over the columns (by the model: the tensor's strides,
        # not its codes', which position-wise ops expand too)
        def column(t: torch.Tensor) -> bool:
            return t.shape[-1] == 1 or t.stride(-1) == 0

        def row(t: torch.Tensor) -> bool:
            return t.shape[-2] == 1 or t.stride(-2) == 0

        if column(tb) and row(ta) and not (column(ta) or row(tb)):
            a, b = b, a
        elif not (column(ta) and row(tb)) or row(ta) or column(tb):
            return False
        if (a.shape[-1] > 1 and not bool((a == a[..., :1]).all())) or (
            b.shape[-2] > 1 and not bool((b == b[..., :1, :]).all())
        ):
            return False  # codes that vary where the values are repeated
        n, m = int(out.shape[-2]), int(out.shape[-1])
        if int(a.shape[-2]) != n or int(b.shape[-1]) != m or n < 2 or m < 2:
            return False
        lead = tuple(out.shape[:-2])
        try:
            q, k = a[..., 0].expand(*lead, n), b[..., 0, :].expand(*lead, m)  # (an expanded one's first)
        except RuntimeError:
            return False
        origin = tags[0].origin | tags[1].origin
        self.set(out, _Tag("scores", origin, smap=ScoreMap(tuple(int(d) for d in out.shape), q, k)))
        return True

    def _outer_product(self, args, out: torch.Tensor) -> None:
        """Queries times keys broadcast against each other, ``q.unsqueeze(-2) * k.unsqueeze(-3)`` (..., n, m, d):
        a dot product written out, as ``q @ k.T`` once summed over the features. Held with the queries' and keys'
        codes, so that sum is tagged as scores placed by lineage, as after a product (``_outer_summed``)."""
        a, b = args
        for t, c in (
            (a, b),
            (b, a),
        ):  # such a product scaled by a number (``(q * k * scale).sum(-1)``): still it
            held = _held(self._outer_products, t) if self._outer_products else None
            if held is not None and tuple(t.shape) == tuple(out.shape) and _scalar(c):
                _hold(self._outer_products, out, *held[1:])
                return
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() < 3 or b.dim() < 3:
            return
        ga, gb = self.tag(a), self.tag(b)
        if ga is None or gb is None or any(g.role in ("scores", "param") or g.probs is not None or g.rowq is not None
                                           for g in (ga, gb)):  # fmt: skip
            return
        ca, cb = self.code_of(a), self.code_of(b)
        if ca is None or cb is None or tuple(ca.shape) != tuple(a.shape) or tuple(cb.shape) != tuple(b.shape):
            return

        def spread(t: torch.Tensor, dim: int) -> bool:  # one value repeated along ``dim`` (1, or expanded)
            return t.shape[dim] == 1 or t.stride(dim) == 0

        nd = out.dim()
        if a.dim() != nd or b.dim() != nd or int(a.shape[-1]) != int(b.shape[-1]):
            return
        if int(out.shape[-1]) != int(a.shape[-1]):
            return
        # the two axes the product pairs: one the queries vary along (the keys repeated there), one the keys do;
        # the others alike in both (a batch, heads), the features last: ``q[..., :, None, :] * k[..., None, :, :]``,
        # or in (B, L, H, d) layout ``q[:, :, None] * k[:, None]``
        pairs = [(i, j) for i in range(nd - 1) for j in range(nd - 1) if i != j
                 and not spread(a, i) and spread(a, j) and spread(b, i) and not spread(b, j)]  # fmt: skip
        if len(pairs) != 1:
            return
        i, j = pairs[0]
        others = [x for x in range(nd - 1) if x not in (i, j)]
        if any(int(a.shape[x]) != int(b.shape[x]) or (int(a.shape[x]) > 1 and (spread(a, x) or spread(b, x)))
               for x in others):  # fmt: skip
            return
        n, m = int(out.shape[i]), int(out.shape[j])
        if n < 2 or m < 2:
            return
        q, mixed_q = lineage.reduced(ca.select(j, 0), -1)  # (the queries' codes, the keys' axis gone)
        k, mixed_k = lineage.reduced(cb.select(i, 0), -1)
        q = q.movedim(i - (j < i), -1)  # (*others, n)
        k = k.movedim(j - (i < j), -1)  # (*others, m)
        lead = tuple(int(out.shape[x]) for x in others)
        try:
            q, k = q.expand(*lead, n), k.expand(*lead, m)
        except RuntimeError:
            return
        canon = (*lead, n, m)
        order = [*others, i, j]  # the canonical layout's axes, by the summed scores' own
        perm = tuple(order.index(x) for x in range(nd - 1))
        chain: tuple = () if perm == tuple(range(nd - 1)) else (("permute", torch.permute, (perm,), {}),)
        why = "the product multiplies features of different positions" if mixed_q or mixed_k else None
        _hold(self._outer_products, out, q, k, why, ga.origin | gb.origin, canon, chain)

    def _outer_summed(self, args, kwargs, out: torch.Tensor) -> None:
        """A broadcast product of queries and keys (``_outer_product``) summed over its features: their scores."""
        held = _held(self._outer_products, args[0])
        if held is None:
            return
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if isinstance(dim, (tuple, list)) and len(dim) == 1:
            dim = dim[0]
        keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        x = args[0]
        if (
            not isinstance(dim, int)
            or dim % x.dim() != x.dim() - 1
            or keep
            or kwargs.get("dtype") is not None
        ):
            return
        _, q, k, why, origin, canon, chain = held
        smap = ScoreMap(
            canon, q, k, chain
        )  # (the summed scores' shape is checked where the chain is replayed)
        self.set(out, _Tag("scores", origin, smap=smap.fail(why) if why else smap))

    def _outside_only(self, code: torch.Tensor) -> bool:
        """Every position of ``code`` is one capture made up for a tensor from outside the call, or made by
        the model from no input (no token, learned or pooled position among them)."""
        idx = torch.unique(self.sources.index(code >> lineage.SHIFT)).tolist()
        return all(self.sources.items[i].kind == "external" for i in idx)

    def _features_joined(self, name, args, kwargs, out: torch.Tensor) -> torch.Tensor | None:
        """Features joined position by position where some parts name no position, or a position repeated
        over the others' (a decoder state repeated over the source, joined to each encoder output:
        Bahdanau's ``cat((s, h), dim=2)``), or parts that are fields of the same positions one to one
        (an item's and its category's embeddings): each row keeps the positions of the part that varies
        along every axis the others vary along (the first such), with its features numbered afresh (a
        projection reads them next); None where no part is that."""
        parts = args[0] if args and isinstance(args[0], (tuple, list)) else None
        if not parts or out.dim() < 2 or _cat_dim(name, args, kwargs, out) != out.dim() - 1:
            return None
        found = []
        for t in parts:
            c = self.code_of(t) if isinstance(t, torch.Tensor) else None
            if c is None or not c.shape[-1]:  # (a part with no features adds none)
                continue
            if tuple(c.shape[:-1]) != tuple(out.shape[:-1]):
                return None
            pos = c[..., :1] >> lineage.SHIFT
            if bool((c >> lineage.SHIFT != pos).any()):
                # features from outside or made from constants (a sine code of positions, its sin and cos
                # parts stacked: Conditional DETR's k_pos), joined to the sequence's row by row: no position
                # of their own, as when added
                if self._outside_only(c):
                    continue
                return None  # a part whose rows mix positions
            found.append(pos)
        if not found:
            return None
        # parts at other positions: a state repeated over the positions (the same position along an
        # axis where another part's positions vary) gives way to the part that varies there; of parts at as
        # many positions, one with no padding or learned position comes first (x-transformers' shift_tokens:
        # chunks shifted by -1, 0 and +1 joined, whose unshifted chunk is the row's own token)
        found.sort(
            key=lambda p: (-int(torch.unique(p).numel()), bool(self.sources.learned(p.clamp_min(0)).any()))
        )
        rows = found[0]

        def varies(p: torch.Tensor) -> list[bool]:  # along each axis of the rows
            return [bool((p != p.narrow(d, 0, 1)).any()) for d in range(p.dim() - 1)]

        main = varies(rows)
        distinct = int(torch.unique(rows).numel()) == math.prod(
            n for n, v in zip(rows.shape[:-1], main, strict=True) if v
        )

        def gives_way(pos: torch.Tensor) -> bool:  # positions capture made up for a tensor from outside the
            return distinct and self._outside_only(pos << lineage.SHIFT)  # call (a code of the rows'

        for pos in found[1:]:  # coordinates, projected: DETR's k_pos) joined to rows of one position each
            if torch.equal(pos, rows):
                continue
            own = varies(pos)
            if own == main:  # another field of the same positions (DIN's item and category embeddings of
                real = ~self.sources.learned(pos.clamp_min(0))  # (a shifted part's padding cells aside)
                r, o = rows[real], pos[real]
                pairs = torch.unique(torch.stack([r.reshape(-1), o.reshape(-1)]), dim=1).shape[1]
                if pairs == int(torch.unique(r).numel()) == int(torch.unique(o).numel()):
                    continue  # one history): one position each, kept as the first part's
                if gives_way(pos):
                    continue
                return None
            # repeated: constant along an axis where the main part varies, and
            if not any(m and not o for m, o in zip(main, own, strict=True)) or any(  # varying only where
                o and not m
                for m, o in zip(main, own, strict=True)  # the main part varies too
            ):
                if gives_way(pos):
                    continue
                return None
        f = torch.arange(int(out.shape[-1]), dtype=torch.int64, device=rows.device)
        return (rows << lineage.SHIFT) | f

    def _reduced_code(self, args, kwargs, c: torch.Tensor, out: torch.Tensor) -> torch.Tensor | None:
        """A sum or mean over the features of each position (``(h * enc).sum(2)``, Luong's dot score):
        the positions stay, one code per position (its first feature). Over any other dim: lost."""
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if isinstance(dim, (tuple, list)) and len(dim) == 1:
            dim = dim[0]
        if not isinstance(dim, int) or c.dim() < 2:
            return None
        dim %= c.dim()
        first, mixed = lineage.reduced(c, dim)
        keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
        if mixed:  # a sum over positions (words pooled into a sentence vector): each row a new position
            if dim == c.dim() - 1 or out.dim() < 2:
                return None
            lead = tuple(int(n) for n in out.shape[:-1])
            # one new position per run of positions pooled (its first and last), shared by the heads
            # that pool the same run (Nystromformer's landmarks: segment means per head); the
            # features stay the input's, so each head's features stay its own
            ends = torch.stack([(first >> lineage.SHIFT).reshape(-1),
                                (c.select(dim, c.shape[dim] - 1) >> lineage.SHIFT).reshape(-1)], 1)  # fmt: skip
            # what it pooled: the sequence of its first position that is no padding (F.pad in front of a sequence
            # to whole blocks, as memory-compressed attention pads its keys before pooling them)
            parent = (self._unpadded_source(ends.t()) or self.sources.at(int(ends[0, 0]))).start
            # (numbered in the order the runs come: a run that begins with padding, made after the tokens, is first)
            runs, inverse = _unique_in_order(ends)
            # positions per row of the input: (B, R, d) out pools R per row (a story's sentences, Nystromformer's
            # landmarks); (B, d) out, one vector per row (a sentence mean-pooled), each its own row
            row = 1 if len(lead) == 1 else lead[-1] if len(runs) % lead[-1] == 0 else 0
            items = self._items_of_features(runs, parent, dim, c.dim())
            start = (
                self.sources.new(len(runs), "pooled", "pooled", ("pooled", parent), row)
                if items is None
                else self.sources.new(
                    len(runs),
                    "tokens",
                    items.label,
                    items.origin,
                    items.lead[-1],
                    table=items.table,
                    lead=items.lead,
                )  # fmt: skip
            )
            code = ((start + inverse.view(first.shape)) << lineage.SHIFT) | (first & lineage.FEATURES)
            if keep:
                code = code.unsqueeze(dim)
            return code if tuple(code.shape) == tuple(out.shape) else None
        res = first.unsqueeze(dim) if keep else first
        return res if tuple(res.shape) == tuple(out.shape) else None

    def _items_of_features(
        self, runs: torch.Tensor, parent: int, dim: int, ndim: int
    ) -> lineage.Source | None:
        """The token source whose ids hold several feature ids per item ((B, N, F) ids: Graphormer's atoms, each
        node's F features looked up in one table), where a sum over the embedding's feature-id axis pools each
        item's run of F ids whole: each item is then a token (its features summed), not a position the model
        made. None for any other pooling."""
        source = self.sources.at(parent)
        if source.kind != "tokens" or len(source.lead) != 2 or dim != ndim - 2 or source.start != parent:
            return None
        per = source.n // max(math.prod(source.lead), 1)  # (ids (*lead, F): the feature ids of each item)
        if per < 2 or int(runs.shape[0]) * per != source.n:
            return None
        first, last = runs[:, 0] - source.start, runs[:, 1] - source.start
        if not bool(((first % per == 0) & (last - first == per - 1)).all()):
            return None
        return source

    def _replay(self, name, func, args, kwargs, fn=None) -> Any:
        """``fn`` (a data-movement op; its replay_fn when None) on the codes of ``args``: remembered (lineage.remember) under
        the codes' identities and the other arguments' values, when every argument has a key."""
        if name in CAT and args and isinstance(args[0], (list, tuple)):
            for t in args[0]:
                self._constant_joined(t)
        if (
            args
            and _ints(args)
            and (not kwargs or _ints((None, *kwargs.values())))
            and not name.endswith("_as")
        ):
            x = args[0]  # x.transpose(1, 2), x.view(b, n, h, d), x.split(d, dim=2), x.mT: one tensor and ints
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                c = self.code_of(x)
                if c is None:
                    raise _NoCode
                key1 = ("replay1", name, func, id(c), args[1:], tuple(kwargs.items()) if kwargs else ())
                try:
                    hit = lineage.recall(key1)
                except TypeError:  # an unhashable function
                    return (fn or lineage.replay_fn(name, func))(c, *args[1:], **kwargs)
                if hit is not lineage.MISS:
                    return hit
                res = (fn or lineage.replay_fn(name, func))(c, *args[1:], **kwargs)
                return lineage.remember(key1, (c,), res)
        held: list[torch.Tensor] = []
        if name.endswith("_as") and len(args) > 1:  # only the other tensor's shape is used
            c0, k0 = self._code_key(args[0], held)
            shape = tuple(args[1].shape)
            coded, keys = [c0, shape, *args[2:]], [k0, shape, *(_arg_key(a) for a in args[2:])]
        else:
            coded, keys = [], []
            for a in args:
                c, k = self._code_key(a, held)
                coded.append(c)
                keys.append(k)
        if kwargs and any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in kwargs.values()):
            coded_kw, kw_keys = {}, []  # torch.matmul(a, other=b): the activations by keyword, as codes too
            for k, v in kwargs.items():
                c, ck = self._code_key(v, held)
                coded_kw[k] = c
                kw_keys.append((k, ck))
            if _NOKEY in keys or any(ck is _NOKEY for _, ck in kw_keys):
                return (fn or lineage.replay_fn(name, func))(*coded, **coded_kw)
            kw_key: tuple = ("replay", name, func, tuple(keys), tuple(kw_keys))
            try:
                hit = lineage.recall(kw_key)
            except TypeError:  # an unhashable function
                return (fn or lineage.replay_fn(name, func))(*coded, **coded_kw)
            if hit is not lineage.MISS:
                return hit
            return lineage.remember(
                kw_key, tuple(held), (fn or lineage.replay_fn(name, func))(*coded, **coded_kw)
            )
        key = None
        if _NOKEY not in keys:
            kw = tuple((k, _arg_key(v)) for k, v in kwargs.items())
            if not any(v is _NOKEY for _, v in kw):
                key = ("replay", name, func, tuple(keys), kw)
                try:
                    hit = lineage.recall(key)
                except TypeError:  # an unhashable function
                    key, hit = None, lineage.MISS
                if hit is not lineage.MISS:
                    return hit
        res = (fn or lineage.replay_fn(name, func))(*coded, **kwargs)
        return res if key is None else lineage.remember(key, tuple(held), res)

    def _code_key(self, a: Any, held: list) -> tuple[Any, Any]:
        """(``a`` with every floating tensor replaced by its codes, a hashable key of it, or _NOKEY
        where it has none: a tensor of indices, whose values may change in place)."""
        t = type(a)
        if t is int or t is str or a is None:
            return a, a
        if isinstance(a, torch.Tensor):
            if a.is_complex():  # (Fourier features: values, never indices, and no codes)
                raise _NoCode
            if not a.is_floating_point():
                return a, _NOKEY
            c = self.code_of(a)
            if c is None:
                raise _NoCode
            held.append(c)
            return c, (_CODE, id(c))
        if isinstance(a, (list, tuple)):
            if not any(isinstance(x, torch.Tensor) for x in a):
                return a, _arg_key(a)
            parts = [self._code_key(x, held) for x in a]
            keys = tuple(k for _, k in parts)
            return t(c for c, _ in parts), _NOKEY if _NOKEY in keys or t not in (tuple, list) else (t, keys)
        return a, _arg_key(a)

    def _unpadded_source(self, pos: torch.Tensor) -> lineage.Source | None:
        """The source of the first of position codes ``pos`` (in row-major order) that is no padding, or None where
        every one is."""
        real = pos[~self.sources.of_kind(pos, ("pad",))]
        return self.sources.at(int(real[0])) if real.numel() else None

    def _patches_projected(self, x: torch.Tensor, xc: torch.Tensor, out: torch.Tensor) -> torch.Tensor | None:
        """Codes of a projection of rows that each hold several positions, where rows that hold different ones
        begin at the same (F.unfold's overlapping patches of a token map, T2T-ViT's soft split: the border
        patches all begin with padding), as a strided conv's: each row a new position pooled from the positions
        it holds (the same for rows that hold the same ones). None where each row's first position is its own
        (lineage of the first one, as before)."""
        if xc.dim() < 2 or bool((xc & lineage.RAW).any()):
            return None
        pos = (xc >> lineage.SHIFT).reshape(-1, int(xc.shape[-1]))
        parent = self._unpadded_source(pos)
        if parent is None:
            return None
        seen = pos.masked_fill(self.sources.of_kind(pos, ("pad",)), -1).sort(-1).values
        kinds, inverse = _unique_in_order(seen)  # (numbered in the order the patches come)
        if len(kinds) <= len(torch.unique(pos[:, 0])):
            return None
        start = self.sources.new(len(kinds), "pooled", "pooled", ("pooled", parent.start), int(xc.shape[-2]))
        f = torch.arange(int(out.shape[-1]), dtype=torch.int64, device=out.device)
        code = ((start + inverse.to(out.device)).view(*xc.shape[:-1], 1) << lineage.SHIFT) | f
        return code if tuple(code.shape) == tuple(out.shape) else None

    def _conv_code(
        self, x: torch.Tensor, xc: torch.Tensor, out: torch.Tensor, weight: Any = None, groups: int = 1
    ) -> torch.Tensor | None:
        """(B, C, *space) convolutions: a position-wise one keeps the positions; one that makes new
        positions (patches of an image) starts them afresh, as a tensor from outside."""
        if out.dim() != x.dim() or out.dim() < 3:
            return None
        space = tuple(out.shape[2:])
        f = torch.arange(int(out.shape[1]), dtype=torch.int64, device=out.device).view(
            1, -1, *(1,) * len(space)
        )
        if space == tuple(x.shape[2:]) and not bool((xc & lineage.RAW).any()):
            return ((xc[:, :1] >> lineage.SHIFT) << lineage.SHIFT) | f
        if (
            weight is not None
            and groups > 1
            and groups == int(x.shape[1])
            and not bool((xc & lineage.RAW).any())
        ):
            # a depthwise convolution (each output channel filters one input channel over space, as a pool
            # does): each channel keeps the features it filters, so heads folded into the batch stay apart
            mult = max(1, int(out.shape[1]) // groups)
            fe = xc.flatten(2)[:, :, :1] & lineage.FEATURES  # (rows, C, 1)
            f = fe.repeat_interleave(mult, dim=1).view(int(out.shape[0]), -1, *(1,) * len(space))
        return (self._new_positions(x, xc, out) << lineage.SHIFT) | f

    def _einsum_over_positions(self, equation: str, xc: torch.Tensor, x_first: bool, out: torch.Tensor):
        """Codes of an einsum of an activation (..., n, d) with a parameter that contracts its positions
        n and makes new ones (``"bnd,nk->bkd"``): the parameter's output letter is positions pooled from
        the activation's sequence, its last letter its features. None for any other einsum."""
        eq = equation.replace(" ", "")
        if "->" not in eq or "." in eq:
            return None
        lhs, rhs = eq.split("->")
        sides = lhs.split(",")
        if len(sides) != 2:
            return None
        x, w = (sides[0], sides[1]) if x_first else (sides[1], sides[0])
        if len(x) != xc.dim() or len(rhs) != out.dim() or len(set(x)) != len(x):
            return None
        contracted = [c for c in x if c not in rhs]
        new = [c for c in rhs if c not in x and c in w]
        if len(contracted) != 1 or len(new) != 1 or x[-1] not in rhs or contracted[0] == x[-1]:
            return None
        batch = [c for c in x if c in rhs and c != x[-1]]
        if sorted(rhs) != sorted([*batch, new[0], x[-1]]):
            return None
        dims = {c: i for i, c in enumerate(x)}
        code = xc.movedim([dims[c] for c in [*batch, contracted[0], x[-1]]], list(range(xc.dim())))
        fe = code.reshape(-1, code.shape[-1])[0] & lineage.FEATURES  # (d,) the features
        pos = code[..., 0] >> lineage.SHIFT  # (*batch, n) the positions each batch slice pools
        positions = self._pooled_positions(pos, int(out.shape[rhs.index(new[0])]))  # (*batch, m)
        if positions is None:
            return None
        full = (positions[..., None] << lineage.SHIFT) | fe  # (*batch, m, d)
        order = [*batch, new[0], x[-1]]
        return full.permute([order.index(c) for c in rhs]).expand(out.shape)

    def _over_positions(self, xc: torch.Tensor, out: torch.Tensor) -> torch.Tensor | None:
        """Codes of a linear layer over positions: ``xc`` (..., rows, n) holds one feature per row and a
        sequence's positions along its last dim (features transposed first: Linformer's ``E(K^T)``);
        the output's last dim is new positions pooled from that sequence, the same for every row of
        it (every feature, every head). None for any other layout."""
        fe, pos = xc & lineage.FEATURES, xc >> lineage.SHIFT
        if xc.dim() < 2 or not bool((fe == fe[..., :1]).all()):
            return None
        positions = self._pooled_positions(pos, int(out.shape[-1]))
        return None if positions is None else (positions << lineage.SHIFT) | fe[..., :1]

    def _pooled_positions(self, pos: torch.Tensor, m: int) -> torch.Tensor | None:
        """(*lead, m) new positions pooled from the positions each row of ``pos`` (*lead, n) reads: the
        same for rows that read the same positions (every feature, every head of a sequence). None
        where the rows are learned positions, or rows that begin at one position read others."""
        parent = self.sources.at(int(pos.reshape(-1)[0]))
        if parent.kind in lineage.LABELLED:
            return None
        first, inverse = torch.unique(pos[..., 0], return_inverse=True)
        rows = pos.reshape(-1, pos.shape[-1])
        seq = torch.zeros(len(first), dtype=torch.long, device=pos.device).scatter_(
            0, inverse.reshape(-1), torch.arange(rows.shape[0], device=pos.device)
        )
        if not bool((rows == rows[seq][inverse.reshape(-1)]).all()):
            return None  # rows that begin at one position but read others
        # (a projection over the positions: each new one a learned mix of them)
        start = self.sources.new(
            len(first) * m, "pooled", "pooled", ("pooled", parent.start, "projection"), m
        )
        return start + inverse[..., None] * m + torch.arange(m, device=pos.device)

    def _new_positions(self, x: torch.Tensor, xc: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """(B, 1, *space) positions of a convolution or pooling of ``x`` (B, C, *space_in) that makes
        new ones. Of a tensor from outside the call: fresh, the same for every op over it that makes
        the same grid (a 1x1 query conv and a 1x1 key conv of one feature map read the same positions).
        Of the model's own positions (a strided conv or a pool of a sequence: PVT's spatial reduction,
        pooled keys): new positions pooled from their sequence, which stays theirs."""
        space = tuple(int(n) for n in out.shape[2:])
        n = int(out.shape[0]) * math.prod(space)
        raw = bool((xc & lineage.RAW).any())
        first = int(xc.reshape(-1)[0]) >> lineage.SHIFT if xc.numel() else -1
        parent = self.sources.at(first) if first >= 0 else None
        if parent is not None and parent.kind == "pad" and not raw and xc.dim() >= 3:
            # padding first (F.pad in front of a sequence to a multiple of the pool's stride, as memory-compressed
            # attention pads its keys): the sequence is that of the first position that is no padding
            parent = self._unpadded_source(xc[0, 0].reshape(-1) >> lineage.SHIFT) or parent
        grid = x
        base = x._base
        if (
            raw
            and base is not None
            and base.dim() == x.dim() >= 3
            and int(base.shape[0]) == int(x.shape[0])
            and tuple(base.shape[2:]) == tuple(x.shape[2:])
            and base.stride() == x.stride()
        ):  # a run of the channels of a tensor handed in (EfficientViT's ``x.chunk(heads, dim=1)``, each chunk a
            grid = base  # head's): the same items and cells, so the same positions
        key = (id(grid), _version_of(grid), space, int(out.shape[0]))
        held = self._grids.get(key) if raw else None
        slots = None  # each row's place among the rows, where rows of one item handed in are put together
        if held is not None and held[0]() is grid:
            start, slots = held[1], held[2]
        elif not raw and parent is not None and parent.kind not in lineage.LABELLED:
            # rows that read the same positions (the heads of a sequence folded into the batch, MViT's pooling
            # of q, k and v per head) pool to the same new ones: their rows stay one sequence's
            rows, cells = int(out.shape[0]), math.prod(space)
            if rows > 1 and xc.dim() >= 3 and int(xc.shape[0]) == rows:
                read = (xc[:, 0] >> lineage.SHIFT).reshape(rows, -1)
                kinds, inverse = torch.unique(read, dim=0, return_inverse=True)
                if int(kinds.shape[0]) < rows:
                    start = self.sources.new(
                        int(kinds.shape[0]) * cells, "pooled", "pooled", ("pooled", parent.start), cells
                    )
                    place = inverse.to(out.device).view(-1, 1) * cells + torch.arange(
                        cells, device=out.device
                    )
                    return start + place.view(rows, 1, *space)
            start = self.sources.new(n, "pooled", "pooled", ("pooled", parent.start), math.prod(space))
        else:
            tag = self.tag(x)
            label = "patches" if tag is None or not tag.origin else "input"
            rows = int(out.shape[0])
            folded = self._folded_rows(x) if raw else None
            if folded is not None:  # (a video's frames folded into the batch: one sequence a clip)
                items, slots = folded
                lead = (items, n // items)
            else:
                lead = (rows, math.prod(space))
            start = self.sources.new(n, "external", label, ("in", self.n_inputs), lead[1], lead=lead)
            self._grid_sources.add(start)
            self.n_inputs += 1
            if raw:
                self._grids[key] = (weakref.ref(grid), start, slots)
        if slots is None:
            return start + torch.arange(n, device=out.device).view(out.shape[0], 1, *space)
        cells = math.prod(space)
        place = slots.to(out.device).view(-1, 1) * cells + torch.arange(cells, device=out.device)
        return start + place.view(out.shape[0], 1, *space)

    def _folded_rows(self, x: torch.Tensor) -> tuple[int, torch.Tensor] | None:
        """A tensor from outside whose items were folded into its rows before it enters (a video's frames, ``'b c t
        h w -> (b t) c h w'`` before a 2-D patch conv, TimeSformer's): the fold replayed on each element's item
        (the first axis of the tensor handed in) says which item every row holds. (the items, each row's slot
        where every item's rows come together in their order), or None: no fold, or rows that mix items or
        hold them unevenly."""
        held = self._outside_moves.get(id(x))
        if held is None or held[0]() is not x:
            return None
        root = held[1]()
        if root is None or root.dim() < 2:
            return None
        items, rows = int(root.shape[0]), int(x.shape[0])
        if items < 1 or rows <= items or rows % items:
            return None
        dtype = torch.int16 if items < 2**15 else torch.int64
        idx = torch.arange(items, dtype=dtype, device=x.device).view(items, *(1,) * (root.dim() - 1))
        moved = _moved_as(held[2], idx.expand(root.shape), tuple(x.shape))
        if moved is None:
            return None
        per_row = moved.reshape(rows, -1)
        item = per_row[:, 0].long()
        if not bool((per_row == per_row[:, :1]).all()):
            return None  # (a row holds several items' values)
        if not bool((torch.bincount(item, minlength=items) == rows // items).all()):
            return None
        order = torch.sort(item, stable=True).indices  # rows by item, in their order within it
        slots = torch.empty_like(order)
        slots[order] = torch.arange(rows, device=order.device)
        return items, slots

    def _sources_key(self) -> tuple:
        """The sources so far, hashable: a key for what lineage found from codes and sources (sources are
        only ever added, so their count says whether the key is still current)."""
        items = self.sources.items
        if self._src_key[0] != len(items):
            self._src_key = (
                len(items),
                tuple((s.start, s.n, s.kind, s.label, s.origin, s.row, s.path) for s in items),
            )
        return self._src_key[1]

    def _im2col_code(self, func, args, kwargs, out) -> torch.Tensor | None:
        """Codes of ``F.unfold`` (patches of an image as columns: MobileViT's, its padding a position of
        its own) and of ``F.fold`` where no two patches overlap (their columns put back in place; where
        they overlap, values are summed: lineage lost): the op replayed on each element's index, which
        float64 holds exactly."""
        c = self.code_of(args[0]) if args else None
        if c is None or tuple(c.shape) != tuple(args[0].shape):
            return None
        try:
            idx = torch.arange(1, c.numel() + 1, dtype=torch.float64, device=c.device).view(c.shape)
            if func is F.fold and bool((func(torch.ones_like(idx), *args[1:], **kwargs) > 1).any()):
                return None
            at = func(idx, *args[1:], **kwargs).long()
        except Exception:  # arguments the replay cannot take
            return None
        if tuple(at.shape) != tuple(out.shape):
            return None
        pad = torch.tensor([self._pad_code()], dtype=c.dtype, device=c.device)
        return torch.cat([pad, c.reshape(-1)])[at]

    def _pad_sequence_code(self, args, kwargs, out: torch.Tensor) -> torch.Tensor | None:
        """Codes of ``nn.utils.rnn.pad_sequence(seqs, batch_first, padding_value, padding_side)``: each
        sequence's own, padded to the longest with cells that are each a position of their own (as F.pad's
        padded cells are), stacked along the batch (first, or second where not ``batch_first``)."""
        seqs = args[0]
        batch_first = args[1] if len(args) > 1 else kwargs.get("batch_first", False)
        side = args[3] if len(args) > 3 else kwargs.get("padding_side", "right")
        maybe = [self.code_of(t) for t in seqs]
        codes = [c for c in maybe if c is not None]
        if (
            not codes
            or len(codes) != len(maybe)
            or any(c.dim() < 2 or c.shape[1:] != codes[0].shape[1:] for c in codes)
        ):
            return None
        n = max(int(c.shape[0]) for c in codes)
        cells = [(n - int(c.shape[0])) * math.prod(c.shape[1:-1]) for c in codes]
        total = sum(cells)
        # (a sequence's padding, as its PAD tokens would be: labelled by none where rows differ)
        start = self.sources.new(total, "pad", lineage.EMPTY) if total else 0
        padded = []
        for c, k in zip(codes, cells, strict=True):
            if k:
                lead = (n - int(c.shape[0]), *c.shape[1:-1])
                fill = lineage.fresh(start, lead, int(c.shape[-1]), c.device)
                start += k
                c = torch.cat([fill, c] if side == "left" else [c, fill])
            padded.append(c)
        res = torch.stack(padded, 0 if batch_first else 1)
        return res if tuple(res.shape) == tuple(out.shape) else None

    def _pad_code(self) -> int:
        """The code of padding added by F.pad: a source of its own (one position, feature 0)."""
        if self._pad_start is None:
            self._pad_start = self.sources.new(1, "pad", "padding")
        return self._pad_start << lineage.SHIFT

    def _mixed(self, x: Any) -> None:
        """A projection read rows whose features come from several positions: when they are
        attention's output, its heads were merged back in another order than they were split."""
        tag = self.tag(x)
        if tag is not None and tag.attn_out is not None:
            self.warn(tag.attn_out, tuple(x.shape), "its heads are merged back in another order than they were "
                      "split: each output row mixes several positions (a fold and unfold that do not match)")  # fmt: skip

    def _zero_one_added(self, m: torch.Tensor, shape: tuple[int, int]) -> None:
        """A float mask of 0s and 1s handed to SDPA, which adds it to the scores (a bool or 0/1 mask turned into
        floats, not into 0 / -inf): a causal one is a decoder's broken mask (``_added_zero_one``); any other with
        some 1 (a padding mask, 1 = keep) hides no key either, and is said."""
        if (
            not m.is_floating_point()
            or not _zero_one(m)
            or not bool((m == 1).any())
            or not bool((m == 0).any())
        ):
            return  # (all ones, or all zeros: added, nothing this batch meant to hide)
        path = self.path()
        how = "passed to scaled_dot_product_attention as a float attn_mask, which it adds to the scores"
        if _zero_one_triangle(m):
            self._added_zero_one(path, shape, how)
        else:
            self.warn(path, tuple(m.shape), f"a mask of 0s and 1s was {how}: adding 0 or 1 hides no key, so the "
                      "keys it meant to hide are attended to. SDPA hides keys with a bool mask (True = may attend) "
                      "or with 0 / -inf")  # fmt: skip

    def _added_zero_one(self, module: str, shape: tuple[int, ...], how: str) -> None:
        """A causal mask written as 0s and 1s was added to a call's scores (a bool or 0/1 mask turned
        into a float one and added): the map is what the model computed, and it sees the future. The call
        is decoder self-attention with a broken mask, as a decoder that forgot its mask is; the note says
        why the map is not causal."""
        self._meant_causal.add(module)
        self.warn(module, shape, f"a causal mask of 0s and 1s was {how}: adding 0 or 1 changes a weight by "
                  "at most a factor e and hides no key, so every query here attends to later keys. A mask "
                  "hides keys by adding -inf (0 where allowed), by masked_fill(hidden, -inf), or, for "
                  "MultiheadAttention, as a bool mask (True = hidden)")  # fmt: skip

    def warn(self, module: str, shape: tuple[int, ...], reason: str) -> None:
        note = Note("warning", module, tuple(int(n) for n in shape), reason)
        if (module, reason) not in self._seen:
            self._seen.add((module, reason))
            self.cap.notes.append(str(note))

    def skip(self, module: str, shape: tuple[int, ...], reason: str) -> None:
        if (module, reason) not in self._seen:
            self._seen.add((module, reason))
            self.cap.skipped.append(Note("info", module, tuple(int(n) for n in shape), reason))

    def _unsay(self, module: str, reason: str) -> None:
        """Take back the information ``skip`` gave of ``module`` (a softmax found to be attention after all): a
        later one of the module with the same reason is noted again."""
        self.cap.skipped[:] = [n for n in self.cap.skipped if (n.module, n.reason) != (module, reason)]
        self._seen.discard((module, reason))

    def propagate(self, name, func, args, kwargs, out, pre) -> None:
        if isinstance(out, torch.Tensor):
            outs: Any = (out,)
        else:
            outs = [o for o in (out if isinstance(out, (tuple, list)) else ()) if isinstance(o, torch.Tensor)]
            if not outs:
                return
        ins = _tensors(args, kwargs)
        if (
            type(out) is torch.Tensor
            and ins
            and (self._int_floats or not ins[0].is_floating_point())
            and all(self._made_inside(t) for t in ins)
        ):
            _hold(self._int_floats, out)  # (a comparison of them too: ``torch.lt(pos, capacity)``)
        if name in OUTSIDE_NORMS and args and isinstance(args[0], torch.Tensor) and self.tag(args[0]) is None:
            return  # a norm of a tensor from outside (GroupNorm on an image): still from outside, not learned
        if name in ROW_REDUCE and len(ins) == 1 and self._row_reduced(name, args, kwargs, outs):
            return
        if (
            name in OUTSIDE_POOLS
            and len(ins) == 1
            and args
            and args[0] is ins[0]
            and self.tag(ins[0]) is None
        ):
            # a mean or max over the positions of a tensor from outside: a pooled token, if it is joined to them
            # (``_pools_joined``)
            x = ins[0]
            root, steps = self._outside_chain(x)
            r = root()
            if r is not None and r.is_floating_point() and r.dim() >= 3 and not _is_param(r):
                pool = ("pool", tuple(args[1:]), dict(kwargs), tuple(outs[0].shape))
                self._hold_pool(outs[0], root, (*steps, pool), True)
            return
        if name == "zero_" and len(ins) == 1 and out is ins[0] and out._base is None and out.dim() >= 2:
            g = self.tag(out)  # a buffer zeroed in place (Hugging Face's SlidingWindowCache: ``cache.zero_();
            if g is not None and g.role in (None, "linear") and g.probs is None:  # cache += k_out``): empty
                new = g.derived(g.origin)
                new.code = self._empty_codes(out)
                self.set(out, new)
                return
        if name == "broadcast_tensors" and len(outs) == len(args):
            self._broadcast_each(args, outs)
            return
        if name in SHAPED_LIKE and len(ins) > 1 and args and ins[0] is args[0]:
            ins = ins[:1]  # x.type_as(s), x.to(s), x.expand_as(s): s gives a dtype or a shape, no values
        if name in RNN and args and isinstance(args[0], torch.Tensor):
            self._recurrent(name, args[0], outs)
            return
        if name in PICKS and args and isinstance(args[0], torch.Tensor):
            g = self.tag(args[0])
            p = self._weights_of(g) if g is not None else None
            if g is not None and p is not None and p.record is not None:
                # weights picked by their size (the sinkhorn transformer's differentiable top-k, put back by a
                # scatter into a sparse copy)
                self._topk_of.add(id(p))
                for o in outs:
                    if o.is_floating_point():
                        self.set(o, _Tag(None, g.origin, lost=p, changed=True))
                return
        if name in PACKING and args and isinstance(args[0], torch.Tensor):
            self._packed(name, func, args, outs)
            return
        if len(ins) == 1 and outs[0] is out and name not in LINEAR and name not in MATMUL:
            x = ins[0]  # one activation in, one out (view, transpose, relu, dropout, x / c): the common case
            g = self.tag(x)
            if x._base is not None and type(out) is torch.Tensor and out._base is x._base:
                fresh = self._read_through_view(x, g, out)
                if fresh is not None:
                    self.set(out, fresh)
                    return
            if g is None:  # (a single tensor from outside enters through LINEAR / CONV / MATMUL / joins only)
                pooled = self._outside_pools.get(id(x))
                if pooled is not None and pooled[0]() is x and type(out) is torch.Tensor:
                    # a mean over a tensor from outside, divided, scaled or unsqueezed before it is joined
                    if name in POOL_MOVES and args and args[0] is x:
                        step_: tuple = ("move", func, tuple(args[1:]), dict(kwargs))
                    elif (name in ADD or name in SUB or name in MUL or name in DIV) and _same_shape(out, x):
                        step_ = ("same",)
                    else:
                        return
                    self._hold_pool(out, pooled[1], (*pooled[2], step_), pooled[3])
                    return
                if x.is_floating_point() and x.dim() >= 3 and not _is_param(x):
                    if name in FOLDS and args and args[0] is x and isinstance(out, torch.Tensor):
                        if len(self._outside_moves) >= HELD:
                            self._outside_moves.clear()
                        # (moved again: the chain from the tensor handed in)
                        held = self._outside_moves.get(id(x))
                        root, chain = (
                            (held[1], held[2])
                            if held is not None and held[0]() is x
                            else (weakref.ref(x), ())
                        )
                        self._outside_moves[id(out)] = (weakref.ref(out), root,
                                                        (*chain, (func, tuple(args[1:]), dict(kwargs))))  # fmt: skip
                return
            if (g.role is None or g.role == "linear") and g.probs is None:
                new = g.derived(g.origin)
                # (dropout in eval mode hands back its input: the heads' output as it was)
                # (a cast that changes no value, ``out.to(torch.float32)`` of a float32 tensor as trax's port ends,
                # a move to another device: the heads' output as it was)
                same = name in lineage.KEEP and out.dtype == x.dtype
                new.moved = g.moved and (name in lineage.REPLAY or same or (name in DROPOUT and out is x))
                if g.wo is not None and (name in lineage.REPLAY or name in DROPOUT or same):
                    new.wo = g.wo
                if out.dim() != 3 or x.dim() != 3 or out.shape[0] != x.shape[0]:
                    new.split = None
                if name in ("view", "reshape", "unflatten"):
                    self._reshaped(x, g, out, new)
                if out.shape != x.shape or (name in MOVES and g.rowq is not None and out is not x):
                    # (moved with the shape kept too: heads and batch swapped where as many of each)
                    new.axes = None
                    if g.rowq is not None:
                        new.lost = self._weights_of(g)
                        new.flat = name in ROW_MAJOR
                    new.rowq = None
                if new.lost is not None and g.lost is new.lost:
                    new.flat = g.flat and _keeps_row_major(name, x, out)
                if new.lost is not None and (
                    name not in KEEPS_VALUES or g.touched or (name in DROPOUT and out is not x)
                ):
                    new.changed = True
                new.code = self._op_code(name, func, args, kwargs, out, [(x, g)])
                self.set(out, new)
                return
        if (
            (name in LINEAR or name in CONV or name in MATMUL)
            and len(ins) >= 2
            and outs[0] is out
            and self._pair_scored(name, args, ins, out)
        ):
            return
        if name == "linear" and len(ins) > 1 and outs[0] is out and ins[0] is args[0]:
            g = self.tag(args[0])  # x W^T + b of an activation and parameters: a projection of its positions
            if g is not None and self._over_heads(args[0], g):  # CaiT's proj_l / proj_w over the heads
                kept = self._scores_mixed_in_place(g, g.origin) if out.shape == args[0].shape else None
                self.set(out, kept or self._heads_mixed(g, g.origin, "mixed across heads by a linear layer over "
                                                        "them (talking-heads attention)"))  # fmt: skip
                return
            if g is not None and g.role != "param" and all(_is_param(t) for t in ins[1:]):
                new = _Tag("linear", g.origin, cache=g.cache)
                new.code = self._op_code(name, func, args, kwargs, out, [(args[0], g)])
                self.set(out, new)
                return
        if name in MUL and len(ins) == 2 and outs[0] is out and self._features_tokenized(ins, out):
            return
        if name in CAT and self._outside_pools and len(ins) > 1:
            self._pools_joined(ins)
        tags = [self.tag(t) for t in ins]
        if name in ADD and len(ins) == 2 and isinstance(out, torch.Tensor):
            for (a, ta), (b, _) in (
                ((ins[0], tags[0]), (ins[1], tags[1])),
                ((ins[1], tags[1]), (ins[0], tags[0])),
            ):
                if (
                    ta is not None
                    and ta.wo is not None
                    and tuple(a.shape) == tuple(b.shape) == tuple(out.shape)
                ):
                    self._residual(ta.wo, a, b, out if name in IN_PLACE and b is out else None)
                    break
                if ta is not None and ta.wo is not None and self._wo_bias(ta.wo, a, b, out):
                    break
        if (
            name in ADD
            and len(ins) == 2
            and isinstance(out, torch.Tensor)
            and self._outer_sum(ins, tags, out)
        ):
            return
        if (
            name in ADD
            and len(ins) == 2
            and isinstance(out, torch.Tensor)
            and self._learned_onto_made(ins, out)
        ):
            return
        if (
            len(ins) == 2
            and not any(tags)
            and isinstance(out, torch.Tensor)
            and (name in ADD or name in SUB or name in MUL or name in DIV)
        ):
            self._outside_arithmetic(name, ins, out)
        if not ins or (name not in ENTRY and not any(tags)):
            return  # nothing the capture follows went in (a tensor from outside enters through ENTRY ops)
        if (name in ADD or name in MUL) and not any(tags):
            return  # tensors from outside added or multiplied element by element (SAM's repeated image plus its
            # dense prompt, both (B, C, h, w)): no axis says features yet; the op that reads the sum tags it
        if name in ENTRY and not any(g is not None and g.role != "param" for g in tags):
            outside = next((t for t, g in zip(ins, tags, strict=True) if g is None and t.is_floating_point()
                            and t.dim() >= 2 and not _is_param(t) and _held(self._int_floats, t) is None),
                           None)  # fmt: skip
            if outside is not None and (name in LINEAR or name in CONV or name in MATMUL or len(tags) > 1):
                # a view of a tensor from outside splitting its features into heads (``x.reshape(N, L, H, d)``,
                # made once per projection): the tensor's positions, viewed, so its views are one input, not one each
                viewed = outside._base
                if (
                    isinstance(viewed, torch.Tensor)
                    and viewed.is_floating_point()
                    and viewed.dim() >= 3
                    and outside.dim() > viewed.dim()
                    and int(outside.shape[-1]) > 1
                    and outside.is_contiguous()
                    and viewed.is_contiguous()
                    and tuple(outside.shape[: viewed.dim() - 1]) == tuple(viewed.shape[:-1])
                    and math.prod(outside.shape[viewed.dim() - 1 :]) == int(viewed.shape[-1])
                    and self.tag(viewed) is None
                    and not _is_param(viewed)
                ):
                    self._external(viewed)
                    if self._view_tag(outside) is None:
                        self._external(outside)
                elif (
                    isinstance(viewed, torch.Tensor)
                    and viewed.is_floating_point()
                    and viewed.dim() == outside.dim() >= 2
                    and int(outside.shape[-1]) == int(viewed.shape[-1])
                    and sorted(outside.stride()) == sorted(viewed.stride())
                    and viewed.is_contiguous()
                    and not _is_param(viewed)
                ):
                    # rows of a tensor from outside (``x[:, -2:]``, the last positions as queries over all of
                    # ``x``, before or after ``x`` itself was read; ``x.transpose(0, 1)``): the tensor's own
                    # positions, so its other reads are the same input
                    if self.tag(viewed) is None:
                        self._external(viewed)
                    if self._view_tag(outside) is None:
                        self._external(outside)
                else:
                    # features, an image, hidden states from outside the call
                    self._external(outside)
                if name in MATMUL:  # the other operand handed in too, read first with its axes swapped
                    for t, g in zip(ins, tags, strict=True):  # (``q @ k.transpose(-2, -1)`` of q and k given)
                        whole = t._base
                        if g is None and t is not outside and whole is not None and _permuted_whole(t):
                            if self.tag(whole) is None:
                                self._external(whole)
                            self._view_tag(t)
                tags = [self.tag(t) or (self._view_tag(t) if t._base is outside else None) for t in ins]
        known = [(t, g) for t, g in zip(ins, tags, strict=True) if g is not None]
        if not known:
            return
        origin = known[0][1].origin
        for _, g in known[1:]:
            o = g.origin
            if o and o is not origin and not o <= origin:
                origin = origin | o if origin else o
        act = [(t, g) for t, g in known if g.role != "param"]
        if (
            len(act) > 1
            and act[0][1].role in (None, "linear")
            and act[0][1].attn_out is None
            and act[0][1].wo is None
            and act[0][1].rowq is None
            and act[0][1].lost is None
            and name not in MATMUL
            and name not in LINEAR
        ):
            at = next((i for i, (t, g) in enumerate(act) if g.role == "scores" and g.probs is None
                       and g.smap is not None and not g.smap.broken and tuple(t.shape) == tuple(out.shape)),
                      0)  # fmt: skip
            if at:  # a bias added to the scores, written first (``rel_bias + q @ k.T``): still the scores
                act.insert(0, act.pop(at))
        if (
            len(act) > 1
            and (name in ADD or name in SUB)
            and act[0][1].role == "scores"
            and act[0][1].smap is None
            and act[0][1].probs is None
        ):
            at = next((i for i, (t, g) in enumerate(act) if i and g.role == "scores" and g.probs is None
                       and g.smap is not None and tuple(t.shape) == tuple(out.shape)), 0)  # fmt: skip
            if at:  # a reduction of the scores written first (DANet's ``max(e) - e``): still the scores
                act.insert(0, act.pop(at))
        if len(act) > 1 and act[0][1].probs is None and act[0][1].rowq is None and name not in MATMUL:
            at = next((i for i, (t, g) in enumerate(act) if (g.probs is not None or g.rowq is not None)
                       and tuple(t.shape) == tuple(out.shape)), 0)  # fmt: skip
            if at:  # weights changed by a tensor written first (``y_hard - y_soft.detach() + y_soft``, the
                act.insert(0, act.pop(at))  # straight-through estimator): still the weights, now changed
        if (
            (name in ADD or name in SUB or name in MUL or name in DIV or name in COMBINES)
            and isinstance(out, torch.Tensor)
            and self._weights_combined(act, origin, out)
        ):
            return
        if not isinstance(out, torch.Tensor):  # split / chunk / unbind: the pieces keep role and origin
            if act and act[0][1].touched and args and args[0] is act[0][0] and name in KEEPS_VALUES:
                # weights changed since the softmax, cut into pieces (a head at a time, each multiplied by its
                # values): the pieces hold the changed weights whole, which the record takes
                p = self._weights_of(act[0][1])
                if p is not None:
                    self._weights_used(p, act[0][0])
            role = act[0][1].role if act else "param"
            heads, cache = (act[0][1].heads, act[0][1].cache) if act else (None, False)
            codes: list[Any] = [None] * len(outs)
            if (
                name in lineage.REPLAY
                and args
                and (args[0] is act[0][0] if act else isinstance(args[0], torch.Tensor))
            ):
                try:
                    res = self._replay(name, func, args, kwargs, func)
                    if len(res) == len(outs) and all(
                        tuple(c.shape) == tuple(o.shape) for c, o in zip(res, outs, strict=True)
                    ):
                        codes = list(res)
                except Exception:
                    pass
            # pieces of weights (``unbind``, ``split``) are pieces of the record's: joined back (``stack``, ``cat``)
            # in another order, they are flagged where they multiply values
            lost = None
            if act and (act[0][1].probs is not None or act[0][1].rowq is not None):
                lost = self._weights_of(act[0][1])
            for o, c in zip(outs, codes, strict=True):
                self.set(o, _Tag(role, origin, heads=heads, cache=cache, code=c, lost=lost))
            return
        if name in MATMUL and len(ins) >= 2:
            new = self._matmul(name, args, kwargs, ins, tags, out, origin)
        elif name in LINEAR:  # position-wise: a cache joined before the projection (Transformer-XL) stays one
            new = _Tag("linear", origin, cache=any(g.cache for _, g in act))
            new.code = self._op_code(name, func, args, kwargs, out, act)
        elif not act:
            new = _Tag("param")  # made from parameters alone: learned vectors (a [CLS], memory keys)
            if out.is_floating_point():  # (a parameter's rows are its codes: ``self.latents * 0.5``)
                rows = [(t, _Tag("param", code=self.code_of(t)) if g is _PARAM_TAG else g) for t, g in known]
                new.code = self._op_code(name, func, args, kwargs, out, rows)
        elif act[0][1].probs is not None and self._probs_step(name, args, out, act[0][0], act[0][1], kwargs):
            return
        else:
            base_t, base = act[0]
            new = base.derived(origin)
            if len(act) > 1:  # (scores plus another activation: RealFormer's previous scores, a mask)
                new.softmaxed = None
            new.moved = name in lineage.REPLAY and all(g.moved for _, g in act) and len(act) == len(ins)
            if (
                (base.probs is not None or base.rowq is not None)
                and (out is not base_t or name not in DROPOUT)  # dropout in eval mode hands back its input
                and name not in lineage.REPLAY
                and (name not in lineage.KEEP or _cast_down(base_t.dtype, out.dtype))
                and tuple(out.shape) == tuple(base_t.shape)
            ):
                new.touched = True  # the weights' values changed: what the product multiplies is taken there
            elif (
                (base.probs is not None or base.rowq is not None)
                and name in lineage.REPLAY
                and name not in lineage.KEEP
                and name not in MOVES
                and name not in TRANSPOSES
                and tuple(out.shape) == tuple(base_t.shape)
                and _moved_values(base_t, out)
            ):
                # moved within the shape (a permutation picked by ``index_select`` or ``gather``): other weights
                # at each place now, which the record, placed as the softmax placed them, cannot hold (the values
                # may have moved alike): flagged at the product, unless what it multiplies is the record's
                # weights there
                new.lost = self._weights_of(base)
                new.changed = True
                new.probs = new.rowq = None
                self._moved_why(new.lost, f"moved within their shape (by {name})")
            if out.dim() != 3 or base_t.dim() != 3 or out.shape[0] != base_t.shape[0]:
                new.split = None
            if name in ("view", "reshape", "unflatten"):
                self._reshaped(base_t, base, out, new)
            moved = name in MOVES and out is not base_t  # (a transpose that keeps the shape: heads and batch
            # swapped where there are as many of each, its elements elsewhere all the same)
            if tuple(out.shape) != tuple(base_t.shape) or (
                moved and (base.probs is not None or base.rowq is not None)
            ):
                new.axes = None
                if base.probs is not None or base.rowq is not None:
                    new.lost = self._weights_of(base)
                    new.flat = name in ROW_MAJOR
                    new.probs = None
                new.rowq = None
            if new.lost is None:
                new.lost = next((g.lost for _, g in act if g.lost is not None), None)
            if new.lost is not None and base.lost is new.lost:
                new.flat = base.flat and _keeps_row_major(name, base_t, out)
            if (
                (name in CAT or name == "stack")
                and new.lost is not None
                and not new.changed
                and tuple(out.shape) == tuple(new.lost.shape)
                and _joined_otherwise(new.lost, out)
            ):
                # slices of the weights joined in another order (``cat([a[..., -1:], a[..., :-1]], -1)``, a
                # circular shift): other weights at some places than the softmax gave
                new.changed = True
                self._moved_why(new.lost, f"joined back in another order (by {name})")
            if new.lost is not None and (
                name not in KEEPS_VALUES
                or any(g.changed or g.touched for _, g in act)
                or (name in DROPOUT and out is not base_t)  # (while training: eval's hands back its input)
            ):
                new.changed = True
            if (
                name in CAT
                and (len(ins) > len(known) or len({g.origin for _, g in known}) > 1)
                and _cat_dim(name, args, kwargs, out) != out.dim() - 1
            ):
                new.cache = True  # joined to positions from outside this call or other inputs (a KV cache)
            if base.role == "scores":
                self._mask_step(name, func, args, kwargs, out, base_t, base, new, pre)
                new.smap = self._score_map_step(name, func, args, kwargs, out, base_t, base.smap)
            else:
                new.code = self._op_code(name, func, args, kwargs, out, act)
        for o in outs:
            self.set(o, new)

    def _row_reduced(self, name, args, kwargs, outs) -> bool:
        """The max (or mean) of query-key scores over the keys: one score per query position (BiDAF's
        query-to-context ``softmax(S.max(-1)[0])``), tagged with the queries' codes (over the queries:
        the keys'), so a softmax over them is placed like any softmax over positions."""
        x = args[0] if args else None
        g = self.tag(x)
        if (not isinstance(x, torch.Tensor) or g is None or g.role != "scores" or g.probs is not None
                or g.smap is None or g.smap.broken):  # fmt: skip
            return False
        smap = g.smap
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if smap.chain or tuple(x.shape) != smap.shape or x.dim() < 2 or not isinstance(dim, int):
            return False
        dim %= x.dim()
        if dim not in (x.dim() - 1, x.dim() - 2):
            return False
        code = smap.q if dim == x.dim() - 1 else smap.k
        if bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False)):
            code = code.unsqueeze(dim)
        out = outs[0]
        if tuple(code.shape) != tuple(out.shape):
            return False
        self.set(out, _Tag(None, g.origin, code=code))
        return True

    def _learned_columns(
        self, name, args, kwargs, base_t, out
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """``torch.cat([scores, sinks], dim=-1)`` (or ``cat([sinks, scores])``): the learned logits joined to the
        scores as more keys, (those before the scores, those after) (GPT-OSS's and StreamingLLM's attention
        sinks, a null key's logit), or None for any other op."""
        if name not in CAT or not args or not isinstance(args[0], (list, tuple)) or len(args[0]) < 2:
            return None
        parts = list(args[0])
        at = [i for i, p in enumerate(parts) if p is base_t]
        if len(at) != 1 or _cat_dim(name, args, kwargs, out) != out.dim() - 1:
            return None
        for p in parts[: at[0]] + parts[at[0] + 1 :]:
            if not isinstance(p, torch.Tensor) or p.dim() != base_t.dim():
                return None
            g = self.tag(p)
            if (g is not None and g.role != "param") or tuple(p.shape[:-1]) != tuple(base_t.shape[:-1]):
                return None
        return parts[: at[0]], parts[at[0] + 1 :]

    def _score_map_step(
        self, name, func, args, kwargs, out, base_t, smap: ScoreMap | None
    ) -> ScoreMap | None:
        """Carry the score map through an op on the scores: same shape keeps it, data movement is
        chained (replayed at the softmax), anything else breaks it with a reason."""
        if smap is None or smap.broken:
            return smap
        if (name in CAT or name == "stack") and args and isinstance(args[0], (list, tuple)):
            joined = self._scores_joined(name, args, kwargs, out)
            if joined is not None:
                return joined
        columns = self._learned_columns(name, args, kwargs, base_t, out)
        if columns is not None:
            return self._with_learned_keys(smap, *columns, tuple(base_t.shape)) or smap.fail(
                "learned logits joined to the scores in a layout capture does not follow"
            )
        if (
            (name in CAT or name == "stack")
            and args
            and isinstance(args[0], (list, tuple))
            and len(args[0]) > 1
        ):
            # (joined with other scores whose keys capture does not know, Longformer's band of each query's
            # neighbours by offset beside its global keys: never read as these scores broadcast)
            return smap.fail(f"{name} joined the scores with others whose keys capture could not place")
        if tuple(out.shape) == tuple(base_t.shape) and (name not in lineage.REPLAY or name in lineage.KEEP):
            return smap
        if name in lineage.REPLAY and args and args[0] is base_t:
            rest = tuple(
                tuple(a.shape) if name.endswith("_as") and isinstance(a, torch.Tensor) else a
                for a in args[1:]
            )
            if any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in rest):
                return smap.fail(f"{name} with a tensor argument on the scores could not be followed")
            return smap.then((name, lineage.replay_fn(name, func), rest, dict(kwargs)))
        if _broadcasts_to(base_t, out):
            return smap.then(("broadcast", torch.Tensor.expand, (tuple(out.shape),), {}))
        return smap.fail(f"{name} changed the scores' shape in a way capture does not follow")

    def _scores_joined(self, name, args, kwargs, out) -> ScoreMap | None:
        """Scores of several products joined along a leading axis (a head's ``q[:, h] @ k[:, h].T`` each, then
        ``torch.stack(..., 1)``; blocks of the batch ``cat``'ed): one score map whose slices are each product's,
        so every head keeps its own queries and keys (read as one product broadcast, the heads were copies of
        the first, and the layout a guess). None where a part is no product capture follows."""
        parts = args[0]
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if not parts or not isinstance(dim, int) or not all(isinstance(t, torch.Tensor) for t in parts):
            return None
        maps = []
        for t in parts:
            g = self.tag(t)
            if g is None or g.role != "scores" or g.smap is None or g.smap.broken or g.probs is not None:
                return None
            sm = lineage.rebased(g.smap, tuple(t.shape)) if g.smap.chain else g.smap
            if sm is None or tuple(sm.shape) != tuple(t.shape):
                return None
            maps.append(sm)
        nd = parts[0].dim()
        if any(t.dim() != nd for t in parts) or nd < 2:
            return None
        if name == "stack":
            d = dim % (nd + 1)
            if d > nd - 2:
                return None  # (stacked along the queries or keys: no leading axis)
            q, k = torch.stack([m.q for m in maps], d), torch.stack([m.k for m in maps], d)
        else:
            d = dim % nd
            if d >= nd - 2:
                return None
            q, k = torch.cat([m.q for m in maps], d), torch.cat([m.k for m in maps], d)
        shape = tuple(int(n) for n in out.shape)
        if tuple(q.shape) != shape[:-1] or tuple(k.shape) != (*shape[:-2], shape[-1]):
            return None
        return ScoreMap(shape, q, k)

    def _with_learned_keys(
        self, smap: ScoreMap, before: list[torch.Tensor], after: list[torch.Tensor], current: tuple[int, ...]
    ) -> ScoreMap | None:
        """The score map with learned keys joined before and after its keys: each joined column's code (a
        parameter's, as it was viewed and expanded; a constant's, a position of its own), the same in every
        row."""
        if smap.chain:
            now = lineage.rebased(smap, current)
            if now is None:
                return None
            smap = now
        if len(smap.shape) != (before + after)[0].dim():
            return None
        ks = []
        for p in before + [None] + after:
            if p is None:
                ks.append(smap.k)
                continue
            code = self.code_of(p) if self.tag(p) is not None else None  # a parameter's, as viewed
            if code is None or tuple(code.shape) != tuple(p.shape):  # a constant (a null key's 0 logit)
                start = self.sources.new(int(p.shape[-1]), "param", "null")
                code = lineage.fresh(start, (int(p.shape[-1]),), 1, p.device)[..., 0].expand(p.shape)
            col = code.select(-2, 0)  # (*s, m): one key per column
            if not bool((code == col.unsqueeze(-2)).all()):
                return None  # the joined logits differ from row to row: not keys
            ks.append(col.expand(*smap.k.shape[:-1], col.shape[-1]))
        k = torch.cat(ks, dim=-1)
        shape = (*smap.shape[:-1], int(k.shape[-1]))
        return ScoreMap(shape, smap.q, k, (), None)

    def _reshaped(self, base_t, base, out, new) -> None:
        """A view that splits the features into (heads, d) names the head count; 4-D -> 3-D folds two dims."""
        n = base_t.dim()
        if n == 0:  # (a number viewed: ``loss.reshape(1)``)
            return
        if new.heads is None:
            if (
                out.dim() > n
                and tuple(out.shape[: n - 1]) == tuple(base_t.shape[:-1])
                and math.prod(out.shape[n - 1 :]) == base_t.shape[-1]
            ):
                new.heads = int(out.shape[-2])  # (..., D) -> (..., H, d), or (..., 3, H, d)
            elif (
                out.dim() == n >= 3
                and tuple(out.shape[:-2]) == tuple(base_t.shape[:-2])
                and 0 < out.shape[-1] < base_t.shape[-1]
                and base_t.shape[-1] % out.shape[-1] == 0
                and out.shape[-2] == base_t.shape[-2] * (base_t.shape[-1] // out.shape[-1])
            ):
                new.heads = int(base_t.shape[-1] // out.shape[-1])  # (L, B, D) -> (L, B * H, d)
        if n == 4 and out.dim() == 3:
            a, b = base_t.shape[0], base_t.shape[1]
            if out.shape[0] == a * b:
                new.split = (int(a), int(b))

    def _transposed(self, t: torch.Tensor, d0: int, d1: int) -> torch.Tensor:
        """``t.transpose(d0, d1)``, followed: an op written otherwise, read as a product with a transpose
        (``tensordot(q, k, dims=([1], [1]))``, ``cdist(q, k)``), takes its operand through it."""
        made = t.transpose(d0, d1)
        self.propagate("transpose", torch.transpose, (t, d0, d1), {}, made, None)
        return made

    def _two_activations(self, a: Any, b: Any) -> bool:
        """Both operands are activations the capture follows (no parameter, no learned table): their product
        is scores or a weighted sum, not a projection."""
        for t in (a, b):
            if not isinstance(t, torch.Tensor) or _is_param(t):
                return False
            g = self.tag(t)
            if g is None or g.role == "param":
                return False
        return True

    def _one_hot_pick(self, ops: list, op_tags: list, origin) -> _Tag | None:
        """An activation times a matrix of 0s and 1s handed in (XLNet's ``einsum("mbnd,mlb->lbnd", q,
        target_mapping)``, the rows of the targets picked; a graph's adjacency summing neighbours): a selection
        or a sum of its rows, no scores of queries against keys. A projection whose positions capture does not
        place, or None where no operand is such a matrix."""
        if len(ops) != 2 or not all(isinstance(o, torch.Tensor) for o in ops):
            return None
        for i in (0, 1):
            sel, g, other = ops[i], op_tags[i], op_tags[1 - i]
            if (
                g is None
                and other is not None
                and other.role in (None, "linear")
                and other.probs is None
                and sel.is_floating_point()
                and sel.dim() >= 2
                and sel.numel() > 1
                and not _is_param(sel)
                and _zero_one(sel)
            ):
                return _Tag("linear", origin)
        return None

    def _pair_scored(self, name: str, args: tuple, ins: list[torch.Tensor], out: torch.Tensor) -> bool:
        """A projection of paired features (``lineage.pair_map``: ``F.linear`` or ``x @ a`` over the last axis, a
        1x1 ``conv2d`` over the channels) is scores: its output tagged as them, its queries the positions along
        the pairs' rows and its keys those along their columns. False for any other projection."""
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        w = ins[1] if len(ins) > 1 else None
        if x is None or w is None or x is w or not _is_param(w) or x.dim() < 3:
            return False
        g = self.tag(x)
        if g is None or g.role not in (None, "linear") or g.probs is not None or g.lost is not None:
            return False
        if name in CONV:
            if (
                name != "conv2d"
                or w.dim() != 4
                or any(int(n) != 1 for n in w.shape[2:])
                or tuple(out.shape[2:]) != tuple(x.shape[2:])
                or out.dim() != 4
            ):
                return False
            axis, kept = 1, True
        elif name in MATMUL:
            if name not in ("matmul", "__matmul__") or w.dim() > 2 or args[1] is not w:
                return False
            axis, kept = -1, w.dim() == 2
        elif name == "linear":
            axis, kept = -1, True
        else:
            return False
        code = self.code_of(x)
        if code is None or tuple(code.shape) != tuple(x.shape):
            return False
        smap = lineage.pair_map(code, axis, tuple(out.shape), kept)
        if smap is None:
            return False
        self.set(out, _Tag("scores", g.origin, smap=smap))
        return True

    def _matmul(self, name, args, kwargs, ins, tags, out, origin) -> _Tag:
        """q @ k of two activations makes scores; with a parameter, a projection. ``baddbmm(bias, q, k)``:
        a very negative bias is an additive mask."""
        bias = None
        if name == "baddbmm":
            bias = args[0] if args else kwargs.get("input")
            ops = [args[i] if len(args) > i else kwargs.get(key) for i, key in ((1, "batch1"), (2, "batch2"))]
            ops = [t for t in ops if isinstance(t, torch.Tensor)]
            op_tags = [self.tag(t) for t in ops]
        else:
            ops, op_tags = ins, tags
        pooled_by, self._pooled_by = self._pooled_by, None
        if (
            pooled_by is not None
            and len(ops) == 2
            and name != "einsum"
            and any(o is pooled_by[0] for o in ops)
        ):
            w, own = pooled_by
            v = ops[1] if ops[0] is w else None
            vc = self.code_of(v) if own and v is not None and tuple(v.shape) == tuple(out.shape) else None
            if (
                vc is not None
                and tuple(vc.shape) == tuple(out.shape)
                and int(w.shape[-1]) == int(w.shape[-2])
            ):
                return _Tag("linear", origin, code=vc)  # self-attention over positions: row i is position i
            code = self._pooled_code(ops, w, out)
            if code is not None:  # sentence vectors pooled from their words by ``bmm(a, h)``
                return _Tag("linear", origin, code=code)
        if any(g is not None and g.role == "param" for g in op_tags):
            mixed = self._mixed_by_parameter(name, args, ops, op_tags, origin)
            if mixed is not None:
                return mixed
            new = _Tag("linear", origin)
            if len(ops) == 2 and op_tags[1] is not None and op_tags[1].role == "param" and name != "einsum":
                xc = self.code_of(ops[0]) if ops[1].dim() == 1 else None
                if xc is not None and tuple(xc.shape[:-1]) == tuple(out.shape):  # x @ w, w a vector: one
                    new.code = (xc[..., 0] >> lineage.SHIFT) << lineage.SHIFT  # feature per position
                elif ops[1].dim() > 2:  # weights per head (H, d, o): each head's outputs features of its own
                    new.code = self._batched_projection(ops[0], ops[1], out)
                else:
                    new.code = self._op_code("linear", None, (ops[0],), {}, out, [])  # x @ W
                if (self._pending or self._wo_taken) and name in ("matmul", "__matmul__", "mm", "bmm"):
                    self._out_projection(ops[0], ops[1], None, True)
            elif (
                len(ops) == 2
                and name in ("matmul", "__matmul__", "mm", "bmm")
                and op_tags[0] is not None
                and op_tags[0].role == "param"
                and (op_tags[1] is None or op_tags[1].role != "param")
                and ops[0].dim() >= 2
                and ops[1].dim() >= 2
            ):  # W @ x, a learned matrix or vector on the left (a pointer network's ``bmm(v.expand(B, -1)
                # .unsqueeze(1), tanh(W1 e + W2 d))``): each column of x is a position, projected to W's rows
                xc = self.code_of(ops[1])
                if xc is not None and tuple(xc.shape) == tuple(ops[1].shape):
                    code, across = lineage.projected(xc.transpose(-1, -2), int(out.shape[-2]), check=True)
                    code = code.transpose(-1, -2)
                    if not across and tuple(code.shape) == tuple(out.shape):
                        new.code = code
            elif name == "einsum" and len(ops) == 2 and isinstance(args[0], str):  # Keras' "abc,cde->abde"
                x_first = op_tags[0] is None or op_tags[0].role != "param"
                if _is_param(ops[0]) != _is_param(ops[1]):  # (a learned vector expanded over positions, as
                    x_first = not _is_param(
                        ops[0]
                    )  # XLNet's ``mask_emb.expand``, times a Parameter: x is it)
                xc = self.code_of(ops[0] if x_first else ops[1])
                w = ops[1] if x_first else ops[0]
                done = (
                    None
                    if xc is None
                    else lineage.einsum_projected(args[0], xc, x_first, out, tuple(w.shape))
                )
                if done is not None:
                    new.code = done[0]
                    if done[1]:
                        xt = op_tags[0] if x_first else op_tags[1]
                        over = None if xc is None or (xt is not None and xt.attn_out is not None) else (
                            self._einsum_over_positions(args[0], xc, x_first, out))  # fmt: skip
                        if over is not None:
                            new.code = over  # Linformer's einsum("bnd,nk->bkd", keys, E)
                        else:
                            self._mixed(ops[0] if x_first else ops[1])
                n_in = (
                    _einsum_contracts_last(args[0]) if x_first and (self._pending or self._wo_taken) else None
                )
                if xc is not None and n_in is not None and ops[1].dim() == n_in + 1:
                    # "abcd,cde->abe": x's last n_in dims (heads, features) times a kernel read as (C, D)
                    kernel = ops[1]
                    w = _same_view(
                        kernel, ("kernel", _version_of(kernel)), lambda k: k.reshape(-1, k.shape[-1])
                    )
                    self._out_projection(ops[0], w, None, True, _flat_codes(xc, n_in))
            return new
        first = op_tags[0] if op_tags else None
        for g in op_tags[1:]:  # changed weights as a later operand (``einsum("bjd,bij->bid", v, w)``, slot
            if g is not None and g.touched and (g.probs is not None or g.rowq is not None):  # attention's
                self._unfollowed(g)  # renormalized weights): not followed, so flagged
            elif g is not None and g.lost is not None and g.changed and g.rowq is None and g.probs is None:
                self._changed_after_view(g.lost)  # (the same, past a view: ``flatten(1, 2).softmax(1).view``)
        if (
            first is not None
            and first.lost is not None
            and first.changed
            and first.rowq is None
            and first.probs is None
        ):
            if first.flat and ops[0].numel() == math.prod(first.lost.shape) and first.lost.record is not None:
                self._weights_used(first.lost, ops[0].reshape(first.lost.shape))  # (the record takes them)
            elif tuple(ops[0].shape) != tuple(first.lost.shape) or _joined_otherwise(first.lost, ops[0]):
                self._changed_after_view(first.lost)  # (else the record's weights at every place: written
                # back in their order, a head or a block of rows at a time)
        if first is not None and (first.rowq is not None or first.probs is not None):
            if name != "einsum":
                rowq = first.rowq
                if (
                    rowq is not None
                    and rowq.dim() == ops[0].dim()
                    and rowq.shape[-1] != 1 != ops[0].shape[-1]
                ):
                    self._other_axis(first)  # the product sums over another axis than the softmax's keys
                    return _Tag(None, origin, attn_out=first.attn_out)
                return self._weighted(ops, first, out, origin)
            eq = args[0] if args and isinstance(args[0], str) else None
            eq = lineage._explicit(eq, [o.dim() for o in ops]) if eq is not None and len(ops) == 2 else None
            return self._weighted_by_equation(eq, ops, first, out, origin)
        second = op_tags[1] if len(op_tags) == 2 else None
        if (
            second is not None
            and (second.rowq is not None or second.probs is not None)
            and (first is None or (first.rowq is None and first.probs is None and first.role != "param"))
            and name in ("matmul", "__matmul__", "bmm")
            and ops[0].dim() == ops[1].dim() == out.dim() >= 2
        ):  # values times weights (SAGAN's ``bmm(value, attention.permute(0, 2, 1))``): (.., d, k) @ (.., k, q)
            lead = "ABCDEFGHIJKLMNOP"[: out.dim() - 2]
            eq = f"{lead}kq,{lead}dk->{lead}dq"
            return self._weighted_by_equation(eq, [ops[1], ops[0]], second, out, origin)
        if (
            second is not None
            and (second.rowq is not None or second.probs is not None)
            and (first is None or (first.rowq is None and first.probs is None and first.role != "param"))
            and name == "einsum"
            and args
            and isinstance(args[0], str)
            and len(ops) == 2
        ):  # values first (slot attention's ``einsum("bjd,bij->bid", v, attn)``): the operands swapped
            eq = lineage._explicit(args[0], [o.dim() for o in ops])
            sides = _two_operands(eq) if eq is not None else None
            if sides is not None:
                swapped = f"{sides[1]},{sides[0]}->{sides[2]}"
                return self._weighted_by_equation(swapped, [ops[1], ops[0]], second, out, origin)
        picked = self._one_hot_pick(ops, op_tags, origin)
        if picked is not None:
            return picked
        if (first is not None and first.role == "scores" and first.smap is not None and not first.smap.broken
                and len(op_tags) > 1 and op_tags[1] is not None and op_tags[1].role != "scores"):  # fmt: skip
            self.n_attention += 1  # attention seen, if not recordable: no "no attention seen" note
            # (an exp of scores is a softmax by hand: where capture cannot follow it, that is said at the end)
            if not (self._hand and self._hand_of(ops[0], "exp") is not None):
                self.warn(self.path(), tuple(int(n) for n in ops[0].shape), "query-key scores multiply values "
                          "without a softmax (sigmoid attention, sparsemax, attention without normalization): "
                          "capture records softmax weights, so these weights are not recorded")  # fmt: skip
        split = (
            first.split
            if first is not None and out.dim() == 3 and ops[0].dim() == 3 and ops[0].shape[0] == out.shape[0]
            else None
        )
        new = _Tag("scores", origin, split, heads=first.heads if first is not None else None)
        if name == "einsum" and args and isinstance(args[0], str) and out.dim() >= 3:
            new.axes = _einsum_axes(args[0], out.dim())
        new.smap = self._product_map(name, args, ops, out)
        if len(op_tags) >= 2 and op_tags[0] is not None and op_tags[1] is not None:
            qo, ko = op_tags[0].origin, op_tags[1].origin
            if qo and ko:
                new.cross = not qo <= ko  # queries from other embedding calls than the keys
                new.ext = qo < ko or (qo == ko and op_tags[1].cache)  # keys = a cache + this call's keys
        if isinstance(bias, torch.Tensor) and bias.is_floating_point():
            beta = kwargs.get("beta", 1)
            bias_tag = self.tag(bias)
            if beta and (bias_tag is None or bias_tag.role != "scores"):
                masked = _added_hides(bias * beta)
                if bool(masked.any()):
                    alpha = kwargs.get("alpha", 1)
                    with torch.no_grad():
                        new.scores = torch.baddbmm(bias.detach().masked_fill(masked, 0), ops[0].detach(),
                                                   ops[1].detach(), beta=beta, alpha=alpha)  # fmt: skip
                    new.allowed, new.mask_source = ~masked, "additive"
        return new

    def _packed(self, name: str, func, args, outs) -> None:
        """``pack_padded_sequence`` / ``pad_packed_sequence``: the same gather replayed on the codes (the
        padding they add is a position of its own, as F.pad's)."""
        g = self.tag(args[0])
        if g is None:
            return
        c = self.code_of(args[0])
        code = None
        if c is not None:
            try:
                if name == "_pack_padded_sequence":  # (input, lengths, batch_first)
                    code = func(c, *args[1:])[0]
                    if len(outs) > 1:  # the padded slots' positions, batch-first, for the unpacking
                        pos = c[..., 0] >> lineage.SHIFT
                        first = bool(args[2]) if len(args) > 2 else False
                        self._packed_slots[id(outs[1])] = (outs[1], pos if first else pos.transpose(0, 1))
                else:  # (data, batch_sizes, batch_first, padding_value, total_length)
                    code = func(c, args[1], args[2], -1.0, *args[4:])[0]
                    held = self._packed_slots.get(id(args[1]))
                    slots = code[..., 0] < 0
                    pos = None
                    if held is not None and held[0] is args[1] and held[1].dim() == 2 and slots.dim() == 2:
                        # as many steps as the longest sequence (or total_length): the packed tensor's
                        # first ones, and padding positions of their own past its end
                        pos = self._unpacked_slots(held[1], slots if bool(args[2]) else slots.transpose(0, 1))
                        pos = pos if pos is None or bool(args[2]) else pos.transpose(0, 1)
                    if pos is not None:
                        # a PAD slot is its own token's position (not computed from it: the mask says so)
                        f = torch.arange(int(code.shape[-1]), dtype=torch.int64, device=code.device)
                        code = torch.where(slots[..., None], (pos[..., None] << lineage.SHIFT) | f, code)
                    else:
                        code = code.masked_fill(code < 0, self._pad_code())
            except Exception:  # an argument the replay does not take: the codes are lost
                code = None
        if code is not None and tuple(code.shape) != tuple(outs[0].shape):
            code = None
        self.set(outs[0], _Tag(g.role, g.origin, code=code))
        entry = _held(self._hand, args[0]) if self._hand and name != "_pack_padded_sequence" else None
        if entry is not None and entry[1] == "exp" and isinstance(entry[3], torch.Tensor):
            # a softmax by hand on PackedSequence.data (sgrvinod's HAN: exp of the packed scores, padded back,
            # divided by their sums): the exp, padded, is still one; its scores padded with -inf, which weigh 0
            try:
                scores = func(entry[3], args[1], args[2], float("-inf"), *args[4:])[0]
            except Exception:  # scores the padding does not take
                return
            if tuple(scores.shape) == tuple(outs[0].shape):
                self.set(scores, _Tag(g.role, g.origin, code=code))  # (at the exp's positions)
                self._remember_hand(outs[0], "exp", outs[0], scores, entry[4])
                if self._unfinished.pop(id(args[0]), None) is not None:
                    self._unfinished[id(outs[0])] = (self.path(), tuple(outs[0].shape))

    def _unpacked_slots(self, packed: torch.Tensor, slots: torch.Tensor) -> torch.Tensor | None:
        """The positions (B, T) of ``pad_packed_sequence``'s output slots, batch-first: the padded tensor's
        that was packed (B, T0), its first T steps (T <= T0), then padding positions of their own (T > T0,
        ``total_length`` past its end); None where the batch differs."""
        b, t = int(slots.shape[0]), int(slots.shape[1])
        if int(packed.shape[0]) != b:
            return None
        t0 = int(packed.shape[1])
        if t <= t0:
            return packed[:, :t].to(slots.device)
        n = b * (t - t0)
        start = self.sources.new(n, "pad", "padding")
        extra = start + torch.arange(n, dtype=torch.int64, device=slots.device).view(b, t - t0)
        return torch.cat([packed.to(slots.device), extra], dim=1)

    def _recurrent(self, name: str, x: torch.Tensor, outs) -> None:
        """An RNN (``nn.GRU``/``LSTM``/``RNN``) or one step of a cell: the output at each position is a
        projection of that position (its state after reading it), so it keeps the input's positions with
        features of its own, as a linear layer's output does. Final states (h_n, c_n) are a vector of each
        sequence: positions of their own (a GRU's ``h_n`` as the query of Luong's or GST's attention)."""
        g = self.tag(x)
        if g is None and x.is_floating_point() and x.dim() >= 2:  # features from outside (a spectrogram)
            g = self._external(x)
        xc = self.code_of(x) if g is not None else None
        origin = g.origin if g is not None else frozenset()
        for i, o in enumerate(outs):
            code = None
            if xc is not None and (i == 0 or name in CELLS) and tuple(o.shape[:-1]) == tuple(x.shape[:-1]):
                code = lineage.projected(xc, int(o.shape[-1]))[0]
            elif xc is not None and i > 0 and name not in CELLS and o.dim() == 3 and o.numel():
                # a final state (layers x directions, B, H): a vector of each sequence, a position of its own
                # (as a sum over positions pools them), so a query made of it is placed in its sequence
                n = int(o.shape[0]) * int(o.shape[1])
                parent = self.sources.at(int(xc.reshape(-1)[0]) >> lineage.SHIFT).start
                start = self.sources.new(n, "state", "final state", ("final state", parent))
                pos = start + torch.arange(n, dtype=torch.int64, device=xc.device).view(
                    o.shape[0], o.shape[1], 1
                )
                code = (pos << lineage.SHIFT) | torch.arange(
                    int(o.shape[-1]), dtype=torch.int64, device=xc.device
                )
                # (a state that read the whole sequence asks as a decoder's state does: cross, as a mean-pooled
                # query over the positions it pooled is)
                self.set(o, _Tag("linear", frozenset({("final state", start)}), code=code))
                continue
            self.set(o, _Tag("linear", origin, code=code))

    def _pooled_code(
        self, ops: list[torch.Tensor], w: torch.Tensor, out: torch.Tensor
    ) -> torch.Tensor | None:
        """Codes of weights over positions times values: ``a (..., R, T) @ h (..., T, d)`` or
        ``h (..., d, T) @ a (..., T, R)``. Each of the R outputs pools the T positions into a position of
        its own (as a sum over positions does), with the values' features."""
        first = ops[0] is w
        v = ops[1] if first else ops[0]
        vc = self.code_of(v)
        if vc is None or tuple(vc.shape) != tuple(v.shape) or v.dim() < 2 or out.dim() != v.dim():
            return None
        lead = tuple(int(n) for n in out.shape[:-2])
        if first:  # out (..., R, d): the values' features along the last dim
            feat, r = (vc.select(-2, 0) & lineage.FEATURES).unsqueeze(-2), int(out.shape[-2])
        else:  # out (..., d, R): the features along the rows
            feat, r = (vc.select(-1, 0) & lineage.FEATURES).unsqueeze(-1), int(out.shape[-1])
        n = math.prod(lead) * r
        if n < 1:
            return None
        parent = self.sources.at(int(vc.reshape(-1)[0]) >> lineage.SHIFT).start
        start = self.sources.new(n, "pooled", "pooled", ("pooled", parent))
        pos = start + torch.arange(n, dtype=torch.int64, device=vc.device).view(*lead, r)
        pos = pos.unsqueeze(-1) if first else pos.unsqueeze(-2)  # (..., R, 1) or (..., 1, R)
        try:
            code = ((pos << lineage.SHIFT) | feat).expand(out.shape)
        except RuntimeError:
            return None
        return code

    def _batched_projection(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor | None:
        """``x @ W`` with weights per slice (``W`` (H, d, o), a graph attention layer's per-head attention
        vectors): the positions of x, and features numbered slice by slice (h * o + j), so heads made
        by different slices of the weights stay apart however many features each has."""
        xc = self.code_of(x)
        if xc is None or out.dim() < 2 or xc.dim() != out.dim():
            return None
        try:  # (x broadcast over the heads: DeepInf's ``h.unsqueeze(1) @ w``, (B, 1, n, f) @ (H, f, o))
            rows = torch.broadcast_shapes(tuple(xc.shape[:-1]), tuple(out.shape[:-1]))
        except RuntimeError:
            return None
        if tuple(rows) != tuple(out.shape[:-1]):
            return None
        lead = tuple(int(n) for n in w.shape[:-2])
        if (
            len(lead) > out.dim() - 2
            or tuple(int(n) for n in out.shape[out.dim() - 2 - len(lead) : -2]) != lead
        ):
            return None
        o = int(out.shape[-1])
        wc = self.code_of(w)
        if wc is not None and tuple(wc.shape) == tuple(w.shape) and w.dim() > 2:
            slices = wc.reshape(-1, *wc.shape[-2:])
            if bool((slices == slices[:1]).all()):  # one weight expanded or repeated over the batch (a
                return self._op_code("linear", None, (x,), {}, out, [])  # learned context vector): x @ W
        slice_no = torch.arange(math.prod(lead), dtype=torch.int64, device=xc.device).view(*lead, 1, 1)
        feat = slice_no * o + torch.arange(o, dtype=torch.int64, device=xc.device)
        return (((xc[..., :1] >> lineage.SHIFT) << lineage.SHIFT) | feat).expand(out.shape)

    def _mixed_by_parameter(self, name, args, ops, op_tags, origin) -> _Tag | None:
        """Scores or weights in a product with a parameter that does not contract their keys: heads
        mixed by a learned matrix (talking-heads attention, ``einsum("bhij,hk->bkij", attn, w)``). Weights
        mixed after the softmax are not what the record holds: the record is flagged. Scores mixed before
        it keep the tag of scores whose layout cannot be followed, so their softmax is recorded, flagged.
        None where no scores or weights are in the product, or it contracts their keys (learned values)."""
        i = next(
            (
                i
                for i, g in enumerate(op_tags)
                if g is not None and (g.probs is not None or g.role == "scores" or g.lost is not None)
            ),
            None,
        )
        if i is None:
            return None
        g, t = op_tags[i], ops[i]
        # (weights viewed into another shape, ``w.view(b, H // g, g, n, n)``: their keys still last)
        key_dim = g.probs.layout.dim if g.probs is not None and g.probs.layout is not None else t.dim() - 1
        if name == "einsum":
            eq = args[0] if args and isinstance(args[0], str) and len(ops) == 2 else None
            sides = _two_operands(lineage._explicit(eq, [o.dim() for o in ops]) if eq is not None else None)
            if sides is None:
                return None
            letter = sides[i][key_dim % t.dim()]
            if letter not in sides[2]:
                return None  # the keys are contracted: the weights multiply learned values
        elif (
            i == 0
            and key_dim % t.dim() == t.dim() - 1
            and (
                g.lost is None
                or g.lost.record is None
                or g.flat
                or int(t.shape[-1]) == int(g.lost.record.probs.shape[-1])
                or int(t.shape[-1]) != int(g.lost.record.probs.shape[1])
            )
        ):
            # w @ W: the weights' last axis (their keys, or relative positions made of them: VITS's) meets the
            # parameter. Weights moved by a permute whose last axis is as long as the heads and not as the keys
            # (``attn.permute(0, 2, 3, 1) @ W``): the heads
            return None
        why = ("mixed across heads by a product with a parameter (talking-heads attention) "
               f"({name}{' ' + args[0] if name == 'einsum' else ''})")  # fmt: skip
        if name == "einsum" and _mixes_one_axis(args[0], ops, i):
            kept = self._scores_mixed_in_place(g, origin)
            if kept is not None:
                return kept
        return self._heads_mixed(g, origin, why)

    def _scores_mixed_in_place(self, g: _Tag, origin) -> _Tag | None:
        """Scores no mask has touched yet, mixed across one axis by a learned square matrix that leaves every
        other axis where it was (talking-heads attention before the softmax, ``einsum("bhij,hg->bgij", s, w)``,
        CaiT's ``proj_l`` over the heads permuted last): each element still holds the query and key it held, and
        the heads mixed are the heads at those places, as a 1x1 convolution over the heads leaves them. None
        where the scores were masked or changed first (a mix over ``-inf`` is no mask any more)."""
        if (
            g.role != "scores"
            or g.probs is not None
            or g.lost is not None
            or g.rowq is not None
            or g.allowed is not None
            or g.smap is None
            or g.smap.broken
        ):
            return None
        return g.derived(origin)

    @staticmethod
    def _over_heads(x: torch.Tensor, g: _Tag) -> bool:
        """Scores (from a product of queries and keys) or weights whose last axis is not their keys: a
        linear layer over it mixes another axis (the heads, permuted last). Over the keys, a linear
        layer multiplies the weights by learned values."""
        if g.probs is not None and g.probs.record is not None:
            return int(x.shape[-1]) != int(g.probs.record.probs.shape[-1])
        if g.lost is not None and g.lost.record is not None:  # weights moved where lineage no longer reads
            return int(x.shape[-1]) != int(g.lost.record.probs.shape[-1])  # their rows (permuted heads last)
        if g.role != "scores" or g.smap is None:
            return False
        if int(x.shape[-1]) != int(g.smap.shape[-1]):
            return True
        # as many heads as keys: the chain of moves since the product says which the last axis holds
        return not g.smap.broken and lineage.keys_last(g.smap, tuple(x.shape)) is False

    def _unfollowed(self, g: _Tag) -> None:
        """Weights changed after the softmax (``touched``: rows zeroed, dropout) went into a product capture
        cannot follow: the record, which holds them as they were, is flagged."""
        if g.touched:
            self._flag_weights(self._weights_of(g), "the weights were changed after the softmax and then "
                               "multiplied in a product capture could not follow: the record holds them as "
                               "the softmax gave them")  # fmt: skip

    def _flag_weights(self, p: _Probs | None, flag: str) -> None:
        """The record these weights were recorded as is flagged (not exact, ``flag`` its reason) and the
        notes warn; a record flagged already keeps its first reason and gets this one too (scores mixed across
        heads before the softmax, then the weights mixed after it: both are said)."""
        rec = p.record if p is not None else None
        if p is None or rec is None or (rec.flag is not None and flag in rec.flag):
            return
        self._update_record(p, exact=False, flag=flag if rec.flag is None else f"{rec.flag}; and {flag}")
        self.warn(rec.name, tuple(rec.probs.shape), f"could not verify: {flag}")

    def _weighted_by_equation(self, eq, ops, first: _Tag, out, origin) -> _Tag:
        """Weights (``ops[0]``, tagged ``first``) times values (``ops[1]``) as the explicit einsum ``eq``
        lays them out: followed as weights (lead, q, k) times values (lead, k, d) where the equation
        sums over the weights' keys; else the weights' record is flagged if they were changed."""
        perms = _einsum_product(eq)  # "... i j, ... j d -> ... i d" with its dots written out
        vcode = self.code_of(ops[1]) if len(ops) == 2 else None
        if perms is None and len(ops) == 2:
            # values with no head axis (multi-query: ``einsum("bhij,bjd->bhid", attn, v)``, lucidrains' CoCa and
            # PaLM): the weights' axes the values lack are broadcast over them, as ``attn @ v.unsqueeze(1)``
            widened = _broadcast_values(eq, ops[0], ops[1], vcode)
            if widened is not None:
                eq, ops, vcode = widened[0], [ops[0], widened[1]], widened[2]
                perms = _einsum_product(eq)
        if perms is None or len(ops) != 2:  # not weights times values along the keys: nothing claimed
            self._unfollowed(first)
            return _Tag(None, origin, attn_out=first.attn_out)
        w_perm, v_perm, out_perm = perms  # to (lead, q, k), (lead, k, d); (lead, q, d) to the output's
        p = first.probs
        if (
            p is not None
            and p.layout is not None
            and first.rowq is not None
            and first.rowq.dim() == len(w_perm)
            and w_perm[-1] != p.layout.dim % len(w_perm)
        ):  # summed over another axis than the softmax's keys (``"bhqk,bhqd->bhkd"``: over the queries)
            self._other_axis(first)
            return _Tag(None, origin, attn_out=first.attn_out)
        w, weights = ops[0], first
        if w_perm != list(range(len(w_perm))):  # the weights laid out otherwise (Transformer-XL's ijbn)
            plain_tag = self._plain_weights(first, w_perm)
            if plain_tag is None:
                self._unfollowed(first)
                return _Tag(None, origin, attn_out=first.attn_out)
            w, weights = w.permute(w_perm), plain_tag
        plain = out.permute([out_perm.index(i) for i in range(out.dim())])
        vc = vcode
        vc = _permuted(vc, v_perm) if vc is not None and vc.dim() == len(v_perm) else None
        new = self._weighted([w, ops[1].permute(v_perm)], weights, plain, origin, (vc,))
        if new.code is not None:
            new.code = _permuted(new.code, out_perm)
        return new

    def _other_axis(self, g: _Tag) -> None:
        """Weights multiplied with the values along another axis than their softmax's (a softmax over
        the queries, dim=1, then ``bmm(w, v)``, as PCT's offset attention): flagged."""
        self._flag_weights(self._weights_of(g), "the weights are multiplied with the values along another "
                           "axis than the one they were last normalized over (by their softmax, or by a "
                           "renormalization after it, as PCT's offset attention does): the record holds them over "
                           "the keys of that normalization, not the ones the product sums over")  # fmt: skip

    def _weights_of(self, g: _Tag) -> _Probs | None:
        """The record's weights a tag of weights (or of their rows) holds."""
        if g.probs is not None:
            return g.probs
        if g.owner is not None:
            return g.owner
        held = self._rowq_owner.get(id(g.rowq)) if g.rowq is not None else None
        return held[1] if held is not None and held[0] is g.rowq else None

    def _rescaled(self, args) -> None:
        """Weights times values (only moved since) scaled by a factor made from the scores (``o *
        exp(lse_block - lse)``: a softmax computed block by block and combined online, ring attention's):
        each block's weights are not the weights the values end up with, so their records are flagged."""
        a, b = args[0], args[1]
        for x, y in ((a, b), (b, a)):
            gx, gy = self.tag(x), self.tag(y)
            merged = _held(self._merged, x)
            if (
                gx is not None
                and gx.made_by is not None
                and (gx.moved or merged is not None)
                and gy is not None
                and gy.role == "scores"
            ):
                if gy.probs is None and gy.rowq is None and y.is_floating_point():
                    for made in merged[1] if merged is not None else (gx.made_by,):
                        self._flag_weights(made, "the product of these weights with the values is then scaled "
                                       "by a factor made from the scores (a softmax computed block by block and "
                                       "combined online, as ring or flash attention written out does): the "
                                       "record holds one block's softmax, not the weights the values end up "
                                       "with")  # fmt: skip

    def _outputs_merged(self, args, out: torch.Tensor) -> None:
        """The products of two maps' weights with their values added or subtracted (``out - bo``, a merge of
        blocks by their log-sum-exp, ``out - sigmoid(lse_b - lse) * (out - bo)``): held, so that scaling
        them by a factor from the scores flags the maps (``_rescaled``) as it does for one map's product."""
        tags = [self.tag(a) for a in args[:2]]
        made = [g.made_by for g in tags if g is not None and g.made_by is not None]
        if len(made) == 2 and made[0].record is not made[1].record:
            held = [p for a in args[:2] for p in (_held(self._merged, a) or (None, ()))[1]]
            _hold(self._merged, out, (*held, *made))

    def _moved_why(self, p: _Probs | None, why: str) -> None:
        """How weights were moved after the softmax, for the flag if a product multiplies them so."""
        if p is not None and id(p) not in self._mixed_why:
            self._mixed_why[id(p)] = why

    def _changed_after_view(self, p: _Probs) -> None:
        """Weights viewed into another shape, changed, then multiplied with values (differential
        attention's ``w.view(B, H, 2, T, S)``, then ``w[:, :, 0] - lam * w[:, :, 1]``), or the largest of them
        picked and put back (top-k): flagged."""
        if id(p) in self._consumed and self._consumed_at.get(id(p)) != self.path():
            return  # (they weighed their values already: another module's readout of them, a head pooling)
        if id(p) in self._mixed_why:
            self._flag_unless_used(p, f"the weights are {self._mixed_why[id(p)]} after the softmax: the record "
                                   "holds the softmax's output, not the weights the values are multiplied with")  # fmt: skip
            return
        if id(p) in self._topk_of:
            self._flag_unless_used(p, "the largest weights were picked after the softmax (top-k, sort) and put "
                                   "into another tensor the values are multiplied with (a sparse copy): the record "
                                   "holds the softmax's output, not the weights the values are multiplied with")  # fmt: skip
            return
        self._flag_unless_used(p, "the weights are changed after the softmax, past a view capture does not "
                               "follow (heads' maps combined, as differential attention does?): the record holds "
                               "the softmax's output, not the weights the values are multiplied with")  # fmt: skip

    def _flag_unless_used(self, p: _Probs, flag: str) -> None:
        """Flag the record of weights that were changed, then multiplied (or combined with another map's), at
        the block's end, unless its own weights, as the softmax gave them, multiply values too: then what
        changed them is a use beside the attention (an entropy or distillation loss summed over layers, a
        rollout of the head-averaged maps), and the record is what the values were weighted by."""
        self._flags_held.append((p, flag))

    def _held_flags(self) -> None:
        """The flags ``_flag_unless_used`` held, on the records whose own weights never weighed values."""
        used = {q.record.seq for q in self._consumed.values() if q.record is not None}
        for p, flag in self._flags_held:
            if p.record is not None and p.record.seq not in used:
                self._flag_weights(p, flag)
        self._flags_held.clear()

    def _weights_combined(self, act: list[tuple[torch.Tensor, _Tag]], origin, out: torch.Tensor) -> bool:
        """Weights combined element by element with another map's weights after the softmax (differential
        attention's ``w[:, :, 0] - lam * w[:, :, 1]``, two maps averaged, interpolated by ``lerp``, multiplied):
        the values are multiplied by the mix, which no record holds, so every record among them is flagged.
        False where fewer than two records' weights meet."""
        # (weights scaled since their softmax, ``lam * a2``, are still that record's weights)
        weights = [p for _, g in act if (p := self._weights_of(g)) is not None and p.record is not None]
        # (weights already combined, then one more map's added: heads summed in a loop, ``acc = acc + w_h``)
        mixed = bool(self._combined) and any(_held(self._combined, t) is not None for t, _ in act)
        if len({id(p.record) for p in weights}) < (1 if mixed else 2):  # (one map's weights over their own
            return False  # sum: renormalized)
        done: set[int] = set()
        for p in weights:
            if id(p.record) not in done:
                done.add(id(p.record))
                self._flag_unless_used(p, "the weights are combined with other weights (heads' maps subtracted "
                                       "or added: differential attention) after the softmax: the record holds the "
                                       "softmax's output, not the weights the values are multiplied with")  # fmt: skip
        self.set(out, _Tag("linear", origin))
        _hold(self._combined, out)
        return True

    def _heads_mixed(self, g: _Tag, origin, why: str, defer: bool = True) -> _Tag:
        """The tag of scores or weights whose heads a learned map mixed (``why``): weights flag their
        record where the mix multiplies values (``defer``; else now); scores lose their layout, so their
        softmax is recorded flagged."""
        p = g.probs or g.lost
        if p is not None and not defer:
            self._flag_weights(p, f"the weights are {why} after the softmax: the record holds the softmax's "
                               "output, not the weights the values are multiplied with")  # fmt: skip
            return _Tag("linear", origin)
        if p is not None:  # (a readout of the maps after they weighed the values, ESM-2's contact head
            self._mixed_why[id(p)] = why  # over every layer's heads, is no attention)
            return _Tag("linear", origin, lost=p, changed=True)
        new = _Tag("scores", origin)
        if g.smap is not None:
            new.smap = g.smap.fail(
                f"the scores are {why} before the softmax, so the head split comes from the shape"
            )
        return new

    def _product_map(self, name, args, ops, out) -> ScoreMap | None:
        """Which query and key every element of a product of two activations holds (lineage)."""
        if len(ops) != 2 or out.dim() < 2:
            return None
        a, b = self.code_of(ops[0]), self.code_of(ops[1], columns=name in ("matmul", "__matmul__", "bmm"))
        if a is None or b is None:
            return None
        if name == "einsum":
            return lineage.einsum_map(args[0], a, b, out) if isinstance(args[0], str) else None
        if ops[0].dim() < 2 or ops[1].dim() < 2 or tuple(a.shape) != tuple(ops[0].shape):
            return None
        if name in ("__rmatmul__",):
            a, b = b, a
        return lineage.matmul_map(a, b, out)

    def _weighted(self, ops, first: _Tag, out, origin, given: tuple | None = None) -> _Tag:
        """Weights times values: the output rows are the weights' queries, its features the values'.
        ``given``: (the values' codes,) where ``ops[1]`` is an einsum's values permuted to (lead, k, d)."""
        new = _Tag(None, origin, attn_out=first.attn_out, moved=True, made_by=self._weights_of(first))
        if given is not None:
            vc = given[0]
        else:
            vc = self.code_of(ops[1]) if len(ops) > 1 else None
        heads = self._keep_values(first, ops, vc, out.dtype)
        rowq = first.rowq
        if (rowq is None or vc is None or ops[0].dim() < 2 or ops[1].dim() < 2
                or tuple(rowq.shape) != (*ops[0].shape[:-1], 1)):  # fmt: skip
            return new
        if heads is not None and tuple(out.shape[:-2]) == tuple(ops[0].shape[:-2]):
            # features numbered head by head (h * dv + d): heads that share their values (grouped-query
            # attention repeats them) stay apart where a projection reads them merged back
            dv = int(out.shape[-1])
            key = ("weighted heads", id(rowq), id(heads), tuple(out.shape))
            hit = lineage.recall(key)
            if hit is lineage.MISS:
                feat = heads.to(rowq.device).view(*out.shape[:-1], 1) * dv + torch.arange(
                    dv, device=rowq.device
                )
                hit = lineage.remember(key, (rowq, heads), ((rowq >> lineage.SHIFT) << lineage.SHIFT) | feat)
            new.code = hit
            return new
        key = ("weighted", id(rowq), id(vc), tuple(out.shape))
        hit = lineage.recall(key)
        if hit is not lineage.MISS:
            new.code = hit
            return new
        v, _ = lineage.reduced(vc, -2)  # (..., c): the values' features
        try:
            code = ((rowq >> lineage.SHIFT) << lineage.SHIFT) | (v & lineage.FEATURES).unsqueeze(-2)
            code = code.expand(out.shape) if tuple(code.shape) != tuple(out.shape) else code
            new.code = lineage.remember(key, (rowq, vc), code)
        except RuntimeError:
            pass
        return new

    def _reused(self, p: _Probs, first: _Tag, ops) -> bool:
        """Weights a module multiplied its values with, multiplied again by another module's values (a map
        shared across layers: the Reuse Transformer's later layers take an earlier layer's map): an attention
        call of that module with the same weights, recorded under its name. Where the weights changed since
        their record (a later flag could not reach the copy), the copy is not made and a warning says so.
        False where the second product is in the same module (Shaw's relative values, a second read), or
        multiplies some of the weights or a mean of them (a head pooling by the class token's attention)."""
        if first.probs is None:
            return False
        here = self.path()
        if (
            self.outside
            or here == self._consumed_at.get(id(p))
            or here == (p.record.name if p.record else here)
        ):
            return False
        values = self.tag(ops[1]) if len(ops) > 1 else None
        if values is None or values.role == "param" or self.code_of(ops[1]) is None:
            return False  # (values from no positions lineage knows: a table, a projection of weights)
        rec = p.record
        if (id(p), here) in self._reuses:
            return True
        if first.touched or rec is None or not rec.exact:
            self.warn(here, tuple(ops[0].shape), "the weights of the attention in "
                      f"{rec.name if rec is not None else 'another module'!r} multiply values here too (a map "
                      "reused across layers), changed or unverified since: not recorded again")  # fmt: skip
            self._reuses.add((id(p), here))
            return True
        self._note_run()
        copy = _replaced(rec, name=here, values=None, residual_of=None, seq=self.n_ops)
        self._reuses.add((id(p), here))
        self.cap.records.append(copy)
        return True

    def _keep_values(self, first: _Tag, ops, vc: torch.Tensor | None, out_dtype=None) -> torch.Tensor | None:
        """The values an exactly laid-out record's weights multiply, (B, H, k, dv), kept on the record;
        their codes wait for the projection that reads the heads merged back. Returns the head of each
        row of the product (``_row_heads``) where the layout gives it, else None."""
        p = self._weights_of(first)
        if p is not None and len(ops) >= 2 and isinstance(ops[0], torch.Tensor):
            w = ops[0]
            if (  # under autocast the product takes the weights cast down to its own dtype
                out_dtype is not None
                and _cast_down(w.dtype, out_dtype)
                and torch.is_autocast_enabled(w.device.type)
            ):
                self._weights_used(p, w.to(out_dtype))
            elif first.touched:
                self._weights_used(p, w)
        if p is not None and len(ops) >= 2:
            self._seal(p.record)  # (laid out or flagged: a later write into its memory is not the record's)
        if p is None or p.layout is None or p.record is None or len(ops) < 2:
            return None
        if id(p) in self._consumed and self._reused(p, first, ops):
            return None
        if id(p) in self._consumed:  # the weights multiply a second tensor (Shaw's relative values): what
            if p.record.values is not None:  # moves from a key is no longer one vector per key
                self._update_record(p, values=None)
            self._pending.pop(first.attn_out or "", None)
            return None
        self._consumed[id(p)] = p
        self._consumed_at[id(p)] = self.path()
        w, v = ops[0], ops[1]
        if not isinstance(v, torch.Tensor) or not v.is_floating_point():
            return None
        shape, rec, layout = tuple(w.shape), p.record, p.layout
        w, v = w.detach(), v.detach()
        held: torch.Tensor | None = (
            w  # what the weights were, kept for make's check unless it is the record's
        )
        try:
            laid = layout.bhqk(w)
            if (
                laid.dtype == rec.probs.dtype
                and laid.data_ptr() == rec.probs.data_ptr()
                and laid.shape == rec.probs.shape
                and laid.stride() == rec.probs.stride()
            ):
                held = None  # the record's weights are these very ones (and a later write is not theirs)
        except RuntimeError:
            pass

        def make() -> torch.Tensor | None:  # on first use: the values, if the weights are the ones recorded
            vals = values_.bh_values(layout, shape, v)
            if vals is None or tuple(vals.shape[:3]) != (*rec.probs.shape[:2], rec.probs.shape[-1]):
                return None
            if held is None:
                return vals
            try:  # not dropped out, gated or renormalized between the softmax and the product
                same = torch.equal(layout.bhqk(held).to(rec.probs.dtype), rec.probs)
            except RuntimeError:
                same = False
            return vals if same else None

        self._update_record(p, values=values_.HeadValues(make=make, watch=(v, held)))
        if vc is None or tuple(vc.shape) != tuple(v.shape) or first.attn_out is None:
            return None
        heads = _row_heads(layout, shape)
        if heads is None:  # the values' own features (two heads sharing them cannot be told apart)
            self._pend(first.attn_out, (
                p, lambda: values_.bh_values(layout, shape, vc), (id(layout), shape, id(vc))
            ))  # fmt: skip
            return None
        b, h = int(layout.rows.shape[0]), int(layout.rows.shape[1])
        k, dv = int(shape[-1]), int(v.shape[-1])

        def vcodes() -> torch.Tensor:  # (B, H, k, dv): head h's feature d is h * dv + d, as in the product
            grid = torch.arange(h, device=vc.device)[:, None] * dv + torch.arange(dv, device=vc.device)
            return grid.view(1, h, 1, dv).expand(b, h, k, dv)

        self._pend(first.attn_out, (p, vcodes, ("heads", id(layout), shape, dv)))
        return heads

    def _out_projection(self, x: Any, weight: Any, bias: Any, transposed: bool, xc: Any = None) -> None:
        """A projection of heads merged back: the columns each head's value features meet are its
        W_O slice (from the codes of its input, or ``xc``: codes of ``x`` with the contracted dims
        flattened, for an einsum), completing that record's values."""
        if not isinstance(weight, torch.Tensor):  # (x @ W's codes, made as a linear's: the product says W)
            return
        merged = self._merged_heads.pop(id(x), None) if self._merged_heads else None
        if merged is not None and merged[0]() is x and weight.dim() == 2:
            self._merged_projection(merged[1], weight, bias, transposed)
            return
        x_tag = self.tag(x) if isinstance(x, torch.Tensor) else None
        taken = _held(self._wo_taken, x) if self._wo_taken else None
        if taken is not None and taken[2] is not weight and taken[1].record is not None:
            # the heads merged back are read by a second projection (the next layer's q, k and v over an
            # attention with no output projection of its own): the first was no output projection either
            values = taken[1].record.values
            if values is not None:
                values.w_o, values.b_o = None, None
            self._wo_taken.pop(id(x), None)
            return
        if x_tag is None or x_tag.attn_out is None or x_tag.attn_out not in self._pending:
            return
        features = int(weight.shape[1] if transposed else weight.shape[0]) if weight.dim() == 2 else None
        if not self._owns_projection(x_tag.attn_out, weight, features):
            # a projection the attention's own code does not run (the next layer's, a classifier's): its
            # values are told without an output projection
            self._pending.pop(x_tag.attn_out)
            return
        if not x_tag.moved:  # something was added to or multiplied with the heads' output after the weights
            # (a gate, Shaw's relative values): what moves from a key is no longer its value vector alone
            p = self._pending.pop(x_tag.attn_out)[0]
            self._update_record(p, values=None)
            if p.record is not None:
                self.skip(p.record.name, tuple(p.record.probs.shape), _NOT_MOVED)
            return
        p, vcodes_of, held = self._pending.pop(x_tag.attn_out)
        rec = p.record
        xc = self.code_of(x) if xc is None else xc
        if (
            rec is None
            or rec.values is None
            or xc is None
            or not isinstance(weight, torch.Tensor)
            or weight.dim() != 2
        ):
            return
        if int(xc.shape[-1]) != int(weight.shape[0] if transposed else weight.shape[1]):
            return
        key = ("head columns", *held, id(xc))  # codes and layouts are shared: found once
        cols = lineage.recall(key)
        if cols is lineage.MISS:
            vcodes = vcodes_of()
            found = None if vcodes is None else values_.head_columns(vcodes, xc)
            cols = lineage.remember(key, (vcodes_of, xc), found)
        if cols is None:
            return
        rec.values.b_o = bias.detach() if isinstance(bias, torch.Tensor) and bias.dim() == 1 else None
        if rec.values.b_o is not None:
            rec.values.watch(rec.values.b_o)
        # again only if the weight changed
        key = ("W_O", id(weight), _version_of(weight), id(cols), transposed)
        w_o = lineage.recall(key)
        if w_o is lineage.MISS:
            w_o = lineage.remember(key, (weight, cols), values_.projection_slices(weight, cols, transposed))
        rec.values.w_o = w_o
        self._last_wo = p
        _hold(self._wo_taken, x, p, weight)

    def _merged_projection(
        self, heads: list[tuple[str, torch.Tensor, _Probs]], weight: torch.Tensor, bias: Any, transposed: bool
    ) -> None:
        """The projection of single-head maps' outputs joined along their features: each head's W_O slice is the
        columns its features hold in the join (one head each: their records are joined at the end)."""
        width = int(weight.shape[0] if transposed else weight.shape[1])
        features = int(weight.shape[1] if transposed else weight.shape[0])
        done: list[_Probs] = []
        owned: dict[str, bool] = {}  # (a loop's heads under one path: asked once)
        for path, _, _ in heads:
            if path not in owned and path in self._pending:
                owned[path] = self._owns_projection(path, weight, features)
                self._pending.pop(path, None)
        for path, cols, p in heads:
            self._pended.pop(id(p), None)
            if not owned.get(path) or int(cols.max()) >= width:
                continue
            rec = p.record
            if rec is None or rec.values is None:
                continue
            rec.values.w_o = values_.projection_slices(weight, cols.to(weight.device), transposed)
            rec.values.watch(rec.values.w_o, weight)
            if isinstance(bias, torch.Tensor) and bias.dim() == 1:
                rec.values.b_o = bias.detach()
                rec.values.watch(rec.values.b_o)
            done.append(p)
        if len(done) > 1:
            self._layer_values(done)

    def _pend(self, key: str, entry: tuple) -> None:
        """Values waiting for the projection that reads their heads merged back, with the module calls that
        may run it: the attention's own, and the one around it unless that is the model's."""
        self._pending[key] = entry
        if len(self._pended) >= HELD:
            self._pended.clear()
        self._pended[id(entry[0])] = entry
        self.path()
        own = parent = None
        width = None  # the features of the stream the module was called with ((B, N, d), or (N, d))
        frame = self._frame
        if frame is not None:
            if frame.f_code is _CALL_IMPL:
                called = [*frame.f_locals.get("args", ()), *(frame.f_locals.get("kwargs") or {}).values()]
            else:  # (a method of a module that is not called as one: its arguments)
                code = frame.f_code
                called = [frame.f_locals.get(n) for n in code.co_varnames[1 : code.co_argcount]]
            first = next((t for t in called if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
            if first is not None and first.dim() in (2, 3):
                width = int(first.shape[-1])
        if frame is not None and frame.f_code is _CALL_IMPL:
            own = frame.f_locals.get("self")
            up = frame.f_back
            while up is not None:
                if up.f_code is _CALL_IMPL:
                    obj = up.f_locals.get("self")
                    if obj is not None and id(obj) in self.names:
                        parent = obj if obj is not self.model else None
                        break
                up = up.f_back
        self._pending_at[key] = (
            weakref.ref(own) if own is not None else None,
            weakref.ref(parent) if parent is not None else None,
            width,
        )

    def _owns_projection(self, key: str, weight: Any, features: int | None = None) -> bool:
        """The projection reading the heads merged back runs in the attention module's own call, or in the call
        of the module around it (BERT's ``attention.output.dense`` beside ``attention.self``): its output
        projection. Past both (the next layer's projections, a classifier), no; where the module around it
        is the model itself, a projection to as many features as it reads is taken (a model that is one
        block). An output projection gives back the width of the stream the module was called with: one to
        fewer features than it reads and than that stream has (a classifier over the heads, 16 -> 3) is none."""
        own, parent, width = self._pending_at.pop(key, (None, None, None))
        if (
            features is not None
            and width is not None
            and isinstance(weight, torch.Tensor)
            and features != width
            and features < int(weight.numel()) // max(features, 1)
        ):
            return False
        if own is None:
            return True  # (no module call seen: as before)
        running = _running_modules()
        if own() is not None and id(own()) in running:
            return True
        if parent is not None:
            return parent() is not None and id(parent()) in running
        return isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.shape[0] == weight.shape[1]

    def _wo_bias(self, p: _Probs, proj: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> bool:
        """``heads @ W_O + b_O`` (or an einsum kernel, then its bias): a learned vector of the projection's
        width added to its output is its bias, b_O; the sum is followed as the projection's output."""
        rec = p.record
        values = rec.values if rec is not None else None
        if (
            values is None
            or values.w_o is None
            or values.b_o is not None
            or not _is_param(bias)
            or bias.dim() != 1
            or tuple(proj.shape) != tuple(out.shape)
            or int(bias.shape[0]) != int(out.shape[-1])
        ):
            return False
        values.b_o = bias.detach()
        values.watch(values.b_o)
        self._last_wo = p  # (the sum is what the residual stream is added to)
        return True

    def _residual(self, p: _Probs, proj: torch.Tensor, x: torch.Tensor, summed: torch.Tensor | None) -> None:
        """``proj`` (the output projection's output) is added to ``x``, the residual stream: its norms
        ||x_i|| (B, q) in the record's query order, found from the codes of ``proj``'s rows. ``summed``:
        x was added to in place (x += proj), so x is now the sum and the stream was ``x - proj``."""
        rec = p.record
        pc = self.code_of(proj)
        if rec is None or rec.residual_of is not None or pc is None or tuple(pc.shape) != tuple(proj.shape):
            return
        made = self.made_at(summed if summed is not None else x)
        if made >= rec.seq:
            # the stream existed before the attention ran; a tensor made since (a parallel block's MLP
            # output, added to the attention's first or added to in place) is not claimed
            return
        qpos = _query_positions(p)
        if qpos is None:
            return
        key = ("residual rows", id(pc), id(qpos))
        index = lineage.recall(key)
        if index is lineage.MISS:
            index = lineage.remember(key, (pc, qpos), _rows_of(pc, qpos))
        if index is None:
            return  # a query row the sum does not hold, or one position on two rows
        shape = tuple(qpos.shape)
        if summed is None:  # the stream, taken when a trace asks (it was not changed in place by then)
            self._update_record(p, residual_of=_Residual(x.detach(), index, shape))
            return
        with torch.no_grad():  # added to in place: the stream is the sum minus the projection, now
            norms = (summed - proj).float().norm(dim=-1).reshape(-1)
        self._update_record(
            p, residual_of=_Residual(None, index, shape, norms[index.to(norms.device)].view(shape))
        )

    def _mask_step(self, name, func, args, kwargs, out, base_t, base, new, pre) -> None:
        """A scores tensor went through an op: note a mask it applied, or carry scores/mask along."""
        before = pre if pre is not None else base_t
        prior_scores = base.scores if base.scores is not None else before.detach()
        prior_allowed = base.allowed
        columns = self._learned_columns(name, args, kwargs, base_t, out)
        if columns is not None:  # learned logits joined as keys (attention sinks): never masked
            before_, after = columns
            new.scores = torch.cat(
                [*(p.detach() for p in before_), prior_scores, *(p.detach() for p in after)], dim=-1
            )
            if prior_allowed is not None:
                ones = [torch.ones(p.shape, dtype=torch.bool, device=p.device) for p in before_ + after]
                new.allowed = torch.cat([*ones[: len(before_)], prior_allowed.expand(base_t.shape),
                                         *ones[len(before_) :]], dim=-1)  # fmt: skip
            new.mask_source = base.mask_source
            return
        if name in FILL and len(args) >= 3 and _very_negative(args[2], FILL_NEG) and args[0] is base_t:
            allowed = ~args[1].bool()
            new.scores = prior_scores
            new.allowed = allowed if prior_allowed is None else (prior_allowed & allowed)
            new.mask_source = base.mask_source or "masked_fill"
            return
        if name == "where" and len(args) == 3:
            cond, x, y = args
            if x is base_t and _all_very_negative(y, FILL_NEG):
                allowed = cond.bool()
            elif y is base_t and _all_very_negative(x, FILL_NEG):
                allowed = ~cond.bool()
            else:
                allowed = None
            if allowed is not None:
                new.scores = prior_scores
                new.allowed = allowed if prior_allowed is None else (prior_allowed & allowed)
                new.mask_source = base.mask_source or "where"
                return
        if name in ADD and len(args) >= 2:
            other = args[1] if args[0] is base_t else args[0]
            other_tag = self.tag(other)
            if (
                isinstance(other, torch.Tensor)
                and other.is_floating_point()
                and (other_tag is None or other_tag.role != "scores" or _gate_of_blocks(other))
            ):
                masked = _added_hides(other)
                if bool(masked.any()):
                    allowed = ~masked
                    new.scores = prior_scores + other.detach().masked_fill(masked, 0)
                    new.allowed = allowed if prior_allowed is None else (prior_allowed & allowed)
                    new.mask_source = base.mask_source or "additive"
                    return
                if _zero_one_triangle(other):  # a causal mask of 0s and 1s added: it hides nothing
                    self._added_zero_one(self.path(), tuple(base_t.shape), "added to the scores")
        if name in SUB and len(args) >= 2 and args[0] is base_t and kwargs.get("alpha", 1) == 1:
            other = args[1]  # scores - 1e9 * (1 - mask)
            other_tag = self.tag(other)
            if (
                isinstance(other, torch.Tensor)
                and other.is_floating_point()
                and (other_tag is None or other_tag.role != "scores")
            ):
                masked = _added_hides(-other)
                if bool(masked.any()):
                    new.scores = prior_scores - other.detach().masked_fill(masked, 0)
                    new.allowed = ~masked if prior_allowed is None else (prior_allowed & ~masked)
                    new.mask_source = base.mask_source or "additive"
                    return
        if base.scores is None and base.allowed is None:
            return
        # any other op (scaling, casts, reshapes): replay it on the kept scores and mask
        rest = args[1:]
        if any(isinstance(a, torch.Tensor) and a.numel() > 1 for a in rest):
            if name not in SHAPE_OPS:  # a tensor operand we cannot replay: keep the mask, lose the scores
                new.scores = None
                new.allowed = base.allowed if out.shape == base_t.shape else None
                if name in RESCORE:
                    self._unhidden(name, new, out)
                return
        op = func
        if name.endswith("_") and not name.startswith("__"):
            op = getattr(torch.Tensor, name[:-1], None)
        elif name.startswith("__i") and name.endswith("__"):
            op = getattr(torch.Tensor, "__" + name[3:], None)
        if name == "view":
            op = torch.Tensor.reshape
        try:
            new.scores = None if base.scores is None else op(base.scores, *rest, **kwargs)
            if base.allowed is not None:
                expanded = base.allowed.expand(base_t.shape)
                if name in SHAPE_OPS:
                    new.allowed = op(expanded, *rest, **kwargs) if name not in ("float", "to", "type_as",
                                     "double", "half", "bfloat16", "type") else expanded  # fmt: skip
                else:  # (a reduction over the keys, ``logsumexp(s, -1, keepdim=True)``: no mask of keys)
                    new.allowed = (
                        expanded if isinstance(out, torch.Tensor) and _broadcasts_to(expanded, out) else None
                    )
                if new.allowed is not None and new.allowed.dtype != torch.bool:
                    new.allowed = new.allowed.bool()
            if name in RESCORE and out.shape == base_t.shape:
                self._unhidden(name, new, out)
        except Exception:
            new.scores, new.allowed = None, None

    def _unhidden(self, name: str, new: _Tag, out: torch.Tensor) -> None:
        """Scores masked, then changed by an op on their values: keys it gave a score above FILL_NEG again are
        no longer hidden (a fill of -100 then scaled by 0.01; a row with no key filled with 0, uniform over
        every key, as a guard against NaN; ``torch.where(eye, 0.0, s)``, each query seeing itself). Where the
        op computes on the values (a scale, a shift, a clamp: not a fill or a ``where`` that writes a score on
        purpose) and leaves them below 0 (logits, not the exp of a softmax written by hand), the model's mask
        stopped hiding those keys, which is a bug a user wants told: a soft-cap
        ``tanh(s / c) * c`` after the mask squashes finfo.min to -c. Said, and a causal mask so squashed keeps
        the call a decoder's, as a causal mask of 0s and 1s added does."""
        if new.allowed is None or not out.is_floating_point():
            return
        allowed = new.allowed.expand(out.shape)
        o = out.detach()
        back = ~allowed & (o > FILL_NEG)
        if not bool(back.any()):
            return
        # (below the row's largest allowed score by more than -FILL_NEG: still hidden, e^-50 of its weight; a row
        # with no allowed key is uniform over whatever it holds: every key of it is back)
        top = o.masked_fill(~allowed, float("-inf")).amax(-1, keepdim=True)
        back &= (o - top) > FILL_NEG
        if not bool(back.any()):
            return
        new.allowed = allowed | back
        if name in FILL or name == "where":
            return  # (a score written on purpose: a guard against NaN, each query seeing itself)
        # weight above 1e-6 of the row's largest, on logits (values below 0: not the exp of a softmax by hand), in
        # a row that has an allowed key (a shift by the row's max moves a row of hidden keys only)
        seen = back & ((o - top) > math.log(1e-6)) & (o < 0) & torch.isfinite(top)
        if not bool(seen.any()):
            return
        path = self.path()
        if self.outside:
            return
        # said where the softmax gives those keys weight (``_squashed``): a later op may scale them back down
        self._unhid[path] = (name, tuple(out.shape), bool(_is_causal_mask(allowed.reshape(-1, *allowed.shape[-2:]))),
                             seen)  # fmt: skip

    def _squashed(self, path: str, probs: torch.Tensor) -> None:
        """A softmax of ``path`` after a mask's keys were given a score again by arithmetic (``_unhidden``):
        where they get weight above 1e-6 in it, the model's mask stopped hiding them. Said, and a causal mask
        so squashed keeps the call a decoder's, as a causal mask of 0s and 1s added does."""
        name, shape, causal, seen = self._unhid.pop(path)
        if tuple(seen.shape) == tuple(probs.shape) and not bool((probs.detach()[seen] > 1e-6).any()):
            return  # (scaled back below: ``tanh(s / 50) * 50`` over a -100 mask leaves e^-48)
        if causal:
            self._meant_causal.add(path)
        self.warn(path, shape, f"keys a mask hid got a score above {FILL_NEG:g} again from an op on the "
                  f"scores after the mask ({name.strip('_')}): a soft-cap such as tanh(s / c) * c, a clamp or a "
                  "scale after the mask squashes it, so these keys get weight at the softmax and the map shows "
                  "them attended" + (" (the mask was causal: queries here attend to later keys)" if causal else "")
                  + ". Apply the mask after such ops")  # fmt: skip

    # -- recording -------------------------------------------------------------------------------------
    def _off_fast_path(self, args) -> None:
        """torch.nn's own MultiheadAttention outside the module captured, in the model that holds it, running under
        the mode (the module captured holds none of torch's layers, so no hooks set it aside): in eval mode without
        gradients torch would take its fused fast path (an encoder's nested tensors too), and under a mode it does
        not. Said once: its output may differ from an uncaptured run."""
        frame: FrameType | None = sys._getframe(2)
        mha = None
        for _ in range(8):  # (F.multi_head_attention_forward's caller: the module's forward)
            if frame is None:
                break
            obj = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
            if isinstance(obj, nn.MultiheadAttention):
                mha = obj
                break
            frame = frame.f_back
        if (
            mha is None
            or mha.training
            or (torch.is_grad_enabled() and any(p.requires_grad for p in mha.parameters()))
        ):
            return  # (no fast path to leave: training, or gradients asked)
        x = args[0] if args else None
        self.warn(
            "(outside the model)", tuple(x.shape) if isinstance(x, torch.Tensor) else (), _OFF_FAST_PATH
        )

    def hears_script(self) -> bool:
        """A TorchScript function called now is the model's code (this block's thread, not capture's own work)."""
        return threading.get_ident() == self.thread and not getattr(_LOCAL, "busy", 0)

    def script_unfollowed(self, name: str, start: int) -> None:
        """The Python original of TorchScript function ``name`` did not give what the script returned: the maps it
        made (records from ``start`` on) are not the script's, flagged as such."""
        why = (f"made by the Python function TorchScript ({name}) was compiled from, run again beside it, which did "
               "not give what the script returned: the script's own ops run where capture cannot see them, so this "
               "map may not be the one it used")  # fmt: skip
        for i in range(start, len(self.cap.records)):
            r = self.cap.records[i]
            if r.exact:
                self.cap.records[i] = _replaced(r, exact=False, flag=why)

    def on_script(self, name: str) -> None:
        """A TorchScript function the model's code called (wrapped for the block), its ops not followed: where
        it ran."""
        if not self.hears_script():
            return
        path = self.path()
        if self.outside:
            return
        ran = self.scripted.setdefault(path, [])
        if name not in ran:
            ran.append(name)

    def _note_run(self) -> None:
        """A record made in a new run of the model starts a call in ``cap.calls``. A run is the outermost
        call of the model, or of a module that holds it, on the stack (the model called again in the
        block: a second batch, a step of a generation loop that calls it); where the model itself is not
        called, a part of it called from outside it again (``model.decoder`` once per step of a greedy
        loop, after ``model.encoder`` once) begins the next. A layer captured on its own and called once
        per layer by the model around it (weights shared across layers) runs in one."""
        start: FrameType | None = sys._getframe(2)
        held, frame = self._run_frame, start
        while held is not None and frame is not None:  # the call recorded last still on the stack: the same
            if frame is held:  # (held: a later call's frame is never this one)
                return
            frame = frame.f_back
        top = entry = None  # the outermost call of the model (or a holder), and of any of its modules
        frame = start
        while frame is not None:
            if frame.f_code is _CALL_IMPL:
                obj = frame.f_locals.get("self")
                if obj is self.model or (isinstance(obj, nn.Module) and self._holds(obj)):
                    top = frame
                elif top is None and id(obj) in self.names:
                    entry = frame
            frame = frame.f_back
        if top is not None:
            self._run_frame, self._entered = top, set()
            self.cap.calls.append(self.n_ops)
        elif entry is not None:
            module = id(entry.f_locals.get("self"))
            if module in self._entered or not self.cap.calls:
                self._entered = set()
                self.cap.calls.append(self.n_ops)
            self._entered.add(module)
            self._run_frame = entry

    def _record(
        self,
        path,
        probs,
        scores,
        allowed,
        source,
        mask_source,
        cross,
        check=None,
        ext=False,
        layout: Layout | None = None,
        flag: str | None = None,
        key_labels=None,
        query_labels=None,
        causal: bool | None = None,
        values: values_.HeadValues | None = None,
        queries: torch.Tensor | None = None,
        query: torch.Tensor | None = None,
        query_code: torch.Tensor | None = None,
        raw_queries: bool = False,
        key_pos: torch.Tensor | None = None,
    ):
        """probs/scores (B, H, q, k); allowed (B, H, q, k) bool or None. The new Record (None: joined).
        ``causal``: whether the mask is a causal one, where the caller knows it (SDPA's is_causal);
        ``values``: what the weights multiply (kept only on a record of its own, not on heads joined);
        ``queries``: the lineage codes of its query rows (position and head), where known; ``query``: the
        tensor of queries (B, H, q, d) where no layout says them (SDPA's argument); ``query_code``: its
        codes, where the caller has them (MultiheadAttention's query, a view its forward made);
        ``raw_queries``: lineage reads the queries from another input than the keys, but they were never
        projected inside the call (as ``layout.raw_queries``), so it cannot say self or cross."""
        probs = probs.detach()
        if path in self._unhid:
            self._squashed(path, probs)
        differ = False
        if flag is None and self.scripted:
            caller = next(
                (m for m in self.scripted if m == "" or path == m or path.startswith(f"{m}.")), None
            )
            if caller is not None:
                flag = (f"{caller or 'the model'} called TorchScript ({', '.join(self.scripted[caller])}), whose "
                        "ops run where capture cannot see them: what went through it is not followed, so this "
                        "map's layout and kind are not verified")  # fmt: skip
        if allowed is not None and allowed.dim() == 4 and allowed.shape[1] == 1:  # one mask for every head
            mask = allowed.select(1, 0).expand(probs.shape[0], *probs.shape[2:])
        elif allowed is not None:
            allowed = allowed.expand(probs.shape)
            if (
                allowed.stride(1) == 0 and allowed.shape[1]
            ):  # broadcast over the heads: every head's is the same memory
                mask = allowed.select(1, 0)
            else:
                mask = allowed.all(dim=1)
                differ = not bool((allowed == mask[:, None]).all())
        elif source not in ("sdpa", "nn.MultiheadAttention") and bool((probs == 0).any()):
            # keys no head attended at all (a call's arguments say its mask: zeros there are dropout's draws)
            mask, mask_source = _zeros_mask(probs, scores)
        else:
            mask = None
        # heads masked differently (a top-k per head): what any head may see says whether the call is
        # causal (what every head may see can be nearly empty, and nearly empty looks causal)
        seen = allowed.any(dim=1) if differ and allowed is not None else mask
        labels = layout.key_labels if layout is not None else key_labels
        q_labels = layout.query_labels if layout is not None else query_labels
        seen = _own_block(seen, labels, q_labels,
                          source == "nn.MultiheadAttention")  # fmt: skip
        qpos = self._query_positions(probs, layout, query, query_code)
        if (
            flag is None
            and seen is not None
            and probs.shape[-2] < probs.shape[-1]
            and self._sees_ahead(qpos, _key_positions(probs, layout) if layout is not None else key_pos, seen)
        ):  # fewer queries than keys, which a causal reading puts last: a query sees a later position of
            if causal is None:  # its own input, so they are not (REFIL's agents, the first of the entities),
                causal = False
            ext = False  # and no decoder's new position over its cache (Longformer's global token over them all)
        if ext and q_labels is not None and all(lab is not None for lab in q_labels):
            ext = False  # (queries that are all pooled or learned vectors are no decoder's new positions)
        raw = flag is None and (raw_queries or (layout is not None and layout.raw_queries))
        if raw and not self._given(path):  # queries handed in or made where capture cannot see (numpy,
            # TorchScript): other positions than the keys' by lineage, whatever they were made from, so the
            # kind is read from the lengths, the mask and the name, and said
            self.warn(path, tuple(probs.shape), _RAW_QUERIES)
            cross = qpos = None  # (their positions are no token's that lineage knows)
        kind = self.kind_of(path, probs.shape[-2], probs.shape[-1], seen, cross, ext,
                            exact=flag is None and not raw, causal=causal if mask is not None else None,
                            grid=lambda: self._grid_queries(qpos))  # fmt: skip
        if kind == "cross" and flag is None and qpos is not None and q_labels and None not in q_labels:
            kind = self._rows_of_self(qpos, _key_positions(probs, layout), labels) or kind
        if (
            kind == "cross"
            and flag is None
            and not self._given(path)
            and self._same_ids_twice(qpos, _key_positions(probs, layout))
        ):
            self._twice.setdefault(path, tuple(int(n) for n in probs.shape))
        scores = None if scores is None or not self.keep_scores else scores.detach()
        if source not in ("sdpa", "nn.MultiheadAttention"):  # (those weights capture computed itself)
            self._alias(probs, scores)
        self._alias(mask)
        self._note_run()
        rec = Record(path, kind, probs, scores, mask, source, mask_source, check, differ, flag is None, flag,
                     layout.key_labels if layout is not None else key_labels,
                     q_labels, values, seq=self.n_ops,
                     query_positions=qpos, key_positions=_key_positions(probs, layout))  # fmt: skip
        if self._frame is None and not self.outside and self._path_at[0] == self.n_ops and self.returned:
            # no module of the model runs this op, and the model's call does not: the block's own code (a forward
            # called as ``model.forward(x)`` with no ``self`` is never taken for it)
            self._outside.add(rec.seq)
        if layout is not None and flag is None and layout.seq_keys is not None:
            self._seq_keys.setdefault(rec.seq, []).append(layout.seq_keys)
            if layout.ext and (rec.key_labels is None or None in rec.key_labels) and queries is not None:
                labels = self._other_sequence(path, layout.seq_keys, queries, rec.key_labels)
                if isinstance(labels, str):
                    rec = _replaced(rec, exact=False, flag=labels)
                    self.warn(path, tuple(int(n) for n in probs.shape), f"could not verify: {labels}")
                elif labels is not None:
                    rec = _replaced(rec, key_labels=labels)
        if queries is not None:
            self._queried.setdefault(path, []).append((rec.kind, queries))
        self._pieces(path, rec, queries, layout)
        if self._orders_pending:
            self._orders_at[rec.seq] = tuple(self._orders_pending)
        group = _head_group(path)
        last = self.cap.records[-1] if self.cap.records else None
        joined = group and self.head_group == (group[0], group[1] - 1) and _same_layer(last, rec)
        self.head_group = group
        if joined and last is not None and group is not None:
            self.cap.records[-1] = _heads_joined(last, rec, group[0])
            self._joined_head = (rec, len(self.cap.records) - 1, int(last.probs.shape[1]))
            return None
        self.cap.records.append(rec)
        if self._slice_pending is rec:
            self._slice_pending = None
            self._flag_weights(_Probs(rec, (1, 1), False, None, False), self._SLICES)
            return self.cap.records[-1]
        return rec

    def _other_sequence(
        self, path: str, seq_keys: torch.Tensor, queries: torch.Tensor, had: tuple | None = None
    ) -> tuple | str | None:
        """Keys beyond the queries' own that are another sequence's positions: fairseq's cross-self-attention
        (``key = cat(encoder_out, x)``), the decoder's queries over the source's positions then their own.
        Such keys were queries of another attention (the encoder's) and never of this module's (a KV
        cache's or a memory's earlier positions were): labelled ``<src i>`` (``<ctx i>`` where no encoder
        self-attention read them), so no picture puts them under the queries' tokens. None otherwise. ``had``:
        the record's labels so far (a cache's empty slots: padding), kept where they are. Why the rows' keys cannot
        share one map's labels, where each row holds its own queries' positions at other columns (a padded batch
        over a paged cache read back by block table: each request's cached and new keys where its blocks put them)."""
        rows = int(seq_keys.shape[0])
        if rows > 1 and queries.dim() >= 1 and int(queries.shape[0]) == rows:
            per_row = (queries >> lineage.SHIFT).reshape(rows, -1)
            per_row = per_row.to(seq_keys.device)
            mine = torch.stack([torch.isin(seq_keys[b], per_row[b]) for b in range(rows)]) & (seq_keys >= 0)
            if not bool((mine == mine[:1]).all()):
                return ("each row's keys hold its own queries' positions at other columns (a padded batch over a "
                        "paged cache read back by block table, its requests of different lengths): one map's key "
                        "labels cannot hold them (each row's keys are in record.key_positions)")  # fmt: skip
        own = {int(p) for p in torch.unique(queries >> lineage.SHIFT).tolist()}
        keys = [int(p) for p in seq_keys[0].tolist()]
        other = [p for p in keys if p >= 0 and p not in own]
        if not other:
            return None
        asked = self._asked_from(path).keys()
        if not asked.isdisjoint(other):
            # this module's own earlier queries (a cache, a memory): this capture's tokens; beside them, the rows
            # of a cache an earlier forward filled (a second decoding step in one block) are still the cache's
            rest = [p for p in other if p not in asked]
            if not rest or not self._from_outside(rest):
                return None
            own |= set(other) - set(rest)
            other = rest
        seen: dict[int, str] = {}
        for name in [*self._queried, *self._asked]:
            if name != path:
                for p, kind in self._asked_from(name).items():
                    seen.setdefault(p, kind)
        if all(p in seen for p in other):
            side = "src" if all(seen[p] == "enc_self" for p in other) else "ctx"
            if self._from_outside(list(own)) and all(self.sources.at(p).kind == "tokens" for p in other):
                # queries that are rows of a tensor handed in, over the tokens this call embedded: which side is
                # the sequence only the model knows (a Block-Recurrent state carried in, reading its block)
                self.warn(path, (), "queries here are rows of a tensor handed in (a state carried from an earlier "
                          "call) and its keys include this call's tokens: capture reads the rows handed in as the "
                          "sequence and the tokens as another's context (<ctx i>), which may be the other way "
                          "round; the weights are exact")  # fmt: skip
        elif not any(p in seen for p in other) and self._from_outside(other):
            # positions of a tensor from outside the call that no attention here asked from: a cache an
            # earlier forward filled, Transformer-XL's memory handed in, another input's context
            cache = all(self.sources.at(p).label == "cache" for p in other)
            side = "cache" if cache else "ctx"
        else:
            return None
        labels: list[str | None] = []
        at = 0
        for p in keys:
            if p >= 0 and p not in own:
                labels.append(f"<{side} {at}>")
                at += 1
            else:
                labels.append(None)
        if had is None:
            return tuple(labels)
        if len(had) != len(labels):
            return None
        return tuple(old if old is not None else new for old, new in zip(had, labels, strict=True))

    def _from_outside(self, positions: list[int]) -> bool:
        """Whether every position is a row of a tensor from outside the call (no token, no learned vector)."""
        return all(self.sources.at(p).kind == "external" for p in positions)

    def _asked_from(self, path: str) -> dict[int, str]:
        """The positions the queries of a module's records held (position -> the record's kind), each record's
        codes read once (a long generation's steps are many records of one module)."""
        got = self._asked.setdefault(path, {})
        for kind, q in self._queried.pop(path, ()):
            for p in torch.unique(q >> lineage.SHIFT).tolist():
                got.setdefault(int(p), kind)
        return got

    def _query_positions(
        self, probs, layout: Layout | None, query: torch.Tensor | None, query_code: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """(B, q) the lineage position of each query row of a record (B, H, q, k): from its layout, or from the
        codes of SDPA's query argument; None where lineage does not have them."""
        b, q = int(probs.shape[0]), int(probs.shape[-2])
        if layout is not None:
            key: tuple = ("query positions", id(layout.qcode), id(layout.rows))
            held: tuple = (layout.qcode, layout.rows)
        else:
            qc = query_code if query_code is not None else self.code_of(query) if query is not None else None
            if qc is None or query is None or tuple(qc.shape) != tuple(query.shape) or qc.dim() < 2:
                return None
            key, held = ("query positions", id(qc), b, q), (qc,)
        hit = lineage.recall(key)
        if hit is not lineage.MISS:
            return hit
        pos: torch.Tensor | None
        if layout is not None:
            rows = layout.rows
            pos = layout.qcode.reshape(-1)[rows[:, 0].reshape(-1).to(layout.qcode.device)] >> lineage.SHIFT
            pos = pos.view(rows.shape[0], -1) if pos.numel() == b * q else None
        else:
            lead = held[0].select(-1, 0) >> lineage.SHIFT  # (..., [H,] q)
            first = lead.reshape(-1, q) if lead.numel() % q == 0 else None
            pos = None if first is None or first.shape[0] % b else first.view(b, -1, q)[:, 0]
        return lineage.remember(key, held, pos)

    def _pieces(self, path: str, rec: Record, queries: torch.Tensor | None, layout: Layout | None) -> None:
        """Note where one call of a module makes maps over other queries than its previous map (other
        positions or heads): attention computed in slices or chunks, a map per piece, joined into one
        layer at finish. Layers written inline in one forward read the same positions and heads, and
        are not taken for pieces. Calls of the module one after another, each over positions and keys
        of its own (local attention in blocks, each block a call: CANINE's; a loop over the sequences of
        the batch), are pieces too; calls that share keys or read more of them (decoding steps, a layer
        in a loop) are not."""
        frame = self._frame
        held, held_path, held_q, held_at, held_layout = self._record_call
        if frame is not None:  # (maps made one after another in one call of a module share its number)
            if frame is not held or path != held_path:
                self._calls_made += 1
            self._call_of[rec.seq] = self._calls_made
        at = len(self.cap.records)  # where rec goes (a record joined to the previous head's is no piece)
        self._record_call = (frame, path, queries, at, layout)
        if frame is not None and frame is held and path == held_path and 0 <= held_at < at:
            self._slices_unplaced(rec, held_at, layout is None, held_layout is None)
        else:
            self._sliced = False  # (another call: its slices are its own)
        if (
            frame is None
            or path != held_path
            or queries is None
            or held_q is None
            or queries.device != held_q.device
        ):
            self._same_q, self._before_q = [(at, queries, layout)], []
            return
        if frame is held and queries.shape == held_q.shape and torch.equal(queries, held_q):
            # another call over the same queries (a loop over the heads, or layers, inside a loop over the
            # sequences): its piece is the call at the same place in the previous sequence's calls
            self._same_q.append((at, queries, layout))
            if len(self._before_q) < len(self._same_q):
                return
            held_at, held_q, held_layout = self._before_q[len(self._same_q) - 1]
        elif bool(torch.isin(queries, held_q).any()):
            self._same_q, self._before_q = [(at, queries, layout)], []
            return
        else:
            self._before_q, self._same_q = self._same_q, [(at, queries, layout)]
            if self._before_q and self._before_q[-1][0] == held_at:
                held_at, held_q, held_layout = self._before_q[0]  # (the first call of the previous sequence)
        if layout is None or held_layout is None or held_q is None or not 0 <= held_at < at:
            return
        if not bool((~torch.isin(queries, held_q)).all()):
            return
        if self._rows_back(queries, held_q):
            return  # (slices of one call go forward through the batch: rows before the last are another pass)
        blocks = frame is not held
        if blocks and not self._blocks(queries, held_q, layout, held_layout, held_at, at):
            if not self._heads_apart(queries, held_q, layout, held_layout, held_at, at):
                return
            blocks, heads = False, True  # (other heads of the same queries and keys: as a call's heads are)
        else:
            heads = False
        run = next((r for r in reversed(self._runs) if r[-1][0] == held_at), None)
        if run is not None and any(
            bool(torch.isin(queries, piece[2].qcode.to(queries.device) >> lineage.SHIFT).any())
            for piece in run
        ):
            return  # queries an earlier piece of the run held: the next pass (a layer written inline, its
            # documents or blocks again a call each), whose pieces make a run of their own
        if run is not None:
            run.append((at, rec, layout))
        else:
            self._runs.append([(held_at, self.cap.records[held_at], held_layout), (at, rec, layout)])
            run = self._runs[-1]
        if blocks:
            self._block_runs.add(id(run))
        if heads:
            self._head_runs.add(id(run))

    def _rows_back(self, queries: torch.Tensor, held: torch.Tensor) -> bool:
        """Every query of a map is in a row of its input before every row of the map made before it in the call:
        a loop going back over the batch is another pass (a later layer run on the rows a per-sample skip
        picked), not the next slice of one attention, which goes forward as slices of a batch are cut."""
        try:
            now, before = queries[queries >= 0], held[held >= 0]
            if not now.numel() or not before.numel():
                return False
            a, b = self.sources.rows(now), self.sources.rows(before)
        except Exception:  # (positions lineage does not place in rows)
            return False
        if bool((a < 0).any()) or bool((b < 0).any()):
            return False
        return int(a.max()) < int(b.min())

    _SLICES = (
        "one call of this module made maps over slices of its batch and heads (attention computed in "
        "slices, diffusers' attention slicing), and a slice that lineage could not place breaks them: "
        "this map is a slice, which may hold other sequences' heads, not a whole layer"
    )

    def _slices_unplaced(self, rec: Record, held_at: int, unplaced: bool, held_unplaced: bool) -> None:
        """Maps of one call of a module, one laid out by lineage and the next not (or after one that was not),
        over the same queries and keys, split into other sequences and heads: slices of one fold that capture cannot
        join (a slice straddling two sequences breaks them), so the ones laid out are flagged too: alone,
        each claims to be sequence 0."""
        held = self.cap.records[held_at] if held_at < len(self.cap.records) else None
        if held is None or unplaced == held_unplaced and not (self._sliced and unplaced is False):
            return
        same = tuple(held.probs.shape[2:]) == tuple(rec.probs.shape[2:])  # (the same queries and keys, split
        if not same or not self._sliced and tuple(held.probs.shape[:2]) == tuple(rec.probs.shape[:2]):
            return  # into other sequences and heads: (1, 2) then (2, 1), a slice across two sequences)
        self._sliced = True
        if held.exact:
            self._flag_weights(_Probs(held, (1, 1), False, None, False), self._SLICES)
        if rec.exact:  # (not in cap.records yet: flagged once it is)
            self._slice_pending = rec

    def _heads_apart(
        self, queries, held_q, layout: Layout, held_layout: Layout, held_at: int, at: int
    ) -> bool:
        """Whether a map from another call of the module than the previous map, right after it, holds other
        heads of the same queries over the same keys: one layer's heads computed a group per call (Ulysses'
        sequence parallelism run on one device: each rank's share of the heads through one attention
        module). Calls of a module shared by layers read the same heads again, and are not these."""
        if held_at != at - 1 or layout.seq_keys is None or held_layout.seq_keys is None:
            return False
        kp, hk = layout.seq_keys, held_layout.seq_keys
        if kp.shape != hk.shape or kp.device != hk.device or not bool((kp == hk).all()):
            return False
        qp, hq = torch.unique(queries >> lineage.SHIFT), torch.unique(held_q >> lineage.SHIFT)
        return qp.shape == hq.shape and bool((qp == hq).all())

    def _blocks(self, queries, held_q, layout: Layout, held_layout: Layout, held_at: int, at: int) -> bool:
        """Whether a map from another call of the module than the previous map, right after it, holds
        queries and keys at other positions than that map's: a block of its own."""
        if held_at != at - 1 or layout.seq_keys is None or held_layout.seq_keys is None:
            return False
        qp, hq = queries >> lineage.SHIFT, held_q >> lineage.SHIFT
        kp, hk = layout.seq_keys, held_layout.seq_keys
        kp, hk = kp[kp >= 0], hk[hk >= 0]
        if not kp.numel() or not hk.numel() or kp.device != hk.device:
            return False
        return not bool(torch.isin(qp, hq).any()) and not bool(torch.isin(kp, hk).any())

    def _causal(self, mask: torch.Tensor, blocks: bool = False, off_by_one: bool = False) -> bool | None:
        """_is_causal_mask(mask) (``blocks``: _chunked(mask), causal by blocks of several positions each;
        ``off_by_one``: _causal_off_by_one(mask)), asked once per mask: the layers of a model are handed the same
        one (the tensor is held with the answer, so its memory is never another's; a write since makes a new
        key)."""
        ask = _causal_off_by_one if off_by_one else _chunked if blocks else _is_causal_mask
        try:
            key = (mask.untyped_storage().data_ptr(), mask.storage_offset(), tuple(mask.shape),
                   mask.stride(), mask.dtype, mask.device, _version_of(mask), blocks, off_by_one)  # fmt: skip
        except (RuntimeError, NotImplementedError):  # (no storage of its own)
            return ask(mask)
        if key[-3] is None:  # an inference tensor: no version counter tells a write
            return ask(mask)
        hit = self._causal_masks.get(key)
        if hit is None:
            if len(self._causal_masks) >= HELD:
                self._causal_masks.clear()
            hit = self._causal_masks[key] = (mask, ask(mask))
        return hit[1]

    def kind_of(
        self, path, lq, lk, mask, cross, ext=False, exact=False, causal: bool | None = None, grid=None
    ) -> str:
        """The kind of an attention call. With lineage (``exact``), queries and keys from different
        inputs are cross-attention whatever their lengths, and keys beyond the queries' own are a
        cache; without it, names and lengths decide. ``grid``: a callable saying whether the queries are
        the pixels of a convolution's feature map (``_grid_queries``)."""

        def causal_mask() -> bool:
            return mask is not None and lq > 1 and bool(self._causal(mask) if causal is None else causal)

        # one query over its one key in a call that says it is causal (SDPA's or MultiheadAttention's
        # is_causal=True): no mask can tell there, the call's word does
        declared = causal is True and lq == lk == 1
        for pattern, kind in (*self.given.items(), *self.fixed.items()):  # the caller's kinds= first
            if pattern == path or fnmatch.fnmatchcase(path, pattern):
                if (
                    kind == "enc_self"
                    and pattern not in self.given
                    and (causal_mask() or declared or path in self._meant_causal)
                ):
                    return "dec_self"  # an nn.TransformerEncoder run with a causal mask: a language model
                if kind == "enc_self" and pattern not in self.given and lq == lk and _undecided(mask, lq):
                    self._undecided.setdefault(path, (lq, lk))  # (one token per sequence: a causal mask says
                return kind  # nothing there either; said at the end)
        low = path.lower()
        if cross is None and any(w in low for w in CROSS_WORDS):
            return "cross"
        if cross:
            return "cross"
        if ext and lk > lq and (lq == 1 or causal_mask()):  # keys = a KV cache (or a memory) then the
            return "dec_self"  # queries' own keys, a step or a causal chunk: decoding (several queries that
            # see all their own keys and another input's before them: an image's over a text's, UnCLIP's)
        if not exact and lq != lk:
            return "cross"
        if mask is not None and lq == lk and self._causal(mask, off_by_one=True):
            self.warn(path, (lq, lk), "a causal mask off by one (every query sees the key after its own and none "
                      "further: a causal buffer sliced a row too far, bias[:, :, 1:T + 1, :T]): the future "
                      "leaks one token; recorded as decoder self-attention with the mask as it ran")  # fmt: skip
            return "dec_self"
        # (a causal mask of 0s and 1s added: broken, and meant causal)
        if causal_mask() or declared or path in self._meant_causal:
            if causal is None and mask is not None and lq == lk and self._causal(mask, blocks=True):
                self._by_blocks.setdefault(
                    path, (lq, lk)
                )  # (said at the end: a streaming encoder's reads alike)
            return "dec_self"
        if not _DECODER.search(low):
            if lq == lk and _undecided(mask, lq):  # (one token per sequence: said at the end)
                self._undecided.setdefault(path, (lq, lk))
            elif mask is not None and lq > 1 and causal is None and self._causal(mask) is None:
                self._prefix_or_encoder.setdefault(
                    path, (lq, lk)
                )  # (a prefix LM's mask and an encoder's: said)
            return "enc_self"
        # named a decoder, and nothing hides the future: a text decoder that forgot its mask stays dec_self (the
        # audit's), and so do learned queries among each other (DETR's decoder side) and floats handed in; the
        # name decides, so a note says so. Attention over the pixels of a convolution's feature map (a
        # latent-diffusion VAE's decoder) is an image's self-attention
        if exact and grid is not None and grid():
            return "enc_self"
        # said at the end, where no mask found since (one after the softmax) made it causal; one query (a
        # decoding loop's first step, recomputed) has no later key to hide
        if lq >= 2 and not (lq == lk and _undecided(mask, lq)):
            self._by_name[path] = (lq, lk)
        elif lq == lk:  # one token per sequence (or each query sees itself alone): the name decides, said
            self._named_one.setdefault(path, (lq, lk))  # unless the module's other calls show a causal mask
        return "dec_self"

    def _rows_of_self(self, qpos: torch.Tensor, kpos: torch.Tensor | None, labels) -> str | None:
        """The kind of an earlier self-attention map of this block over the same keys whose queries include
        these (a learned [CLS] that was one of that map's queries and keys, alone asking in a last layer: the
        FT-Transformer computes only its row), or None. Learned queries that never asked among these keys
        (CaiT's class token over the patches, a Perceiver's latents) stay cross-attention."""
        if kpos is None or qpos.dim() != 2 or kpos.dim() != 2:
            return None
        for r in reversed(self.cap.records):
            if (
                r.kind == "cross"
                or r.key_positions is None
                or r.query_positions is None
                or r.key_labels != labels
                or tuple(r.key_positions.shape) != tuple(kpos.shape)
                or tuple(r.query_positions.shape[:1]) != tuple(qpos.shape[:1])
                or r.key_positions.device != kpos.device
            ):
                continue
            if not torch.equal(r.key_positions, kpos) and not torch.equal(
                self._pooled_alike(r.key_positions), self._pooled_alike(kpos)
            ):
                continue
            # (the latest map over these keys decides: an encoder's layers all read them)
            asked = (qpos.to(r.query_positions.device)[:, :, None] == r.query_positions[:, None, :]).any(-1)
            return r.kind if bool(asked.all()) else None
        return None

    def _pooled_alike(self, pos: torch.Tensor) -> torch.Tensor:
        """Position codes with each position pooled from a sequence (a Linformer projection's, made anew in every
        layer) named by that sequence and its place among the positions pooled with it: the keys of two layers
        that each pool the same sequence read alike (negative codes, apart from any position's)."""
        out = pos.clone()
        real = pos >= 0
        if not bool(real.any()):
            return out
        src = self.sources.index(pos.clamp_min(0))
        for i in torch.unique(src[real]).tolist():
            s = self.sources.items[i]
            if s.kind == "pooled" and isinstance(s.origin, tuple) and len(s.origin) >= 2:
                at = real & (src == i)
                out[at] = -(1 << 50) - (int(s.origin[1]) << 20) - (pos[at] - s.start)
        return out

    def _sees_ahead(self, qpos: torch.Tensor | None, kpos: torch.Tensor | None, seen: torch.Tensor) -> bool:
        """Whether lineage shows a query allowed to see a key at a later position of its own input (REFIL's
        agents, the first entities, each seeing a different prefix of the entities). ``qpos`` (B, q),
        ``kpos`` (B, k), ``seen`` (B, q, k), True = may attend."""
        if qpos is None or kpos is None or seen.dim() != 3:
            return False
        b, q, k = seen.shape
        if tuple(qpos.shape) != (b, q) or tuple(kpos.shape) != (b, k) or qpos.device != kpos.device:
            return False
        qp, kp = qpos.to(seen.device), kpos.to(seen.device)
        own = (qp >= 0)[:, :, None] & (kp >= 0)[:, None, :]
        if not bool(own.any()):
            return False
        same = (
            self.sources.index(qp.clamp_min(0))[:, :, None] == self.sources.index(kp.clamp_min(0))[:, None, :]
        )
        return bool((seen & own & same & (kp[:, None, :] > qp[:, :, None])).any())

    def _grid_queries(self, qpos: torch.Tensor | None) -> bool:
        """Whether every query of a record (B, q lineage positions) is a pixel of a convolution's grid (an
        image's, a feature map's), none a token's or a learned vector's."""
        if qpos is None or not qpos.numel() or not self._grid_sources:
            return False
        pos = qpos.reshape(-1)
        if bool((pos < 0).any()):
            return False
        found = torch.unique(self.sources.index(pos)).tolist()
        return all(self.sources.items[i].start in self._grid_sources for i in found)

    def on_softmax(self, args, kwargs, out) -> None:
        x = args[0] if args else kwargs.get("input")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
            return
        path = self.path()
        shape = tuple(x.shape)
        if path in self._unhid and tuple(self._unhid[path][3].shape) == tuple(out.shape):
            self._squashed(path, out)  # (the softmax of the scores whose hidden keys were scored again)
        if dim is None:  # torch's implicit dim (deprecated, still run): 0 for 0-, 1- and 3-D input, else 1
            dim = 0 if x.dim() in (0, 1, 3) else 1
        if x.dim() < 2 and (_is_param(x) or ((tag0 := self.tag(x)) is not None and tag0.role == "param")):
            self.skip(path, shape, "a softmax of learned weights alone (mixing weights, a normalized kernel over "
                      "a window): it depends on no input, so it is no attention")  # fmt: skip
            return
        if x.dim() < 2:  # (told again as a warning if its weights multiply values over positions)
            self._unrecorded(path, shape, None, out, "a softmax over one vector has no batch or query axis")
            return
        dim = dim % x.dim()
        if _matches(path, self.exclude):
            self.skip(path, shape, "left out by exclude=")
            return
        tag = self.tag(x)
        if tag is not None and tag.probs is not None and self._softmax_of_weights(x, out, dim, tag):
            return
        smap = tag.smap if tag is not None else None
        why: str | None = None
        if smap is not None:
            found = self._decoded(smap, shape, dim)
            if isinstance(found, Layout) and x.dim() == 2 and shape[dim] == 1:
                self.skip(
                    path, shape, "a 2-D softmax over one key is 1 everywhere (a similarity of one pair)"
                )
                return
            if isinstance(found, Layout) and x.dim() == 2 and self._across_rows(found):
                why = ("a 2-D softmax over positions from several rows of their input: a similarity across the "
                       "batch (contrastive image-text logits, not attention) or one sequence laid out sequence-"
                       "first, which capture cannot tell apart")  # fmt: skip
                self._record(path, out[None, None], x.detach()[None, None], None, "softmax", None, found.cross,
                             layout=found, flag=why)  # fmt: skip
                self.warn(path, shape, f"could not verify: {why}")
                return
            if isinstance(found, Layout):
                before = self._record_call  # (renormalized over another dim? then recorded again, as if
                self._record_exact(path, x, out, tag, found)  # this record had not been made)
                g = self.tag(out)
                if tag is not None and g is not None and g.probs is not None and g.probs.record is not None:
                    self._hold_softmaxed(out, x, tag, path, dim, g.probs, before)
                    first = tag.softmaxed.record if tag.softmaxed is not None else None
                    if first is not None and first.name != path and any(r is first for r in self.cap.records):
                        self._rereads[g.probs.record.seq] = first.name
                    elif first is None:
                        marked = tag.copy()  # (tags are replaced, never changed in place)
                        marked.softmaxed = g.probs
                        self.set(x, marked)
                return
            why = found
        self._record_guess(path, x, out, dim, tag, why)

    def _softmax_of_weights(self, x: torch.Tensor, out: torch.Tensor, dim: int, tag: _Tag) -> bool:
        """A softmax of recorded weights over their keys again (a double softmax, a classic slip): the record
        becomes the weights this second softmax gives, which are the ones the values are multiplied with
        (keys the first one masked get weight again: the map shows it), its scores the first one's output."""
        p = tag.probs
        if (
            p is None
            or p.layout is None
            or p.record is None
            or tag.touched
            or tuple(out.shape) != tuple(p.shape)
            or dim != p.layout.dim % out.dim()
            or not any(r is p.record for r in self.cap.records)
        ):
            return False
        changes: dict[str, Any] = {"probs": p.bhqk(out.detach())}
        if p.record.scores is not None:
            changes["scores"] = p.bhqk(x.detach())
        self._update_record(p, **changes)
        self.set(out, _Tag(None, tag.origin, probs=p, rowq=tag.rowq, attn_out=tag.attn_out))
        return True

    def _across_rows(self, layout: Layout) -> bool:
        """The queries or the keys of one of a map's sequences are positions from more than one row of the
        tensor they came from (``x[arange(B), eot]``: one token of every caption)."""
        queries = layout.qcode.reshape(-1)[layout.rows[:, 0].reshape(-1)].view(layout.rows.shape[0], -1)
        sides = [queries >> lineage.SHIFT]
        if layout.seq_keys is not None:
            sides.append(layout.seq_keys)
        for side in sides:  # (sequences, n) positions: each sequence's from one row of its input
            for pos in side.cpu():
                pos = pos[pos >= 0]
                if pos.numel() > 1:
                    rows = self.sources.rows(pos)
                    if int(torch.unique(rows[rows >= 0]).numel()) > 1:
                        return True
        return False

    def _decoded(self, smap: ScoreMap, shape: tuple[int, ...], dim: int) -> Layout | str:
        """lineage.decode, once per layout: layers (and later calls of the same model on inputs of
        the same shape) whose queries and keys carry the same codes (the same positions and heads)
        and whose sources are the same share it."""
        sources = self._sources_key()
        key = (smap.shape, len(smap.chain), smap.broken, tuple(shape), dim, str(smap.q.device), sources,
               torch.is_inference_mode_enabled())  # (tensors made in inference mode stay there)  # fmt: skip
        with _LAYOUTS_LOCK:
            seen = list(_LAYOUTS.get(key, ()))
        for q, k, chain, found in seen:
            if (
                chain == smap.chain
                and (q is smap.q or torch.equal(q, smap.q))
                and (k is smap.k or torch.equal(k, smap.k))
            ):
                return found
        found = lineage.decode(smap, shape, dim, self.sources)
        with _LAYOUTS_LOCK:
            if key not in _LAYOUTS and len(_LAYOUTS) >= MAX_LAYOUTS:
                _LAYOUTS.pop(next(iter(_LAYOUTS)))
            entries = _LAYOUTS.setdefault(key, [])
            entries[:] = [*entries[-3:], (smap.q, smap.k, smap.chain, found)]
        return found

    def _record_exact(self, path, x, out, tag, layout: Layout) -> None:
        """A softmax whose layout lineage found: recorded as it is, whatever the fold."""
        scores = tag.scores if tag.scores is not None else x
        allowed = layout.bhqk(tag.allowed.expand(x.shape)) if tag.allowed is not None else None
        source = tag.mask_source if allowed is not None else None
        self._joined_head = None
        rec = self._record(path, layout.bhqk(out), layout.bhqk(scores.detach()), allowed, "softmax", source,
                           layout.cross, ext=layout.ext, layout=layout, queries=layout.qcode)  # fmt: skip
        joined = None
        if rec is None and self._joined_head is not None:  # one module per head: this head's weights are
            rec, at, offset = self._joined_head  # followed too (dropout after the softmax), into its slice
            joined = (at, offset)
        self._joined_head = None
        if rec is None:
            return
        b, h = rec.probs.shape[0], rec.probs.shape[1]
        p = _Probs(rec, (int(b), int(h)), False, layout.cross, layout.ext, tuple(out.shape), layout=layout,
                   joined=joined)  # fmt: skip
        moved = out.movedim(layout.dim, -1).shape
        key = ("rowq", id(layout.qcode), str(out.device), tuple(moved), layout.dim)
        rowq = lineage.recall(key)
        if rowq is lineage.MISS:
            rowq = layout.qcode.to(out.device).view(*moved[:-1], 1).movedim(-1, layout.dim)
            lineage.remember(key, (layout.qcode,), rowq)
        self.set(out, _Tag(None, tag.origin, probs=p, rowq=rowq, attn_out=path))
        self._rowq_owner[id(rowq)] = (
            rowq,
            p,
        )  # ops that keep the weights' rows keep rowq (held: its id stays)

    def _hold_softmaxed(self, out: torch.Tensor, *entry: Any) -> None:
        """Keep what renormalizing ``out`` over another axis needs (its scores among it) while ``out`` lives."""
        _hold(self._softmaxed, out, *entry)
        weakref.finalize(out, self._softmaxed.pop, id(out), None)

    def _renormalized_masked(self, args, kwargs, out: torch.Tensor) -> None:
        """Such weights times a 0/1 mask before they are renormalized over the other axis (slot attention over
        padded inputs: ``attn = attn * mask[:, None, None, :]`` between the epsilon and the sum): still those
        weights, the mask's zeros hidden keys of the record the renormalization makes."""
        if len(args) != 2 or kwargs:
            return
        for w, m in ((args[0], args[1]), (args[1], args[0])):
            entry = _held(self._softmaxed, w) if isinstance(w, torch.Tensor) else None
            if entry is None or not isinstance(m, torch.Tensor) or tuple(out.shape) != tuple(w.shape):
                continue
            if self.tag(m) is not None and self.tag(m) is not _PARAM_TAG or not _zero_one(m):
                return  # (times values, or a weighting: not a mask)
            scores, tag, path, dim, p, before = entry[1:]
            try:
                keep = (m != 0).expand(scores.shape)
            except RuntimeError:
                return
            allowed = keep if tag.allowed is None else tag.allowed.expand(scores.shape) & keep
            self._hold_softmaxed(out, scores, replace(tag, allowed=allowed, mask_source="multiplied"), path, dim,
                                 p, before)  # fmt: skip
            return

    def _renormalized(self, name: str, args, kwargs, out: torch.Tensor) -> None:
        """Weights a softmax gave over one axis (plus a constant), divided by their sum over another:
        ``attn = dots.softmax(dim=1) + eps; attn = attn / attn.sum(dim=-1, keepdim=True)``, slot attention's
        competition over the slots then weighted mean over the inputs. The weights the values are
        multiplied with are a distribution over that other axis: the record becomes them, laid out with
        it as the keys (the scores' lineage says where each element is), in place of the softmax's."""
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor):
            return
        if name in MUL:
            self._renormalized_masked(args, kwargs, out)
            return
        entry = _held(self._softmaxed, x)
        plus = name in ("add", "__add__", "__radd__", "sub", "__sub__") and len(args) == 2 and not kwargs
        if entry is None:
            total = _held(self._sums, x) if plus and type(args[1]) in (int, float) else None
            if total is not None:  # their sum plus a constant (PCT's ``1e-9 + attention.sum(dim=1)``)
                _hold(self._sums, out, *total[1:])
            return
        if plus:
            if type(args[1]) in (int, float):  # the weights plus a constant (slot attention's epsilon)
                self._hold_softmaxed(out, *entry[1:])
            return
        if name == "sum":
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            keep = args[2] if len(args) > 2 else kwargs.get("keepdim", kwargs.get("keepdims", False))
            if isinstance(dim, (tuple, list)) and len(dim) == 1:
                dim = dim[0]
            if type(dim) is int and keep is True and out.dim() == x.dim():
                _hold(self._sums, out, weakref.ref(x), dim % x.dim())
            return
        if name not in ("div", "__truediv__", "true_divide", "divide") or len(args) != 2 or kwargs:
            return
        total = _held(self._sums, args[1])
        if total is None or total[1]() is not x:
            return
        scores, tag, path, dim, p, before = entry[1:]
        axis = total[2]
        if axis == dim or tag.smap is None or tuple(out.shape) != tuple(scores.shape):
            return  # (over the softmax's own keys: the weights renormalized as the record follows them)
        found = self._decoded(tag.smap, tuple(scores.shape), axis)
        old = p.record
        at = next((i for i, r in enumerate(self.cap.records) if r is old), None)
        if not isinstance(found, Layout) or at is None:
            return
        del self.cap.records[at]
        p.record = None  # (the softmax's output, followed on, is no longer a record's)
        self._record_call = before  # (the call's maps as before the softmax's record)
        if self._runs and self._runs[-1][-1][0] == at:  # (nor is it a piece of the call's maps)
            self._runs[-1].pop()
            if len(self._runs[-1]) < 2:
                run = self._runs.pop()
                self._block_runs.discard(id(run))
                self._head_runs.discard(id(run))
        n = len(self.cap.records)
        self._record_exact(path, scores, out, tag, found)
        if len(self.cap.records) == n + 1:  # the new record where the softmax's was
            self.cap.records.insert(at, self.cap.records.pop())
        else:  # (not made: the softmax's record back, to be flagged where its changed weights are used)
            self.cap.records.insert(at, old)
            p.record = old

    def _record_over_positions(self, path, x, out, dim: int, tag: _Tag) -> bool:
        """A softmax over positions of a sequence whose scores are not a product of queries and keys:
        additive (Bahdanau: ``v . tanh(W q + U k)``), a dot written as a sum (Luong: ``(h * enc).sum(2)``),
        or a learned query (a hierarchical attention network's context vector). Lineage says, for every
        row, which positions it runs over (one sequence's) and which feature of the last projection
        made its scores (a head, when the projection has several outputs); the record is
        (sequences, heads, rows, keys) with each head's rows in the model's order. False where the
        codes do not show one sequence's positions along the softmax's dim in every row."""
        code = tag.code
        keys = int(x.shape[dim])
        if code is None or tuple(code.shape) != tuple(x.shape) or keys < 2 or not x.numel():
            return False
        moved = code.movedim(dim, -1)
        first = moved[(0,) * (moved.dim() - 1)] & lineage.FEATURES  # one row first (no copy of the codes):
        if bool((first != first[0]).any()):  # a vocabulary's features vary along it (a quick no)
            return False
        c = moved.reshape(-1, keys)
        pos, feat = c >> lineage.SHIFT, c & lineage.FEATURES
        if not bool((feat == feat[:, :1]).all()) or not bool((pos != pos[:, :1]).any(-1).all()):
            return False  # features along the dim (a vocabulary, a class), or a row over one position
        param = self.sources.learned(pos)
        srcs = [self.sources.items[i] for i in torch.unique(self.sources.index(pos[:1])).tolist()]
        if all(isinstance(s.origin, tuple) and s.origin[2:3] == ("projection",) for s in srcs):
            # weights over positions a projection made of the positions (FiBiNET's SENET, a Linear over the
            # fields): a synthesizer's weights, no map of queries over keys
            return False
        seen = pos.masked_fill(param, -1).sort(-1).values
        if bool(((seen[:, 1:] == seen[:, :-1]) & (seen[:, 1:] >= 0)).any()):
            return False  # a sequence position twice in a row (padding may repeat)
        seq_rows, seq = torch.unique(pos.masked_fill(param, -1), dim=0, return_inverse=True)
        if bool((seq_rows < 0).all(-1).any()):
            return False  # learned positions alone: no sequence to tell the rows apart by
        held = seq_rows[seq_rows >= 0]
        if held.numel() != torch.unique(held).numel():  # rows over overlapping sets of positions (each its
            return False  # neighbours, gathered): slots, not a sequence's keys; no sequences to split by
        heads, head = torch.unique(feat[:, 0], return_inverse=True)
        n_seq, n_heads = int(seq_rows.shape[0]), int(heads.numel())
        unit = seq * n_heads + head
        counts = torch.bincount(unit, minlength=n_seq * n_heads)
        if n_heads > 1 and (int(counts.max()) <= 1 or bool((heads[1:] - heads[:-1] == 1).any())):
            # one distribution per feature of a projection: linear attention's keys (a kernel, not a
            # query-key map), multi-hop pooling (Lin et al.), which cannot be told apart, or vector attention
            # (Point Transformer: every channel its own weights). Heads are rows, as many per sequence as
            # there are keys, each head's scores summed over its slice of features (multi-head GATv2)
            why = (
                "a softmax over positions for every feature of a projection (linear attention's keys, "
                "multi-hop pooling, or vector attention's channels), not a map of queries over keys"
            )
            self.skip(path, tuple(x.shape), why)
            _hold(
                self._unplaced, out, path, tuple(x.shape), why
            )  # told again if values follow (label attention)
            return True
        if not bool((counts == counts[0]).all()) or not int(counts[0]):
            return False  # (sequence, head) pairs with different numbers of rows
        # sequences in the order the weights hold them (each where its first row is): the model's batch order,
        # also where their positions were numbered in another (sentences pooled in a packed, sorted order)
        r = torch.arange(unit.numel(), device=unit.device)
        first_row = torch.full((n_seq,), int(unit.numel()), dtype=torch.int64, device=unit.device)
        order = torch.sort(first_row.scatter_reduce(0, seq, r, "amin")).indices
        rank = torch.empty_like(order)
        rank[order] = torch.arange(n_seq, device=order.device)
        sort_key = (rank[seq] * n_heads + head) * unit.numel() + r  # rows in the model's order in a unit
        rows = r[torch.argsort(sort_key)].view(n_seq, n_heads, -1).cpu()

        def bhqk(t: torch.Tensor) -> torch.Tensor:
            return t.movedim(dim, -1).reshape(-1, keys)[rows.to(t.device)]

        source = tag.mask_source
        if tag.allowed is not None:
            allowed = bhqk(tag.allowed.expand(x.shape))
        else:  # keys the scores hide (-inf or a very negative value), as masked by the model
            # (half NEG: a -1e4 penalty added to a positive score stays far below every real score)
            allowed, source = bhqk(x.detach() > NEG / 2), "scores"
            if bool(allowed.all()):
                allowed = None
        scores = tag.scores if tag.scores is not None else x
        labels = lineage._labels(pos[rows[0, 0, 0]], self.sources)
        first_rows = rows[:, 0, 0].to(pos.device)
        placed = None  # why the sequences' keys cannot share one map's labels
        if n_seq > 1:
            learned = param[first_rows]  # (sequences, keys): learned or padding keys of each sequence
            if not bool((learned == learned[:1]).all()):
                padded = self.sources.of_kind(pos[first_rows], ("pad",))
                if bool(((learned & ~padded) == (learned & ~padded)[:1]).all()):
                    # only padding in other places (pad_packed_sequence pads each sequence to the longest): a
                    # padded slot is a position of its sequence, as its PAD token is, so no column is labelled
                    # padding (the first sequence's labels would call another's real keys padding)
                    cols = padded.any(0).tolist()
                    kept = tuple(None if cols[j] else lab for j, lab in enumerate(labels or ()))
                    labels = kept if any(kept) else None
                else:
                    placed = ("sequences have learned or padding keys in different places: one map's key labels "
                              "cannot hold them")  # fmt: skip

        made_at = self.n_ops
        out_shape = tuple(out.shape)
        # a row per position of the sequence, from one input (``(q[:, :, None] * k[:, None]).sum(-1)``, GATv2's
        # dense scores): self-attention, as after a product whose queries and keys share their origin
        cross = not (self._one_input(tag.origin, pos[rows[0, 0, 0]], n_seq * int(rows.shape[-1]) * keys)
                     and int(rows.shape[-1]) == keys and labels is None)  # fmt: skip
        # the batch put in another order before (Show, Attend and Tell sorts its images with their captions by
        # length): record row b is not the caller's sequence b (its keys are not, where a state asks)
        key_pos = pos.masked_fill(param, -1)[first_rows]  # (sequences, keys)
        reordered = self._batch_reordered(key_pos, cross) or placed
        grid = self.sources.items[int(self.sources.index(pos[:1, :1]).reshape(-1)[0])]
        if reordered is None and grid.kind == "external" and len(grid.lead) >= 3 and 0 < grid.lead[0] < n_seq:
            # keys that are a line of a tensor handed in with several axes of positions ((B, N, N, d): pairs
            # an edge MLP scored, EGNN's; (B, S, W, d): sentences of documents), one line per record row
            reordered = (f"its {n_seq} rows are lines of a tensor handed in with more than one axis of positions "
                         f"{tuple(grid.lead)} (pairs the model tiled, as an edge MLP over [h_i, h_j] makes them, "
                         "or the sentences of documents): record row b is not the caller's sequence b, and lineage "
                         "does not say which position asks in each row")  # fmt: skip

        def record(used: torch.Tensor | None, keep: torch.Tensor | None, changed: bool) -> None:
            """The rows read other positions than their own (a decoder step's state, a learned query): cross;
            a row per position of the one input the keys come from: self-attention.
            ``used``: the weights as multiplied, in the softmax's shape (None: as the softmax gave them);
            ``keep``: a 0/1 mask they were multiplied by on the way (True = kept); ``changed`` with no
            ``used``: changed in a way capture cannot map back, so the record is flagged."""
            mask = allowed
            if keep is not None:
                kept = bhqk(keep.expand(out_shape))
                mask = kept if mask is None else mask & kept
            flag = None
            if changed and used is None:
                flag = ("the weights were changed after the softmax in a layout capture could not map back: "
                        "the record holds them as the softmax gave them")  # fmt: skip
            elif reordered is not None:
                flag = reordered
            if flag is not None:
                self.warn(path, out_shape, f"could not verify: {flag}")
            rec = self._record(path, bhqk(out if used is None else used), bhqk(scores.detach()), mask, "softmax",
                               (source if keep is None else "multiplied") if mask is not None else None, cross,
                               key_labels=labels, flag=flag)  # fmt: skip
            if rec is not None:  # (made where its weights are read: they weigh values)
                self._weighed.add(rec.seq)
            records = self.cap.records
            if rec is not None and records and records[-1] is rec and rec.key_positions is None:
                # each sequence's keys (a trace asks whether they are its tokens in order: instances sorted by a
                # score, DTFD-MIL's, are not)
                if tuple(key_pos.shape) == (int(rec.probs.shape[0]), int(rec.probs.shape[-1])):
                    rec = records[-1] = _replaced(rec, key_positions=key_pos)
            if rec is not None and not self._runs and records and records[-1] is rec:  # in softmax order
                at = next((i for i, r in enumerate(records[:-1]) if r.seq > made_at), None)
                if at is not None:
                    records.insert(at, records.pop())

        if len(self._positional) >= 256:  # a few are pending at a time; older ones were never used
            self._positional.clear()
            self._self_weights.clear()
        self._positional[id(out)] = (out, record, lambda t: t, None, False)
        self._positional_shapes[id(record)] = (path, tuple(int(n) for n in x.shape))
        if not cross:  # what they weigh keeps its positions: row i of ``a @ v`` is position i, as in any
            self._self_weights.add(id(record))  # self-attention (a GAT layer's output feeds the next)
        if self.tag(out) is None:  # the weights as features (Tacotron 2's location layer convolves them over
            self.set(out, _Tag(None, tag.origin, code=code))  # the keys): each the key position it weighs
        return True

    def _one_input(self, origin: frozenset, keys: torch.Tensor, pairs: int) -> bool:
        """Whether scores over positions ``keys`` of one input come from that input alone, or besides from
        inputs with one position per (query, key) pair (``pairs`` of them: edge types of a graph,
        embedded as ``(B, N, N)``), which are features of the pairs, not a sequence of queries."""
        if len(origin) == 1:
            return True
        own = {self.sources.items[i].origin for i in torch.unique(self.sources.index(keys)).tolist()}
        if len(own) != 1 or not own <= origin:
            return False
        by_origin: dict[Any, list[int]] = {}
        for s in self.sources.items:
            by_origin.setdefault(s.origin, []).append(s.n)
        return all(by_origin.get(o) and all(n == pairs for n in by_origin[o]) for o in origin - own)

    def _positional_step(self, name: str, args, kwargs, out) -> None:
        """Weights over positions (``_record_over_positions``) followed through views of them, a 0/1 mask
        or a renormalization, dropout, and recorded as they are where they multiply values
        (``bmm(a.unsqueeze(1), enc)``, ``(a.unsqueeze(-1) * h).sum(1)``): a distribution over positions
        nothing is weighted by (a pointer network's output) is not attention."""
        found = None
        for t in _tensors(args, kwargs):
            entry = self._positional.get(id(t))
            if entry is not None and entry[0] is t:
                found = entry
                break
        if found is None and (name in MUL or name in MATMUL):  # a slice of the weights (a loop over them)
            ins = _tensors(args, kwargs)
            for t in ins:
                base = t._base
                entry = self._positional.get(id(base)) if base is not None else None
                if (
                    entry is not None
                    and entry[0] is base
                    and any(
                        o is not t
                        and o._base is not base
                        and (g := self.tag(o)) is not None
                        and g.role != "param"
                        for o in ins
                    )
                ):  # times values: an activation capture follows (not a mask, not another slice of them)
                    self._in_pieces.add(id(entry[1]))
            return
        if found is not None and name in PACKING:  # packed into a sequence (DIEN's AUGRU gates its
            self._packed_weights.add(id(found[1]))  # recurrence with them)
            return
        if found is None or not isinstance(out, torch.Tensor):
            return
        t, record, to_softmax, keep, was_changed = found
        if name in MATMUL and len(args) >= 2 and _sums_over_one(args[0], args[1]):
            return  # each position's share of a vector (a DNC's memory write ``bmm(w.unsqueeze(2), a.unsqueeze(1))``):
            # nothing is summed over the positions, so no values are read through the weights
        factor = self._factor_read.get(id(record))
        if (
            factor is not None
            and name in ("sum", "nansum")
            and out.dim() == t.dim()
            and id(record) in self._positional_shapes
        ):
            # summed keeping the axis: a renormalization's denominator, if the product is divided by it next
            # (forward attention's ``alpha = prior * w; alpha / alpha.sum(1, keepdim=True)``); a read
            # otherwise, recorded so at the end of the block
            self._factor_kept[id(record)] = (weakref.ref(out), factor)
            return
        if factor is not None and name in ("sum", "mean", "nansum") and id(record) in self._positional_shapes:
            # weights times a tensor of their shape, summed: that tensor was the values, one number a position
            del self._positional_shapes[id(record)]
            del self._factor_read[id(record)]
            for key in [k for k, e in self._positional.items() if e[1] is record]:
                del self._positional[key]
            n_ops, self.n_ops = self.n_ops, factor[4]  # (recorded as at that product: in call order)
            try:
                record(*factor[1:4])
            finally:
                self.n_ops = n_ops
            return
        others = [o for o in _tensors(args, kwargs) if o is not t and o.numel() > 1]
        if name in lineage.REPLAY and args and args[0] is t:  # a view of the weights: still them
            back = None
            if to_softmax is not None and name in ("unsqueeze", "squeeze", "view", "reshape", "flatten",
                                                   "unflatten", "contiguous", "clone", "detach"):  # fmt: skip
                shape = tuple(t.shape)
                back = lambda o, f=to_softmax, s=shape: f(o.reshape(s))  # noqa: E731
            elif to_softmax is not None:  # axes moved (``al.movedim(3, 1)``, PyG's DenseGATConv): moved back
                undo = _undo_move(name, args[1:], kwargs, t.dim())
                if undo is not None:
                    back = lambda o, f=to_softmax, u=undo: f(u(o))  # noqa: E731
            self._positional[id(out)] = (out, record, back, keep, was_changed)
            return
        mask = None
        if name in MUL and len(others) == 1 and (others[0].dtype == torch.bool or bool(((others[0] == 0) |
                                                                                       (others[0] == 1)).all())):  # fmt: skip
            mask = others[0].bool()  # a 0/1 mask the weights are multiplied by (AllenNLP, Keras ports)
        elif name in FILL and len(args) >= 3 and args[0] is t and args[2] == 0:
            mask = ~args[1].bool()
        same = tuple(out.shape) == tuple(t.shape) and out.is_floating_point()
        if (
            mask is None
            and same
            and name in MUL
            and len(others) == 1
            and (
                tuple(others[0].shape) == tuple(t.shape)
                or (self.tag(others[0]) is None and _broadcasts_to(others[0], t))
            )
            and not _is_param(others[0])
            and id(record) in self._positional_shapes
            and t.numel() == math.prod(self._positional_shapes[id(record)][1])
        ):
            # times a tensor of their own shape (not repeated over the values' features first, as DLFS2's
            # ``a.reshape(N, T, 1).repeat(1, 1, H)`` is: that is their product): a prior (forward attention's
            # ``(prev + shift(prev)) * w``, then renormalized), so what follows reads changed weights; or values,
            # one number a position, read by the sum after; or a gate (DA-RNN's input attention scales its
            # inputs): what follows says
            self._positional[id(out)] = (out, record, to_softmax, keep, True)
            used = to_softmax(t) if to_softmax is not None and was_changed else None
            self._factor_read[id(record)] = (record, used, keep, was_changed, self.n_ops)
            return
        changed = mask is not None or (
            same
            and name not in MUL
            and name not in MATMUL
            and name not in REDUCTIONS
            and name not in lineage.REPLAY
            and (name not in DIV or args[0] is t)
        )  # (changed element by element: renormalized, clamped, dropped out, cast, a prior added)
        kept = self._factor_kept.pop(id(record), None) if name in DIV and args and args[0] is t else None
        if kept is not None and len(args) > 1 and args[1] is kept[0]():  # the product renormalized: the
            self._factor_read.pop(id(record), None)  # weights the values are multiplied with (no read)
        elif kept is not None:
            self._factor_kept[id(record)] = kept
        if changed:  # the weights, changed: followed as they are (renormalized after a mask, dropped out)
            if mask is not None and tuple(out.shape) != tuple(t.shape):
                return
            if mask is not None and to_softmax is not None:  # kept in the softmax's shape
                soft = to_softmax(mask.expand(out.shape).reshape(out.shape))
                keep = soft if keep is None else keep & soft
            self._positional[id(out)] = (out, record, to_softmax, keep, True)
            return
        if (
            (name in MATMUL or name in MUL)
            and any((g := self.tag(o)) is not None and g.role != "param" for o in others)
            or (name in MATMUL and any(o.is_floating_point() and not _is_param(o) for o in others))
        ):
            # the weights times values (activations, or values handed in: not a learned bias)
            self._factor_read.pop(id(record), None)
            for key in [k for k, e in self._positional.items() if e[1] is record]:
                del self._positional[key]
            self._positional_shapes.pop(id(record), None)
            own = id(record) in self._self_weights
            self._self_weights.discard(id(record))
            used = to_softmax(t) if to_softmax is not None and was_changed else None
            record(used, keep, was_changed)
            if name in MATMUL:  # the product's output: positions pooled by these weights, or (self-attention
                self._pooled_by = (t, own and to_softmax is not None)  # in the softmax's shape) the rows' own

    def _record_guess(self, path, x, out, dim, tag, why) -> None:
        """No lineage for this softmax: the shape rules decide, and a record is flagged as a guess."""
        shape = tuple(x.shape)
        if (
            why is None
            and tag is not None
            and tag.code is not None
            and self._record_over_positions(path, x, out, dim, tag)
        ):
            return
        if x.dim() < 3:
            self.skip(path, shape, _PER_ROW)
            _hold(self._unplaced, out, path, shape, _PER_ROW)  # told again if values follow
            return
        perm = None
        if dim != x.dim() - 1:  # einsum scores laid out as (q, k, B, H) (Transformer-XL's "ijbn")
            axes = tag.axes if tag is not None else None
            if not axes or axes[dim] != "k" or sorted(axes) != ["k", "q", *["s"] * (x.dim() - 2)]:
                self._unrecorded(path, shape, tag, out, why or "the softmax is not over the last axis, and lineage does "
                                 "not say which axis holds the keys")  # fmt: skip
                return
            perm = [i for i, a in enumerate(axes) if a == "s"] + [axes.index("q"), axes.index("k")]
            x, out = x.permute(perm), out.permute(perm)
        role = tag.role if tag is not None else None
        ext = bool(tag is not None and tag.ext and x.shape[-1] > x.shape[-2])
        if not _matches(path, self.include):
            if role in ("linear", "param"):
                self.skip(path, shape, _PROJECTED)
                _hold(self._projected, out, path, shape)  # told again if values follow
                return
            lengths = self.cap.lengths
            if lengths and int(x.shape[-1]) not in lengths and not ext:  # ext: past + current keys
                self._unrecorded(path, shape, tag, out, why or f"its last axis ({int(x.shape[-1])}) is not a sequence "
                                 "length of this call's inputs, and lineage does not place its keys (tokens pruned, "
                                 "merged or made from others on the way)")  # fmt: skip
                return
            if not lengths and role != "scores":
                self._unrecorded(path, shape, tag, out, why or "it is not made from a product of two activations "
                                 "and no sequence length is known")  # fmt: skip
                return
        cross = tag.cross if tag is not None else None
        if why == lineage.RAW_QUERIES:  # (queries handed in: whether they are the keys' sequence is unknown,
            cross = None  # so the kind is read from the lengths, the mask and the name)
        layout = _Probs(None, *self._layout(x, tag), cross, ext, tuple(out.shape))
        scores = x
        if tag is not None and tag.scores is not None:
            scores = tag.scores if perm is None else tag.scores.permute(perm)
        allowed = None
        if tag is not None and tag.allowed is not None:
            full = tag.allowed.expand(shape)
            allowed = layout.bhqk(full if perm is None else full.permute(perm))
        source = tag.mask_source if tag is not None and allowed is not None else None
        flag = (
            f"{why}, so which axes hold the batch and the heads is read from the shape (a guess)"
            if why
            else "the queries' and keys' lineage was lost before the product, or the scores' on the way to the "
            "softmax (an op capture does not follow, as scores written by scatter_ into a new tensor), so the head "
            "and batch split comes from the shape"
        )
        rec = self._record(path, layout.bhqk(out), layout.bhqk(scores.detach()), allowed, "softmax", source, cross,
                           ext=ext, flag=flag)  # fmt: skip
        self.warn(path, shape, f"could not verify: {flag}")
        if rec is not None and perm is None:  # follow the weights: a masked renormalization replaces them
            layout.record = rec
            self.set(
                out, _Tag(None, tag.origin if tag is not None else frozenset(), probs=layout, attn_out=path)
            )

    def _projected_used(self, args, kwargs, broadcast: bool = False) -> bool:
        """A softmax over a projection's output multiplied with values over their positions: weights made
        without queries and keys (a synthesizer's dense or random attention), not a vocabulary or router
        distribution after all. A warning, in place of the information that said so. (Efficient
        attention's queries softmaxed over their features multiply a context over features: not this.)"""
        ins = _tensors(args, kwargs)
        if len(ins) != 2 or ins[0].dim() < 2 or ins[1].dim() < 2:
            return False
        t, v = ins  # weights @ values
        for w, vals in ((t, v), (v, t)) if broadcast else ():  # (``values * weights`` too)
            held = _held_or_base(self._projected, w)
            if held is None or _held(self._sampled, vals) is None or w.dim() != vals.dim():
                continue
            # (a weight per sampling point, shared by the values' features: not a gate over channels)
            if not any(a == 1 < b for a, b in zip(w.shape, vals.shape, strict=True)):
                continue
            self._projected.pop(id(held[0]()), None)
            _, path, shape = held
            self._unsay(path, _PROJECTED)
            self.warn(path, shape, "weights over sampling points (deformable attention: a softmax of a projection "
                      "of the queries) multiply values F.grid_sample took at offsets the model predicts: there "
                      "are no query-key scores over the keys' positions, so capture records no map of these "
                      "weights")  # fmt: skip
            return True
        # (the weights or a view of them: ``softmax(R).unsqueeze(0).expand(B, ...)``)
        entry = _held_or_base(self._projected, t)
        if entry is None or (broadcast and (v.dim() < 3 or v.dim() != t.dim())):
            return False
        g, code = self.tag(v), self.code_of(v)
        if g is None or g.role == "param" or code is None or tuple(code.shape) != tuple(v.shape):
            return False
        pos = code >> lineage.SHIFT  # one position per row of the values, other ones along the product's axis
        # (of an einsum, the values' axis the weights' last is summed with)
        over = _einsum_axis(args[0], v.dim()) if args and isinstance(args[0], str) else -2
        if over is None or int(v.shape[over]) < 2:
            return False
        if over == -2 and bool((pos != pos[..., :1]).any()):
            return False
        if not bool((pos != pos.narrow(over, 0, 1)).any()):
            return False
        self._projected.pop(id(entry[0]()), None)
        _, path, shape = entry
        self._unsay(path, _PROJECTED)  # (a vocabulary softmax of the module later is one)
        self.warn(path, shape, "weights whose scores capture could not trace to queries times keys multiply "
                  "values here: scores made by a projection or a learned table (a synthesizer's dense or random "
                  "attention, or a similarity scored by a projection of paired features whose pairs lineage could "
                  "not place: both halves tiled from one tensor by expand, or heads among the pairs' axes), or over "
                  "keys gathered in a way capture does not follow (windows of "
                  "keys cut by F.unfold or Tensor.unfold). Capture records maps of query-key scores, so these "
                  "weights are not recorded")  # fmt: skip
        return True

    def _unrecorded(self, path, shape, tag, out, reason) -> None:
        """A softmax left out: a warning when it was made from a product of activations (it may be
        attention), information otherwise (told again as a warning if its weights multiply values)."""
        if tag is not None and tag.role == "scores":
            self.warn(path, shape, f"not recorded: {reason}")
        else:
            self.skip(path, shape, reason)
            _hold(self._unplaced, out, path, shape, reason)

    def _carry_left_out(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """Weights of a softmax left out (``_unplaced``, ``_projected``) changed element by element keep its
        entry: a product with values after a mask and a renormalization is said as one straight after it."""
        for registry in (self._unplaced, self._projected):
            entry = _held(registry, x)
            if entry is not None and _held(registry, out) is None:
                _hold(registry, out, *entry[1:])

    def _left_out_carried(self, name: str, args, kwargs, out, registry: dict | None = None) -> None:
        """Weights of a softmax left out as not attention that the model changes, moves or joins before it
        reads with them keep its entry, so a read of values with them is a warning: an NTM's content weights
        interpolated with the last step's, shifted by ``cat`` and ``conv1d`` a row at a time and written into
        a new tensor (``result[b] = ...``), then sharpened (``w ** gamma / sum``). What keeps the key axis (its
        length), joins or convolves the weights carries it; a reduction or a product does not. ``registry``:
        another one kept so (``_energies``)."""
        reg = self._unplaced if registry is None else registry
        if name == "__setitem__":
            if (
                len(args) < 3
                or not isinstance(args[0], torch.Tensor)
                or not isinstance(args[2], torch.Tensor)
            ):
                return
            entry = _held_or_base(reg, args[2])
            target = args[0]
            if entry is not None and target.is_floating_point():
                for t in (target, target._base):
                    if t is not None and _held(reg, t) is None:
                        _hold(reg, t, *entry[1:4], True)
            return
        if type(out) is not torch.Tensor or not out.is_floating_point() or _held(reg, out) is not None:
            return
        joins = name in CAT or name == "stack" or name in CONV
        for t in _tensors(args, kwargs):
            entry = _held_or_base(reg, t)
            if entry is None:
                continue
            if name == "einsum" and tuple(out.shape) != tuple(t.shape):
                return  # (a product: weights times values, said by _unplaced_used; a mask by einsum is carried)
            if name in lineage.REPLAY and name not in REORDERS:
                # the same weights, or some of them, in another shape (squeezed, transposed, sliced): as they were
                _hold(reg, out, *entry[1:])
            elif (
                joins
                or name in REORDERS
                or (out.dim() >= 1 and t.dim() >= 1 and out.shape[-1] == t.shape[-1])
            ):
                _hold(reg, out, *entry[1:4], True)  # (changed: said where values follow)
            return

    def _sparse_weights_used(self, args, kwargs) -> None:
        """A sparse matrix whose values are an exp or a sigmoid of activations (pyGAT's per-edge
        ``exp(-leakyrelu(a . [h_i; h_j]))`` put into ``sparse_coo_tensor``) times activations: attention over a
        graph's edges, computed in a sparse product capture does not lay out. A warning."""
        ins = _tensors(args, kwargs)
        if len(ins) != 2:
            return
        for w, v in ((ins[0], ins[1]), (ins[1], ins[0])):
            if _held(self._sparse_weights, w) is None:
                continue
            g = self.tag(v)
            if g is None or g.role == "param" or not v.is_floating_point() or v.is_sparse:
                continue
            self._sparse_weights.pop(id(w), None)
            self.n_attention += 1
            self.warn(self.path(), tuple(w.shape), "weights over a graph's edges (an exp or a sigmoid of "
                      "activations put into a sparse matrix, pyGAT's) multiply values: capture records dense maps "
                      "of softmax weights, so these weights are not recorded")  # fmt: skip
            return

    def _energies_made(self, args, out: torch.Tensor) -> None:
        """One number a position made by a projection of activations over positions (additive attention's
        energies, ``v(tanh(W h + U s))``): held, so that weights made of them without a softmax that multiply
        values over those positions are a warning (a softmax of them is recorded as any other)."""
        x = args[0] if args else None
        g = self.tag(x) if isinstance(x, torch.Tensor) else None
        code = self.code_of(x) if g is not None and g.role != "param" else None
        if code is None or code.dim() < 2 or tuple(code.shape[:-1]) != tuple(out.shape[:-1]):
            return
        pos = code[..., 0] >> lineage.SHIFT
        if bool((pos != pos.reshape(-1)[:1]).any()):
            _hold(self._energies, out, self.path(), tuple(out.shape), "", "energies")

    def _energies_used(self, args, kwargs, out: torch.Tensor) -> None:
        """Energies (``_energies_made``) made into weights without a softmax (a sigmoid and a cumprod:
        monotonic attention's expected alignment; ``exp(u) / moving_sum``: MoChA's chunks) that multiply
        values over positions: a warning, as scores that multiply values without a softmax get."""
        ins = _tensors(args, kwargs)
        if len(ins) != 2:
            return
        for w, v in ((ins[0], ins[1]), (ins[1], ins[0])):
            entry = _held_or_base(self._energies, w)
            if entry is None or entry[4] == "energies":
                continue  # (the projection's output itself: a product of it is a projection)
            if self._exps and _held(self._exps, w) is not None:
                # (the exp of query-key scores with a bias beside them, a softmax computed block by block with a
                # triangle bias of one head, as OpenFold's LMA: said as that, no energies without a softmax)
                continue
            g = self.tag(v)
            if g is None or g.role == "param" or g.probs is not None or not v.is_floating_point():
                continue
            made = self.tag(out)
            if (made is not None and (made.made_by is not None or made.attn_out is not None)) or any(
                r.seq == self.n_ops for r in self.cap.records
            ):  # (weights of a record: a softmax written by hand, recorded where they multiply values)
                return
            code = self.code_of(v)
            if code is None or tuple(code.shape) != tuple(v.shape):
                continue
            pos = code >> lineage.SHIFT
            if not bool((pos != pos.reshape(-1)[:1]).any()):
                continue
            self._energies.pop(id(entry[0]()), None)
            self.n_attention += 1
            self.warn(self.path(), tuple(w.shape), "weights over positions made from energies without a softmax "
                      "(a sigmoid, a cumulative product, an exp over a moving sum: monotonic or chunkwise attention) "
                      "multiply values: capture records softmax weights, so these weights are not recorded")  # fmt: skip
            return

    def _other_values(self, w: torch.Tensor, v: torch.Tensor) -> bool:
        """``v``, of the weights' own shape, holds values of other positions than the weights' (Point
        Transformer's ``v[:, None] + delta``, a value per pair of points), not a function of the weights
        themselves (their own log: an entropy) nor a one-hot the model made (a Dice loss's target)."""
        if self.tag(v) is None:  # (a tensor nothing tagged: from outside, or made from the weights alone)
            return False
        vc = self.code_of(v)
        if vc is None or tuple(vc.shape) != tuple(v.shape):
            return False
        wc = self.code_of(w) if self.tag(w) is not None else None
        return (
            wc is None
            or tuple(wc.shape) != tuple(w.shape)
            or not torch.equal(wc >> lineage.SHIFT, vc >> lineage.SHIFT)
        )

    def _unplaced_used(self, args, kwargs, broadcast: bool = False, out: torch.Tensor | None = None) -> None:
        """A softmax left out as not attention (a 2-D one, one whose axis is no sequence length) whose
        weights, or a view of them, multiply values over several positions (``attn @ enc_out``, the values
        first in ``bmm(v, attn)``): attention after all, that capture could not lay out. A warning, in
        place of the information that said so."""
        ins = _tensors(args, kwargs)
        if len(ins) != 2:
            return
        if not broadcast and _sums_over_one(ins[0], ins[1]):
            return  # (each position's share of a vector, a memory write: it reads no values)
        for w, v in ((ins[0], ins[1]), (ins[1], ins[0])):
            if broadcast and (v.dim() < 3 or v.dim() != w.dim()):
                continue  # (a product element by element: values over positions, (B, N, d) against (B, N, 1))
            entry = _held_or_base(self._unplaced, w)
            if entry is None:
                continue
            gw = self.tag(w)
            pw = self._weights_of(gw) if gw is not None else None
            if pw is not None and pw.record is not None and len(entry) > 4:
                # left-out weights combined with a softmax that is recorded (ConViT's gated positional attention:
                # ``(1 - g) * softmax(q k^T) + g * softmax(pos_proj(rel))``): the record holds what multiplies the
                # values, these weights in it; nothing to tell
                self._unplaced.pop(id(entry[0]()), None)
                self._unsay(entry[1], entry[3])
                continue
            if broadcast and _held(self._shifted, v) is not None:
                self._tell_unplaced(entry, True, shifted=True)
                return
            # a read weighs values along an axis the weights span, one broadcast over the other (``w[..., None] *
            # memory``), then sums it; a gate is 1 along the positions (SKNet's branch weights over every pixel), and
            # weights times a tensor of their own shape (a one-hot target, their own log) read nothing
            full = (
                [a for a in range(1, v.dim()) if int(w.shape[a]) == int(v.shape[a]) > 1] if broadcast else []
            )
            if broadcast and (
                not full or (tuple(w.shape) == tuple(v.shape) and not self._other_values(w, v))
            ):
                continue
            g = self.tag(v)
            if g is _PARAM_TAG or (g is not None and g.role == "param") or not v.is_floating_point():
                continue  # (a learned table: a projection of the weights, as a soft embedding's)
            if _held(self._int_floats, v) is not None:
                continue  # (one-hots the model made: a count, no values)
            code = self.code_of(v) if g is not None else None
            if code is not None and tuple(code.shape) != tuple(v.shape):
                code = None
            if code is not None:
                pos = code >> lineage.SHIFT
                if not bool(
                    (pos != pos.reshape(-1)[:1]).any()
                ):  # (one position: a vector, not values over positions)
                    continue
                if broadcast and not any(
                    bool((pos.narrow(a, 1, int(pos.shape[a]) - 1) != pos.narrow(a, 0, 1)).any()) for a in full
                ):
                    continue  # (the weights span no axis of positions: a mixture within each row, an MDN's)
            elif v.dim() < 3 or int(v.shape[0]) != int(w.shape[0]) or _is_param(v):
                continue  # (a table with no batch axis, class embeddings handed in: what a class softmax weighs;
                # a memory read by its weights is one per sequence)
            if broadcast and out is not None:
                # a read once its product is summed over those positions (else a gate: SENET's over fields)
                _hold(self._reads, out, entry, code is not None, tuple(full))
                return
            # (values that are another left-out softmax's weights times values: linear attention's context)
            read = code is None and _held_or_base(self._unplaced_products, v) is not None
            self._tell_unplaced(entry, code is not None, context=read)
            if out is not None:
                _hold(self._unplaced_products, out)
            return

    def _read_summed(self, name: str, args, kwargs) -> None:
        """The product of left-out weights and values broadcast over their features (``_unplaced_used``) summed
        over the positions the weights span (``(w[..., None] * memory).sum(1)``): a read, told as a warning."""
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor):
            return
        held = _held_or_base(self._reads, x)
        if held is None:
            return
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        _, entry, coded, full = held
        if dim is None or any(isinstance(d, int) and d % x.dim() in full for d in dims):
            self._reads.pop(id(held[0]()), None)
            if _held(self._unplaced, entry[0]()) is not None or entry[0]() is None:
                self._tell_unplaced(entry, coded)

    def _tell_unplaced(self, entry: tuple, coded: bool, shifted: bool = False, context: bool = False) -> None:
        """The warning that a left-out softmax's weights multiply values (in place of the information);
        ``shifted``: copies of the values moved along their positions by a shift the data picked; ``context``: the
        values are another left-out softmax's weights times values."""
        held, path, shape, reason = entry[:4]
        if shifted:
            reason = ("each weight multiplies a copy of the values shifted along their positions by an offset the "
                      "data picked, as Autoformer's auto-correlation weighs its top-k time delays: attention over "
                      "shifts, with no query-key scores to lay out")  # fmt: skip
        self._unplaced.pop(id(held()), None)
        self._unsay(path, entry[3])  # (a later softmax of the module left out so is noted again)
        # (without codes: a memory or features from outside the call, or past an op lineage does not follow)
        what = (
            "values over positions (attention)"
            if coded
            else "the product of another softmax's weights with values (a context over features, as linear and "
            "efficient attention make it from their keys' softmax): attention, it may be"
            if context
            else "a tensor capture does not follow (from outside the call, as a memory read by its weights, "
            "or past an op lineage does not follow, as F.interpolate): attention, it may be"
        )
        changed = (
            ", changed after the softmax (moved, joined or combined with other tensors),"
            if len(entry) > 4
            else ""
        )
        self.warn(path, shape, f"not recorded: its weights{changed} multiply {what}, but capture could not lay "
                  f"them out ({reason})")  # fmt: skip

    def _layout(self, x, tag) -> tuple[tuple[int, int], bool]:
        """(a, b) factors of the first dim of 3-D scores, and whether they are (H, B) (head-major);
        (B, H) for 4-D+. The fold's order comes from the head count of the view that made q (a 3-D
        tensor folded from 4-D), else from the batch size of the token ids."""
        if x.dim() >= 4:
            return (int(x.shape[0]), int(math.prod(x.shape[1:-2]))), False
        n = int(x.shape[0])
        heads = tag.heads if tag is not None else None
        if tag is not None and tag.split is not None and tag.split[0] * tag.split[1] == n:
            a, b = tag.split
            if heads is not None and a != b and heads in (a, b):
                return (a, b), a == heads
            return (a, b), self.batch is not None and b == self.batch and a != self.batch
        if heads and n % heads == 0:
            return (n // heads, heads), False
        if self.batch and n % self.batch == 0:
            return (self.batch, n // self.batch), False
        return (n, 1), False

    def _probs_step(self, name, args, out, base_t, base, kwargs=None) -> bool:
        """Softmax weights multiplied by a 0/1 mask (or filled with 0), then divided by their sums
        (AllenNLP's ``masked_softmax``): the record takes the renormalized weights and that mask."""
        p = base.probs
        if name in TRANSPOSES and args and args[0] is base_t:
            return self._weights_transposed(name, args, kwargs or {}, out, base)
        if name in DROPOUT and out is base_t:  # dropout in eval mode hands back its input: the weights as
            return True  # they were (a 0/1 mask they were multiplied by still theirs: "Let's build GPT")
        if tuple(out.shape) != p.shape:
            return False
        if name in COPIES and args and args[0] is base_t and out.dtype == base_t.dtype:
            if out is not base_t:  # the same weights in memory of their own (which a head ablation writes)
                self.set(out, base)
            return True
        if name in CASTS and args and args[0] is base_t:
            if _cast_down(base_t.dtype, out.dtype):  # LLaMA's softmax(scores.float()).type_as(q): the
                self._replace_probs(p, out)  # model goes on with the rounded weights
                self.set(out, replace(base, probs=p, touched=False))
            elif out is not base_t:  # the same weights in a wider (or the same) dtype
                self.set(out, base)
            return True
        if name in TRIANGLES and args and args[0] is base_t and out.dim() >= 2:
            # ``w.tril()`` after the softmax: a 0/1 mask of the (last two) axes, as ``w * tril`` is
            diagonal = args[1] if len(args) > 1 else (kwargs or {}).get("diagonal", 0)
            if type(diagonal) is not int:
                return False
            keep = torch.ones(out.shape[-2:], dtype=torch.bool, device=out.device)
            keep = keep.tril(diagonal) if name.startswith("tril") else keep.triu(diagonal)
            layout = replace(p, allowed=keep if p.allowed is None else p.allowed & keep)
            self.set(out, replace(base, probs=layout, touched=True))
            _hold(self._masked_of, out, weakref.ref(base_t), keep)
            return True
        if len(args) < 2:
            return False
        if name in SUB and len(args) == 2 and args[0] is base_t and isinstance(args[1], torch.Tensor):
            # ``w - w.triu(1)``: the weights less a masked copy of themselves are the weights masked by the
            # rest (``w.tril()``)
            held = _held(self._masked_of, args[1])
            if held is None or held[1]() is not base_t or tuple(out.shape) != p.shape:
                return False
            keep = ~held[2]
            layout = replace(p, allowed=keep if p.allowed is None else p.allowed & keep)
            self.set(out, replace(base, probs=layout, touched=True))
            _hold(self._masked_of, out, weakref.ref(base_t), keep)
            return True
        if name in MUL or name in FILL:
            other = args[1] if args[0] is base_t else args[0]
            if not isinstance(other, torch.Tensor) or other.numel() <= 1:
                return False
            if name in FILL:
                if (
                    args[0] is not base_t
                    or len(args) < 3
                    or not (isinstance(args[2], (int, float)) and args[2] == 0)
                ):
                    return False
                keep = ~other.bool()
            elif other.dtype == torch.bool or _zero_one(other):
                keep = other != 0
            else:
                return False
            layout = replace(p, allowed=keep if p.allowed is None else p.allowed & keep)
            self.set(out, replace(base, probs=layout, touched=True))
            _hold(self._masked_of, out, weakref.ref(base_t), keep)
            return True
        if name in DIV and args[0] is base_t and p.allowed is not None:
            sums = out.detach().sum(-1)
            if bool((((sums - 1).abs() < 1e-3) | (sums == 0)).all()) and self._masked_weights(p, out):
                self.set(
                    out, replace(base, probs=replace(p, allowed=None), touched=False)
                )  # the record's weights now:
                return True  # followed into the product with the values
        return False

    def _plain_weights(self, first: _Tag, perm: list[int]) -> _Tag | None:
        """The tag of the weights permuted by ``perm`` to (lead, q, k): their layout's rows re-read in
        that order (the same (batch, head, query) for every row), or None where it cannot be."""
        p = first.probs
        if p is None or p.layout is None or first.rowq is None or first.rowq.dim() != len(perm):
            return None
        layout, n = p.layout, len(perm)
        if perm[-1] != layout.dim % n:
            return None
        key = ("plain weights", id(layout), id(first.rowq), tuple(perm))
        hit = lineage.recall(key)
        if hit is lineage.MISS:
            nonkey = [d for d in range(n) if d != perm[-1]]  # the weights' other dims, in their order
            shape = [int(p.shape[d]) for d in nonkey] if len(p.shape) == n else None
            hit = None
            if shape is not None and math.prod(shape) == layout.qcode.numel():
                order = [nonkey.index(d) for d in perm[:-1]]
                multi = torch.unravel_index(layout.rows.reshape(-1), shape)
                flat = torch.zeros_like(layout.rows.reshape(-1))
                for i in order:
                    flat = flat * shape[i] + multi[i]
                plain = replace(layout, rows=flat.view(layout.rows.shape), dim=n - 1,
                                qcode=layout.qcode.view(shape).permute(order).reshape(-1), _in_order=None)  # fmt: skip
                hit = (plain, first.rowq.permute(perm))
            hit = lineage.remember(key, (layout, first.rowq), hit)
        if hit is None:
            return None
        plain_layout, rowq = hit
        shape_plain = tuple(p.shape[d] for d in perm) if len(p.shape) == n else p.shape
        return replace(first, probs=replace(p, layout=plain_layout, shape=shape_plain), rowq=rowq)

    def _weights_transposed(self, name, args, kwargs, out, base: _Tag) -> bool:
        """The weights transposed with the keys moved and every other dim in its order (keys-first
        scores, ``att.transpose(-1, -2) @ v``): still the record's weights, at a new key dim."""
        p, n = base.probs, out.dim()
        if p is None or p.layout is None or base.rowq is None or base.rowq.dim() != n:
            return False
        perm = _permutation(name, args, kwargs, n)
        if perm is None:
            return False
        old = p.layout.dim % n
        new_dim = perm.index(old)
        if [d for d in perm if d != old] != [d for d in range(n) if d != old]:
            return False  # the other dims moved too: the layout's rows no longer read in order
        rowq = _permuted(base.rowq, perm)
        layout = replace(p.layout, dim=new_dim)
        self.set(out, replace(base, probs=replace(p, layout=layout, shape=tuple(out.shape)), rowq=rowq))
        return True

    def _weights_times_values(self, args, out: torch.Tensor) -> tuple[_Probs, torch.Tensor | None] | None:
        """Weights multiplied by values broadcast over their features, to be summed over the keys (ESPnet's
        ``torch.sum(enc_h * w.unsqueeze(-1), dim=1)``, a Chainer port's ``sum(a[:, None] * v[:, :, None], 3)``):
        where they were changed since the softmax (``touched``: forward attention's ``(prev + shift(prev)) * w``
        renormalized, NaN rows set to 0) the record takes them as a product by ``bmm`` does (it held the
        softmax's output). Returns the record's weights: the product is no longer weights (``_product_made``)."""
        a, b = args
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            return None
        for w, v in ((a, b), (b, a)):
            g, gv = self.tag(w), self.tag(v)
            if g is None or gv is None or gv.role == "param" or gv.probs is not None or gv.rowq is not None:
                continue
            p, vc = self._weights_of(g), self.code_of(v)
            if p is None or p.record is None or not v.is_floating_point() or vc is None:
                continue
            # (only unsqueezed, or expanded by ``broadcast_tensors``, for the broadcast: the softmax output's
            # elements in its order) its shape with 1 along the axes it is broadcast over
            spread = [1 if n == 1 or st == 0 else n for n, st in zip(w.shape, w.stride(), strict=True)]
            kept = w[tuple(0 if n == 1 else slice(None) for n in spread)]
            if out.numel() <= kept.numel() or [n for n in kept.shape if n != 1] != [
                n for n in p.shape if n != 1
            ]:
                continue
            if _zero_one(v):
                continue  # (a 0/1 mask broadcast over the weights: still weights)
            if g.touched:
                self._weights_used(p, kept.reshape(p.shape))
            self._seal(p.record)
            return p, self._product_codes(p, spread, vc, out)
        return None

    def _product_codes(
        self, p: _Probs, spread: list[int], vc: torch.Tensor, out: torch.Tensor
    ) -> torch.Tensor | None:
        """Lineage codes of weights times values element by element (``_weights_times_values``): each element
        is its weights row's query, with the values' feature (``vc`` their codes), so their sum over the keys
        reads as a product by ``bmm`` does (the query's position, the values' features). ``spread``: the
        weights' shape with 1 along the axes they are broadcast over."""
        lay = p.layout
        if lay is None:
            return None
        try:
            moved = list(p.shape)
            moved.pop(lay.dim)
            rowq = lay.qcode.to(out.device).view(*moved, 1).movedim(-1, lay.dim).expand(p.shape)
            rows = rowq.reshape(spread).expand(out.shape)
            return ((rows >> lineage.SHIFT) << lineage.SHIFT) | (vc.expand(out.shape) & lineage.FEATURES)
        except RuntimeError:
            return None

    def _broadcast_each(self, args, outs: list[torch.Tensor]) -> None:
        """``torch.broadcast_tensors(a, b)``: each output is its own input expanded (Chainer's ``F.broadcast``
        of weights and values before their product), not the first input's pieces as a split's are."""
        for t, o in zip(args, outs, strict=True):
            g = self.tag(t) if isinstance(t, torch.Tensor) else None
            if g is None or g is _PARAM_TAG:
                continue
            new = g.derived(g.origin)
            if tuple(o.shape) != tuple(t.shape):
                if g.probs is not None or g.rowq is not None:
                    new.lost = self._weights_of(g)
                new.rowq = new.axes = new.split = None
            c = self.code_of(t)
            if c is not None and tuple(c.shape) == tuple(t.shape):
                new.code = c.expand(o.shape)
            self.set(o, new)

    def _product_made(self, out: torch.Tensor, p: _Probs, code: torch.Tensor | None) -> None:
        """``out`` is weights times values element by element (``_weights_times_values``): no longer weights,
        so that a later op on it (its sum over the keys cut into heads, ``split(c, batch)``) is not taken for the
        weights changed again, even where its shape is theirs (head size equal to the key length)."""
        g = self.tag(out)
        if (
            g is None
            or g is _PARAM_TAG
            or (g.lost is None and g.owner is None and g.probs is None and not g.touched)
        ):
            return
        new = g.copy()
        new.probs = new.rowq = new.lost = new.owner = None
        new.touched = new.changed = new.flat = False
        new.made_by = p
        if code is not None:
            new.code = code
        self.set(out, new)

    def _weights_used(self, p: _Probs, w: torch.Tensor) -> None:
        """The weights were changed since the softmax (``touched``) and ``w`` is what the model multiplies
        the values with: the record takes it (where its shape is still the softmax output's)."""
        rec = p.record  # (a record since joined with the next head's is left alone by _update_record)
        if rec is None or tuple(w.shape) != tuple(p.shape):
            return
        if p.allowed is not None and self._masked_weights(p, w):
            return  # multiplied by a 0/1 mask and not renormalized: the mask is the record's too
        used = p.bhqk(w.detach())
        if used.dtype != rec.probs.dtype:
            used = used.to(rec.probs.dtype)
        if tuple(used.shape) == tuple(rec.probs.shape) and not torch.equal(used, rec.probs):
            self._update_record(p, probs=used)

    def _alias(self, *tensors: torch.Tensor | None) -> None:
        """Memory a record holds that may be the model's (so the model, or its caller, may write it again)."""
        for t in tensors:
            at = _storage_at(t)
            if at:
                self._aliased.add(at)

    def _seal(self, rec: Record | None) -> None:
        """The record's weights met the values: from here on, a write into its memory is not its."""
        if rec is not None:
            for t in (rec.probs, rec.scores, rec.mask):
                at = _storage_at(t)
                if at in self._aliased:
                    self._sealed.add(at)

    def _unshare(self, name: str, args, kwargs) -> None:
        """An op about to write into memory a sealed record holds (in place, or ``out=``): the records get
        copies first, so they keep what the model used (a buffer the next layer's softmax writes again, weights
        turned into log-weights for display after the product)."""
        out = kwargs.get("out")
        targets = (
            [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else []
        )
        if _writes_first(name) and args:
            targets.append(args[0])
        hit = {_storage_at(t) for t in targets} & self._sealed
        if hit:
            self._copy_records(hit)
            self._sealed -= hit

    def _copy_records(self, storages: builtins.set[int]) -> None:
        """Records whose tensors lie in ``storages`` hold copies of them instead (the same records)."""
        _LOCAL.busy = getattr(_LOCAL, "busy", 0) + 1
        try:
            for rec in self.cap.records:
                for field in ("probs", "scores", "mask"):
                    t = getattr(rec, field)
                    if t is not None and _storage_at(t) in storages:
                        object.__setattr__(rec, field, t.clone())  # (frozen: the records others point to)
        finally:
            _LOCAL.busy -= 1
        self._aliased -= storages

    def tell_named_decoders(self) -> None:
        """A warning for each decoder-named module recorded dec_self by its name alone: no mask, before the
        softmax or after it, hides its later keys."""
        for r in self.cap.records:
            if (
                r.name in self._by_name
                and r.kind == "dec_self"
                and not (r.mask is not None and self._causal(r.mask))
            ):
                self.warn(r.name, self._by_name[r.name], "named a decoder, but no mask hides later keys: recorded "
                          "as decoder self-attention (dec_self) by its name alone. A text decoder needs a causal "
                          "mask; a decoder that attends both ways by design (MAE's over patches, DETR's object "
                          "queries) is self-attention: capture_attention(model, kinds={'<its module path, or a "
                          "glob of them>': 'enc_self'}) says so; cross-attention over another stream of the same "
                          "positions (an autoencoder's decoder over its encoder's output of the same input) is "
                          "'cross'")  # fmt: skip

    def _given(self, path: str) -> bool:
        """The caller's kinds= names this module path (or a glob of it)."""
        return any(p == path or fnmatch.fnmatchcase(path, p) for p in self.given)

    def _same_ids_twice(self, qpos: torch.Tensor | None, kpos: torch.Tensor | None) -> bool:
        """Queries and keys of two embedding calls of the same token ids in the same table
        (``attn(emb(ids), emb(ids))``): other inputs by lineage, the same tokens by their data."""
        if qpos is None or kpos is None or not self._id_memory:
            return False
        queries, keys = self._sources_of(qpos), self._sources_of(kpos)
        if not queries or not keys or queries.keys() & keys.keys():
            return False
        for r in self.cap.records:  # keys a self-attention asked over before: an encoder's memory, cross
            if r.kind != "cross" and r.query_positions is not None:
                if self._sources_of(r.query_positions).keys() & keys.keys():
                    return False
        looked = set()
        for start, source in (queries | keys).items():
            memory = self._id_memory.get(start)
            if memory is None or source.kind != "tokens" or not memory[0]:
                return False
            looked.add((memory, source.table))
        return len(looked) == 1

    def _sources_of(self, pos: torch.Tensor) -> dict[int, lineage.Source]:
        """The lineage sources of positions ``pos`` (-1, learned, left out), by their start."""
        try:
            return {s.start: s for s in lineage._kinds(pos[pos >= 0].reshape(-1).unique(), self.sources)}
        except (RuntimeError, IndexError):
            return {}

    def tell_undecided_kinds(self) -> None:
        """One warning naming the modules recorded as encoder self-attention where this input could not tell
        an encoder from a decoder (a single token, or one token and padding in every sequence), and one naming
        those recorded as cross-attention over two embedding calls of the same ids."""
        records = self.cap.records
        self._tell_paths([r.name for r in records if r.name in self._twice and r.kind == "cross"], self._twice,
                         "its queries and keys come from two embedding calls of the same token ids in the same table "
                         "(attn(emb(ids), emb(ids))): two calls are two inputs, so it is recorded as cross-attention, "
                         "but the tokens are the same, and self-attention written so looks the same. If it is "
                         "self-attention: capture_attention(model, kinds={'<its module path, or a glob of them>': "
                         "'enc_self'}), or embed once")  # fmt: skip
        self._tell_paths([r.name for r in records if r.name in self._prefix_or_encoder and r.kind == "enc_self"],
                         self._prefix_or_encoder,
                         "its mask reads alike as an encoder's whose padding rows see themselves and as a prefix LM's "
                         "(a sequence whose later rows see the first tokens and themselves: a one-token sequence "
                         "among longer ones), so capture cannot tell them apart and recorded encoder self-attention "
                         "(enc_self). A prefix LM's is dec_self: capture_attention(model, kinds={'<its module path, "
                         "or a glob of them>': 'dec_self'})")  # fmt: skip
        self._tell_paths([r.name for r in records if r.name in self._by_blocks and r.kind == "dec_self"],
                         self._by_blocks,
                         "its mask is causal by blocks (each position sees its own block, later positions of it too, "
                         "and blocks before it, none after): a decoder over frames or steps (a world model's, Gato's) and a "
                         "streaming encoder's chunk mask (WeNet's and ESPnet's subsequent_chunk_mask) read alike, so "
                         "capture cannot tell them apart and recorded decoder self-attention (dec_self). A streaming "
                         "encoder's is enc_self: capture_attention(model, kinds={'<its module path, or a glob of "
                         "them>': 'enc_self'})")  # fmt: skip
        # (heads a call each, joined into one record under their parent's path: any head's path undecided)
        heads_of = {p.rsplit(".", 1)[0]: shape for p, shape in self._undecided.items() if "." in p}
        undecided = {**heads_of, **self._undecided}
        # (the calls of the shape it could not tell: a module shared by an encoder and a decoder's steps has its
        # encoder's calls, decided by their mask, besides a first step the later ones made dec_self)
        self._tell_paths([r.name for r in records if r.name in undecided and r.kind == "enc_self"
                          and tuple(int(n) for n in r.probs.shape[-2:]) == tuple(undecided[r.name])], undecided,
                         "every sequence of this input is one token (and padding), or each query may see only its own "
                         "key: its mask looks the same in an encoder and in a causal decoder, so capture cannot tell "
                         "them apart and recorded encoder self-attention (enc_self). A decoder's is dec_self: "
                         "capture_attention(model, kinds={'<its module path, or a glob of them>': 'dec_self'}), or "
                         "give it two tokens")  # fmt: skip
        # decoder-named modules over one token per sequence, unless a call of theirs showed a causal mask (a
        # decoding loop's later steps)
        shown = {r.name for r in records if r.kind == "dec_self" and (
                 r.probs.shape[-1] > r.probs.shape[-2]  # (a step over its cache: a decoder's, decoding)
                 or (r.mask is not None and r.probs.shape[-2] > 1 and self._causal(r.mask)))}  # fmt: skip
        self._tell_paths([r.name for r in records
                          if r.name in self._named_one and r.kind == "dec_self" and r.name not in shown],
                         self._named_one,
                         "every sequence of this input is one token (and padding), or each query may see only its own "
                         "key: its mask looks the same in an encoder and in a causal decoder, so capture recorded "
                         "decoder self-attention (dec_self) by the module's name. An encoder's is enc_self: "
                         "capture_attention(model, kinds={'<its module path, or a glob of them>': 'enc_self'}), or "
                         "give it two tokens")  # fmt: skip

    def _tell_paths(self, names: list[str], shapes: Mapping[str, tuple[int, ...]], why: str) -> None:
        """One warning naming the module paths ``names`` (each once, in order), at the first one's shape."""
        paths = list(dict.fromkeys(names))
        if paths:
            self.warn(_paths_named(paths), shapes[paths[0]], why)

    def weighed(self, name: str, args, out: Any) -> None:
        """Weights going into a product (a matmul, or a broadcast multiply that makes more elements than they
        have): recorded outside the model, a plain function's attention, kept; fed to a loss too, attention."""
        if not isinstance(out, torch.Tensor):
            return
        for t in _tensors(args, {}):
            g = self.tag(t)
            if g is None or (g.probs is None and g.rowq is None and g.lost is None):
                continue
            seq = self._record_seq(g)
            if seq is not None and not (name in MUL and out.numel() <= t.numel()):
                self._weighed.add(seq)

    def _fed_to_loss(self, args, kwargs) -> None:
        """Weights of a record that go into a loss (``F.kl_div(student, teacher_probs)``): a distillation target,
        if they multiplied no values (``drop_unused_outside``)."""
        for t in _tensors(args, kwargs):
            g = self.tag(t)
            seq = None if g is None else self._record_seq(g)
            if seq is not None:
                self._loss_fed.add(seq)

    def _record_seq(self, g: _Tag) -> int | None:
        """``Record.seq`` of the record whose weights a tag holds (moved or changed too), or None."""
        p = g.probs or g.lost or self._weights_of(g)
        return p.record.seq if p is not None and p.record is not None else None

    def drop_unused_outside(self) -> None:
        """Softmaxes the block ran after the model's call returned, outside every module of it, whose weights
        went into no product (CLIP's label probabilities, a distillation target, a loss): not the model's
        attention, so their records go (those flagged stay, with their flag), and a note says so. A plain
        function's attention in the block, whose weights do multiply values, stays."""
        drop = {
            id(r)
            for r in self.cap.records
            if (
                r.seq in self._outside
                or r.seq in self._rereads
                or (r.seq in self._loss_fed and r.source == "softmax")
            )
            and r.seq not in self._weighed
            and r.flag is None
        }
        if not drop:
            return
        for r in self.cap.records:
            if id(r) in drop and r.seq in self._rereads:
                self.skip(r.name or "(model)", tuple(r.probs.shape), "a softmax again over the scores of "
                          f"{self._rereads[r.seq]!r}'s map (kept by a hook or returned), whose weights multiplied no "
                          "values: that map is its record (Whisper's alignment heads)")  # fmt: skip
            elif id(r) in drop and r.seq in self._outside:
                self.skip("(outside the model)", tuple(r.probs.shape), "a softmax the block ran outside the "
                          "model's forward whose weights multiplied no values (a similarity, a loss, a "
                          "distillation target): not the model's attention")  # fmt: skip
            elif id(r) in drop:
                self.skip(r.name, tuple(r.probs.shape), "a softmax over query-key scores whose weights multiplied "
                          "no values and went into a loss (a distillation target, MiniLM's value relation): not "
                          "attention the model computed with")  # fmt: skip
        self.cap.records[:] = [r for r in self.cap.records if id(r) not in drop]

    def sequence_rows(self) -> None:
        """At the block's end: the positions lineage numbered, kept with the capture for ``Captured.rows_of``
        (asked by a trace, not made for every record)."""
        self.cap._sources = self.sources

    def detach_records(self) -> None:
        """At the block's end: records that hold the model's memory where anything else still holds it too (maps
        the model returned or kept) get copies, so a write after the block (maps post-processed in place, a
        buffer reused by the next batch) cannot change what was captured."""
        if not self._aliased:
            return
        held: dict[
            int, tuple[int, torch.Tensor]
        ] = {}  # memory -> how many record tensors hold it, one of them
        for rec in self.cap.records:
            for t in (rec.probs, rec.scores, rec.mask):
                at = _storage_at(t)
                if t is not None and at in self._aliased:
                    held[at] = (held[at][0] + 1 if at in held else 1, t)
        shared = {at for at, (n, t) in held.items() if _storage_users(t) != n}
        if shared:
            self._copy_records(shared)

    def _update_record(self, p: _Probs, **changes) -> None:
        """The record these weights were recorded as, with ``changes`` (it is still the one in
        ``cap.records``: a record joined with the next head's is left alone)."""
        rec = p.record
        self._alias(*(changes.get(f) for f in ("probs", "scores", "mask")))
        i = next((i for i, r in enumerate(self.cap.records) if r is rec), None)
        if i is not None and rec is not None:
            self.cap.records[i] = _replaced(rec, **changes)
            p.record = self.cap.records[i]
        elif p.joined is not None and rec is not None and set(changes) == {"values"}:
            # (a head joined into its layer's record: its values, joined into the layer's where heads merge)
            p.record = _replaced(rec, **changes)
        elif p.joined is not None and rec is not None and set(changes) == {"probs"}:
            at, offset = p.joined  # a head joined into its layer's record: its slice of the heads
            layer = self.cap.records[at] if at < len(self.cap.records) else None
            new = changes["probs"]
            h = int(new.shape[1])
            if layer is not None and tuple(layer.probs[:, offset : offset + h].shape) == tuple(new.shape):
                probs = layer.probs.clone()
                probs[:, offset : offset + h] = new
                self.cap.records[at] = _replaced(layer, probs=probs)
                p.record = _replaced(rec, probs=new)

    def _replace_probs(self, p: _Probs, out: torch.Tensor) -> None:
        """The record's weights become ``out`` (the softmax output cast to a lower precision)."""
        self._update_record(p, probs=p.bhqk(out.detach()))

    def _masked_weights(self, p: _Probs, out: torch.Tensor) -> bool:
        """The record takes the weights ``out`` multiplied by a 0/1 mask (renormalized after, or not:
        ``att * tril`` after the softmax) and that mask, which then says the kind too."""
        rec, multiplier = p.record, p.allowed
        if rec is None or multiplier is None or not any(r is rec for r in self.cap.records):
            return False
        probs = p.bhqk(out.detach())
        allowed = p.bhqk(multiplier.expand(out.shape))
        if allowed.numel() and bool((allowed == allowed[..., :1, :1]).all()):
            # one number per head (and sequence): heads pruned whole (BERT's ``head_mask``), no key masked; the
            # record takes the weights as multiplied, its mask stays what the keys were masked by
            self._update_record(p, probs=probs)
            return True
        mask = allowed.all(dim=1)
        differ = rec.head_masks_differ or not bool((allowed == mask[:, None]).all())
        source = rec.mask_source  # keys hidden before (by the scores, or weights exactly 0) stay hidden:
        if rec.mask is not None:  # the multiplier hides more (SASRec's ``w * query_mask`` after a causal one)
            mask = mask & rec.mask
        if rec.mask is None or source == "zeros":
            source = "multiplied"
        seen = _own_block(mask, rec.key_labels, rec.query_labels, rec.source == "nn.MultiheadAttention")
        kind = self.kind_of(rec.name, probs.shape[-2], probs.shape[-1], seen, p.cross, p.ext, exact=rec.exact,
                            grid=lambda: self._grid_queries(rec.query_positions))  # fmt: skip
        self._update_record(
            p, kind=kind, probs=probs, mask=mask, mask_source=source, head_masks_differ=differ
        )
        return True

    def _weights_copied(self, dst: torch.Tensor, src: Any) -> bool:
        """``torch.empty_like(a).copy_(w)``: weights copied whole into a tensor of their shape are the same
        weights there (True: followed here); into a view of a buffer, False (followed as written by an index)."""
        vt = self.tag(src) if isinstance(src, torch.Tensor) else None
        if vt is None or dst._base is not None or (vt.probs is None and vt.rowq is None and vt.lost is None):
            return False
        if tuple(dst.shape) == tuple(src.shape) and not _cast_down(src.dtype, dst.dtype):
            self.set(dst, vt)  # (the same weights, in a dtype as wide)
        else:  # broadcast, or rounded: what a product reads is not where the weights' rows were
            w = vt.lost if vt.lost is not None else self._weights_of(vt)
            if w is not None:
                self.set(dst, _Tag(None, vt.origin, lost=w, changed=True))
        return True

    def _whole_copied(self, dst: torch.Tensor, src: Any) -> bool:
        """``buf.copy_(x)`` over the whole of a tensor of its own (``torch.empty_like(k)`` filled by an
        all-gather's copy, Ulysses' all-to-all buffers): it holds ``x`` now, followed as ``x.clone()`` (it
        kept the positions of the tensor its shape was taken from)."""
        if dst._base is not None or not isinstance(src, torch.Tensor) or tuple(src.shape) != tuple(dst.shape):
            return False
        g = self.tag(src)
        if g is None or g.role == "param" or g.role == "scores" or g.probs is not None:
            return False
        self.propagate("clone", torch.clone, (src,), {}, dst, None)
        return True

    def _view_copied(self, dst: torch.Tensor, src: Any) -> None:
        """``cache.narrow(2, cur, n).copy_(k)`` (Medusa's and EAGLE's KV cache), ``buf[:, :, a:b].copy_(k)``:
        this call's keys copied into a slice of a buffer along one dim, followed as ``buf[..., a:b] = k``; or into
        one buffer's layer of keys or values first (``data[2 * i].narrow(2, cur, n).copy_(k)``, where Medusa keeps
        every layer's keys and values in one tensor), followed as ``buf[2 * i, ..., a:b] = k``."""
        base = dst._base
        if base is None or not isinstance(src, torch.Tensor):
            return
        where = _view_index(dst, base)
        if where is None or sum(isinstance(i, slice) and i != slice(None) for i in where) != 1:
            return
        self.on_setitem((base, where, src), None)

    def _index_copied(self, args) -> None:
        """``cache.index_copy_(dim, positions, k)``: this call's keys written into a buffer (a static KV
        cache, as Hugging Face's StaticCache writes it), followed as ``cache[..., positions] = k``."""
        target, dim, index, value = args[0], args[1], args[2], args[3]
        if (
            not isinstance(target, torch.Tensor)
            or not isinstance(dim, int)
            or not isinstance(value, torch.Tensor)
        ):
            return
        where = (slice(None),) * (dim % target.dim()) + (index,)
        self.on_setitem((target, where, value), None)

    def _scatter_written(self, args, kwargs) -> bool:
        """``cache.scatter_(1, pos[None, :, None, None].repeat(b, 1, h, d), k)`` (mistral-src's rotating KV
        cache): keys written by slot, an index that names one slot per position along ``dim`` for all the
        other dims, followed as ``cache[:, pos] = k`` (True). Other scatters are left to the ops' replay (False)."""
        names = ("dim", "index", "src")
        a = dict(zip(names, args[1:], strict=False)) | {k: v for k, v in kwargs.items() if k in names}
        target, dim, index, src = args[0], a.get("dim"), a.get("index"), a.get("src")
        if not (isinstance(dim, int) and isinstance(index, torch.Tensor) and isinstance(src, torch.Tensor)):
            return False
        vt = self.tag(src)
        if vt is None or vt.probs is not None or vt.rowq is not None or vt.lost is not None:
            return False  # (weights put back into a sparse copy are followed where they are picked)
        if index.dim() != target.dim() or tuple(index.shape) != tuple(src.shape):
            return False
        d = dim % target.dim()
        first = index[tuple(slice(None) if i == d else 0 for i in range(index.dim()))]  # the slots, (n,)
        view = first.reshape([-1 if i == d else 1 for i in range(index.dim())])
        if not bool((index == view).all()) or tuple(src.shape[d : d + 1]) != tuple(first.shape):
            return False  # the slot differs along another dim: not a write by slot
        full = [i for i in range(index.dim()) if i != d and index.shape[i] != target.shape[i]]
        if full:
            return False  # (a scatter into part of the other dims)
        self.on_setitem((target, (slice(None),) * d + (first,), src), None)
        return True

    def _weights_written(self, target: torch.Tensor) -> None:
        """A write into weights (``w[:, 0] = 0``, ``w[:, h].zero_()``) or into the tensor a view of them
        belongs to (a copy the model ablates: ``w = w.clone(); w[:, 0] = 0``, in a hook on its nn.Softmax):
        their values are not the softmax's any more, so the record takes them where they are multiplied."""
        for t in (target, target._base):
            if t is None:
                continue
            g = self.tag(t)
            if g is not None and (g.probs is not None or g.rowq is not None) and not g.touched:
                self.set(t, replace(g, touched=True))

    def on_setitem(self, args, pre) -> None:
        """``X[~mask] = -1e6`` on scores (d2l's ``sequence_mask``) masks them; ``cache[:, a:b] = k``
        writes this call's keys into a buffer (a KV cache)."""
        if len(args) < 3 or not isinstance(args[0], torch.Tensor):
            return
        target, index, value = args[0], args[1], args[2]
        if self._int_floats and isinstance(value, torch.Tensor) and value.is_floating_point():
            # a buffer the model made (``torch.zeros``), now holding data: the encoder's outputs written into it
            # a step at a time, as the PyTorch seq2seq tutorial does
            written = self.tag(value)
            if written is not None and written.role != "param":
                for buffer in (target, target._base):
                    if buffer is not None:
                        self._int_floats.pop(id(buffer), None)
        t = self.tag(target)
        if t is not None and t.role == "scores":
            if (
                isinstance(index, torch.Tensor)
                and index.dtype == torch.bool
                and _very_negative(value)
                and tuple(index.shape) == tuple(target.shape[: index.dim()])
            ):
                keep = ~index.reshape(*index.shape, *(1,) * (target.dim() - index.dim()))
                self.set(target, replace(t, scores=t.scores if t.scores is not None else pre,
                                         allowed=keep if t.allowed is None else t.allowed & keep,
                                         mask_source=t.mask_source or "index"))  # fmt: skip
                return
            vt = self.tag(value) if isinstance(value, torch.Tensor) else None
            if vt is not None and vt.role == "scores" and vt.allowed is not None:
                # masked scores written back into a part of them (``att[:, :1] = att[:, :1].masked_fill(m, -inf)``,
                # one head's mask): the mask there, and the scores before it
                try:
                    keep = torch.ones(target.shape, dtype=torch.bool, device=target.device)
                    keep[index] = vt.allowed.expand(value.shape)
                    scores = t.scores if t.scores is not None else pre if pre is not None else target.detach()
                    if vt.scores is not None and _storage_at(vt.scores) != _storage_at(target):
                        # (scores the value was made from that are a view of these: as they were, in ``pre``)
                        scores = scores.clone()
                        scores[index] = vt.scores.expand(value.shape).to(scores.dtype)
                except (RuntimeError, IndexError, TypeError):
                    return
                self.set(target, replace(t, scores=scores, allowed=keep if t.allowed is None else t.allowed & keep,
                                         mask_source=t.mask_source or vt.mask_source or "masked_fill"))  # fmt: skip
            return
        vt = self.tag(value)
        if (
            isinstance(value, torch.Tensor)
            and vt is not None
            and vt.attn_out is not None
            and vt.probs is None
        ):
            self._head_written(target, index, value)
        if (
            isinstance(value, torch.Tensor)
            and vt is not None
            and vt.role == "scores"
            and vt.smap is not None
            and (t is None or t.role != "scores")
        ):  # scores written by slices into a tensor of their own (Longformer's diagonals, into ``new_zeros``):
            # the tensor holds scores whose layout capture does not follow (said where they are softmaxed)
            self.set(target, _Tag("scores", vt.origin, smap=vt.smap.fail(
                "scores written by slices into another tensor, which capture does not follow")))  # fmt: skip
            return
        if (
            isinstance(value, torch.Tensor)
            and vt is not None
            and (t is None or (t.role != "scores" and t.probs is None and t.rowq is None and t.lost is None))
        ):  # (into the weights themselves, ``a[:, -1] *= 0.5``: weights changed in place, taken at the product)
            # weights moved or changed since the softmax written into another tensor (``r[..., 1:] =
            # a[..., :-1]``, a circular shift written by slices; dropped weights put in a buffer): what that
            # tensor holds is not the record's weights where they were, so a product with it is flagged
            w = vt.lost if vt.lost is not None else self._weights_of(vt) if vt.touched else None
            if w is None and _by_tensor(index) and (vt.probs is not None or vt.rowq is not None):
                # (whole weights put at places an index picks: ``buf[..., perm] = p``)
                w = self._weights_of(vt)
            if w is not None:
                self.set(target, _Tag(None, vt.origin, lost=w, changed=True))
                self._moved_why(w, "written into another tensor at other places or changed")
                return
        if not isinstance(value, torch.Tensor) or vt is None or vt.role in ("param", "scores"):
            return
        code = None
        tc: torch.Tensor | None
        made = t is None and _held(self._made, target) is not None
        through = self._view_codes(target) if t is None else None  # a view of a buffer written before
        # a buffer made inside the call (torch.zeros): each cell not written a padding position of its own, as
        # F.pad's padded cells are (HF LLaVA's merge into ``torch.zeros``: a sequence with no image keeps
        # padded slots, several queries that are no one position)
        if made:
            tc = self._empty_codes(target)
        elif through is not None:  # (a paged cache's next step: the slots its last step wrote keep theirs)
            tc = through
        else:  # slots not written yet hold no position (a static KV cache)
            tc = self._cache_codes(target, index, value) if t is None else None
            tc = self.code_of(target) if tc is None else tc
            if t is None and tc is not None and target.is_floating_point() and target.dim() >= 3:
                # a buffer from before the block (a static KV cache its model set up before the call): the
                # slots that hold nothing yet (all zeros, as allocated) are padding, not the rows of an input;
                # slots an earlier forward filled keep their positions from outside (a cache to read)
                with _no_grad():
                    empty = (target.detach() == 0).all(-1, keepdim=True)
                if bool(empty.any()):
                    tc = torch.where(empty.to(tc.device), self._pad_code(), tc)
        vc = self.code_of(value)
        if tc is not None and vc is not None:
            try:
                code = tc.clone()
                # cells keep their positions where another embedding of the same cells is written (SAINT's mask
                # embeddings put in where a value is missing), and where features are spliced over placeholder
                # tokens (``x[ids == IMG] = feats``: LLaVA's and InternVL's image tokens, as ``masked_scatter``
                # leaves them)
                slots = (
                    t is not None
                    and not t.cache
                    and isinstance(index, torch.Tensor)
                    and index.dtype == torch.bool
                    and index.dim() == target.dim() - 1
                    and tuple(index.shape) == tuple(target.shape[:-1])
                )
                if t is None or t.cache or not (slots or self._same_cells(tc[index], vc)):
                    code[index] = vc
            except Exception:  # an index the codes cannot take: the lineage of the buffer is lost
                code = None
        if t is None:  # a buffer that holds this call's keys (and maybe earlier ones)
            self.set(target, _Tag(vt.role, vt.origin, heads=vt.heads, cache=True, code=code))
            if code is not None and target._base is not None:
                self._view_written(target, code, vt)
        elif t.role != "param":
            self.set(target, replace(t, origin=t.origin | vt.origin, code=code))
            if code is not None and t.cache and target._base is not None:  # (a view the mode tagged)
                self._view_written(target, code, vt)

    def _view_codes(self, view: torch.Tensor) -> torch.Tensor | None:
        """The codes of a fresh view of a buffer that holds codes already (a cache written through a view
        before): the buffer's, where the view lies in its memory; None otherwise."""
        base = view._base
        g = self.tag(base) if base is not None else None
        if base is None or g is None or g.code is None or not g.cache or not base.is_contiguous():
            return None
        if tuple(g.code.shape) != tuple(base.shape):
            return None
        try:
            return _where_view(g.code.contiguous(), view, base).clone()
        except RuntimeError:
            return None

    def _read_through_view(self, x: torch.Tensor, g: _Tag | None, out: torch.Tensor) -> _Tag | None:
        """A view of a buffer read after keys were written into the buffer through another view (EAGLE's and
        Medusa's KV cache: the caller hands the model ``data[0]``, the model writes ``view.narrow(2, cur,
        n).copy_(k)`` and reads ``view.narrow(2, 0, cur + n)``): what the buffer holds now, where ``out`` lies in
        its memory, not what the view's tag said before the write (or nothing, a view made before the block)."""
        base = x._base
        gb = self.tag(base) if base is not None else None
        if base is None or gb is None or not gb.cache or gb.code is None:
            return None
        if g is not None and (
            g.role == "scores"
            or g.probs is not None
            or g.rowq is not None
            or self.made_at(base) <= self.made_at(x)
        ):
            return None
        code = self._view_codes(out)
        if code is None or tuple(code.shape) != tuple(out.shape):
            return None
        return _Tag(gb.role, gb.origin, heads=gb.heads, cache=True, code=code)

    def _view_written(self, view: torch.Tensor, code: torch.Tensor, vt: _Tag) -> None:
        """Keys written into a view of a buffer (vLLM's and nano-vllm's paged cache:
        ``key_cache.view(-1, heads, d)[slot_mapping] = k``): the buffer holds them too, where the view
        lies in its memory, for what reads the buffer itself next (its blocks, gathered by a block table)."""
        base = view._base
        if base is None or not base.is_contiguous() or tuple(code.shape) != tuple(view.shape):
            return
        g = self.tag(base)
        old = g.code if g is not None else None
        if old is None or tuple(old.shape) != tuple(base.shape):
            old = torch.full(tuple(base.shape), self._pad_code(), dtype=torch.int64, device=code.device)
        try:
            whole = old.clone(memory_format=torch.contiguous_format)
            _where_view(whole, view, base).copy_(code)
        except RuntimeError:  # a view the codes cannot mirror
            return
        self.set(base, _Tag(vt.role, vt.origin, heads=vt.heads, cache=True, code=whole))

    def _same_cells(self, old: torch.Tensor, new: torch.Tensor) -> bool:
        """Positions ``new`` written over ``old`` are the same cells of another embedding of the same grid
        (``x[mask == 0] = m[mask == 0]``, ``x`` and ``m`` embeddings of two id tensors of one shape): the
        same place in a source of tokens as large as the other, element by element."""
        if tuple(old.shape) != tuple(new.shape) or not old.numel():
            return False
        a, b = old >> lineage.SHIFT, new >> lineage.SHIFT
        items = self.sources.items
        ia, ib = self.sources.index(a), self.sources.index(b)
        pairs = torch.unique(torch.stack([ia.reshape(-1), ib.reshape(-1)]), dim=1).tolist()
        for sa, sb in zip(*pairs, strict=True):
            if (
                sa == sb
                or items[sa].kind != "tokens"
                or items[sb].kind != "tokens"
                or items[sa].n != items[sb].n
            ):
                return False
        starts = torch.tensor([s.start for s in items], dtype=torch.int64, device=a.device)
        return bool(torch.equal(a - starts[ia], b - starts[ib]))

    def _cache_codes(self, target: torch.Tensor, index: Any, value: Any = None) -> torch.Tensor | None:
        """Codes of a buffer from before the call that this call writes keys into by slot (a KV cache set up
        before it, ``k_cache[:, :, input_pos] = k`` or ``cache_k[:bsz, start:end] = k``): one position per
        sequence (dim 0) and slot (the dim the write indexes), shared by the dims between (the key heads),
        as the keys written there are. A pool of slots no sequence owns (a paged cache,
        ``key_cache.view(-1, heads, d)[slot_mapping] = k``): one position per slot its leading index tensors
        pick, where each row written holds one position. None where the write does not say one slot dim, or
        the buffer is the model's parameter or already has codes."""
        parts = index if isinstance(index, tuple) else (index,)
        if any(p is Ellipsis or p is None for p in parts):
            return None
        pool = self._pool_codes(target, parts, value)
        if pool is not None:
            return pool
        slot = next((i for i, p in enumerate(parts) if not (isinstance(p, slice) and p == slice(None))
                     and i > 0), None)  # fmt: skip
        if slot is None or any(not isinstance(p, slice) or p.step not in (None, 1) for p in parts[1:slot]):
            return None
        return self._slot_codes(target, slot)

    def _pool_codes(self, target: torch.Tensor, parts: tuple, value: Any) -> torch.Tensor | None:
        """Codes of a paged cache's pool (``(slots, heads, d)`` or ``(blocks, block_size, heads, d)``) written
        by integer index tensors on its leading dims: one position per slot, shared by the dims between
        (the key heads), as the rows written hold one position each (a row of this call's keys). None where
        a row written holds several positions (``out[rows] = h``: whole sequences put in place)."""
        lead = 0
        for p in parts:
            if isinstance(p, torch.Tensor) and not p.is_floating_point() and p.dtype != torch.bool:
                lead += 1
            elif isinstance(p, slice) and p == slice(None):
                break
            else:
                return None
        if (
            not lead
            or any(not (isinstance(p, slice) and p == slice(None)) for p in parts[lead:])
            or not isinstance(value, torch.Tensor)
            or not target.is_floating_point()
            or _is_param(target)
            or target.dim() - lead < 2
        ):
            return None
        vc = self.code_of(value)
        if vc is None or vc.dim() < target.dim() - lead + 1 or not vc.numel():
            return None
        rows = (vc >> lineage.SHIFT).flatten(vc.dim() - (target.dim() - lead))  # (..., one row's cells)
        if not bool((rows == rows[..., :1]).all()):
            return None
        n = math.prod(int(d) for d in target.shape[:lead])
        start = self.sources.new(n, "external", "cache", ("in", self.n_inputs))
        self.n_inputs += 1
        pos = start + torch.arange(n, dtype=torch.int64, device=target.device)
        pos = pos.view(*target.shape[:lead], *(1,) * (target.dim() - lead))
        f = torch.arange(int(target.shape[-1]), dtype=torch.int64, device=target.device) | lineage.RAW
        return ((pos << lineage.SHIFT) | f).expand(*target.shape).contiguous()

    def _cache_joined(self, name: str, args, kwargs, out) -> None:
        """``torch.cat([past_k, k], dim=-2)`` (a Hugging Face DynamicCache handed in, a cache kept as a
        tensor from an earlier call): a tensor from outside the call joined to this call's keys along a
        middle dim gets one position per sequence and slot, shared by its key heads (``_slot_codes``), as
        the keys it is joined to have, rather than one per element."""
        parts = args[0] if args and isinstance(args[0], (list, tuple)) else None
        if not parts or len(parts) < 2 or not isinstance(out, torch.Tensor) or out.dim() < 3:
            return
        d = _cat_dim(name, args, kwargs, out)
        if (
            out.dim() == 3
        ):  # (B*H, T, d): a cache folded into the batch before the join (fairseq's ``prev_key``)
            if d == 1 and any(self.tag(t) is not None for t in parts):
                for t in parts:
                    if isinstance(t, torch.Tensor) and self.tag(t) is None and t.is_floating_point():
                        self._folded_cache(t)
            return
        if not 0 < d < out.dim() - 1 or not any(self.tag(t) is not None for t in parts):
            return
        for t in parts:
            if isinstance(t, torch.Tensor) and self.tag(t) is None and t.is_floating_point():
                self._slot_codes(t, d)

    def _folded_cache(self, t: torch.Tensor) -> None:
        """``t`` (B*H, T, d), made from a (B, H, T, d) cache handed in by views, reshapes and transposes only
        (``prev_key.view(bsz * heads, -1, head_dim)``, either order of batch and heads): its codes are the
        cache's (one position per sequence and slot, shared by the heads: ``_slot_codes``) moved the same way.
        Where no such chain made it, nothing is placed (the record says it cannot tell)."""
        held = self._outside_moves.get(id(t))
        if held is None or held[0]() is not t:
            return
        x = held[1]()
        if x is None or x.dim() != 4 or self.tag(x) is not None:
            return

        def moved(a: torch.Tensor) -> torch.Tensor | None:  # ``a`` (x's shape) moved as x was into ``t``
            return _moved_as(held[2], a, tuple(t.shape))

        # the slots are the axis of x (between its sequences and its features) whose index, moved the same way,
        # is the join's axis of ``t`` alone: (B, H, T, d) or (B, T, H, d)
        slot = None
        for axis in (1, 2):
            at = torch.arange(int(x.shape[axis]), device=x.device).view(
                [-1 if i == axis else 1 for i in range(4)]
            )
            got = moved(at.expand(x.shape))
            if (
                got is not None
                and torch.equal(got, got[:1, :, :1].expand_as(got))
                and int(got[0, :, 0].unique().numel())
                == int(t.shape[1])  # (one slot each: not a head axis of 1)
            ):
                slot = axis
                break
        code = self._slot_codes(x, slot) if slot is not None else None
        code = moved(code) if code is not None else None
        if code is not None:
            self._fixed_codes[id(t)] = (weakref.ref(t), code)

    def _slot_codes(self, target: torch.Tensor, slot: int) -> torch.Tensor | None:
        """Codes of a tensor from outside the call whose dim ``slot`` holds positions (a KV cache): one
        position per sequence (dim 0) and slot, the same for every index of the dims between and after."""
        if not target.is_floating_point() or target.dim() < 3 or _is_param(target):
            return None
        entry = self._fixed_codes.get(id(target))
        if entry is not None and entry[0]() is target:
            return entry[1]
        if not 0 < slot < target.dim() - 1:
            return None
        b, n = int(target.shape[0]), int(target.shape[slot])
        start = self.sources.new(b * n, "external", "cache", ("in", self.n_inputs), n)
        self.n_inputs += 1
        shape = [1] * (target.dim() - 1)
        shape[0], shape[slot] = b, n
        pos = start + torch.arange(b * n, dtype=torch.int64, device=target.device).view(shape)
        f = torch.arange(int(target.shape[-1]), dtype=torch.int64, device=target.device) | lineage.RAW
        code = ((pos << lineage.SHIFT)[..., None] | f).expand(*target.shape).contiguous()
        self._fixed_codes[id(target)] = (weakref.ref(target), code)
        return code

    def on_sdpa(self, args, kwargs, out) -> None:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        a = dict(zip(names, args, strict=False)) | kwargs
        q, k, v = a["query"], a["key"], a["value"]
        bias = a.get("attn_mask")
        if bias is not None and type(bias).__name__ == "CausalBias" and hasattr(bias, "_materialize"):
            # torch.nn.attention.bias.causal_lower_right / causal_upper_left: a tensor subclass whose memory holds
            # no mask; the (q, k) bool mask SDPA applies for it
            a["attn_mask"] = bias._materialize(q.device)
        unsq = q.dim() == 3
        if unsq:
            q, k, v = q[:, None], k[:, None], v[:, None]
        lead = q.shape[:-3]
        hq, lq, e = q.shape[-3], q.shape[-2], q.shape[-1]
        hk, lk = k.shape[-3], k.shape[-2]
        if hq != hk:
            k = k.repeat_interleave(hq // hk, dim=-3)
            v = v.repeat_interleave(hq // hk, dim=-3)
        scale = a.get("scale")
        scale = 1.0 / math.sqrt(e) if scale is None else scale
        work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        with _no_grad(), _autocast_aside(q.device):  # (under autocast, the kernel's float32 all the same)
            q, k, v = (t if t.dtype == work else t.to(work) for t in (q, k, v))
            scores = (q @ k.transpose(-2, -1)).mul_(scale)  # (..., H, q, k)
            allowed = None  # the record's mask: keys hidden by a bool mask, -inf or a very negative value
            fill = None  # where SDPA itself puts -inf: the causal mask and bool masks
            logits = scores
            if a.get("is_causal"):
                allowed = fill = _causal(lq, lk, q.device)
            m = a.get("attn_mask")
            if m is not None:
                if unsq and m.dim() >= 3:
                    m = m.unsqueeze(-3)
                if m.dtype == torch.bool:
                    allowed = m if allowed is None else allowed & m
                    fill = m if fill is None else fill & m
                else:  # added as SDPA adds it: a row hidden by finfo.min is uniform there, as here
                    logits = logits + m.to(work)
                    ok = torch.isfinite(m) & ~_added_hides(m)
                    allowed = ok if allowed is None else allowed & ok
                    self._zero_one_added(m, (lq, lk))
            if fill is not None:  # broadcast as given: a causal (q, k) mask is never expanded
                if (
                    logits is scores
                    and (m is None or 4 * fill.numel() <= scores.numel())  # (made anew: small)
                    and bool(scores.sum().isfinite())
                ):  # every score finite: adding 0 or -inf is where() at a fifth of its cost
                    logits = scores + _hiding(fill, work, m is None)
                else:
                    logits = torch.where(fill, logits, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            only_causal = m is None and lq <= lk  # causal alone: every row keeps its first key
            if (not only_causal and (fill is not None or (m is not None and m.dtype != torch.bool))) and (
                not lk or bool(torch.isnan(probs[..., :1]).any())
            ):  # rows with no key at all: 0, as SDPA (the softmax of a row of -inf is NaN throughout, so
                # only rows whose first weight is NaN can be one; a row's max is -inf when all of it is)
                dead = (
                    (logits.amax(-1, keepdim=True) == float("-inf"))
                    if lk
                    else torch.isneginf(logits).all(-1, keepdim=True)
                )
                if bool(dead.any()):
                    probs = probs.masked_fill(dead, 0.0)
            check = None
            dropped: str | None = None
            if a.get("dropout_p"):
                # dropped at random inside the call: the same draws from the same RNG state
                probs, dropped, check = self._sdpa_dropped(probs, v, out[:, None] if unsq else out,
                                                           float(a["dropout_p"]))  # fmt: skip
            else:  # probs @ v against SDPA's output, on up to CHECK_ROWS query rows
                got = out[:, None] if unsq else out
                check = 0.0
                if got.numel():
                    p_rows, g_rows = probs, got  # up to CHECK_ROWS query rows: all of them
                    if lq > 4 * CHECK_ROWS:  # a few rows more cost less than picking them
                        rows = _check_rows(lq, q.device)
                        p_rows, g_rows = probs.index_select(-2, rows), got.index_select(-2, rows)
                    if g_rows.dtype != work:
                        g_rows = g_rows.to(work)
                    pv = p_rows @ v
                    diff = pv - g_rows
                    check = float(diff.abs_().max())  # NaN where either is NaN, inf where either is inf
                    if not math.isfinite(check):  # then as before: NaN where only one of them is NaN flags it
                        if bool((pv.isnan() != g_rows.isnan()).any()):  # a NaN (or inf) in q or k: SDPA adds
                            dropped = ("the weights recomputed from the call's arguments do not give its output "
                                       "where it is NaN (a NaN or infinity in the queries or keys, which SDPA "
                                       "spreads over their rows through the mask): the record holds them "
                                       "without it")  # fmt: skip
                        check = float(torch.nan_to_num(pv.sub_(g_rows), nan=0.0).abs_().max())
                    reach = float(v.abs().max()) if v.numel() else 0.0  # (the output is a mean of the values)
                    if dropped is None and check > _SDPA_TOL.get(a["query"].dtype, 1e-4) * max(reach, 1e-6):
                        dropped = (f"the weights recomputed from the call's arguments do not give its output "
                                   f"(largest difference {check:.3g}, where the values reach {reach:.3g}): SDPA "
                                   "applied a mask, scale or bias that capture did not read from its arguments "
                                   "as it did, so the record holds weights it may not have used")  # fmt: skip
        b = int(math.prod(lead)) if lead else 1
        shape = (b, hq, lq, lk)
        if dropped is not None:
            path = self.path()
            cross, ext = self._cross(a["query"], a["key"])
            self._record(path, probs.reshape(shape), scores.reshape(shape), allowed, "sdpa",
                         "arguments" if allowed is not None else None, cross, None, ext, flag=dropped)  # fmt: skip
            self.warn(path, shape, f"could not verify: {dropped}")
            return
        packed = self._sdpa_packed(a["query"], a["key"], unsq, hq, hk, scores)
        if isinstance(packed, lineage.Layout):  # heads (or sequences) packed into SDPA's query axis
            self._record_sdpa_packed(a, packed, probs, scores, allowed, check)
            return
        cross, ext = self._cross(a["query"], a["key"])
        seen = self._described(a["query"], a["key"])
        if seen is not None and seen.cross is not None:  # lineage: where q and k came from
            cross, ext = seen.cross, seen.ext
        if allowed is not None:  # (b or 1, h or 1, q, k), broadcastable to the record
            if allowed.dim() < scores.dim():
                allowed = allowed.view((1,) * (scores.dim() - allowed.dim()) + tuple(allowed.shape))
            if scores.dim() != 4:
                allowed = allowed.expand(scores.shape).reshape(shape)
        if packed is not None:
            path = self.path()
            why = ("query rows of one slice of scaled_dot_product_attention come from the same position (heads "
                   f"or sequences packed into its query axis), and lineage could not place them: {packed}")  # fmt: skip
            self._record(path, probs.reshape(shape), scores.reshape(shape), allowed, "sdpa",
                         "arguments" if allowed is not None else None, cross, check, ext, flag=why)  # fmt: skip
            self.warn(path, shape, f"could not verify: {why}")
            return
        hv = None
        if v.shape[-2] == lk:  # the values the weights multiply
            v_kept = v.detach()
            hv = values_.HeadValues(make=lambda: v_kept.reshape(b, hq, lk, -1), watch=(v_kept,))
        rec = self._record(self.path(), probs.reshape(shape), scores.reshape(shape), allowed, "sdpa",
                     "arguments" if allowed is not None else None, cross, check, ext,
                     key_labels=seen.key_labels if seen else None,
                     query_labels=seen.query_labels if seen else None,
                     causal=True if a.get("is_causal") and a.get("attn_mask") is None and lq == lk else None,
                     values=hv, query=a["query"], raw_queries=bool(seen and seen.raw_queries),
                     key_pos=self._sdpa_key_positions(a["key"], unsq, b) if lq < lk else None)  # fmt: skip
        if rec is not None:
            rec = self._sdpa_keys(rec, a["key"], unsq, b, a["query"] if ext else None)
        if rec is not None and hv is not None:
            self._follow_sdpa_out(a, out, rec, unsq, (b, hq, lk))

    def _mha_keys(self, rec: Record, key: torch.Tensor, extra: int) -> None:
        """The positions a MultiheadAttention record's keys hold, per sequence, where lineage has them: asked
        at finish whether they are whole sequences, as SDPA's are (keys a top-k picked per query, a kNN
        memory's neighbours folded into the batch). ``extra``: keys the call adds (``bias_k``, zero attention)."""
        kc = self.code_of(key)
        if kc is None or tuple(kc.shape) != tuple(key.shape):
            return
        # (remembered with the codes: later captures get the same positions back, and what finish asks of them)
        memo = ("mha keys", id(kc), extra, self._sources_key())
        pos = lineage.recall(memo)
        if pos is lineage.MISS:
            pos = kc.select(-1, 0) >> lineage.SHIFT  # (S, B) sequence-first, or (S,) unbatched
            pos = pos.transpose(0, 1) if pos.dim() == 2 else pos[None]
            if extra:
                pos = F.pad(pos, (0, extra), value=-1)
            pos = lineage.remember(memo, (kc,), pos.masked_fill(self.sources.learned(pos), -1))
        if tuple(pos.shape) != (int(rec.probs.shape[0]), int(rec.probs.shape[-1])):
            return
        self._seq_keys.setdefault(rec.seq, []).append(pos)
        self._twice_by_keys(rec, pos)
        self._asked_by_some(rec, pos)

    def _asked_by_some(self, rec: Record, pos: torch.Tensor) -> Record:
        """Self-attention of MultiheadAttention or SDPA where fewer queries ask than keys answer (CLIP's
        AttentionPool2d: the mean token alone asks, ``query=x[:1]``): the record keeps its keys' positions
        ``pos`` (B, k), so a trace draws it at the rows of the positions that ask, as a softmax's record."""
        if rec.kind == "cross" or rec.key_positions is not None or rec.query_positions is None:
            return rec
        if int(rec.probs.shape[-2]) >= int(rec.probs.shape[-1]):
            return rec
        at = next((i for i, r in enumerate(self.cap.records) if r is rec), None)
        if at is None:
            return rec
        rec = self.cap.records[at] = _replaced(rec, key_positions=pos)
        return rec

    def _twice_by_keys(self, rec: Record, pos: torch.Tensor) -> None:
        """A cross record of SDPA or MultiheadAttention (no layout gives its keys' positions to ``_record``)
        whose queries and keys are two embedding calls of the same ids: said at the end, as a softmax's is."""
        if (
            rec.kind == "cross"
            and rec.exact
            and not self._given(rec.name)
            and self._same_ids_twice(rec.query_positions, pos)
        ):
            self._twice.setdefault(rec.name, tuple(int(n) for n in rec.probs.shape))

    def _sdpa_key_positions(self, key: torch.Tensor, unsq: bool, b: int) -> torch.Tensor | None:
        """(B, K) the lineage position of each of an SDPA call's keys (-1 at learned ones), or None."""
        kc = self.code_of(key)
        if kc is None or tuple(kc.shape) != tuple(key.shape) or kc.dim() < 2 + (not unsq):
            return None
        memo = ("sdpa keys", id(kc), unsq, b, self._sources_key())
        pos = lineage.recall(memo)
        if pos is lineage.MISS:
            pos = kc.select(-1, 0) >> lineage.SHIFT  # (..., H_kv, K), or (B, K) unbatched over heads
            pos = pos if unsq else pos.select(-2, 0)  # one key head: the same positions for every head
            pos = pos.reshape(b, -1)
            pos = lineage.remember(memo, (kc,), pos.masked_fill(self.sources.learned(pos), -1))
        return pos

    def _sdpa_keys(self, rec: Record, key: torch.Tensor, unsq: bool, b: int, query=None) -> Record:
        """The positions an SDPA record's keys hold, per sequence (from lineage, where the keys have it):
        asked at finish whether they are whole sequences (lineage.subset). With ``query`` (keys beyond the
        queries' own), keys from outside the call are labelled as ``_other_sequence`` says."""
        pos = self._sdpa_key_positions(key, unsq, b)
        if pos is None:
            return rec
        self._seq_keys.setdefault(rec.seq, []).append(pos)
        if tuple(pos.shape) == (int(rec.probs.shape[0]), int(rec.probs.shape[-1])):
            self._twice_by_keys(rec, pos)
            rec = self._asked_by_some(rec, pos)
        qc = self.code_of(query) if query is not None else None
        if qc is None or (rec.key_labels is not None and None not in rec.key_labels):
            return rec
        labels = self._other_sequence(rec.name, pos, qc.select(-1, 0), rec.key_labels)
        at = next((i for i, r in enumerate(self.cap.records) if r is rec), None)
        if isinstance(labels, str):
            if at is not None and rec.flag is None:
                rec = self.cap.records[at] = _replaced(rec, exact=False, flag=labels)
                self.warn(rec.name, tuple(int(n) for n in rec.probs.shape), f"could not verify: {labels}")
            return rec
        if labels is None or len(labels) != int(rec.probs.shape[-1]):
            return rec
        if at is not None:
            rec = self.cap.records[at] = _replaced(rec, key_labels=labels)
        return rec

    def _sdpa_dropped(self, probs, v, out, p: float) -> tuple[torch.Tensor, str | None, float | None]:
        """SDPA's weights after its dropout: drawn again from the RNG state the call started from (its math
        path draws them as ``torch.dropout`` does), kept where they times the values give the call's output;
        else the weights before dropout and why they are not the ones used."""
        state, self._rng = self._rng, None
        if state is not None and out.numel():
            with torch.random.fork_rng(devices=[out.device] if out.is_cuda else []):
                _set_rng_state(state, out.device)
                dropped = torch.dropout(probs, p, True)
            got = dropped @ v
            if _same_output(got, out):
                return dropped, None, float((got - out.to(got.dtype)).abs().max())
        return probs, (f"scaled_dot_product_attention drops weights at random while training (dropout_p={p:g}) "
                       "inside its kernel, and the draws could not be repeated: the weights recorded are before "
                       "dropout, not the ones the call multiplied its values with"), None  # fmt: skip

    def _sdpa_packed(self, query, key, unsq: bool, hq: int, hk: int, scores: torch.Tensor):
        """None where SDPA's query rows are positions, as its API lays them out (the common case, or no
        lineage to say otherwise); else the layout lineage finds for them (Hugging Face's decoding step
        packs a grouped head's query heads into the query axis: (B, H_kv, H / H_kv, d)), or why not."""
        qc, kc = self.code_of(query), self.code_of(key)
        if (
            qc is None
            or kc is None
            or tuple(qc.shape) != tuple(query.shape)
            or tuple(kc.shape) != tuple(key.shape)
        ):
            return None
        memo = ("sdpa rows packed", id(qc), unsq)  # a pure function of the codes: kept with them
        packed = lineage.recall(memo)
        if packed is lineage.MISS:
            first = qc.select(-1, 0).sort(-1).values  # (..., h, q) each row's first code (position, feature)
            pos = first >> lineage.SHIFT
            rows = bool(((pos[..., 1:] == pos[..., :-1]) & (first[..., 1:] != first[..., :-1])).any())
            packed = lineage.remember(memo, (qc,), rows or _heads_on_batch(qc, unsq))
        if not packed:
            # no two rows of a slice at one position with other features (other heads' slices), and no two
            # slices SDPA reads as other sequences that hold one sequence's positions with other features (one
            # query row each too: a decoding step over folded heads)
            return None
        if unsq:
            qc, kc = qc[:, None], kc[:, None]
        if hq != hk:
            kc = kc.repeat_interleave(hq // hk, dim=-3)
        smap = lineage.matmul_map(qc, kc.transpose(-2, -1), scores)
        return self._decoded(smap, tuple(scores.shape), scores.dim() - 1)

    def _record_sdpa_packed(self, a: dict, layout, probs, scores, allowed, check) -> None:
        """An SDPA call whose query axis holds heads (or sequences) as well as positions: recorded in the
        layout lineage found (the values it multiplies are not kept: what it moves is not shown)."""
        if allowed is not None:
            allowed = layout.bhqk(allowed.expand(scores.shape))
        self._record(self.path(), layout.bhqk(probs), layout.bhqk(scores), allowed, "sdpa",
                     "arguments" if allowed is not None else None, layout.cross, check, layout.ext,
                     layout=layout, queries=layout.qcode)  # fmt: skip

    def _follow_sdpa_out(self, a: dict, out: torch.Tensor, rec: Record, unsq: bool, bhk) -> None:
        """SDPA's output is the weights times the values: tagged as such, with lineage codes for its
        rows (the queries' positions) and features (numbered head by head, so heads that share a value
        head under grouped-query attention stay apart), so the projection that reads the heads merged
        back is found as after a softmax and a product (each head's W_O slice)."""
        qc = self.code_of(a["query"])
        if qc is None or tuple(qc.shape) != tuple(a["query"].shape) or not isinstance(out, torch.Tensor):
            return
        b, hq, lk = bhk
        dv = int(out.shape[-1])
        key = ("sdpa out", id(qc), tuple(out.shape), unsq, hq)  # the same codes every call: kept once
        hit = lineage.recall(key)
        if hit is lineage.MISS:
            hit = lineage.remember(key, (qc,), _sdpa_out_codes(qc, tuple(out.shape), unsq, hq, b))
        if hit is None:
            return
        code, feat, qrows = hit

        def vcodes() -> torch.Tensor:  # (B, H, k, dv): the same feature numbers, head by head
            return feat.view(1, -1, 1, dv).expand(b, hq, lk, dv)

        origin: frozenset = frozenset()
        for t in (a["query"], a["key"], a["value"]):
            tag = self.tag(t)
            if tag is not None:
                origin = origin | tag.origin
        p = _Probs(rec, (b, hq), False, None, False, tuple(rec.probs.shape), qpos=qrows)
        # (``made_by``: the record whose weights made it, so heads a call each joined in head order are put in
        # that order, whatever order the calls ran in)
        self.set(out, _Tag(None, origin, attn_out=rec.name, moved=True, code=code, made_by=p))
        self._pend(rec.name, (p, vcodes, ("sdpa", str(qc.device), hq, dv, unsq, b, lk)))

    def _described(self, q: torch.Tensor, k: torch.Tensor) -> lineage.Described | None:
        """What lineage says of an attention call's queries and keys (..., L, d), or None."""
        qc, kc = self.code_of(q), self.code_of(k)
        if qc is None or kc is None or tuple(qc.shape) != tuple(q.shape) or tuple(kc.shape) != tuple(k.shape):
            return None
        key = ("describe", id(qc), id(kc), self._sources_key())
        hit = lineage.recall(key)
        if hit is not lineage.MISS:
            return hit
        return lineage.remember(key, (qc, kc), lineage.describe(qc, kc, self.sources))

    def _cross(self, q, k) -> tuple[bool | None, bool]:
        """(queries come from other embedding calls than the keys, the keys extend the queries' own)."""
        tq, tk = self.tag(q), self.tag(k)
        if tq is None or tk is None or not tq.origin or not tk.origin:
            return None, False
        return not tq.origin <= tk.origin, tq.origin < tk.origin or (tq.origin == tk.origin and tk.cache)

    def on_mha(self, func, args, kwargs):
        unguarded = _unguarded(func, args, kwargs)
        qk = None
        try:  # the arguments by name, once; where they do not bind, the call itself says what is wrong
            p: dict[str, Any] | None = _mha_arguments(args, kwargs)
        except TypeError:
            p = None
        rng = None  # dropout while training: the RNG state the call starts from
        if p is not None and p["training"] and p["dropout_p"] and isinstance(p["query"], torch.Tensor):
            rng = _rng_state(p["query"].device)
        if unguarded is None:
            out = self.run_op(func, args, kwargs)
        elif unguarded[1] is not None:  # the call runs as asked; its own q and k are kept where it
            own, held = unguarded  # hands them to SDPA
            held.qk = None
            try:
                out = self.run_op(own, args, kwargs)
                qk = held.qk
            finally:
                held.qk = 0
        else:
            grab = _GrabQK()
            with _modes_back(self.lower[-1] if self.lower else []), grab:
                out = unguarded[0](*args, **kwargs)
            qk = grab.qk
        _LOCAL.busy = getattr(_LOCAL, "busy", 0) + 1
        try:
            p = _mha_arguments(args, kwargs) if p is None else p
            self._mha_record(func, p, out, qk, rng, self.path())
        except Exception as exc:
            self.cap.notes.append(f"nn.MultiheadAttention: {type(exc).__name__}: {exc}")
        finally:
            _LOCAL.busy -= 1
        return out

    def _mha_query(self, query: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """MultiheadAttention's (sequence-first) query batch-first, with its codes, for the record's query
        positions: the query's own, or a view's of a tagged tensor (the transpose a batch-first module
        makes while capture is set aside); (None, None) where lineage has none (no positions made up)."""
        if query.dim() not in (2, 3):
            return None, None
        g = self.tag(query) or self._view_tag(query)
        if g is None or g.code is None or tuple(g.code.shape) != tuple(query.shape):
            return None, None
        if query.dim() == 2:  # unbatched (L, E): a batch of one
            return query[None], g.code[None]
        return query.transpose(0, 1), g.code.transpose(0, 1)

    def _mha_record(
        self, func, p: dict[str, Any], out: Any, qk, rng, path: str, rebuilds: Callable | None = None
    ) -> Record | None:
        """The record of one F.multi_head_attention_forward call from its arguments ``p`` (by name) and
        its output ``out`` (None where the call ran where capture does not see its output: a torch.nn
        encoder layer's fused fast path); ``qk``: the q and k it handed to SDPA, or None.

        ``rebuilds`` (torch.nn's own modules, run without the mode): a callable saying whether given
        weights rebuild what the module returned. Torch may have run its fused path there, which reads
        some masks otherwise than F.multi_head_attention_forward's Python code: a float mask as a bool
        one (every nonzero value hides its key) where the Python code adds it, and with ``is_causal=True``
        the mask as given where the Python code (no key_padding_mask, no weights asked) drops it for
        SDPA's own causal mask. Where the two readings weigh differently, the one that rebuilds the
        output is recorded; where neither or both do, the Python path's, flagged. Without ``rebuilds``
        the call ran the Python code (under the mode)."""
        query, key = p["query"], p["key"]
        # (the call says its mask is causal: that decides one query over one key)
        declared = bool(p["is_causal"])
        by_sdpa = not p.get("need_weights", True)  # (its weights inside SDPA: a row with no key is 0)
        attn_mask = p["attn_mask"]
        fused = None  # the fused path's reading of the masks, where it may weigh otherwise
        if rebuilds is not None:
            fused = _fused_reading(attn_mask, p["key_padding_mask"])
        if p["is_causal"] and attn_mask is None:
            n = query.shape[0]
            attn_mask = ~torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
        elif p["is_causal"] and p["key_padding_mask"] is None and by_sdpa:
            # the Python code's: the mask given only as a hint; SDPA's causal mask is what weighs
            lq, lk = int(query.shape[0]), int(key.shape[0])
            causal = ~_causal(lq, lk, query.device)
            if rebuilds is not None and fused is None and not _hides_as(attn_mask, causal):
                fused = (attn_mask, None)
            attn_mask = causal
        p.update(need_weights=True, average_attn_weights=False, attn_mask=attn_mask, is_causal=False)
        with _no_grad():
            scores = _mha_scores(p, int(p["num_heads"]), qk)
        # the softmax of the scores with the call's masks; whether rows with no key were weighed 0 (SDPA's)
        weights, self._rows_zeroed = _mha_weights(p, scores, by_sdpa)
        dropped: str | None = None
        if fused is not None and weights is not None and rebuilds is not None:
            other = dict(p, attn_mask=fused[0], key_padding_mask=fused[1])
            w_fused, zeroed = _mha_weights(other, scores, by_sdpa)
            if w_fused is not None and not _same_weights(w_fused, weights):
                by_python, by_fused = rebuilds(weights, p), rebuilds(w_fused, other)
                if by_fused and not by_python:  # the fused path ran: its reading of the masks weighed
                    p.update(attn_mask=fused[0], key_padding_mask=fused[1])
                    attn_mask, weights, self._rows_zeroed = fused[0], w_fused, zeroed
                elif by_fused == by_python:
                    dropped = ("torch's fused path and its Python path read this call's masks differently (a "
                               "float mask with values other than 0 and -inf, which the fused path reads as a "
                               "bool one, or is_causal=True with a mask the Python path drops), and the output "
                               "did not tell which ran: the record holds the Python path's weights")  # fmt: skip
        if _zero_one_triangle(attn_mask):  # (the reading recorded adds it: the fused one's is a bool mask)
            self._added_zero_one(path, (int(query.shape[0]), int(key.shape[0])), "passed to MultiheadAttention "
                                 "as a float attn_mask, which it adds to the scores")  # fmt: skip
        kpm_added = p["key_padding_mask"]
        if (
            isinstance(kpm_added, torch.Tensor)
            and kpm_added.is_floating_point()
            and _zero_one(kpm_added)
            and bool((kpm_added == 1).any())
        ):
            self.warn(path, tuple(kpm_added.shape), "a padding mask of 0s and 1s was passed to "
                      "MultiheadAttention as a float key_padding_mask, which it adds to the scores: adding 0 "
                      "or 1 hides no key, so padding is attended to. It hides keys as a bool mask (True = "
                      "padding) or as 0 / -inf")  # fmt: skip
        if weights is None:  # learned keys, static keys or dropout: MultiheadAttention itself, again,
            fork = None  # with dropout from the RNG state the call started from (the same draws)
            if rng is not None:
                fork = torch.random.fork_rng(devices=[query.device] if query.is_cuda else [])
            with torch.no_grad(), fork or contextlib.nullcontext():
                if rng is not None:
                    _set_rng_state(rng, query.device)
                _, weights = func(**p)
            if (
                by_sdpa  # (asked for its weights, the call ran its bmm path: the weights it returned are those)
                and weights is not None
                and scores is not None
                and torch.is_autocast_enabled(query.device.type)
                and p["training"]
            ):
                # under autocast its bmm path weighed in the lower dtype, where the call (its SDPA) weighed in float32:
                # the float32 softmax of the scores, dropped where the same draws dropped the module's own
                full, _ = _mha_weights(dict(p, training=False), scores, by_sdpa)
                if full is not None and tuple(full.shape) == tuple(weights.shape):
                    keep = 1.0 / (1.0 - float(p["dropout_p"]))
                    weights = full.masked_fill(weights == 0, 0.0) * keep
            if rng is not None and not _mha_output_is(weights, p, out):
                dropped = (f"nn.MultiheadAttention drops weights at random while training (dropout={p['dropout_p']:g}), "
                           "and the draws could not be repeated: the weights recorded are not the ones the "
                           "call multiplied its values with")  # fmt: skip
        unbatched = query.dim() == 2
        weights = weights[None] if weights.dim() == 3 else weights  # (B, H, q, k); one sequence: B = 1
        b, h, lq, lk = weights.shape
        kpm = p["key_padding_mask"]
        kpm = kpm[None] if unbatched and kpm is not None else kpm
        extra = (["<bias_k 0>"] if p["bias_k"] is not None else []) + (
            ["<zero_attn 0>"] if p["add_zero_attn"] else []
        )
        labels = (*[None] * (lk - len(extra)), *extra) if extra else None  # learned keys MHA appends
        if extra:  # MHA pads its masks with "may attend" for them
            kpm = (
                None
                if kpm is None
                else F.pad(kpm, (0, len(extra)), value=False if kpm.dtype == torch.bool else 0.0)
            )
            if attn_mask is not None and attn_mask.shape[-1] != lk:
                attn_mask = F.pad(
                    attn_mask, (0, len(extra)), value=False if attn_mask.dtype == torch.bool else 0.0
                )
        allowed = _mask(b, h, lq, lk, attn_mask, kpm, weights.device)
        cross = None if query is key else True
        seen = None  # lineage: where the queries and keys came from, and learned positions among them
        labelled = any(
            src.kind in lineage.LABELLED or src.kind in ("pooled", "state") for src in self.sources.items
        )
        if query.dim() in (2, 3) and key.dim() == query.dim() and (query is not key or labelled):
            qc, kc = self.code_of(query), self.code_of(key)  # (L, B, E), sequence-first, or unbatched (L, E)
            if qc is not None and kc is not None and qc.shape == query.shape and kc.shape == key.shape:
                qc, kc = (
                    (qc.transpose(0, 1), kc.transpose(0, 1)) if query.dim() == 3 else (qc[None], kc[None])
                )
                seen = lineage.describe(qc, kc, self.sources)
        if query is key and path not in self.fixed:
            cross = False
        elif query is not key and seen is not None and seen.cross is not None:
            cross = seen.cross  # a mean token among the keys (CLIP's attention pool): self
        if seen is not None and seen.key_labels and len(seen.key_labels) == lk - len(extra):
            labels = (*seen.key_labels, *extra)  # a [CLS] prepended, registers, learned object queries
        query_labels = seen.query_labels if seen is not None and seen.query_labels else None
        if query_labels is not None and len(query_labels) != lq:
            query_labels = None
        hv = _mha_values(p, h, (b, h, lk))
        q_first, q_code = self._mha_query(query)
        one = declared and int(weights.shape[-2]) == int(weights.shape[-1]) == 1
        rec = self._record(path, weights, scores, allowed, "nn.MultiheadAttention",
                           "arguments" if allowed is not None else None, cross, key_labels=labels,
                           query_labels=query_labels, values=hv, flag=dropped,
                           query=q_first, query_code=q_code, causal=True if one else None)  # fmt: skip
        if dropped is not None:
            self.warn(path, tuple(weights.shape), f"could not verify: {dropped}")
        if rec is not None and key.dim() in (2, 3):
            self._mha_keys(rec, key, len(extra))
        qc = self.code_of(query) if rec is not None else None
        if rec is not None and qc is not None and qc.shape == query.shape:  # the positions it asked from
            self._queried.setdefault(path, []).append((rec.kind, qc))
        if rec is not None and hv is not None and hv.w_o is not None and out is not None:
            self._follow_mha_out(query, out, rec, unbatched)
        return rec

    # -- torch.nn encoder layers, run as torch runs them ----------------------------------------------
    def model_called(self, module: nn.Module, args: tuple) -> None:
        if module is self.model and threading.get_ident() == self.thread:
            self.returned = False

    def model_returned(self, module: nn.Module, args: tuple, out: Any) -> None:
        if module is self.model and threading.get_ident() == self.thread:
            self.returned = True

    def before_layer(self, module: nn.Module, args: tuple) -> None:
        """A global forward pre-hook: torch.nn's own attention of the model (an encoder, an encoder layer,
        MultiheadAttention, as torch ships them, with no hook of their own and no attention dropout drawn)
        runs without the mode, so torch takes its fused fast paths where it would without capture, and
        its output is the one it computes uncaptured. The layers of an encoder set aside are recorded
        from their arguments too (nested tensors where the encoder makes them)."""
        if threading.get_ident() != self.thread or getattr(_LOCAL, "busy", 0) > 0:
            return
        if id(module) not in self.native:
            self._aside_outside(module, args)
            return
        if self._set_aside:  # inside a module set aside: only an encoder's own layers are recorded
            holder = self._set_aside[-1][0]
            if isinstance(holder, nn.TransformerEncoder) and any(m is module for m in holder.layers):
                self._set_aside.append((module, False))
            return
        if not torch._C._is_torch_function_mode_enabled():  # hidden from modes (DisableTorchFunction)
            return
        attns = _attentions_of(module)
        with _modes_aside():  # (a mode of the user's below capture's sees the model's ops alone)
            nested = bool(args) and isinstance(args[0], torch.Tensor) and args[0].is_nested
        if (
            not args
            or not isinstance(args[0], torch.Tensor)
            or nested
            or _FUNCTORCH_WRAPPED(args[0])
            or any(sa.training and sa.dropout > 0 for sa in attns)  # weights drawn at random: the mode
            # follows the call's RNG; hooks of a layer's own modules may change what its attention gets
            or (not isinstance(module, nn.MultiheadAttention)
                and any(m._forward_hooks or m._forward_pre_hooks for m in module.modules()))
        ):  # fmt: skip
            if not nested and _makes_nested(module) and any(m._forward_hooks or m._forward_pre_hooks
                                                            for m in module.modules()):  # fmt: skip
                self.skip(self.names.get(id(module), ""), (), _NO_NESTED.format(why="a hook on one of its "
                          "modules (a forward hook, pruning, a parametrization) makes capture follow it under "
                          "its mode"))  # fmt: skip
            return
        n = torch._C._len_torch_function_stack()
        if n == 0 or torch._C._get_function_stack_at(n - 1) is not self.mode:  # another mode above ours
            others = (torch._C._get_function_stack_at(i) for i in range(n))
            if any(isinstance(m, _Mode) and m is not self.mode for m in others):
                # (another capture's: without this one, that one would run torch.nn as torch runs it; a mode of
                # the user's above, torch.device(...), turns its fast paths off with or without capture)
                self.skip(self.names.get(id(module), ""), (), _MODE_ABOVE)
            return
        torch._C._pop_torch_function_stack()
        self._set_aside.append((module, True))
        if isinstance(module, nn.TransformerEncoder):
            self._encoder_input = args[0]

    def _aside_outside(self, module: nn.Module, args: tuple) -> None:
        """torch.nn's own attention outside the model captured (the decoder's MultiheadAttention where only the
        encoder is captured) runs without the mode too, as it runs without capture: under a mode torch leaves
        its fused fast path, and the output would change in its last bits. Not recorded (it is not the model's),
        and never a module the model captured runs inside (an encoder around the layer captured)."""
        if (
            self._set_aside
            or type(module) not in _NATIVE_TYPES
            or id(module) in self.names
            or not torch._C._is_torch_function_mode_enabled()
        ):
            return
        outside = self._outside_native.get(id(module))
        if outside is None or outside[0]() is not module:
            native = _native_layer(module) or _native_mha(module) or _native_encoder(module)
            holds = any(m is self.model for m in module.modules())
            if len(self._outside_native) >= HELD:
                self._outside_native.clear()
            outside = self._outside_native[id(module)] = (weakref.ref(module), native and not holds)
        if not outside[1] or any(sa.training and sa.dropout > 0 for sa in _attentions_of(module)):
            return  # (weights drawn at random: as in the model, followed under the mode)
        n = torch._C._len_torch_function_stack()
        if n == 0 or torch._C._get_function_stack_at(n - 1) is not self.mode:
            return
        self._path_at = (-1, "")  # (where this call runs, found anew: not the last op's)
        self.path()
        if self.alien is not None:  # another model's (not one that holds the model): its attention is said
            self.n_alien += 1
            x = args[0] if args else None
            self.skip(self.alien, tuple(x.shape) if isinstance(x, torch.Tensor) else (), _ANOTHER_MODEL)
        torch._C._pop_torch_function_stack()
        self._set_aside.append((module, True))
        self._aside_only.add(id(module))

    def after_layer(self, module: nn.Module, args: tuple, *rest: Any) -> None:
        """A global forward hook (always called): the mode back, and the layer's attention recorded from
        its arguments (``rest``: kwargs and output; the output alone, None, where the forward raised)."""
        if (
            not self._set_aside
            or self._set_aside[-1][0] is not module
            or threading.get_ident() != self.thread
        ):
            return
        _, popped = self._set_aside.pop()
        try:
            if id(module) in self._aside_only:  # (outside the model captured: not recorded)
                self._aside_only.discard(id(module))
            elif len(rest) == 2 and rest[1] is not None:
                _LOCAL.busy = getattr(_LOCAL, "busy", 0) + 1
                try:
                    with _modes_aside():  # (the user's modes stay off capture's own tensors)
                        if isinstance(module, nn.MultiheadAttention):
                            self._native_mha(module, args, rest[0], rest[1])
                        elif isinstance(module, nn.TransformerEncoder):
                            self._out_of_native(args[0] if args else rest[0].get("src"), rest[1])
                        elif isinstance(rest[1], torch.Tensor):
                            self._native_record(module, args, rest[0], rest[1])
                except Exception as exc:  # bookkeeping must never break the user's forward pass
                    self.cap.notes.append(f"{type(module).__name__}: {type(exc).__name__}: {exc}")
                finally:
                    _LOCAL.busy -= 1
        finally:
            if popped:
                torch._C._push_on_torch_function_stack(self.mode)
            if isinstance(module, nn.TransformerEncoder):
                self._encoder_input = None

    def _out_of_native(self, src: Any, out: Any) -> None:
        """The output of an encoder or encoder layer that ran without the mode, tagged as a projection of
        its input's positions (hidden states handed in get positions of their own first, as a projection
        finds them)."""
        if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor) or out.is_nested:
            return
        if self.tag(src) is None and src.is_floating_point() and src.dim() >= 2:
            self._external(src)
        code, g = self.code_of(src), self.tag(src)
        if code is not None and tuple(code.shape) == tuple(out.shape) == tuple(src.shape):
            self.set(out, _Tag("linear", g.origin if g is not None else frozenset(),
                               code=lineage.projected(code, int(out.shape[-1]))[0]))  # fmt: skip

    def _native_record(self, module: nn.Module, args: tuple, kwargs: dict, out: torch.Tensor | None) -> None:
        """The record nn.MultiheadAttention's call inside ``module`` makes under the mode, made from the
        layer's arguments as the layer and MultiheadAttention hand them on (the same masks, the same
        sequence-first query), by the same code; the output is tagged as a projection of the input's
        positions, and the record's residual stream is the layer's input."""
        names = ("src", "src_mask", "src_key_padding_mask", "is_causal")
        a = dict(zip(names, args, strict=False)) | kwargs
        src, src_mask, pad, is_causal = (
            a["src"],
            a.get("src_mask"),
            a.get("src_key_padding_mask"),
            a.get("is_causal", False),
        )
        sa = cast(nn.MultiheadAttention, module.self_attn)
        norm1 = cast(nn.LayerNorm, module.norm1)
        path = self.names.get(id(sa), "")
        self.n_ops += 1
        self.n_attention += 1
        lengths = None  # a nested tensor (an encoder's, over a padding mask): each sequence's own length
        if src.is_nested:
            whole = self._encoder_input
            if whole is None or whole.dim() != 3 or not sa.batch_first:
                self.warn(path, (), "could not verify: a nested tensor handed in, whose padded shape capture "
                          "does not know: not recorded")  # fmt: skip
                return
            lengths = src._nested_tensor_size()[:, 0].to(whole.device)
            with _no_grad():
                src = src.to_padded_tensor(0.0, tuple(whole.shape))
            src_mask, is_causal = None, False  # (the encoder makes nested tensors only without them)
            pad = torch.arange(src.shape[1], device=src.device)[None, :] >= lengths[:, None]
            out = None
        if src.numel() == 0:
            self.skip(path, tuple(src.shape), "an attention call over an empty batch or sequence: it has no "
                      "weights to record")  # fmt: skip
            return
        with _no_grad():  # (check_other=False: torch's warning about the masks' types, given by the call)
            x = norm1(src) if module.norm_first else src
            pad = F._canonical_mask(mask=pad, mask_name="src_key_padding_mask", other_type=F._none_or_dtype(src_mask),
                                    other_name="src_mask", target_type=src.dtype, check_other=False)  # fmt: skip
            src_mask = F._canonical_mask(mask=src_mask, mask_name="src_mask", other_type=None, other_name="",
                                         target_type=src.dtype, check_other=False)  # fmt: skip
        query = x.transpose(1, 0) if sa.batch_first and x.dim() == 3 else x
        g = self.tag(src)
        sc = self.code_of(src) if g is not None and g.role != "param" else None
        if (
            g is not None
            and query is not src
            and sc is not None
            and tuple(sc.shape) == tuple(src.shape) == tuple(x.shape)
        ):
            # (the layer's norm and transpose, made here: the positions of its input, learned ones labelled)
            self.set(query, _Tag("linear", g.origin, code=sc.transpose(1, 0) if query is not x else sc))
        p = _mha_arguments(
            (query, query, query, sa.embed_dim, sa.num_heads, sa.in_proj_weight, sa.in_proj_bias, sa.bias_k, sa.bias_v,
             sa.add_zero_attn, sa.dropout, sa.out_proj.weight, sa.out_proj.bias),
            # need_weights=False, as the layer asks (a row with every key masked is 0, as its Python path
            # weighs it; NaN below where the output is: the fast path's)
            {"training": sa.training, "key_padding_mask": pad, "need_weights": False,
             "attn_mask": src_mask, "average_attn_weights": True, "is_causal": is_causal},
        )  # fmt: skip
        rebuilds = None
        if out is not None and _fused_possible(module):
            layer_in = src
            rebuilds = lambda w, pp: _layer_output_is(module, layer_in, w, pp, out)  # noqa: E731
        rec = self._mha_record(F.multi_head_attention_forward, p, None, None, None, path, rebuilds)
        if lengths is not None:
            rec = self._padded_rows_unseen(rec, lengths)
        if rec is not None and self.cap.records and self.cap.records[-1] is rec and src.dim() == 3:
            b, lq = int(rec.probs.shape[0]), int(rec.probs.shape[2])

            def rows() -> torch.Tensor:  # src's rows in the record's (batch, query) order
                r = torch.arange(b * lq, device=src.device)
                return r if sa.batch_first else r.view(lq, b).t().reshape(-1)

            index = _kept(("residual rows", b, lq, sa.batch_first, str(src.device)), rows)
            rec = _replaced(rec, residual_of=_Residual(src.detach(), index, (b, lq)))
            self.cap.records[-1] = rec
        if out is None:  # (a nested output: the encoder's is followed where it comes out)
            return
        self._dead_rows_as_out(rec, out, sa.batch_first)
        self._out_of_native(src, out)

    def _padded_rows_unseen(self, rec: Record | None, lengths: torch.Tensor) -> Record | None:
        """A layer over an encoder's nested tensors computes no row for a sequence's padding: those
        query rows are 0, see no key, and have no scores (NaN)."""
        if rec is None or not self.cap.records or self.cap.records[-1] is not rec:
            return rec
        q = torch.arange(rec.probs.shape[2], device=rec.probs.device)
        unseen = q[None, :] >= lengths.to(q.device)[:, None]  # (B, q)
        if not bool(unseen.any()):
            return rec
        rows = unseen[:, None, :, None]
        mask = rec.mask if rec.mask is not None else torch.ones(
            rec.probs.shape[0], *rec.probs.shape[2:], dtype=torch.bool, device=rec.probs.device)  # fmt: skip
        changed = replace(
            rec,
            probs=rec.probs.masked_fill(rows, 0.0),
            scores=None if rec.scores is None else rec.scores.masked_fill(rows, float("nan")),
            mask=mask.masked_fill(unseen[:, :, None], False),
        )
        self.cap.records[-1] = changed
        return changed

    def _native_mha(self, module: nn.MultiheadAttention, args: tuple, kwargs: dict, out: Any) -> None:
        """The record of an nn.MultiheadAttention call that ran without the mode, made from its arguments
        as MultiheadAttention.forward hands them to F.multi_head_attention_forward (the same masks, the
        same sequence-first query, key and value, tagged as the mode tags their transposes), by the code
        that records the call under the mode; its output is followed to the residual stream as there."""
        names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
                 "is_causal")  # fmt: skip
        a = dict(zip(names, args, strict=False)) | kwargs
        query, key, value = a["query"], a["key"], a["value"]
        path = self.names.get(id(module), "")
        self.n_ops += 1
        self.n_attention += 1
        if query.numel() == 0 or key.numel() == 0:
            self.skip(path, tuple(query.shape), "an attention call over an empty batch or sequence: it has no "
                      "weights to record")  # fmt: skip
            return
        attn_mask = a.get("attn_mask")
        with _no_grad():  # (check_other=False: torch's warning about the masks' types, given by the call)
            pad = F._canonical_mask(mask=a.get("key_padding_mask"), mask_name="key_padding_mask",
                                    other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                                    target_type=query.dtype, check_other=False)  # fmt: skip
            attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                          target_type=query.dtype, check_other=False)  # fmt: skip
        batched = query.dim() == 3
        q, k, v = query, key, value
        if module.batch_first and batched:  # as MultiheadAttention.forward transposes them (one tensor
            q = query.transpose(1, 0)  # where they are one)
            k = q if key is query else key.transpose(1, 0)
            v = k if value is key else (q if value is query else value.transpose(1, 0))
            for t, made in ((query, q), (key, k), (value, v)):
                if self.tag(made) is None:
                    self.propagate("transpose", torch.transpose, (t, 1, 0), {}, made, None)
        got = out[0] if isinstance(out, (tuple, list)) and out else out
        p = _mha_arguments(
            (q, k, v, module.embed_dim, module.num_heads, module.in_proj_weight, module.in_proj_bias, module.bias_k,
             module.bias_v, module.add_zero_attn, module.dropout, module.out_proj.weight, module.out_proj.bias),
            {"training": module.training, "key_padding_mask": pad, "need_weights": a.get("need_weights", True),
             "attn_mask": attn_mask, "average_attn_weights": a.get("average_attn_weights", True),
             "is_causal": a.get("is_causal", False)},
        )  # fmt: skip
        rebuilds = None
        if isinstance(got, torch.Tensor) and _fused_possible(module):
            seq_first_out = (got.transpose(1, 0) if module.batch_first and batched else got,)
            rebuilds = lambda w, pp: _mha_output_is(w, pp, seq_first_out)  # noqa: E731
        rec = self._mha_record(F.multi_head_attention_forward, p, None, None, None, path, rebuilds)
        if isinstance(got, torch.Tensor) and batched:
            rec = self._dead_rows_as_out(rec, got, module.batch_first)
        hv = rec.values if rec is not None else None
        if isinstance(got, torch.Tensor) and rec is not None and hv is not None and hv.w_o is not None:
            seq_first = got.transpose(1, 0) if module.batch_first and batched else got
            self._follow_mha_out(q, (seq_first,), rec, not batched)
            if seq_first is not got:
                self.propagate("transpose", torch.transpose, (seq_first, 1, 0), {}, got, None)

    def _dead_rows_as_out(self, rec: Record | None, out: torch.Tensor, batch_first: bool) -> Record | None:
        """A head's row with every key masked is NaN in the record where its query's row is NaN in the call's
        output: torch's fused fast path weighs it so (its softmax over no key), where its Python path inside
        SDPA gives 0 (a row of zeros, which no softmax over a key makes). Rows of other heads stay as they
        are (one head's NaN row makes the output's row NaN). ``out``: (B, L, E) where ``batch_first``, else
        (L, B, E)."""
        if (
            rec is None
            or not self._rows_zeroed  # (_mha_record, which made rec, weighed no row 0)
            or rec.mask is None
            or out.dim() != 3
            or not self.cap.records
            or self.cap.records[-1] is not rec
        ):
            return rec
        dead = (rec.probs == 0).all(-1)  # (B, H, q): a head's row that SDPA weighed 0 (no key allowed)
        if not bool(dead.any()):
            return rec
        rows = torch.isnan(out if batch_first else out.transpose(0, 1)).all(-1)  # (B, q)
        if tuple(rows.shape) != (dead.shape[0], dead.shape[2]):
            return rec
        fill = dead & rows[:, None, :]
        if not bool(fill.any()):
            return rec
        probs = rec.probs.masked_fill(fill[..., None], float("nan"))
        self.cap.records[-1] = _replaced(rec, probs=probs)
        return self.cap.records[-1]

    def _follow_mha_out(self, query: torch.Tensor, out: Any, rec: Record, unbatched: bool) -> None:
        """MultiheadAttention's output went through its own output projection: tagged as a projection
        of the queries' positions that these weights made, so the sum adding it to the residual stream
        is found (the residual norms)."""
        attn = out[0] if isinstance(out, (tuple, list)) else out
        qc = self.code_of(query)
        if not isinstance(attn, torch.Tensor) or qc is None or tuple(qc.shape) != tuple(query.shape):
            return
        if tuple(attn.shape[:-1]) != tuple(query.shape[:-1]):
            return
        code, _ = lineage.projected(qc, int(attn.shape[-1]))
        key = ("mha query positions", id(qc))
        qpos = lineage.recall(key)
        if qpos is lineage.MISS:
            rows = qc.select(-1, 0) >> lineage.SHIFT  # (L, B) or (L,): MultiheadAttention is sequence-first
            qpos = lineage.remember(key, (qc,), rows[None] if unbatched else rows.t())
        g = self.tag(query)
        b, h = int(rec.probs.shape[0]), int(rec.probs.shape[1])
        p = _Probs(rec, (b, h), False, None, False, tuple(rec.probs.shape), qpos=qpos)
        self.set(attn, _Tag("linear", g.origin if g is not None else frozenset(), code=code, wo=p))


# how far SDPA's output may be from the weights recomputed times the values, relative to the values' largest
# magnitude, before the record is flagged (the call's own rounding, in its dtype)
_SDPA_TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4, torch.float64: 1e-8}


def _no_torch_function(*_args) -> bool:
    return False


# func -> (the globals its code reads, as they were, its own code, the grab of its q and k or None)
_OWN: dict[Any, tuple[tuple, Callable[..., Any], threading.local | None]] = {}


def _unguarded(func, args, kwargs) -> tuple[Callable[..., Any], threading.local | None] | None:
    """F.multi_head_attention_forward's own code (the same bytecode, defaults and module globals)
    with its torch-function guard answered "none", so its ops run as torch runs them without a mode;
    and, where it calls ``scaled_dot_product_attention`` by its module name, that call wrapped so
    the q and k it hands to SDPA are kept (the grab's ``qk``, per thread). None where the guard would
    not say "none" anyway (another mode on the stack, a tensor subclass among the arguments) or the
    function is not one of Python code. Built once, and again whenever a global its code reads has
    been replaced since (a patched F.scaled_dot_product_attention or F.linear is the one it calls)."""
    code = getattr(func, "__code__", None)
    if not isinstance(func, types.FunctionType) or code is None or "has_torch_function" not in code.co_names:
        return None
    tensors = tuple(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
    if torch.overrides.has_torch_function(tensors):
        return None
    g = func.__globals__
    now = tuple(map(g.get, code.co_names))
    key = (func, code)
    hit = _OWN.get(key)
    if hit is not None and len(hit[0]) == len(now) and all(map(operator.is_, hit[0], now)):
        return hit[1], hit[2]
    scope = dict(g)
    scope["has_torch_function"] = _no_torch_function
    grab: threading.local | None = None
    sdpa = scope.get("scaled_dot_product_attention")
    if "scaled_dot_product_attention" in code.co_names and callable(sdpa):
        grab = threading.local()
        held = grab

        def grabbed(*a, **k):
            if getattr(held, "qk", 0) is None and len(a) >= 2:
                held.qk = (a[0], a[1])
            return sdpa(*a, **k)

        scope["scaled_dot_product_attention"] = grabbed
    own = types.FunctionType(code, scope, func.__name__, func.__defaults__, func.__closure__)
    own.__kwdefaults__ = func.__kwdefaults__
    _OWN[key] = (now, own, grab)
    return own, grab


class _GrabQK(TorchFunctionMode):
    """Around F.multi_head_attention_forward's own code where it does not call SDPA by its module
    name: the q and k of the SDPA call it makes (need_weights=False); every call passes through."""

    def __init__(self):
        super().__init__()
        self.qk: tuple[torch.Tensor, torch.Tensor] | None = None

    def __torch_function__(self, func, types=(), args=(), kwargs=None):
        if (
            self.qk is None
            and getattr(func, "__name__", "") == "scaled_dot_product_attention"
            and len(args) >= 2
        ):
            self.qk = (args[0], args[1])
        return func(*args, **(kwargs or {}))


_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


class _Mode(TorchFunctionMode):
    def __init__(self, session: _Session):
        super().__init__()
        self.session = session

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _compiling():  # torch.compile tracing an op inside the call (flex_attention's own): not followed
            return func(*args, **(kwargs or {}))
        if not torch._C._len_torch_function_stack():
            return self.session.call(func, args, kwargs or {})
        with _modes_aside() as lower:  # modes below capture's: back around the model's op alone
            self.session.lower.append(lower)
            try:
                return self.session.call(func, args, kwargs or {})
            finally:
                self.session.lower.pop()


@contextlib.contextmanager
def _modes_aside() -> Iterator[list[TorchFunctionMode]]:
    """Every TorchFunctionMode on this thread's stack set aside (bottom first), and put back after."""
    lower = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())]
    lower.reverse()
    try:
        yield lower
    finally:
        for m in lower:
            torch._C._push_on_torch_function_stack(m)


@contextlib.contextmanager
def _modes_back(lower: list[TorchFunctionMode]) -> Iterator[None]:
    """The modes ``_modes_aside`` set aside, back on the stack for the block (the model's own op)."""
    for m in lower:
        torch._C._push_on_torch_function_stack(m)
    try:
        yield
    finally:
        for _ in lower:
            torch._C._pop_torch_function_stack()


# -- masks and scores for nn.MultiheadAttention -------------------------------------------------------------
def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The RNG state dropout on ``device`` draws from (the CPU's, and the GPU's where it runs there)."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _rows_named(how: str, order: torch.Tensor, keys_only: bool) -> str:
    """The flag of a batch put in another order: ``how``, and the caller's sequence each record row holds (its
    keys only, ``keys_only``: queries from a state, or cross-attention, whose rows the keys do not say)."""
    if keys_only:
        text = (
            f"{how}: the keys of record row b are the caller's sequence {order.tolist()}[b], not sequence b"
        )
    else:
        text = f"{how}: record row b holds the caller's sequence {order.tolist()}[b], not sequence b"
    flag = _Reordered(text)
    flag.order = tuple(int(n) for n in order.tolist())
    return flag


def _same_scores(a: Any, b: Any) -> bool:
    """Two tensors of scores that are one (or equal, value for value: the same scores computed twice)."""
    if a is b:
        return True
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and tuple(a.shape) == tuple(b.shape)
        and a.dtype == b.dtype
        and a.device == b.device
        and bool(torch.equal(a, b))
    )


def _same_shape(a: Any, b: Any) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and tuple(a.shape) == tuple(b.shape)


def _same_output(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Weights times values give what the call returned, up to rounding in its dtype."""
    if tuple(got.shape) != tuple(want.shape):
        return False
    tol = 1e-4 if want.dtype in (torch.float32, torch.float64) else 1e-2  # (half: rounded in its dtype)
    want = want.to(got.dtype)
    return bool(((got - want).abs() <= tol * (1 + want.abs())).all())


def _mha_output_is(weights: torch.Tensor | None, p: dict[str, Any], out: Any) -> bool:
    """MultiheadAttention's output rebuilt from ``weights`` (B·H or B, H, q, k), its values and output
    projection equals the output the call returned."""
    got = out[0] if isinstance(out, (tuple, list)) else out
    if weights is None or not isinstance(got, torch.Tensor):
        return False
    w = weights[None] if weights.dim() == 3 else weights
    rebuilt = _attention_output(w, p)
    if rebuilt is None:
        return False
    want = got[None] if got.dim() == 2 else got.transpose(0, 1)  # MultiheadAttention is sequence-first
    return _same_rows(rebuilt, want, w)


def _attention_output(w: torch.Tensor, p: dict[str, Any]) -> torch.Tensor | None:
    """(B, q, D): MultiheadAttention's attention block output from weights ``w`` (B, H, q, k), the values and
    output projection its arguments ``p`` give; None where they give none."""
    h = int(p["num_heads"])
    hv = _mha_values(p, h, (int(w.shape[0]), h, int(w.shape[-1])))
    vals = hv.values if hv is not None else None
    if vals is None or hv is None or hv.w_o is None:
        return None
    with torch.no_grad():
        out = torch.einsum("bhqk,bhkd,hDd->bqD", w.to(vals.dtype), vals, hv.w_o)
        return out if hv.b_o is None else out + hv.b_o


def _same_rows(got: torch.Tensor, want: torch.Tensor, weights: torch.Tensor) -> bool:
    """``_same_output`` of (B, q, D) outputs on the rows where ``want`` is finite; its other rows must be
    rows that ``weights`` (B, H, q, k) weigh no key in (a fused kernel's softmax over no key is NaN)."""
    bad = ~torch.isfinite(want).all(-1)  # (B, q)
    if not bool(bad.any()):
        return _same_output(got, want)
    dead = ((weights.sum(-1) == 0) | weights.isnan().any(-1)).any(1)
    if tuple(dead.shape) != tuple(bad.shape) or bool((bad & ~dead.to(bad.device)).any()):
        return False
    return _same_output(got[~bad], want[~bad])


def _allowed(m: torch.Tensor) -> torch.Tensor:
    """torch.nn mask (bool: True = NOT allowed; float: additive, -inf or a very negative value such as
    -1e9 or -1e4 = not allowed, as a user's ``(1 - mask) * -1e9`` makes it) -> True = allowed."""
    return ~m if m.dtype == torch.bool else torch.isfinite(m) & ~_added_hides(m)


_ROWS: dict[tuple, torch.Tensor] = {}  # SDPA: checked rows by query length and device; causal masks


def _kept(key: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A small constant tensor of SDPA's checks, made once per key (never written to)."""
    key = (*key, torch.is_inference_mode_enabled())  # inference tensors never leave inference mode
    t = _ROWS.get(key)
    if t is None:
        t = make()
        if len(_ROWS) >= 256:
            _ROWS.clear()
        _ROWS[key] = t
    return t


def _causal(lq: int, lk: int, device) -> torch.Tensor:
    """SDPA's is_causal mask (lq, lk), kept per shape and device."""
    return _kept(("causal", lq, lk, str(device)),
                 lambda: torch.ones(lq, lk, dtype=torch.bool, device=device).tril())  # fmt: skip


def _hiding(keep: torch.Tensor, dtype: torch.dtype, causal: bool) -> torch.Tensor:
    """A bool mask as the float one SDPA adds: 0 where it keeps, -inf where it hides (the causal one kept
    per shape; a mask of the call's made anew, as it may be written to between calls)."""

    def make() -> torch.Tensor:
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, float("-inf"))

    return _kept(("hiding", *keep.shape, dtype, str(keep.device)), make) if causal else make()


def _check_rows(lq: int, device) -> torch.Tensor:
    """Up to CHECK_ROWS query rows evenly spread, the first and last included."""
    return _kept((lq, str(device)),
                 lambda: torch.linspace(0, lq - 1, min(lq, CHECK_ROWS), device=device).round().long().unique())  # fmt: skip


def _mha_arguments(args, kwargs) -> dict[str, Any]:
    """F.multi_head_attention_forward's arguments by name, defaults filled in (inspect's bind where
    the call is not a plain one)."""
    p = dict(_MHA_DEFAULTS)
    p.update(zip(_MHA_NAMES, args, strict=False))
    if len(args) > len(_MHA_NAMES) or any(k in _MHA_POSITIONAL[len(args)] or k not in _MHA_SIG.parameters
                                           for k in kwargs):  # fmt: skip
        bound = _MHA_SIG.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)
    p.update(kwargs)
    if len(p) != len(_MHA_NAMES):  # a required argument missing: bind says which
        _MHA_SIG.bind(*args, **kwargs)
    return p


def _where_view(codes: torch.Tensor, view: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """``codes`` (contiguous, laid out as the contiguous ``base``), seen where ``view`` lies in base's memory (a
    view of them: a write into it writes ``codes``)."""
    return codes.as_strided(tuple(view.shape), tuple(view.stride()),
                            codes.storage_offset() + view.storage_offset() - base.storage_offset())  # fmt: skip


def _fused_possible(module: nn.Module) -> bool:
    """Whether torch may have run a fused kernel for this torch.nn module's call (eval, no gradients): else
    it ran its Python code."""
    if module.training:
        return False
    return not (torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters()))


def _layer_output_is(
    layer: nn.Module, src: torch.Tensor, weights: torch.Tensor, p: dict[str, Any], out
) -> bool:
    """nn.TransformerEncoderLayer's output rebuilt from its attention's ``weights`` (B, H, q, k), the values and
    output projection ``p`` gives, and the layer's own norms and feed-forward, equals ``out`` (eval)."""
    if (
        not isinstance(out, torch.Tensor)
        or out.is_nested
        or not isinstance(src, torch.Tensor)
        or src.dim() != 3
    ):
        return False
    attn = _attention_output(weights, p)
    if attn is None:
        return False
    lay = cast(Any, layer)
    first = bool(getattr(lay.self_attn, "batch_first", False))
    with torch.no_grad():
        x = src if first else src.transpose(0, 1)
        if lay.norm_first:
            x = x + attn
            x = x + lay.linear2(lay.activation(lay.linear1(lay.norm2(x))))
        else:
            x = lay.norm1(x + attn)
            x = lay.norm2(x + lay.linear2(lay.activation(lay.linear1(x))))
    return _same_rows(x, out if first else out.transpose(0, 1), weights)


def _fused_reading(attn_mask, key_padding_mask) -> tuple[Any, Any] | None:
    """The masks as torch's fused MultiheadAttention and encoder-layer kernels read them: a float mask as a
    bool one, every nonzero value hiding its key (the Python path adds it). None where that weighs as the
    Python path does (no float mask with a value other than 0 or a very negative one)."""

    def read(m):
        if m is None or m.dtype == torch.bool or not m.is_floating_point():
            return m, False
        return m != 0, bool(((m != 0) & (m > NEG)).any())

    am, differs_a = read(attn_mask)
    kpm, differs_k = read(key_padding_mask)
    return (am, kpm) if differs_a or differs_k else None


def _param_label(name: str) -> str:
    """The label of a learned tensor's rows from its parameter's name: its own attribute (``cls_token``),
    its module's for a module's own weight (``iou_token.weight`` -> ``iou_token``: an embedding table read
    whole, SAM's tokens; ``prompts.3.weight`` -> ``prompts``, a layer's own table in a ModuleList), an index
    into a ParameterList kept with it (``cls_token.0`` -> ``cls_token[0]``)."""
    parts = name.split(".")
    last = parts[-1]
    if len(parts) > 1 and last in ("weight", "bias"):
        # (a ModuleList's tables, one per layer, by the list's name: each layer's labels alike)
        return parts[-2] if not parts[-2].isdigit() or len(parts) < 3 else parts[-3]
    if len(parts) > 1 and last.isdigit():
        return f"{parts[-2]}[{last}]"
    return last


def _keeps_row_major(name: str, x: torch.Tensor, out: Any) -> bool:
    """An op after which ``out`` read in row-major order holds ``x``'s elements in that order (a reshape, a
    copy, a cast) or values computed element by element in place of them (dropout, a head mask)."""
    if name in ROW_MAJOR or name in lineage.KEEP:
        return True
    return (
        name not in lineage.REPLAY
        and isinstance(out, torch.Tensor)
        and tuple(out.shape) == tuple(x.shape)
        and name not in ("sort", "msort", "argsort")
    )


def _zero_one(t: torch.Tensor) -> bool:
    """Every value of ``t`` is 0 or 1."""
    return bool(((t == 0) | (t == 1)).all())


def _zero_one_triangle(m: Any) -> bool:
    """A float tensor of 0s and 1s whose last two axes are a causal mask's triangle in every slice, either way
    round, with or without the diagonal: 1 = kept (``tril(ones)``), where both the query's and the key's
    positions are real (Hugging Face's ``tril * attention_mask``); or 1 = hidden (``triu(ones, 1)``), the
    future and the padded rows and columns."""
    if not isinstance(m, torch.Tensor) or not m.is_floating_point() or m.dim() < 2:
        return False
    lq, lk = int(m.shape[-2]), int(m.shape[-1])
    if lq < 2 or lq != lk or m.numel() > (1 << 24):
        return False
    # the first slice first, a view: a relative-position bias fails there, cheaply
    if not _zero_one(m[(0,) * (m.dim() - 2)]) or not _zero_one(m):
        return False
    ones = torch.ones(lq, lk, dtype=torch.bool, device=m.device)
    every = m == 1
    keep_col, keep_row = every.any(-2, keepdim=True), every.any(-1, keepdim=True)
    hide_col, hide_row = every.all(-2, keepdim=True), every.all(-1, keepdim=True)
    for t in (ones.tril(), ones.tril(-1)):
        if bool((every == (t & keep_col & keep_row)).all()) and bool((every & ones.tril(-1)).any()):
            return True
    for t in (ones.triu(), ones.triu(1)):
        if bool((every == (t | hide_col | hide_row)).all()) and bool((~every & ones.tril(-1)).any()):
            return True
    return False


def _hides_as(m, hidden: torch.Tensor) -> bool:
    """Whether a torch.nn mask ``m`` (bool: True hides; float: added) hides exactly the keys ``hidden``
    (True = hidden) and adds nothing elsewhere."""
    if m is None:
        return False
    if m.dtype == torch.bool:
        return tuple(m.shape[-2:]) == tuple(hidden.shape) and bool((m == hidden.to(m.device)).all())
    if tuple(m.shape[-2:]) != tuple(hidden.shape):
        return False
    h = hidden.to(m.device)
    return bool(((m <= NEG) == h).all()) and bool((m.masked_fill(h, 0) == 0).all())


def _same_weights(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal weights, NaN where the other is NaN."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _mask(b: int, h: int, lq: int, lk: int, attn_mask, key_padding_mask, device):
    """Allowed mask (B, 1, q, k) from MultiheadAttention's arguments, or (B, H, q, k) where a 3-D
    ``attn_mask`` gives each head its own (``m.repeat(H, 1, 1)`` where ``repeat_interleave`` was
    meant masks each head with another sequence's keys); None when nothing is masked (broadcast: a
    padding mask stays one row per sequence)."""
    if attn_mask is None and key_padding_mask is None:
        return None
    allowed = None
    if attn_mask is not None:
        am = _allowed(attn_mask)
        # (B*H, q, k): batch-major, as MultiheadAttention views it
        allowed = am.view(b, h, lq, lk) if am.dim() == 3 else am.view(1, 1, lq, lk)
    if key_padding_mask is not None:
        kpm = _allowed(key_padding_mask).view(b, 1, 1, lk)
        allowed = kpm if allowed is None else allowed & kpm
    assert allowed is not None
    allowed = allowed.to(device)
    if allowed.shape[1] > 1 and bool((allowed == allowed[:, :1]).all()):
        allowed = allowed[:, :1]  # every head the same
    return allowed.expand(b, allowed.shape[1], lq, lk)


def _mha_weights(
    p: dict[str, Any], scores: torch.Tensor | None, by_sdpa: bool = False
) -> tuple[torch.Tensor | None, bool]:
    """(B, H, q, k) weights from the scores and the call's masks, as MultiheadAttention computes them: a
    row with every key masked is NaN by its bmm path (``need_weights=True``), 0 inside SDPA (``by_sdpa``,
    as ``nn.TransformerEncoderLayer`` calls it; a NaN in the data stays NaN either way); None where only
    the module itself can say (learned or static keys, dropout while training). And whether some row
    was weighed 0 so."""
    if scores is None or (p["training"] and p["dropout_p"]) or p["static_v"] is not None:
        return None, False
    b, h, lq, lk = scores.shape
    with _no_grad():
        logits = scores
        masks = []
        if p["attn_mask"] is not None:
            am = p["attn_mask"]
            masks.append(am.view(b, h, lq, lk) if am.dim() == 3 else am)
        kpm = p["key_padding_mask"]
        if kpm is not None:
            masks.append((kpm[None] if p["query"].dim() == 2 else kpm).view(b, 1, 1, lk))
        for m in masks:
            logits = logits.masked_fill(m, float("-inf")) if m.dtype == torch.bool else logits + m
        weights = torch.softmax(logits, dim=-1)
        # a row with every key masked is NaN throughout (its first weight too): looked for only there
        if by_sdpa and masks and bool(torch.isnan(weights[..., :1]).any()):
            dead = torch.isneginf(logits).all(-1, keepdim=True)
            if bool(dead.any()):
                return weights.masked_fill(dead, 0.0), True
        return weights, False


def _mha_scores(p: dict[str, Any], h: int, qk=None) -> torch.Tensor | None:
    """(B, H, q, k) q.k/sqrt(d_head) from F.multi_head_attention_forward's arguments, computed the
    way it computes them (one packed projection, q scaled before the product), so the weights
    made from them equal its own to the bit. ``qk``: the (B, H, L, d) q and k the call itself handed
    to SDPA (its own projection, laid out as it lays them out for its own product): not projected
    again."""
    if p["bias_k"] is not None or p["add_zero_attn"] or p["static_k"] is not None:
        return None
    query, key, value = p["query"], p["key"], p["value"]
    if query.dim() == 2:
        query, key, value = query[:, None], key[:, None], value[:, None]
    lq, b, e = query.shape
    lk, d = key.shape[0], e // h
    if qk is not None and tuple(qk[0].shape) == (b, h, lq, d) and tuple(qk[1].shape) == (b, h, lk, d):
        with _autocast_aside(qk[0].device):  # (SDPA's product of them, in float32 under autocast too)
            q = _as_work(qk[0]).reshape(b * h, lq, d) * math.sqrt(1.0 / float(d))
            return torch.bmm(q, _as_work(qk[1]).reshape(b * h, lk, d).transpose(-2, -1)).view(b, h, lq, lk)
    bias = p["in_proj_bias"]
    if p["use_separate_proj_weight"]:
        b_q = b_k = None
        if bias is not None:
            b_q, b_k = bias[:e], bias[e : 2 * e]
        q = F.linear(query, p["q_proj_weight"], b_q)
        k = F.linear(key, p["k_proj_weight"], b_k)
    elif query is key:  # self-attention: the first two thirds of MHA's packed projection (the values are
        w = p["in_proj_weight"]  # made only when asked for); each output feature is its own row's product
        qk = F.linear(query, w[: 2 * e], None if bias is None else bias[: 2 * e])
        q, k = qk[..., :e], qk[..., e:]
    else:
        packed = getattr(F, "_in_projection_packed", None)  # private: the projection MHA itself runs
        if packed is not None:
            q, k, _ = packed(query, key, value, p["in_proj_weight"], bias)
        else:
            w = p["in_proj_weight"]
            q = F.linear(query, w[:e], None if bias is None else bias[:e])
            k = F.linear(key, w[e : 2 * e], None if bias is None else bias[e : 2 * e])
    q = q.reshape(lq, b * h, d).transpose(0, 1)  # (B*H, q, d), as F.multi_head_attention_forward
    k = k.reshape(lk, b * h, d).transpose(0, 1)
    if not torch.is_autocast_enabled(q.device.type):
        q = q * math.sqrt(1.0 / float(d))
        return torch.bmm(q, k.transpose(-2, -1)).view(b, h, lq, lk)
    with _autocast_aside(q.device):  # projected as autocast projected them, then their
        # product as SDPA makes it under autocast (float32 from the lower dtype's q and k)
        q = _as_work(q) * math.sqrt(1.0 / float(d))
        return torch.bmm(q, _as_work(k).transpose(-2, -1)).view(b, h, lq, lk)


def _as_work(t: torch.Tensor) -> torch.Tensor:
    """A half-precision tensor in float32 (the dtype products of the weights are made in), else as it is."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _mha_values(p: dict[str, Any], h: int, want: tuple[int, int, int]) -> values_.HeadValues | None:
    """MultiheadAttention's values (B, H, k, d), projected as it projects them (on first use), and its
    out_proj's slice per head, the keys it adds after the tokens' included (``add_bias_kv``: its learned
    ``bias_v``; ``add_zero_attn``: a zero value); None with static values."""
    if p.get("static_v") is not None or (p["bias_k"] is None) != (p["bias_v"] is None):
        return None
    value = p["value"].detach()
    if value.dim() == 2:
        value = value[:, None]
    e = int(p["embed_dim_to_check"])
    d = e // h
    bias = p["in_proj_bias"]
    b_v = None if bias is None else bias.detach()[2 * e :]
    w_v = p["v_proj_weight"] if p["use_separate_proj_weight"] else p["in_proj_weight"][2 * e :]
    if w_v is None:
        return None
    w_v = w_v.detach()
    bias_v = None if p["bias_v"] is None else p["bias_v"].detach()
    zero = bool(p["add_zero_attn"])

    def make() -> torch.Tensor | None:
        lk, b = value.shape[0], value.shape[1]
        with torch.no_grad():
            # (under autocast the call projected in the values' dtype: bfloat16 values, float32 weights)
            w, bv = w_v.to(value.dtype), None if b_v is None else b_v.to(value.dtype)
            v = F.linear(value, w, bv).reshape(lk, b, h, d).permute(1, 2, 0, 3)  # (B, H, k, d)
            extra = []  # as F.multi_head_attention_forward appends them: bias_v, then a zero value
            if bias_v is not None:
                extra.append(bias_v.reshape(1, h, 1, d).expand(b, h, 1, d).to(v.dtype))
            if zero:
                extra.append(v.new_zeros(b, h, 1, d))
            if extra:
                v = torch.cat([v, *extra], dim=2)
        return v if tuple(v.shape[:3]) == want else None

    w_o = p["out_proj_weight"].detach()
    w_o = w_o.reshape(w_o.shape[0], h, d).permute(1, 0, 2)  # (H, D, d)
    b_o = p["out_proj_bias"]
    watched = tuple(t for t in (value, w_v, b_v, bias_v) if t is not None)
    return values_.HeadValues(None, w_o, None if b_o is None else b_o.detach(), make=make, watch=watched)


_MIXED_HEADS = (
    "the heads' weights are joined and reduced (averaged or summed over the heads) after the softmax: the record "
    "holds one head's softmax output, not the mix the values are multiplied with"
)
_SCALED_HEADS = (
    "the heads' weights are joined and then scaled (a temperature, a per-head gate) after the softmax: the record "
    "holds the softmax's output, not the weights the values are multiplied with"
)


def _whole_weights(g: _Tag | None) -> _Probs | None:
    """The record whose weights a tag holds unchanged: as the softmax made them, or viewed into another shape
    since (``w.unsqueeze(1)``) with their values kept."""
    if g is None:
        return None
    if g.probs is not None:
        return g.probs
    return g.lost if g.lost is not None and not g.changed and not g.touched else None


def _heads_on_batch(qc: torch.Tensor, unsq: bool) -> bool:
    """Whether SDPA's query codes ``qc`` (..., H, q, d), or (N, q, d) where ``unsq``, hold heads on an axis it
    reads as the batch: two slices of other batch indices whose first rows are one position with other
    features (one sequence's heads: ``(B * H, L, d)`` folds, ``(H, B, L, d)`` head-major). Beams (a sequence
    repeated with the same features) and the heads on SDPA's own head axis are not."""
    first = qc.select(-2, 0).select(-1, 0)  # (..., H) or (N,): each slice's first row's first code
    if unsq:
        first = first[:, None]
    flat = first.reshape(-1, first.shape[-1])  # (batch, H)
    if flat.shape[0] < 2:
        return False
    # (at one index of SDPA's head axis: learned queries expanded over the batch hold one parameter's rows in
    # every sequence, each head its own features, and are no heads on the batch)
    pos = flat >> lineage.SHIFT
    same = (pos[:, None, :] == pos[None, :, :]) & (flat[:, None, :] != flat[None, :, :])  # (batch, batch, H)
    return bool(same.any())


def _paths_named(paths: list[str], most: int = 3) -> str:
    """Module paths a note is about, every one a user may name in ``kinds=`` (up to ``most``, then how many
    more): ``enc.attn, blocks.0.a1``."""
    named = ", ".join(p or "(model)" for p in paths[:most])
    return named + (f" and {len(paths) - most} more" if len(paths) > most else "")


def _read_as_memory(r: Record, cross: list[Record]) -> bool:
    """Whether every query position of ``r`` (lineage's, per sequence) is a key of one of the ``cross``
    records: the positions a cross-attention reads as its memory, an encoder's."""
    q = r.query_positions
    if q is None or q.dim() != 2 or not bool((q >= 0).any()):
        return False
    for c in cross:
        k = c.key_positions
        if k is None or k.dim() != 2 or k.shape[0] != q.shape[0] or k.device != q.device:
            continue
        found = (q[:, :, None] == k[:, None, :]).any(-1) | (q < 0)
        if bool(found.all()):
            return True
    return False


def _given_mask(r: Record) -> torch.Tensor | None:
    """The record's mask where the model gave one (not read from weights that are exactly 0: a saturated
    head's, which a layer's other heads lack)."""
    return None if r.mask_source == "zeros" else r.mask


def _zeros_mask(
    probs: torch.Tensor, scores: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, str | None]:
    """(mask, mask_source) of weights with no mask given: keys no head attended at all, if any, where their
    scores (when there are any to tell by) say a fill the capture did not follow: -inf, or one very negative
    value in every head (-1e9, -100; -1e9 added to scores rounds to nearly one value). Zeros of scores of many
    values are underflow, not a mask: a softmax saturated by a large scale, or a +1e9 given to other keys,
    hides nothing, and no mask is made up for it."""
    if not bool((probs == 0).any()):
        return None, None
    mask = (probs != 0).any(dim=1)
    if scores is not None and tuple(scores.shape) == tuple(probs.shape):
        hidden = scores[(~mask)[:, None].expand(probs.shape)]
        finite = hidden[torch.isfinite(hidden)].double()
        if finite.numel():
            low, high = float(finite.min()), float(finite.max())
            if high > SOFT_NEG or high - low > 1e-3 * abs(low):
                return None, None
    return mask, "zeros"


def _same_places(a: Record, b: Record) -> bool:
    """Whether two maps read the same queries and keys, where lineage placed both (heads of one layer do;
    CSWin's branches, vertical and horizontal stripes of one map, do not)."""
    for x, y in ((a.query_positions, b.query_positions), (a.key_positions, b.key_positions)):
        if x is not None and y is not None and not _equal_positions(x, y):
            return False
    return True


def _same_layer(a: Record | None, b: Record) -> bool:
    """b can be the next head of a's layer: same kind, batch, query and key lengths, same fields."""
    return (
        a is not None
        and b.probs.shape[1] == 1
        and a.kind == b.kind
        and a.source == b.source
        and (a.probs.shape[0], *a.probs.shape[2:]) == (b.probs.shape[0], *b.probs.shape[2:])
        and (a.scores is None) == (b.scores is None)
        and (_given_mask(a) is None) == (_given_mask(b) is None)
    )


def _heads_joined(a: Record, b: Record, name: str) -> Record:
    """One record with b's heads after a's (the layer's module name: the ModuleList of heads)."""
    am, bm = _given_mask(a), _given_mask(b)
    mask, source, differ = am, a.mask_source, a.head_masks_differ or b.head_masks_differ
    probs = torch.cat([a.probs, b.probs], dim=1)
    if am is not None and bm is not None:
        differ = differ or not torch.equal(am, bm)
        mask = am & bm
    elif am is None:  # (weights exactly 0 in some head: keys no head attended, over the heads joined)
        scores = None if a.scores is None or b.scores is None else torch.cat([a.scores, b.scores], dim=1)
        mask, source = _zeros_mask(probs, scores)
    checks = [c for c in (a.check, b.check) if c is not None]
    return Record(  # the heads of a layer: exact only if every head is, learned keys as the first head's
        name,
        a.kind,
        probs,
        None if a.scores is None or b.scores is None else torch.cat([a.scores, b.scores], dim=1),
        mask,
        a.source,
        source,
        max(checks) if checks else None,
        differ,
        a.exact and b.exact,
        a.flag or b.flag,
        a.key_labels,
        a.query_labels,
        seq=a.seq,  # (the layer's first head: which call of the model made it)
        # the positions every head read, where they read the same (a layer's heads do)
        query_positions=a.query_positions if _equal_positions(a.query_positions, b.query_positions) else None,
        key_positions=a.key_positions if _equal_positions(a.key_positions, b.key_positions) else None,
        values=_head_values_joined(a.values, b.values),
    )


def _head_values_joined(
    a: values_.HeadValues | None, b: values_.HeadValues | None
) -> values_.HeadValues | None:
    """The values of two records' heads joined (b's after a's), with their W_O slices where both have one from
    the same projection (else the values alone: "without the output projection" for all of them)."""
    if a is None or b is None:
        return None
    w_o = b_o = None
    if (
        a.w_o is not None
        and b.w_o is not None
        and tuple(a.w_o.shape[1:]) == tuple(b.w_o.shape[1:])
        and (a.b_o is None) == (b.b_o is None)
        and (a.b_o is None or (b.b_o is not None and torch.equal(a.b_o, b.b_o)))
    ):
        w_o, b_o = torch.cat([a.w_o, b.w_o]), a.b_o

    def make() -> torch.Tensor | None:  # (read when asked: each part's own checks first)
        va, vb = a.values, b.values
        if va is None or vb is None or va.shape[0] != vb.shape[0] or va.shape[2:] != vb.shape[2:]:
            return None
        return torch.cat([va, vb], dim=1)

    return values_.HeadValues(make=make, w_o=w_o, b_o=b_o)


def _sequences_joined(rows: list[Record]) -> Record | None:
    """One record of the sequences a model ran one at a time (each (1, H, q, k), in order), or None where
    they are not maps of one layer (other kinds, shapes, labels, or fields)."""
    a = rows[0]
    if any(r.kind != a.kind or r.probs.shape[1:] != a.probs.shape[1:] or r.key_labels != a.key_labels
           or r.query_labels != a.query_labels or (_given_mask(r) is None) != (_given_mask(a) is None)
           or (r.scores is None) != (a.scores is None) for r in rows[1:]):  # fmt: skip
        return None
    probs = torch.cat([r.probs for r in rows])
    given = [_given_mask(r) for r in rows]
    scores = None if a.scores is None else torch.cat([r.scores for r in rows if r.scores is not None])
    mask, source = (torch.cat([m for m in given if m is not None]), a.mask_source) if given[0] is not None else (
        _zeros_mask(probs, scores if scores is not None and scores.shape == probs.shape else None))  # fmt: skip
    return replace(
        a,
        probs=probs,
        scores=None if a.scores is None else torch.cat([r.scores for r in rows if r.scores is not None]),
        mask=mask,
        mask_source=source,
        head_masks_differ=any(r.head_masks_differ for r in rows),
        exact=all(r.exact for r in rows),
        flag=next((r.flag for r in rows if r.flag), None),
        values=None,
        residual_of=None,
        query_positions=_joined_positions([r.query_positions for r in rows]),
        key_positions=_joined_positions([r.key_positions for r in rows]),
    )


def _joined_positions(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """(B, n) positions of records joined along the batch, where every one has them, of one length."""
    if any(p is None for p in parts) or len({(p.shape[-1], p.device) for p in parts if p is not None}) != 1:
        return None
    return torch.cat([p for p in parts if p is not None])


def _view_index(view: torch.Tensor, base: torch.Tensor) -> tuple[int | slice, ...] | None:
    """The index ``base[index]`` that is ``view`` (ints and step-1 slices, one per dim of ``base``), where
    ``view`` is such a view of a contiguous ``base``; None for any other view (transposed, strided, reshaped)."""
    if not base.is_contiguous() or view.dim() > base.dim():
        return None
    off = int(view.storage_offset() - base.storage_offset())
    if off < 0:
        return None

    def place(d: int, j: int, off: int) -> Iterator[list[int | slice]]:
        """Every way base dims d.. hold view dims j..: each view dim one base dim (a slice of it, in order),
        every other base dim one index (the strides of a contiguous tensor decrease: the offset splits one way)."""
        if d == base.dim():
            if j == view.dim() and off == 0:
                yield []
            return
        step, size = base.stride(d), int(base.shape[d])
        at = off // step if step else 0
        if at >= size:
            return
        rest = off - at * step
        if j < view.dim() and (view.stride(j) == step or view.shape[j] == 1):
            n = int(view.shape[j])  # a slice of this dim (a dim of one element may have any stride)
            if at + n <= size:
                whole = slice(None) if at == 0 and n == size else slice(at, at + n)
                yield from ([whole, *tail] for tail in place(d + 1, j + 1, rest))
        yield from ([at, *tail] for tail in place(d + 1, j, rest))  # one index of this dim

    # dims of one element make several ways (``data[0]`` of a (2, 1, ...) buffer is also ``data[0:1, 0]``): the one
    # with the fewest partial slices
    ways = [tuple(w) for w in place(0, 0, off)]
    return min(ways, key=lambda w: sum(isinstance(i, slice) and i != slice(None) for i in w), default=None)


def _permuted_whole(t: torch.Tensor) -> bool:
    """``t`` is a float tensor from outside with its axes swapped (``k.transpose(-2, -1)``, ``k.mT``): a view of
    the whole of a contiguous tensor, in another order."""
    base = t._base
    return (
        isinstance(base, torch.Tensor)
        and t.is_floating_point()
        and base.is_floating_point()
        and base.dim() == t.dim() >= 2
        and base.is_contiguous()
        and not _is_param(base)
        and sorted(t.shape) == sorted(base.shape)
        and sorted(t.stride()) == sorted(base.stride())
        and t.storage_offset() == base.storage_offset()
    )


def _join_pieces(pieces: list[tuple[Record, Layout]], sources: lineage.Sources) -> Record | str | None:
    """One record (B, H, q, k) from the pieces of one attention call computed in slices of its batch x
    heads (diffusers' sliced attention) or in chunks of queries (memory-efficient attention), each
    recorded exactly with its lineage; or why they do not make one map. Every piece's rows are
    placed by their codes: the head by its feature, the sequence by its keys' positions, the queries
    in the order the model computed them. Nothing is assumed of the slicing: every (sequence, head)
    must be there with the same queries, none twice. None where the maps read their queries or keys
    from different inputs: two attentions written inline in one call (tokens to image, then image to
    tokens), not pieces of one, left as they are."""
    first = pieces[0][0]
    Unit = tuple[tuple[int, ...], int]  # (the sequence's key positions, the head's feature)
    units: dict[Unit, list[tuple[int, int, int]]] = {}  # -> (piece, b, h) in the order computed
    queries: dict[Unit, list[int]] = {}
    # each piece's query inputs, the rows of them its queries are in, and its key inputs
    asked: list[tuple[frozenset[int], frozenset[int], frozenset[int]]] = []
    for _, lay in pieces:
        seq_keys = lay.seq_keys
        kpos = seq_keys[seq_keys >= 0] if seq_keys is not None else lay.qcode[:0]
        qpos = lay.qcode >> lineage.SHIFT
        qsrc = sources.index(qpos)
        asked.append((frozenset(qsrc.unique().tolist()),
                      frozenset((qsrc * (1 << 32) + sources.rows(qpos)).unique().tolist()),
                      frozenset(sources.index(kpos).unique().tolist())))  # fmt: skip
    # queries from other inputs are two attentions (tokens to image, then back), and so are queries from the same
    # rows of their input over keys from other inputs (text keys, then an image's; or half the queries over
    # each): not pieces of one. Keys from other inputs for other rows of the queries' input are other sequences'
    # (guidance's two halves, each half's context its own embedding call)
    if len({q for q, _, _ in asked}) > 1 or any(
        r1 & r2 and k1 != k2 for i, (_, r1, k1) in enumerate(asked) for _, r2, k2 in asked[i + 1 :]
    ):
        return None
    if any(r.probs.shape[-1] != first.probs.shape[-1] for r, _ in pieces[1:]):
        varlen = _join_varlen(pieces, sources)
        if varlen is not None:
            return varlen
    kinds = {r.kind for r, _ in pieces}
    for i, (r, lay) in enumerate(pieces):
        if (r.probs.shape[-1] != first.probs.shape[-1] or r.key_labels != first.key_labels
                or r.query_labels != first.query_labels or r.source != first.source or not r.exact
                or (r.kind != first.kind and kinds != {"enc_self", "dec_self"})):  # fmt: skip
            return "the pieces differ in their keys, kind or labels"
        seq_keys = lay.seq_keys
        if seq_keys is None or bool((seq_keys < 0).all(-1).any()):
            return "a piece's keys name no sequence"
        qc = lay.qcode.to(lay.rows.device)[lay.rows]  # (B, H, q)
        for b in range(int(r.probs.shape[0])):
            keys = tuple(seq_keys[b].tolist())
            for h in range(int(r.probs.shape[1])):
                unit = (keys, int(qc[b, h, 0]) & lineage.FEATURES)
                units.setdefault(unit, []).append((i, b, h))
                queries.setdefault(unit, []).extend((qc[b, h] >> lineage.SHIFT).tolist())
    seqs = sorted({keys for keys, _ in units}, key=lambda k: min(p for p in k if p >= 0))
    heads = sorted({f for _, f in units})
    if len(units) != len(seqs) * len(heads):
        return "some sequence lacks a head"
    for unit, held in units.items():  # queries a chunk at a time: parts of the keys' own sequence (of cross-
        # attention, chunks of queries and a decoder's steps written inline look the same to lineage: not joined)
        if len({i for i, _, _ in held}) > 1 and not set(queries[unit]) <= set(unit[0]):
            return (
                "pieces over the same keys hold queries from outside those keys' sequence (keys the "
                "batch shares, or queries from another input), so their sequences cannot be told apart"
            )
    for s in seqs:
        qs = [queries[(s, f)] for f in heads]
        if any(q != qs[0] for q in qs) or len(set(qs[0])) != len(qs[0]):
            return "the heads of a sequence hold different queries, or a query twice"
    if len({len(queries[(s, heads[0])]) for s in seqs}) != 1:
        return "sequences hold different numbers of queries"

    rows = [
        sources.rows(torch.tensor([p for p in keys if p >= 0], dtype=torch.int64)).unique()
        for keys in seqs
        if _rows_known(sources.at(min(p for p in keys if p >= 0)))
    ]
    one_row = [int(r) for r in rows if r.numel() == 1 and int(r) >= 0]
    if len(set(one_row)) < len(one_row):
        # keys of two pieces from one row of the batch: documents packed into a row (or windows of one
        # sequence), each attended on its own: not sequences of their own, and not drawn as rows of the batch
        return _join_varlen(pieces, sources) or (
            "pieces over different keys of one row of the batch (documents packed into a row, or windows of one "
            "sequence, each attended on its own) could not be placed in that row's map"
        )

    def joined(get: Callable[[Record], torch.Tensor]) -> torch.Tensor:
        """(B, H, q, ...) from every unit's rows of ``get(piece)`` (B', H', q', ...), queries in order."""
        return torch.stack([torch.stack([torch.cat([get(pieces[i][0])[b, h] for i, b, h in units[(s, f)]])
                                         for f in heads]) for s in seqs])  # fmt: skip

    probs = joined(lambda r: r.probs)
    scores = joined(lambda r: r.scores) if all(r.scores is not None for r, _ in pieces) else None  # type: ignore[arg-type,return-value]
    mask, differ = None, any(r.head_masks_differ for r, _ in pieces)
    if any(r.mask is not None for r, _ in pieces):
        per_head = joined(lambda r: (torch.ones(r.probs.shape[0], *r.probs.shape[2:], dtype=torch.bool,
                                                device=r.probs.device) if r.mask is None else r.mask
                                     ).unsqueeze(1).expand(r.probs.shape))  # fmt: skip
        mask = per_head.all(dim=1)
        differ = differ or not bool((per_head == mask[:, None]).all())
    kind = first.kind
    if len(kinds) > 1:  # chunks of a causal self-attention's queries: the last chunk's mask hides nothing
        # from its own rows (the rows before it are elsewhere), so alone it read as an encoder's; joined, the
        # mask says
        if mask is None or not _is_causal_mask(mask):
            return "the pieces differ in their kind (some encoder self-attention, some decoder)"
        kind = "dec_self"
    checks = [r.check for r, _ in pieces if r.check is not None]
    # the values do not depend on the query: each (sequence, head)'s from the first piece that holds it
    where = [[units[(s, f)][0] for f in heads] for s in seqs]
    values = _joined_values([r.values for r, _ in pieces], where)
    qpos = torch.tensor([queries[(s, heads[0])] for s in seqs], dtype=torch.int64)  # (B, q), as joined
    kpos = torch.tensor([list(s) for s in seqs], dtype=torch.int64)  # (B, k): each sequence's keys
    return Record(first.name, kind, probs, scores, mask, first.source,
                  next((r.mask_source for r, _ in pieces if r.mask_source), None), max(checks) if checks else None,
                  differ, True, None, first.key_labels, first.query_labels, values, seq=first.seq,
                  query_positions=qpos.to(probs.device), key_positions=kpos.to(probs.device))  # fmt: skip


def _rows_known(source: lineage.Source) -> bool:
    """Token ids whose rows are the caller's sequences: a batch (B, L), one sequence (1, L). Ids of one dim are one
    sentence, or a batch packed into a stream (``ids[valid]``), whose sequences only the calls over them tell."""
    return source.kind == "tokens" and (source.row > 0 or source.lead == (1,))


def _join_varlen(pieces: list[tuple[Record, Layout]], sources: lineage.Sources) -> Record | None:
    """One record (B, H, L, L) of a batch's sequences attended one call each over their own lengths, with
    no padding (``attn(x[i:i + 1, :n_i])`` in a loop), or of documents packed into the rows and attended one
    call each (a loop over ``cu_seqlens``): each piece's queries and keys are positions of one row of the
    batch, every row reached, no query of a row twice. Each map goes to its own row and positions; what no
    call computed (keys and queries past a sequence's length, another document's keys) weighs 0 and is
    masked. None where the pieces are not that (a subset of the rows, learned keys)."""
    first = pieces[0][0]
    heads = int(first.probs.shape[1])
    src: int | None = None
    placed: list[tuple[int, int, int, torch.Tensor, torch.Tensor]] = []  # (piece, its row, batch row, q, k)
    for i, (r, lay) in enumerate(pieces):
        if (int(r.probs.shape[1]) != heads or not r.exact or r.kind not in ("enc_self", "dec_self")
                or r.source != first.source or r.key_labels is not None or r.query_labels is not None):  # fmt: skip
            return None
        keys = lay.seq_keys
        if keys is None or keys.shape[0] != r.probs.shape[0] or bool((keys < 0).any()):
            return None
        qpos = lay.qcode.to(lay.rows.device)[lay.rows] >> lineage.SHIFT  # (B', H, q)
        if qpos.shape[-1] != r.probs.shape[2] or not bool((qpos == qpos[:, :1]).all()):
            return None  # (every head over the same queries)
        for b in range(int(r.probs.shape[0])):
            both = torch.cat([qpos[b, 0], keys[b].to(qpos.device)])
            at = sources.index(both).unique()
            if at.numel() != 1 or (src is not None and int(at) != src):
                return None
            src = int(at)
            source = sources.items[src]
            if not _rows_known(source):
                return None
            rel = both - source.start
            in_row = rel // (source.row or source.n)  # (row 0: one row, the whole source)
            col = rel % (source.row or source.n)
            q = int(qpos.shape[-1])
            if (
                not bool((in_row == in_row[0]).all())
                or col[:q].unique().numel() != q
                or col[q:].unique().numel() != col[q:].numel()
            ):
                return None
            placed.append((i, b, int(in_row[0]), col[:q], col[q:]))
    if src is None:
        return None
    source = sources.items[src]
    length = source.row or source.n
    n_rows = source.n // length
    if sorted({p[2] for p in placed}) != list(range(n_rows)):
        return None  # (every row of the batch)
    for row in range(n_rows):  # several calls in one row (documents packed into it, each attended on its own)
        cols = [int(c) for p in placed if p[2] == row for c in p[3].tolist()]  # place no query twice
        if len(set(cols)) != len(cols):
            return None
    probs = first.probs.new_zeros(n_rows, heads, length, length)
    mask = torch.zeros(n_rows, length, length, dtype=torch.bool, device=probs.device)
    keep_scores = all(r.scores is not None for r, _ in pieces)
    scores = probs.new_full(probs.shape, float("-inf")) if keep_scores else None
    for i, b, row, qc, kc in placed:
        r = pieces[i][0]
        qi, ki = qc.to(probs.device)[:, None], kc.to(probs.device)[None, :]
        probs[row][:, qi, ki] = r.probs[b]
        if scores is not None and r.scores is not None:
            scores[row][:, qi, ki] = r.scores[b].to(scores.dtype)
        mask[row][qi, ki] = True if r.mask is None else r.mask[b].to(mask.device)
    kind = first.kind
    if len({r.kind for r, _ in pieces}) > 1:  # chunks of a causal self-attention's queries: the last chunk's
        if not _is_causal_mask(mask):  # mask hides nothing from its own rows; joined, the mask says
            return None
        kind = "dec_self"
    checks = [r.check for r, _ in pieces if r.check is not None]
    hvs = [r.values for r, _ in pieces]
    values = None
    if all(hv is not None for hv in hvs):

        def make() -> torch.Tensor | None:
            vs = [hv.values for hv in hvs if hv is not None]
            if any(v is None for v in vs) or any(
                tuple(v.shape[:3]) != (int(r.probs.shape[0]), heads, int(r.probs.shape[3]))  # type: ignore[union-attr]
                for v, (r, _) in zip(vs, pieces, strict=True)
            ):
                return None
            out = vs[0].new_zeros(n_rows, heads, length, vs[0].shape[-1])  # type: ignore[union-attr]
            for i, b, row, _, kc in placed:
                out[row][:, kc.to(out.device)] = vs[i][b]  # type: ignore[index]
            return out

        w_o = hvs[0].w_o if all(hv.w_o is not None for hv in hvs if hv is not None) else None  # type: ignore[union-attr]
        values = values_.HeadValues(w_o=w_o, b_o=hvs[0].b_o if w_o is not None else None, make=make)  # type: ignore[union-attr]
    # every row's positions, in order: the queries and the keys of the map (layers of one forward read the same)
    pos = (source.start + torch.arange(n_rows * length, dtype=torch.int64, device=probs.device)).view(
        n_rows, -1
    )
    return Record(first.name, kind, probs, scores, mask, first.source,
                  next((r.mask_source for r, _ in pieces if r.mask_source), None) or "lengths",
                  max(checks) if checks else None, any(r.head_masks_differ for r, _ in pieces), True, None,
                  None, None, values, seq=first.seq, query_positions=pos, key_positions=pos)  # fmt: skip


def _joined_values(
    hvs: list[values_.HeadValues | None], where: list[list[tuple[int, int, int]]]
) -> values_.HeadValues | None:
    """The values of pieces joined into one record: (sequence, head) -> (piece, b, h) in ``where``;
    the output projection's slice per head where every piece found its own."""
    held = [hv for hv in hvs if hv is not None]
    if len(held) != len(hvs):
        return None

    def make() -> torch.Tensor | None:
        vs = [hv.values for hv in held]
        if any(v is None for v in vs):
            return None
        return torch.stack([torch.stack([vs[i][b, h] for i, b, h in row]) for row in where])  # type: ignore[index]

    w_o = None
    if all(hv.w_o is not None for hv in held):
        w_o = torch.stack([held[i].w_o[h] for i, _, h in where[0]])  # type: ignore[index]
    return values_.HeadValues(w_o=w_o, b_o=held[0].b_o if w_o is not None else None, make=make)


_CALL_IMPL = getattr(getattr(nn.Module, "_call_impl", None), "__code__", None)


def _running_modules() -> builtins.set[int]:
    """The ids of the modules whose calls are on this thread's stack now."""
    running: builtins.set[int] = set()
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _CALL_IMPL:
            obj = frame.f_locals.get("self")
            if obj is not None:
                running.add(id(obj))
        frame = frame.f_back
    return running


def _module_call(frame: FrameType, module: nn.Module) -> FrameType:
    """The frame of the call of ``module`` that ``frame`` runs in (``Module._call_impl``'s, alive for the
    whole call, whichever of its methods made the op), or ``frame`` where none is nearby."""
    up: FrameType | None = frame
    for _ in range(8):
        up = up.f_back if up is not None else None
        if up is None:
            break
        if up.f_code is _CALL_IMPL and up.f_locals.get("self") is module:
            return up
    return frame


_GROUPS: dict[str, tuple[str, int] | None] = {}


def _head_group(path: str) -> tuple[str, int] | None:
    """(parent, index) of a module path that is one item of a list of per-head modules, or None."""
    if path in _GROUPS:
        return _GROUPS[path]
    item = _HEAD_ITEM.match(path)
    group = (item["parent"], int(item["i"])) if item else None
    if len(_GROUPS) >= 4096:
        _GROUPS.clear()
    _GROUPS[path] = group
    return group


def _joined_otherwise(p: _Probs, out: torch.Tensor) -> bool:
    """Whether ``out``, pieces of the weights ``p`` joined back to their shape, holds other weights than
    the record at some place (pieces joined in another order)."""
    rec = p.record
    if rec is None:
        return False
    try:
        with _no_grad():
            used = p.bhqk(out.detach())
            return tuple(used.shape) != tuple(rec.probs.shape) or not bool(
                torch.equal(used.to(rec.probs.dtype), rec.probs)
            )
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return True


def _moved_values(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether a data-movement op that kept ``x``'s shape put other values at some place of ``out`` (a
    view of the same memory read the same way holds the same ones)."""
    try:
        if out.data_ptr() == x.data_ptr() and out.stride() == x.stride() and out.dtype == x.dtype:
            return False
        with _no_grad():
            return not bool(torch.equal(out.detach(), x.detach()))
    except (RuntimeError, TypeError, NotImplementedError):  # (tensor subclasses, functorch wrappers)
        return True


def _writes_first(name: str) -> bool:
    """Whether the op writes into its first argument: ``x.add_(y)``, ``x += y``, ``x[i] = y``."""
    return name in WRITES or (name[-1:] == "_" and name[:1] != "_")


def _table_id(args) -> int:
    """The id of the table an embedding lookup reads (its weight, the second argument), 0 where none."""
    return id(args[1]) if len(args) > 1 and isinstance(args[1], torch.Tensor) else 0


def _storage_at(t: Any) -> int:
    """The address of a tensor's memory (0: none, or not a plain tensor's)."""
    if not isinstance(t, torch.Tensor):
        return 0
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):  # (tensor subclasses, functorch wrappers)
        return 0


_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _storage_users(t: torch.Tensor) -> int:
    """How many tensors hold ``t``'s memory (-1 where torch cannot say: then it counts as shared)."""
    if _USE_COUNT is None:
        return -1
    try:
        return int(_USE_COUNT(t.untyped_storage()._cdata)) - 1  # (less the storage asked)
    except (RuntimeError, TypeError, AttributeError):
        return -1


def _cast_down(src: torch.dtype, dst: torch.dtype) -> bool:
    """A cast from one floating dtype to a less precise one (float32 -> bfloat16)."""
    return src.is_floating_point and dst.is_floating_point and torch.finfo(dst).eps > torch.finfo(src).eps


def _no_grad() -> Any:
    """torch.no_grad() where gradients are on; a no-op context where they are off already."""
    return torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext()


def _autocast_aside(device: torch.device) -> Any:
    """Autocast set aside on ``device`` where it is on: capture's own products of the weights run in the dtype
    it asks for (float32, as SDPA's kernels accumulate), not autocast's lower one."""
    try:
        on = torch.is_autocast_enabled(device.type)
    except (RuntimeError, TypeError):  # (a device type autocast does not know)
        on = False
    return torch.autocast(device.type, enabled=False) if on else contextlib.nullcontext()


def _is_causal_mask(mask: torch.Tensor | None) -> bool | None:
    """No query may see a later key, and some query sees an earlier one: plain causal masks, causal
    masks with padding (of any sequence) and sliding windows (Mistral) alike. None (not causal) where a
    prefix LM's mask and an encoder's explain it alike (``_prefix_causal``)."""
    if mask is None or mask.shape[-1] < 2:
        return False
    while mask.dim() > 2 and mask.stride(0) == 0:  # the same mask for every sequence: check one
        mask = mask[0]
    lq, lk = mask.shape[-2], mask.shape[-1]
    if lq > lk:  # queries over fewer keys (blocks pooled from the sequence: NSA's compressed branch): causal
        # where every row sees a run of the first keys that grows row by row, and some row not every key
        if mask.stride(-2) == 0:
            return False
        seen = mask.sum(-1)
        first = torch.arange(lk, device=mask.device) < seen[..., None]
        return (
            bool(torch.equal(mask, first))
            and bool((seen[..., 1:] >= seen[..., :-1]).all())
            and bool((seen[..., 1:] > seen[..., :-1]).any())
            and bool((seen < lk).any())
        )
    if lq < lk:  # a chunk of queries (or the last ones) over more keys: causal if no query sees a key
        # further ahead than the chunk's offset allows, rows see different keys (a padding mask's rows
        # are all the same) and some query sees an earlier key
        if lq < 2 or mask.stride(-2) == 0 or not bool(mask.any()):
            return False
        i = torch.arange(lq, device=mask.device)[:, None]
        j = torch.arange(lk, device=mask.device)[None, :]
        ahead = int((j - i).masked_fill(~mask, -lk).amax())  # the furthest key ahead of its row
        rows_differ = bool((mask != mask[..., :1, :]).any())
        return 0 <= ahead <= lk - lq and rows_differ and bool(mask.tril(ahead - 1).any())
    if mask.stride(-2) == 0:  # one row for every query (a padding mask): no triangle (a sequence of one token
        return False  # and padding shows one too in a decoder: ``_undecided`` says so)
    # rows that see every key say nothing where they are a causal mask's last row, or a padding position's
    # (its key seen by no other row: a left-padded query row that a model left unmasked, as ChatGLM's
    # get_masks does): the other rows decide. A full row elsewhere sees later keys: no causal mask
    full = mask.all(-1, keepdim=True)
    other = mask & ~full
    # a full row whose own key no other row sees (where every row of a sequence sees every key, none: that
    # sequence is bidirectional)
    said = full[..., 0] & ~other.any(-2)[..., :lq] & ~full.all(-2)
    said[..., -1] |= full[..., -1, 0]
    rows = mask & ~said[..., None]
    if bool((full[..., 0] & ~said).any()):
        rows = mask
    if not bool(rows.any()):  # every row sees every key or none (a padding mask over the queries,
        return False  # ``am[:, None, :, None]``, a (B, L, 1) mask): no triangle, whatever is left out
    if not bool(rows.triu(1).any()):  # (a causal mask's full last row still shows its earlier keys)
        # a triangle: rows of one sequence that see different numbers of keys (a padding mask given per
        # query shows one row over and over: a sequence of one token's padded rows each see key 0)
        n = mask.sum(-1)
        seen = n > 0
        most = torch.where(seen, n, -1).amax(-1)
        least = torch.where(seen, n, mask.shape[-1] + 1).amin(-1)
        return not bool(full.all()) and bool(mask.tril(-1).any()) and bool((most > least).any())
    prefix = _prefix_causal(mask)
    if prefix is False and _block_causal(mask):
        return True
    if prefix is False and _one_way(mask):
        # (a row past the rest that sees them and itself alone reads as an encoder's padding row that sees itself
        # too: undecided, said)
        return None if _encoder_explains(mask) else True
    return prefix


def _gate_of_blocks(t: torch.Tensor) -> bool:
    """Scores made into a mask: 0 where kept, very negative where hidden, nothing else (MoBA's gate, each query's
    top-k key blocks picked by its scores over the blocks' mean keys, then ``gate[need] = 0; gate[~need] = -inf``):
    added to the scores, a mask of its own, per head."""
    with _no_grad():
        hides = _added_hides(t)
        return bool(hides.any()) and bool((t.detach().masked_fill(hides, 0) == 0).all())


def _unique_in_order(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(rows, dim=0, return_inverse=True)`` with the distinct rows numbered in the order they first
    come, not sorted."""
    kinds, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if not bool((inverse[1:] < inverse[:-1]).any()):
        return kinds, inverse
    first = torch.full((len(kinds),), len(inverse), dtype=torch.int64, device=inverse.device)
    first.scatter_reduce_(0, inverse, torch.arange(len(inverse), device=inverse.device), "amin")
    order = torch.argsort(first)
    return kinds[order], torch.argsort(order)[inverse]


def _einsum_axis(equation: str, ndim: int) -> int | None:
    """Of ``einsum(equation, weights, values)``: the values' axis that the weights' last axis is summed with
    (``"bhnw,bhndw->bhnd"``: 4, the window's), or None where it is kept, or the equation is not two operands'."""
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, rhs = eq.split("->")
    sides = lhs.split(",")
    if len(sides) != 2 or not sides[0] or len(sides[1]) != ndim:
        return None
    last = sides[0][-1]
    return None if last in rhs or last not in sides[1] else sides[1].index(last)


def _features_of(c: torch.Tensor, dim: int) -> torch.Tensor:
    """The feature codes along ``dim`` of codes ``c`` (those of its first cell: a projection's features are the
    same at every position), or 0.. along it where ``c`` holds no cell."""
    rows = c.movedim(dim, -1).reshape(-1, int(c.shape[dim]))
    if not rows.shape[0]:
        return torch.arange(int(c.shape[dim]), dtype=c.dtype, device=c.device)
    return rows[0] & lineage.FEATURES


def _causal_off_by_one(mask: torch.Tensor) -> bool:
    """A causal mask one key too far: each query sees every key up to the one after its own and none further (the
    keys no row sees, padding, aside), some query sees its next key, and some a key another does not."""
    lq, lk = int(mask.shape[-2]), int(mask.shape[-1])
    # (one row for every query, a padding mask's: no key some row sees is hidden from another)
    if lq != lk or lq < 3 or mask.dtype != torch.bool or mask.stride(-2) == 0:
        return False
    if bool(mask[..., 0, 2:].any()):  # (a first row that sees a key past its next: not one too far)
        return False
    keys = mask.any(-2, keepdim=True)  # (the keys some row sees: padding aside)
    band = torch.ones(lq, lk, dtype=torch.bool, device=mask.device)
    want = band.tril(1) & keys
    return (
        bool(torch.equal(mask, want.expand_as(mask)))
        and bool((mask & (band.tril(1) & ~band.tril(0))).any())
        and bool((keys & ~mask).any())  # (a key some row sees hidden from another: no padding mask alone)
    )


def _one_way(mask: torch.Tensor) -> bool:
    """Among a sequence's real positions (rows that see their own key), some later one sees an earlier one that
    does not see it back, none the other way, and each real row sees one run of the real positions, the runs
    moving forward row by row: a decoder's
    visibility, whatever else is bidirectional (a multimodal decoder's image block among causal text, Gemma 3's
    with a sliding window; a prefix LM's prefix before one causal token, padded). An encoder's masks (padding,
    windows, packed documents, global tokens) are symmetric among real positions, and keys the data picks (each
    head's top-k) leave holes."""
    lq, lk = mask.shape[-2], mask.shape[-1]
    if lq != lk or lq < 2:
        return False
    real = mask.diagonal(dim1=-2, dim2=-1)  # (..., q)
    a = mask & real[..., :, None] & real[..., None, :]
    later = a.tril(-1)  # row i sees key j < i
    earlier = a.transpose(-1, -2).tril(-1)  # row j < i sees key i
    if not bool((later & ~earlier).any()) or bool((earlier & ~later).any()):
        return False
    j = torch.arange(lk, device=mask.device)
    lo = torch.where(a, j, lk).amin(-1).clamp_max(lk - 1)
    hi = torch.where(a, j, -1).amax(-1).clamp_min(0)
    count = real.long().cumsum(-1)  # (..., k) real positions up to each key
    between = count.gather(-1, hi) - count.gather(-1, lo) + 1
    if not bool(((between == a.sum(-1)) | ~real).all()):
        return False
    # and the runs move forward row by row (later rows reach no less far, and start no earlier): a window or a
    # block slides along, as no union of keys the data picked does
    reach = torch.where(real, hi, -1)
    start = torch.where(real, lo, -1)
    if not (
        bool((reach == reach.cummax(-1).values.masked_fill(~real, -1)).all())
        and bool((start == start.cummax(-1).values.masked_fill(~real, -1)).all())
    ):
        return False
    # and a row that sees later keys sees them as a block of its own: the last key it sees is a real row that sees
    # no further (a multimodal decoder's image block, a prefix LM's prefix). Rows that each see a little further
    # than the one before (d2l's per-query valid lengths, a window over both sides) are no decoder's
    ahead = real & (hi > torch.arange(lq, device=mask.device))
    if bool(ahead.any()):
        ends = real.gather(-1, hi) & (hi.gather(-1, hi) == hi)
        if bool((ahead & ~ends).any()):
            return False
    return True


def _chunked(mask: torch.Tensor) -> bool:
    """Causal by blocks (``_block_causal``, or ``_one_way``: blocks that see a window of the earlier ones), two
    blocks at least of more than one position in some sequence: a
    streaming encoder's chunks and a decoder's frames or steps (a prefix LM's one block before its causal
    tokens is a decoder's only)."""
    if not (_block_causal(mask) or _one_way(mask)):
        return False
    j = torch.arange(mask.shape[-1], device=mask.device)
    far = torch.where(mask, j, -1).amax(-1)  # (..., q) each row's block's last key
    own = mask.diagonal(
        dim1=-2, dim2=-1
    )  # (rows of real positions: a padded query row sees no key of its own)
    rows, owns = far.reshape(-1, far.shape[-1]), own.reshape(-1, own.shape[-1])
    for row, real in zip(rows, owns, strict=True):
        _, sizes = torch.unique_consecutive(row[real], return_counts=True)
        if int((sizes > 1).sum()) >= 2:
            return True
    return False


def _block_causal(mask: torch.Tensor) -> bool:
    """Causal by blocks (a world model's frames, Gato's steps): each position sees every position of its own
    block and of the blocks before, none after; two blocks at least in some sequence, one of them of more than
    one position (a plain causal mask is one position a block). Padding keys no row sees are left aside. An
    encoder's mask (one block) and packed documents (no earlier block seen) are not."""
    lq, lk = mask.shape[-2], mask.shape[-1]
    if lq != lk or lq < 3:
        return False
    j = torch.arange(lk, device=mask.device)
    far = torch.where(mask, j, -1).amax(-1)  # (..., q) the furthest key each row sees
    keys = mask.any(-2, keepdim=True)  # (..., 1, k) keys some row sees (not padding)
    sees = far >= 0
    if not bool(((mask == ((j <= far[..., None]) & keys)) | ~sees[..., None]).all()):
        return False  # a row that sees other keys than every (real) key up to its furthest
    own = mask.diagonal(dim1=-2, dim2=-1) & sees  # rows of real positions
    i = torch.arange(lq, device=mask.device)
    if bool((own & (far < i)).any()):
        return False
    reach = torch.where(own, far, -1)
    if not bool((reach == reach.cummax(-1).values.masked_fill(~own, -1)).all()):
        return False  # (later rows reach no less far)
    ends = far.clamp_min(0)
    if not bool((~own | own.gather(-1, ends) & (far.gather(-1, ends) == ends)).all()):
        return False  # a block's last row is a real one and ends it
    # (...,) blocks per sequence: the block ends real rows reach (a padded row reaching one writes nothing)
    blocks = torch.zeros_like(own, dtype=torch.int64).scatter_reduce(-1, ends, own.long(), "amax").sum(-1)
    return bool((blocks >= 2).any()) and bool((own & (far > i)).any())


def _undecided(mask: torch.Tensor | None, lq: int) -> bool:
    """Self-attention whose mask looks the same in an encoder and in a decoder: one query over one key, or
    every sequence one token and padding (each row that sees a key sees the same ones, none after itself)."""
    if lq == 1:
        return True
    if mask is None or mask.shape[-1] == 1:  # (no mask, or one broadcast over the keys: the same for each, no
        return False  # triangle: CANINE's (B, 1, 1) over its molecules)
    if bool(mask[..., 0, 1:].any()):
        return False  # (a first row that sees a later key: every padded encoder's, asked once)
    if not bool(mask.any()):
        return False
    seen = mask.any(-1)  # (..., q)
    if mask.shape[-1] == lq:  # every query that sees a key sees its own alone (packed one-token documents,
        own = torch.eye(lq, dtype=torch.bool, device=mask.device)  # an identity mask): as in either
        if bool(((mask == own) | ~seen[..., None]).all()):
            return True
    first = mask.gather(
        -2, seen.int().argmax(-1)[..., None, None].expand(*mask.shape[:-2], 1, mask.shape[-1])
    )
    if bool((seen[..., None] & (mask != first)).any()):
        return False
    i = torch.arange(mask.shape[-2], device=mask.device)[:, None]
    j = torch.arange(mask.shape[-1], device=mask.device)[None, :]
    return not bool((mask & (j > i)).any())


def _prefix_evidence(mask: torch.Tensor) -> bool:
    """A prefix-LM's mask (GLM, MPT, T5's prefix LM): the first p positions of a sequence see each other,
    and every later one (at least one in some sequence) sees itself and what comes before it, nothing
    after. A decoder with a bidirectional prefix. An encoder's mask is none: all its rows see the
    same keys (a padded row, which does not see itself, is left out)."""
    lk = mask.shape[-1]
    j = torch.arange(lk, device=mask.device)
    far = torch.where(mask, j, -1).amax(-1)  # (..., q) the furthest key each row sees
    i = torch.arange(mask.shape[-2], device=mask.device)
    ahead = far > i  # rows that see a later key: the prefix's
    prefix = torch.where(ahead, far + 1, 0).amax(-1, keepdim=True)  # (..., 1) each sequence's p
    if bool((ahead & (far + 1 != prefix)).any()):
        # examples packed into one row (MPT's and UL2's sequence ids), each with a prefix of its own: each
        # row's example starts at the first key it sees, which is no later than the row, and rows of one
        # example follow each other
        seen = far >= 0  # (a row that sees nothing, padding, belongs to the example before it)
        seg = torch.where(mask, j, lk).amin(-1).masked_fill(~seen, -1)
        if bool((seen & (seg > i)).any()) or bool((seen & (seg < seg.cummax(-1).values)).any()):
            return False
        seg = seg.cummax(-1).values.clamp_min(0)
        ends = torch.zeros(*mask.shape[:-2], lk, dtype=torch.int64, device=mask.device)
        ends = ends.scatter_reduce(-1, seg, torch.where(ahead, far + 1, 0), "amax")
        prefix = ends.gather(-1, seg)  # (..., q) the end of each row's example's prefix
    in_prefix = i < prefix
    if bool((ahead & ~in_prefix).any()) or bool((ahead & (far + 1 != prefix)).any()):
        return False  # a row past the prefix sees ahead, or prefix rows reach different ends
    after = ~in_prefix & mask.diagonal(dim1=-2, dim2=-1)  # rows past the prefix that see themselves
    # (a padded row, whose own key is masked, says nothing): each sees nothing after itself
    if bool((after & (far != i)).any()):
        return False
    # some row past its prefix sees itself and an earlier key past the prefix too: the rows after the prefix see
    # each other as a decoder's do (a sequence all prefix is consistent; a one-token sequence's own row sees
    # itself alone, and says nothing; padded rows that see the sequence and themselves, as XLNet's do, see no
    # other padded row: an encoder's)
    start = prefix if prefix.shape[-1] == i.shape[0] else prefix.expand(*prefix.shape[:-1], i.shape[0])
    chain = mask & (j >= start[..., None]) & (j < i[:, None])
    return bool((after & chain.any(-1)).any())


def _prefix_causal(mask: torch.Tensor) -> bool | None:
    """A prefix-LM's mask (``_prefix_evidence``) that no encoder's explains (``_encoder_explains``). None
    where both do (an encoder that lets its padding rows see themselves, over a batch holding a one-token
    sequence, whose padding rows then look like a decoder's rows past an empty prefix): not causal, and
    the kind is said to be undecided."""
    if not _prefix_evidence(mask):
        return False
    return None if _encoder_explains(mask) else True


def _encoder_explains(mask: torch.Tensor) -> bool:
    """Every row of each sequence sees one set of keys, that set and its own position (a padding row an
    encoder lets see itself, a guard against rows that see no key), or nothing: an encoder's padding mask."""
    lq, lk = mask.shape[-2], mask.shape[-1]
    if lq != lk:
        return False
    sees = mask.any(-1)  # (..., q)
    common = (mask | ~sees[..., None]).all(-2, keepdim=True)  # (..., 1, k) what every row that sees sees
    own = common | torch.eye(lq, dtype=torch.bool, device=mask.device)
    rows = (mask == common).all(-1) | (mask == own).all(-1) | ~sees
    return bool(rows.all())


def _layer_kinds(model: nn.Module, modules=None) -> dict[str, str]:
    """module name -> kind for attention modules inside torch.nn encoder/decoder layers."""
    kinds = {}
    for name, mod in model.named_modules() if modules is None else modules:
        prefix = f"{name}." if name else ""
        if isinstance(mod, nn.TransformerEncoderLayer):
            kinds[prefix + "self_attn"] = "enc_self"
        elif isinstance(mod, nn.TransformerDecoderLayer):
            kinds[prefix + "self_attn"] = "dec_self"
            kinds[prefix + "multihead_attn"] = "cross"
    return kinds


_NATIVE_TYPES = (nn.TransformerEncoderLayer, nn.TransformerEncoder, nn.MultiheadAttention)


def _attentions_of(m: nn.Module) -> list[nn.MultiheadAttention]:
    """The MultiheadAttention of torch.nn's own encoder, encoder layer, or MultiheadAttention itself."""
    if isinstance(m, nn.TransformerEncoder):
        return [cast(nn.MultiheadAttention, layer.self_attn) for layer in m.layers]
    return [m if isinstance(m, nn.MultiheadAttention) else cast(nn.MultiheadAttention, m.self_attn)]


def _native_layer(m: nn.Module) -> bool:
    """nn.TransformerEncoderLayer as torch ships it: its own forward and self-attention block, a plain
    MultiheadAttention (one packed projection, no learned keys) and LayerNorms (its fast path reads
    their weights)."""
    if type(m) is not nn.TransformerEncoderLayer or "forward" in vars(m) or "_sa_block" in vars(m):
        return False
    return _native_mha(m.self_attn) and type(m.norm1) is nn.LayerNorm and type(m.norm2) is nn.LayerNorm


def _native_encoder(m: nn.Module) -> bool:
    """nn.TransformerEncoder as torch ships it, over layers as torch ships them (its nested tensors,
    which it makes only where no mode is active, stay its own)."""
    return (
        type(m) is nn.TransformerEncoder
        and "forward" not in vars(m)
        and len(m.layers) > 0
        and all(_native_layer(layer) for layer in m.layers)
        and (m.norm is None or type(m.norm) is nn.LayerNorm)
    )


def _native_mha(m: nn.Module) -> bool:
    """nn.MultiheadAttention as torch ships it, with one packed projection and no learned keys."""
    return (
        type(m) is nn.MultiheadAttention
        and "forward" not in vars(m)
        and m._qkv_same_embed_dim
        and m.in_proj_weight is not None
        and m.bias_k is None
        and m.bias_v is None
        and not m.add_zero_attn
    )


# -- public API --------------------------------------------------------------------------------------
@contextlib.contextmanager
def capture_attention(
    model: nn.Module,
    kinds: dict[str, str] | None = None,
    include: list[str] | tuple[str, ...] | None = None,
    exclude: list[str] | tuple[str, ...] | None = None,
    lengths: list[int] | tuple[int, ...] | None = None,
    *,
    scores: bool = True,
) -> Iterator[Captured]:
    """Record every attention map this thread computes inside ``model`` during the block.

    kinds: {module path or glob: "enc_self" | "dec_self" | "cross"}; include/exclude: globs on module
    paths that force a softmax in or out; lengths: sequence lengths of the call (besides those seen
    going through an embedding); scores: False keeps no scores on the records (a map less per call
    held until the block ends)."""
    if not isinstance(model, nn.Module):
        what = f"the class {model.__name__}" if isinstance(model, type) else f"a {type(model).__name__}"
        raise TypeError(f"capture_attention takes the model, a torch.nn.Module instance, not {what} (for a plain "
                        "function, wrap it in an nn.Module whose forward calls it)")  # fmt: skip
    if kinds is not None and not isinstance(kinds, Mapping):
        raise TypeError(
            f"kinds must be a dict of module path (or glob) -> kind, e.g. {{'decoder.*': 'dec_self'}}, not a "
            f"{type(kinds).__name__}"
        )
    for path, k in (kinds or {}).items():
        if not isinstance(path, str):
            raise TypeError(
                f"kinds= keys are module paths (or globs) as strings, e.g. 'decoder.*', not {path!r}"
            )
        if k not in KINDS:
            raise ValueError(f"unknown attention kind {k!r}; expected one of {KINDS}")
    for name, globs in (("include", include), ("exclude", exclude)):
        if globs is not None and (
            isinstance(globs, (str, bytes)) or not all(isinstance(g, str) for g in _iterable(globs))
        ):
            raise TypeError(f"{name}= is a list of module paths (or globs) as strings, e.g. ['decoder.*'], "
                            f"not {globs!r}")  # fmt: skip
    if lengths is not None and (
        isinstance(lengths, (str, bytes))
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in _iterable(lengths))
    ):
        raise TypeError(f"lengths= is a list of sequence lengths (positive whole numbers), e.g. [12, 40], not "
                        f"{lengths!r}")  # fmt: skip
    if isinstance(lengths, int):  # (one length given for a list of them)
        lengths = [lengths]
    cap = Captured()
    with _modes_aside():  # (a mode the caller set sees the model's ops alone)
        first = next(itertools.chain(model.named_parameters(), model.named_buffers()), None)  # (one says)
        meta = first[0] if first is not None and first[1].is_meta else None
    if meta is not None:  # shapes without data: the forward runs, with nothing to record
        cap.notes.append(f"the model's tensors are on the 'meta' device ({meta} among them: shapes, no data), so "
                         "there are no weights to record: nothing was captured")  # fmt: skip
        yield cap
        return
    # one walk for the names, the layer kinds, TorchScript and torch.compile (whose wrapper holds the
    # model as "_orig_mod": its modules keep the names they have without it)
    modules = [
        (_ORIG_MOD.sub("", name).lstrip(".") if "_orig_mod" in name else name, mod)
        for name, mod in model.named_modules()
    ]
    for pattern in kinds or {}:
        if not any(pattern == name or fnmatch.fnmatchcase(name, pattern) for name, _ in modules):
            cap.notes.append(f"kinds= names {pattern!r}, which is no module path of this model and matches none, "
                             "so it was not applied (paths are the names model.named_modules() gives, '' for "
                             "the model itself; globs such as 'decoder.*' match them)")  # fmt: skip
    blind = _blind_spot(model, modules)
    if blind:
        cap.notes.append(blind)
    compiled = [name for name, mod in modules if _is_compiled(mod)]
    if compiled:  # compiled code runs where a mode cannot see: the forward runs eagerly in the block
        cap.skipped.append(Note("info", compiled[0] or "(model)", (), _COMPILED))
    subclassed = next(
        (
            (name, base)
            for name, mod in modules
            if not mod.training
            for base in _FAST_PATH_TYPES
            if isinstance(mod, base) and type(mod) is not base
        ),
        None,
    )
    if subclassed:  # (torch's own classes run with the mode set aside: their fast path is kept)
        name, base = subclassed
        cap.skipped.append(Note("info", name or "(model)", (), _SUBCLASSED.format(base=base.__name__)))
    unnested = next((name for name, mod in modules if _makes_nested(mod) and not _native_encoder(mod)), None)
    if unnested is not None:  # (a layer TorchScript'ed, subclassed or changed: followed under the mode)
        cap.skipped.append(Note("info", unnested or "(model)", (), _NO_NESTED.format(
            why="a layer of it is not torch's own (a subclass, TorchScript, a forward or block replaced)")))  # fmt: skip
    session = _Session(cap, model, kinds, include, exclude, lengths, modules, scores)
    wrapped = _wrap_scripts(_script_calls(modules))
    eager = torch.compiler.set_stance("force_eager") if compiled else contextlib.nullcontext()
    hooks: list[Any] = []
    try:
        if session.native:  # torch.nn encoder layers run as torch runs them: hooks around every module call
            # (and torch.nn's own attention outside the model, called in the block, as torch runs it too)
            hooks += [
                torch.nn.modules.module.register_module_forward_pre_hook(session.before_layer),
                torch.nn.modules.module.register_module_forward_hook(session.after_layer, with_kwargs=True,
                                                                     always_call=True),
            ]  # fmt: skip
        hooks += _returned_hooks(session, model)
    except BaseException:
        for hook in hooks:
            hook.remove()
        _unwrap_scripts(wrapped)
        raise
    sessions = _LOCAL.__dict__.setdefault("sessions", [])
    sessions.append(session)
    try:
        with eager, _Mode(session) as mode:
            session.mode = mode
            try:
                yield cap
            finally:  # an interrupt inside a layer running without the mode (no hook ran after it): back
                while session._set_aside:
                    if session._set_aside.pop()[1]:
                        torch._C._push_on_torch_function_stack(mode)
    finally:
        for hook in hooks:
            hook.remove()
        if session in sessions:
            sessions.remove(session)
        _unwrap_scripts(wrapped)
    if session._repeated is not None:
        given, times = session._repeated
        copies = [r.name for r in cap.records if int(r.probs.shape[0]) == given * times]
        if copies:
            cap.notes.append(
                f"the {given} sequence(s) given were each repeated {times} times in a row (generate's beams or "
                f"num_return_sequences: repeat_interleave({times}, dim=0)): in the maps of {given * times} rows "
                f"({_listed(list(dict.fromkeys(copies)))}), row b holds sequence b // {times} (its copy or beam "
                f"b % {times}), and "
                "cap.trace(i) draws their row i"
            )
    if session.scripted:
        where = list(session.scripted)
        fns = sorted({f for names in session.scripted.values() for f in names})
        cap.notes.append(
            f"{_listed(['the model' if w == '' else w for w in where])} called TorchScript "
            f"({', '.join(fns[:4])}{' …' if len(fns) > 4 else ''}), whose ops run outside Python, where "
            "capture cannot see them: attention computed inside it is not recorded, and maps these modules "
            "made after it are flagged (what went through it is not followed)"
        )
    with _modes_aside():  # (modes the caller set, as ``torch.device("cuda")``, are not capture's)
        session.finish()
        session.drop_unused_outside()
        session.tell_named_decoders()
        session.tell_undecided_kinds()
        session.sequence_rows()
        session.detach_records()
    if session.n_ops and not (session.n_attention or blind or session.n_alien or session.scripted):
        logs = session.n_log_softmax
        cap.notes.append(
            "no softmax, scaled_dot_product_attention or MultiheadAttention call was seen in this forward "
            f"({session.n_ops} torch calls"
            + (f"; {logs} log_softmax call{'s' if logs > 1 else ''}, log-probabilities that weigh no values: a "
               "classifier's or a pointer network's output, not recorded" if logs else "")
            + "): attention written without a softmax (linear attention's feature maps) has no weights to record, "
            "and attention computed where capture cannot see (a compiled C++/CUDA extension, TorchScript, or code "
            "outside torch) is not recorded"
        )  # fmt: skip


def _returned_hooks(session: _Session, model: nn.Module) -> list[Any]:
    """Hooks that tell whether the model's own call has returned (a softmax after it, outside it, is the
    caller's): the model's own where no torch.nn layer of it looks for hooks (an encoder layer's fast path is
    off where it or a module of its holds one), so every other module's call stays on torch's path without
    hooks; global ones where one does, and for a module that takes none of its own (a ScriptModule)."""
    if not session.native and not isinstance(model, torch.jit.ScriptModule):
        own: list[Any] = []
        try:
            own.append(model.register_forward_pre_hook(session.model_called))
            own.append(model.register_forward_hook(session.model_returned, always_call=True))
            return own
        except RuntimeError:
            for hook in own:
                hook.remove()
    return [
        torch.nn.modules.module.register_module_forward_pre_hook(session.model_called),
        torch.nn.modules.module.register_module_forward_hook(session.model_returned, always_call=True),
    ]


_ORIG_MOD = re.compile(r"(^|\.)_orig_mod(?=\.|$)")
_FAST_PATH_TYPES = (nn.TransformerEncoderLayer, nn.TransformerEncoder, nn.MultiheadAttention)
_NO_NESTED = (
    "nn.TransformerEncoder with nested tensors (enable_nested_tensor, in eval mode): {why}, and under a mode torch "
    "makes no nested tensors, so over a padded batch its output at the padding positions is computed where "
    "without capture torch writes 0 (the other positions can differ in the last bits), and its maps have rows for "
    "the padding queries. capture_call returns the output of the run without capture"
)
_MODE_ABOVE = (
    "another capture is active inside this one (its mode above this one's): torch.nn's own attention runs its "
    "Python path under this one's mode, so outputs can differ from the run without this capture in the last bits, "
    "and an encoder makes no nested tensors (rows for padding queries are computed). capture_call returns the "
    "output of the run without capture"
)


def _makes_nested(m: nn.Module) -> bool:
    """An nn.TransformerEncoder that makes nested tensors of a padded batch where no mode is active."""
    return (
        isinstance(m, nn.TransformerEncoder)
        and not m.training
        and bool(getattr(m, "use_nested_tensor", False))
    )


_SUBCLASSED = (
    "a subclass of nn.{base}: under capture it runs torch's Python path, where without capture torch may take its "
    "fused fast path, so the model's output can differ from the run without capture in the last bits (and code "
    "the subclass runs only on the Python path runs); the maps are the Python path's, exact. capture_call returns "
    "the output of the run without capture"
)
_COMPILED = (
    "compiled with torch.compile: capture runs its forward eagerly (torch.compiler.set_stance("
    "'force_eager')), so its attention is seen; the compiled forward computes the same maps up to "
    "floating-point rounding"
)


_RAW_QUERIES = (
    "could not verify its kind: the queries were never projected inside the captured call (handed in from "
    "outside it, or made where capture cannot see: numpy, TorchScript, a C++ extension), so lineage cannot "
    "tell whether they are the keys' own sequence (self-attention) or another input's (cross-attention); "
    "the kind is read from their lengths, the mask and the module's name (give kinds= to say it)"
)
_OFF_FAST_PATH = (
    "torch.nn's own nn.MultiheadAttention (or a layer of nn.TransformerEncoder) outside the module captured, in the "
    "model that holds it, ran under capture's mode: torch takes no fused fast path there, nor an encoder's nested "
    "tensors, so its output, and what it hands the module captured, may differ from a run without capture in the "
    "last bits, and at padded positions, where nested tensors give 0. Capture the model that holds it (its torch.nn "
    "layers then run as without capture), or run it outside the block"
)
_ANOTHER_MODEL = (
    "attention of another model called in the block, which neither is part of the model captured nor holds it: "
    "not recorded (capture that model to see its maps)"
)


def _another_model(module: nn.Module) -> bool:
    """A module outside the model captured whose code is another model's: a class of the user's, or one of
    torch.nn's holding weights or layers (``nn.MultiheadAttention``). torch.nn's stateless modules
    (``nn.Softmax(dim=-1)(scores)`` in the block's own code) are the block's code."""
    return not type(module).__module__.startswith("torch.") or bool(module._parameters or module._modules)


def _is_compiled(mod: nn.Module) -> bool:
    """A module wrapped by torch.compile (its OptimizedModule), without importing torch._dynamo."""
    cls = type(mod)
    return cls.__name__ == "OptimizedModule" and cls.__module__.startswith("torch._dynamo")


# a module class -> (its functions, the (globals, name, object) their code read, the TorchScript functions
# it calls), found again where a function or a global read changed since
_SCRIPT_CALLS: dict[type, tuple[list, list, list[tuple[dict, str]]]] = {}
_SCRIPT_LOCK = threading.Lock()
_SCRIPT_WRAPPED: dict[tuple[int, str], list] = {}  # (id(globals), name) -> [globals, name, wrapper, blocks]


class _ScriptCall:
    """A TorchScript function a model's code calls by a global name, wrapped while a capture block runs: the
    call goes to it unchanged, and the block of this thread hears that it ran (the mode cannot see it)."""

    def __init__(self, fn: Any, name: str):
        self.fn, self.name = fn, name
        self.__name__ = name
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args, **kwargs):
        sessions = list(getattr(_LOCAL, "sessions", ()))
        py = _python_of(self.fn)  # (the Python function ``torch.jit.script`` compiled, which it keeps)
        stack = _current_modes() if sessions and py is not None else []
        live = [s for s in sessions if s.hears_script() and getattr(s, "mode", None) in stack]
        copies = _script_copies(args, kwargs) if live else None
        state = _rng_state_all() if copies is not None else None
        out = self.fn(*args, **kwargs)
        followed = (
            copies is not None
            and py is not None
            and _script_followed(py, copies, out, state, live, self.name, _script_attention(self.fn))
        )
        for session in sessions:
            if not (followed and session in live):
                session.on_script(self.name)
        return out

    def __getattr__(self, attr: str) -> Any:  # (graph, code, schema: the function's own)
        if attr == "fn":  # (not set yet: a copy made without __init__ asks before it is)
            raise AttributeError(attr)
        return getattr(self.fn, attr)


def _script_partial(obj: Any) -> bool:
    """``functools.partial`` of a TorchScript function (``self.attn_fn = partial(scripted, dim=-1)``)."""
    return isinstance(obj, functools.partial) and isinstance(
        obj.func, (torch.jit.ScriptFunction, _ScriptCall)
    )


def _is_script(obj: Any) -> bool:
    """A TorchScript function, one capture wrapped, or a ``functools.partial`` of either."""
    return isinstance(obj, (torch.jit.ScriptFunction, _ScriptCall)) or _script_partial(obj)


def _python_of(fn: Any) -> Callable | None:
    """The Python function a TorchScript function was compiled from (``torch.jit.script`` keeps it), with a
    partial's arguments where ``fn`` is one of a script; None where none is kept."""
    if isinstance(fn, functools.partial):
        inner = _python_of(fn.func)
        return None if inner is None else functools.partial(inner, *fn.args, **fn.keywords)
    py = getattr(fn, "_torchdynamo_inline", None)
    return py if callable(py) else None


class _ClassScope(dict):
    """A class's attributes as the wrapping of TorchScript functions reads and writes a scope (a script held as a
    class attribute, ``softmax_fn = scripted`` then ``self.softmax_fn(x)``): one per class, by identity."""

    def __init__(self, cls: type):
        super().__init__()
        self.cls = cls

    def get(self, key: Any, default: Any = None) -> Any:
        return vars(self.cls).get(key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        setattr(self.cls, key, value)


_CLASS_SCOPES: weakref.WeakKeyDictionary[type, _ClassScope] = weakref.WeakKeyDictionary()


def _class_scope(cls: type) -> _ClassScope:
    scope = _CLASS_SCOPES.get(cls)
    if scope is None:
        scope = _CLASS_SCOPES[cls] = _ClassScope(cls)
    return scope


def _moved_as(chain: tuple, a: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    """``a`` moved by the chain of views, reshapes and transposes (``(func, args, kwargs)`` each) that moved a tensor
    from outside of its shape into one of ``shape`` (``_outside_moves``); None where a step does not replay on it
    or the result is not of that shape."""
    try:
        for func, rest, kw in chain:
            a = func(a, *rest, **kw)
    except Exception:  # (a step that does not replay on it: nothing said of it)
        return None
    return a if isinstance(a, torch.Tensor) and tuple(a.shape) == tuple(shape) else None


def _undo_move(
    name: str, rest: tuple, kwargs: dict, ndim: int
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The op that puts back the axes a ``movedim``, ``transpose`` or ``permute`` of a tensor of ``ndim`` dims
    moved, or None for any other op (or other arguments)."""
    if kwargs:
        return None
    if name in ("movedim", "moveaxis") and len(rest) == 2:
        src, dst = rest
        return lambda o: torch.movedim(o, dst, src)
    if name in ("transpose", "swapaxes", "swapdims") and len(rest) == 2:
        a, b = rest
        return lambda o: o.transpose(a, b)
    if name == "permute" and rest:
        dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (tuple, list)) else rest
        if len(dims) != ndim or not all(isinstance(d, int) for d in dims):
            return None
        inverse = [0] * ndim
        for i, d in enumerate(dims):
            inverse[d % ndim] = i
        return lambda o: o.permute(*inverse)
    return None


def _scalar(x: Any) -> bool:
    """A number, or a tensor of one (a scale: ``d ** -0.5``, ``torch.tensor(8.0).rsqrt()``)."""
    return type(x) in (int, float) or (isinstance(x, torch.Tensor) and x.numel() == 1 and x.dim() <= 1)


def _current_modes() -> list[TorchFunctionMode]:
    """The TorchFunctionModes on this thread's stack now (capture's own set aside where torch runs its fast path)."""
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def _rng_state_all() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """The CPU's RNG state, and every GPU's where CUDA is up: what a TorchScript function may draw from."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _script_copies(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Copies of a TorchScript call's tensor arguments (parameters as they are), made under capture's mode so each
    keeps its lineage: the Python function the script was compiled from runs on them, never on the model's own
    tensors (a function that writes its arguments in place writes the copies). None where they cannot be made."""
    from torch.utils._pytree import tree_map

    def copy(a: Any) -> Any:
        return a.clone() if isinstance(a, torch.Tensor) and not _is_param(a) else a

    try:
        return tree_map(copy, args), tree_map(copy, kwargs)
    except Exception:  # (an argument torch cannot copy: the call is said unseen, as before)
        return None


def _same_results(a: Any, b: Any) -> bool:
    """Two results of a function equal value for value (tensors of one shape, dtype and device, and equal)."""
    from torch.utils._pytree import tree_flatten

    flat_a, spec_a = tree_flatten(a)
    flat_b, spec_b = tree_flatten(b)
    if spec_a != spec_b:
        return False
    for x, y in zip(flat_a, flat_b, strict=True):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                return False
            if (
                x.shape != y.shape
                or x.dtype != y.dtype
                or x.device != y.device
                or not bool(torch.equal(x, y))
            ):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


_GRAPH_ATTENTION = frozenset({"aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax",
                              "aten::scaled_dot_product_attention"})  # fmt: skip


def _script_attention(fn: Any) -> int:
    """How many softmaxes (and SDPA calls) a TorchScript function's graph holds, the scripts it calls inlined: a
    Python re-run that follows fewer ran some where capture cannot see (a script it reached another way)."""
    fn = fn.func if isinstance(fn, functools.partial) else fn
    fn = getattr(fn, "fn", fn) if isinstance(fn, _ScriptCall) else fn
    try:
        return sum(node.kind() in _GRAPH_ATTENTION for node in fn.inlined_graph.nodes())
    except Exception:  # (no graph to read: nothing to hold the re-run to)
        return 0


def _script_followed(
    py: Callable, copies: tuple[tuple, dict], out: Any, state, sessions: list, name: str, attention: int = 0
) -> bool:
    """A TorchScript function's Python original (``torch.jit.script`` keeps it) run once more under capture's mode,
    on copies of the arguments and from the RNG state the script's call started from: where it gives what the
    script returned, value for value, its ops were those the mode follows, and each result takes the lineage its
    copy got (what went through the script is followed, and a map made inside it is the script's, recorded). Where
    it does not (or raises), the maps it made are flagged and False: the call is said unseen, as before."""
    starts = [len(s.cap.records) for s in sessions]
    counts = [s.n_attention + s.n_log_softmax for s in sessions]
    got: Any = _MISSING
    # (TorchScript the Python function calls in its turn, wrapped for the run: followed so too, or heard)
    inner = _wrap_scripts(_script_functions(py, set()))
    try:
        with torch.random.fork_rng(devices=range(len(state[1])) if state[1] is not None else []):
            torch.set_rng_state(state[0])
            if state[1] is not None:
                torch.cuda.set_rng_state_all(state[1])
            got = py(*copies[0], **copies[1])
    except Exception:
        got = _MISSING
    finally:
        _unwrap_scripts(inner)
    _LOCAL.busy = getattr(_LOCAL, "busy", 0) + 1  # (the comparison and the tags: capture's own work)
    try:
        same = got is not _MISSING and _same_results(out, got)
        # (every softmax of the script's graph seen in the re-run: none ran in a script it reached unseen)
        seen = min(
            (s.n_attention + s.n_log_softmax - c for s, c in zip(sessions, counts, strict=True)), default=0
        )
        if same and seen >= attention:
            from torch.utils._pytree import tree_leaves

            for session in sessions:
                for o, g in zip(tree_leaves(out), tree_leaves(got), strict=True):
                    tag = session.tag(g) if isinstance(g, torch.Tensor) else None
                    if tag is not None and tag is not _PARAM_TAG and isinstance(o, torch.Tensor):
                        session.set(o, tag)
            return True
        for session, start in zip(sessions, starts, strict=True):
            session.script_unfollowed(name, start)
        return False
    finally:
        _LOCAL.busy -= 1


def _wrap_scripts(calls: list[tuple[dict, str]]) -> list[tuple[int, str]]:
    """Wrap these global names (once for every block that wants them; _unwrap_scripts puts them back)."""
    done = []
    with _SCRIPT_LOCK:
        for scope, name in calls:
            key = (id(scope), name)
            entry = _SCRIPT_WRAPPED.get(key)
            if entry is None:
                fn = scope.get(name)
                if not isinstance(fn, torch.jit.ScriptFunction) and not _script_partial(fn):
                    continue
                # (its own name, where it is held under another)
                own = getattr(fn.func if isinstance(fn, functools.partial) else fn, "name", None)
                wrapper = _ScriptCall(fn, own if isinstance(own, str) and own else name)
                scope[name] = wrapper
                entry = _SCRIPT_WRAPPED[key] = [scope, name, wrapper, 0]
            entry[3] += 1
            done.append(key)
    return done


def _unwrap_scripts(keys: list[tuple[int, str]]) -> None:
    with _SCRIPT_LOCK:
        for key in keys:
            entry = _SCRIPT_WRAPPED.get(key)
            if entry is None:
                continue
            entry[3] -= 1
            if entry[3] <= 0:
                scope, name, wrapper, _ = entry
                if scope.get(name) is wrapper:  # (unless the model's code replaced it since)
                    scope[name] = wrapper.fn
                del _SCRIPT_WRAPPED[key]


_MODULE_DICTS = frozenset(nn.Module().__dict__)  # torch's own (parameters, buffers, submodules, hooks)


def _scripts_in(scope: dict) -> list[tuple[dict, str]]:
    """(scope, key) of every TorchScript function a dict holds under a string key."""
    return [(scope, k) for k, v in list(scope.items()) if isinstance(k, str) and _is_script(v)]


def _script_functions(
    fn: Any, seen: builtins.set[int], depth: int = 0, names: list[tuple[dict, str, Any]] | None = None
) -> list[tuple[dict, str]]:
    """The TorchScript functions (``@torch.jit.script``) that Python function ``fn`` calls by a global name,
    itself or through the module-level Python functions it calls (two levels down): (the globals that
    name them, the name). ``names`` gets every (globals, name, object) the search read, to tell later
    whether any was rebound."""
    code = getattr(fn, "__code__", None)
    scope = getattr(fn, "__globals__", None)
    if code is None or scope is None or id(code) in seen:
        return []
    seen.add(id(code))
    read: list[str] = []
    stack = [code]
    while stack:
        c = stack.pop()
        read.extend(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    found = []
    for name in dict.fromkeys(read):
        obj = scope.get(name, _MISSING)
        if names is not None:
            names.append((scope, name, obj))
        if _is_script(obj):
            found.append((scope, name))
        elif isinstance(obj, dict):  # a registry of attention functions (``ALL_ATTENTION_FUNCTIONS[impl]``)
            found.extend(_scripts_in(obj))
        elif isinstance(obj, types.ModuleType) and not obj.__name__.startswith("torch"):
            # a module the code reads a name of (``ops.masked_softmax``, ``from . import fused_ops as ops``)
            space = vars(obj)
            for attr in dict.fromkeys(read):
                held = space.get(attr, _MISSING)
                if _is_script(held):
                    if names is not None:
                        names.append((space, attr, held))
                    found.append((space, attr))
        elif (
            depth < 2
            and isinstance(obj, types.FunctionType)
            and not (obj.__module__ or "").startswith("torch")
        ):
            found.extend(_script_functions(obj, seen, depth + 1, names))
    return found


def _script_calls(modules) -> list[tuple[dict, str]]:
    """The TorchScript functions the model's classes' code calls by a global name (GPT-BigCode's fused
    softmax in half precision, ChatGLM's rotary): the mode cannot see inside them, nor that they ran."""
    out: list[tuple[dict, str]] = []
    done: dict[type, tuple[tuple[dict, str], ...]] = {}
    for _name, mod in modules:
        cls = type(mod)
        if cls.__module__.startswith("torch.") or isinstance(mod, torch.jit.ScriptModule):
            continue
        if cls not in done:
            done[cls] = _class_scripts(cls)
        out.extend(done[cls])
        own = mod.__dict__  # one held as an attribute (``self.rope = torch.jit.script(rope)``), or in a dict
        out.extend(_scripts_in(own))
        for n, v in list(own.items()):
            if isinstance(v, dict) and n not in _MODULE_DICTS:
                out.extend(_scripts_in(v))
            elif n == "forward" and isinstance(v, (types.FunctionType, types.MethodType)):
                # a forward set on the instance (``m.forward = types.MethodType(f, m)``): read each time
                out.extend(_script_functions(getattr(v, "__func__", v), set()))
    return out


def _class_scripts(cls: type) -> tuple[tuple[dict, str], ...]:
    """The TorchScript functions a module class's code calls by a global name (found once per class, and
    again where its functions or a global name they read changed; a registry dict they read is read again
    each time)."""
    fns = [
        attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
        for klass in cls.__mro__
        if not (klass is nn.Module or klass is object or klass.__module__.startswith("torch."))
        for attr in vars(klass).values()
    ]
    fns = [fn for fn in fns if isinstance(fn, types.FunctionType)]
    held = _SCRIPT_CALLS.get(cls)
    if held is None or not _still(held[0], fns, held[1]):
        seen: builtins.set[int] = set()
        names: list[tuple[dict, str, Any]] = []
        found = [c for fn in fns for c in _script_functions(fn, seen, names=names)]
        registries = {id(obj) for _g, _n, obj in names if type(obj) is dict}  # (read again below)
        found = [(g, n) for g, n in found if id(g) not in registries]
        held = _SCRIPT_CALLS[cls] = (fns, names, found)
    calls = held[2] + [c for _g, _n, obj in held[1] if type(obj) is dict for c in _scripts_in(obj)]
    for klass in cls.__mro__:  # scripts held as class attributes (``softmax_fn = scripted``), read each time
        if klass is nn.Module or klass is object or klass.__module__.startswith("torch."):
            continue
        for key, attr in vars(klass).items():
            if _is_script(attr):
                calls.append((_class_scope(klass), key))
    return tuple({(id(g), n): (g, n) for g, n in calls}.values())


def _still(fns: list, now: list, names: list[tuple[dict, str, Any]]) -> bool:
    """The class's functions and every global name their code reads are what they were when its TorchScript
    calls were found (a global rebound to a script function after, ``Cls.forward`` patched: found again)."""
    return (
        len(fns) == len(now)
        and all(a is b for a, b in zip(fns, now, strict=True))
        and all(scope.get(name, _MISSING) is obj for scope, name, obj in names)
    )


_MISSING = object()


def _listed(names: list[str], most: int = 3) -> str:
    """``module a``, ``modules a, b and c``, ``modules a, b, c and 4 more``; ``the model``."""
    if names == ["the model"]:
        return "the model"
    shown = ", ".join(repr(n) if n != "the model" else n for n in names[:most])
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"{'module' if len(names) == 1 else 'modules'} {shown}{more}"


def _blind_spot(model: nn.Module, modules=None) -> str | None:
    """One sentence when (part of) the model runs where a TorchFunctionMode cannot see."""
    scripted: list[str] = []
    for name, mod in model.named_modules() if modules is None else modules:
        if isinstance(mod, torch.jit.ScriptModule) and not any(
            s == "" or name.startswith(f"{s}.") for s in scripted
        ):
            scripted.append(name)  # (a scripted module's own submodules are script modules too)
    if not scripted:
        return None
    if scripted == [""]:
        where = "the model is"
    else:
        named = ", ".join(repr(n) for n in scripted[:6]) + (
            f" and {len(scripted) - 6} more" if len(scripted) > 6 else ""
        )
        where = f"module {named} is" if len(scripted) == 1 else f"modules {named} are"
    its = "its" if len(scripted) == 1 else "their"
    return (f"{where} TorchScript: {its} operations run outside Python, where attnscope cannot see them, so "
            f"{its} attention is not recorded (capture the model before torch.jit.script)")  # fmt: skip


def capture_call(
    model: nn.Module, *args, kinds: dict[str, str] | None = None, **kwargs
) -> tuple[Any, Captured]:
    """(model(*args, **kwargs) exactly as without capture, the attention of a second, captured call)."""
    output = model(*args, **kwargs)
    with capture_attention(model, kinds) as cap:
        model(*args, **kwargs)
    return output, cap
