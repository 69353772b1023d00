"""Lineage codes: where every element of an activation came from, to split attention exactly.

Capture gives each activation it follows an integer tensor of the same shape, its *code*: the
high bits say which source position the element belongs to (a token of an embedding call, a
position of a tensor that entered the forward from outside, a row of a learned parameter), the
low bits which feature of the last projection it is. Data-movement ops (``view``, ``permute``,
``chunk`` + ``cat``, ``repeat``, indexing, einops' ``rearrange``, ...) are replayed on the code
as they run; position-wise ops (norms, activations, adds) keep it; a projection keeps the
positions and numbers its output features afresh.

At a product of two activations (``q @ k.T``, ``bmm``, ``einsum``) the operands' codes say,
for every slice, which query position and which head (the first feature of the query's slice of
the projection) it holds, and which key position. The ops between that product and the softmax
are replayed once on an index tensor, so for every row of the softmax the capture knows exactly
which sequence, head and query it is, and what each key is. Nothing about the layout is guessed:
batch-major or head-major folds, keys-first layouts and learned keys all come out of the same
bookkeeping, and what does not add up is reported with its reason instead of a picture.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

SHIFT = 24  # low bits: the feature index of the last projection
FEATURES = (1 << SHIFT) - 1
RAW = 1 << (SHIFT - 1)  # set on features that were never projected inside the capture (a tensor from outside)
# the label of a "pad" source whose cells no content fills: a made buffer's slots nothing was written to,
# pad_sequence's padding (a row's padding, as its PAD tokens are)
EMPTY = "empty"
LABELLED = ("param", "pad")  # positions that are not a sequence's: learned vectors, F.pad's padding

# ops that only move elements around: replayed on the code with the same arguments
REPLAY = frozenset(
    {"view", "reshape", "permute", "transpose", "t", "flatten", "unflatten", "squeeze", "unsqueeze",
     "expand", "expand_as", "view_as", "reshape_as", "repeat", "repeat_interleave", "tile", "chunk", "split",
     "tensor_split", "unbind", "cat", "concat", "concatenate", "stack", "hstack", "vstack", "__getitem__",
     "narrow", "select", "movedim", "moveaxis", "swapaxes", "swapdims", "flip", "roll", "index_select",
     "gather", "take_along_dim", "split_with_sizes", "unsafe_split", "unsafe_chunk", "dsplit", "hsplit",
     "vsplit", "diagonal", "unfold", "as_strided", "broadcast_to", "contiguous", "clone", "detach",
     "T", "mT", "H", "mH", "adjoint"}
)  # fmt: skip
# ops whose output is the input's values in another dtype or place: the code is kept as it is
KEEP = frozenset(
    {"to", "type", "type_as", "float", "double", "half", "bfloat16", "cpu", "cuda", "contiguous", "clone",
     "detach", "requires_grad_", "detach_"}
)  # fmt: skip


# -- memo: code ops are pure functions of their code operands, which are never written to ------------
# A code op's result is kept under the identity of its code operands (held by the entry, so an id is
# never another tensor's while its entry lives) and the value of its other arguments. The same
# layers, and later captures of the model on inputs of the same shape, then get the same code
# tensors back for a dict lookup: exact by construction (the same inputs give the same result),
# and every layout cached downstream compares its codes by identity first.
MEMO_ENTRIES = 4096
MEMO_BYTES = 256 << 20  # int64 codes the memo may keep alive (storages counted once per entry)
_MEMO: dict[tuple, tuple[tuple, Any, int]] = {}  # key -> (held operands, result, bytes)
_MEMO_LOCK = threading.Lock()
_memo_bytes = 0
MISS = object()


def recall(key: tuple) -> Any:
    """The remembered result of a code op, or MISS."""
    entry = _MEMO.get((key, torch.is_inference_mode_enabled()))
    return MISS if entry is None else entry[1]


def remember(key: tuple, held: tuple, result: Any) -> Any:
    """Keep ``result`` under ``key`` (whose tensor ids are those of ``held``); returns it."""
    global _memo_bytes
    nbytes = _nbytes(result)
    if nbytes > MEMO_BYTES // 4:
        return result
    key = (key, torch.is_inference_mode_enabled())  # codes made in inference mode are inference tensors,
    # which a capture outside it (gradients on) cannot use
    with _MEMO_LOCK:
        if key in _MEMO:
            return result
        while _MEMO and (len(_MEMO) >= MEMO_ENTRIES or _memo_bytes + nbytes > MEMO_BYTES):
            _memo_bytes -= _MEMO.pop(next(iter(_MEMO)))[2]
        _MEMO[key] = (held, result, nbytes)
        _memo_bytes += nbytes
    return result


def forget() -> None:
    """Drop every remembered code (tests; memory)."""
    global _memo_bytes
    with _MEMO_LOCK:
        _MEMO.clear()
        _memo_bytes = 0


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return int(x.untyped_storage().nbytes())
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(t) for t in x)
    if isinstance(x, ScoreMap):
        return _nbytes(x.q) + _nbytes(x.k)
    return 0


def replay_fn(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """The function that replays data-movement op ``name`` on codes or indices: ``view`` becomes
    ``reshape`` (they need not be contiguous where the tensor was), and ``x_as(other)`` becomes
    ``x(other's shape)`` (the caller passes the shape)."""
    base = name[: -len("_as")] if name.endswith("_as") else name
    if base == "view":
        return torch.Tensor.reshape
    return getattr(torch.Tensor, base) if base != name else func


@dataclass(frozen=True)
class Source:
    """A run of positions: ``tokens`` (an embedding call's ids), ``param`` (rows of a learned tensor),
    ``external`` (a tensor that entered the captured call from outside: inputs, a KV cache),
    ``pad`` (what F.pad added)."""

    start: int
    n: int
    kind: str
    label: str  # the parameter's attribute name; the embedding call's number; "input"
    origin: Any = None  # the lineage origin the capture's tags use for these positions
    row: int = 0  # positions per row of the tensor they came from (its last leading dim), 0: one row
    path: str = ""  # a learned tensor's dotted path in the model, where its label is shorter (``dec.tok``)
    table: int = 0  # tokens: the embedding table they were looked up in (id of its weight), 0 unknown
    lead: tuple[int, ...] = ()  # external: the leading dims of the tensor they came from


@dataclass
class Sources:
    items: list[Source] = field(default_factory=list)
    end: int = 0

    def new(
        self,
        n: int,
        kind: str,
        label: str,
        origin: Any = None,
        row: int = 0,
        path: str = "",
        table: int = 0,
        lead: tuple[int, ...] = (),
    ) -> int:
        start = self.end
        self.items.append(Source(start, n, kind, label, origin, row if 0 < row < n else 0, path, table, lead))
        self.end += max(int(n), 1)
        if self.end >= 1 << (62 - SHIFT):
            raise OverflowError("too many positions to follow")
        return start

    def at(self, pos: int) -> Source:
        """The source of one position code."""
        return self.items[bisect.bisect_right([s.start for s in self.items], pos) - 1]

    def index(self, pos: torch.Tensor) -> torch.Tensor:
        """Source number of every position code."""
        starts = torch.tensor([s.start for s in self.items], dtype=torch.int64, device=pos.device)
        return torch.searchsorted(starts, pos.contiguous(), right=True) - 1

    def rows(self, pos: torch.Tensor) -> torch.Tensor:
        """The row of its source tensor every position code is in (batch-first: (B, L) ids put positions
        b * L .. b * L + L - 1 in row b), as one number across sources; -1 at learned positions."""
        src = self.index(pos)
        start = torch.tensor([s.start for s in self.items], dtype=torch.int64, device=pos.device)[src]
        per = torch.tensor([s.row or (s.n + 1) for s in self.items], dtype=torch.int64, device=pos.device)[
            src
        ]
        return ((pos - start) // per + start).masked_fill(self.learned(pos), -1)

    def learned(self, pos: torch.Tensor) -> torch.Tensor:
        """Whether every position code is a learned one (a parameter's row, padding, a pooled position:
        a labelled source), not a sequence's."""
        return self.of_kind(pos, LABELLED)

    def of_kind(self, pos: torch.Tensor, kinds: tuple[str, ...]) -> torch.Tensor:
        """Whether every position code's source is of one of ``kinds``."""
        hit = torch.tensor([s.kind in kinds for s in self.items], dtype=torch.bool, device=pos.device)
        return hit[self.index(pos)]

    def empty(self, pos: torch.Tensor) -> torch.Tensor:
        """Whether every position code is an empty slot (``EMPTY``): a made buffer's cell nothing was written
        to, pad_sequence's padding."""
        hit = torch.tensor([s.kind == "pad" and s.label == EMPTY for s in self.items], device=pos.device)
        return hit[self.index(pos)]

    def span(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The first position of the row every position code is in, and that row's length."""
        src = self.index(pos)
        start = torch.tensor([s.start for s in self.items], dtype=torch.int64, device=pos.device)[src]
        size = torch.tensor([s.row or max(s.n, 1) for s in self.items], dtype=torch.int64, device=pos.device)[
            src
        ]
        return start + (pos - start) // size * size, size


def fresh(start: int, lead: tuple[int, ...], features: int, device, raw: bool = False) -> torch.Tensor:
    """Codes of a tensor (*lead, features) whose positions are start, start + 1, ... (row-major)."""
    key = ("fresh", start, lead, features, str(device), raw)
    hit = recall(key)
    if hit is not MISS:
        return hit
    pos = start + torch.arange(math.prod(lead), dtype=torch.int64, device=device).view(*lead, 1)
    f = torch.arange(features, dtype=torch.int64, device=device)
    return remember(key, (), (pos << SHIFT) | (f | RAW if raw else f))


def projected(code: torch.Tensor, features: int, check: bool = False) -> tuple[torch.Tensor, bool]:
    """Codes of a projection's output (the same positions, ``features`` new features), and (when
    ``check``) whether the input's rows mixed positions (one row's features from several positions)."""
    key = ("projected", id(code), features, check)
    hit = recall(key)
    if hit is not MISS:
        return hit
    pos = code[..., :1] >> SHIFT
    mixed = check and code.shape[-1] > 1 and bool(((code >> SHIFT) != pos).any())
    f = torch.arange(features, dtype=torch.int64, device=code.device)
    # rows that start past feature 0 are a slice of a row (a head's features after a view): their outputs
    # are numbered after that offset, so a projection shared by the heads keeps the heads apart
    first = code[..., :1] & (FEATURES & ~RAW)
    if bool(first.any()):
        width = torch.arange(code.shape[-1], dtype=torch.int64, device=code.device)
        if bool(((code >> SHIFT) == pos).all()) and bool(((code & (FEATURES & ~RAW)) - first == width).all()):
            f = (first * features + f) & FEATURES  # every row one position's run of features: a head's
    return remember(key, (code,), ((pos << SHIFT) | f, mixed))


def reduced(code: torch.Tensor, dim: int) -> tuple[torch.Tensor, bool]:
    """One code per slice along ``dim`` (the contracted features of a product): its first element,
    whose position is the slice's and whose feature stands for its head (every row of a head starts
    with the same feature); and whether the slice held more than one position (its first, middle
    and last elements are compared: one pass over the slices, not over every feature)."""
    key = ("reduced", id(code), dim)
    hit = recall(key)
    if hit is not MISS:
        return hit
    n = code.shape[dim]
    first = code.select(dim, 0)
    pos = first >> SHIFT
    mixed = n > 1 and bool(
        ((code.select(dim, n - 1) >> SHIFT) != pos).any() | ((code.select(dim, n // 2) >> SHIFT) != pos).any()
    )
    return remember(key, (code,), (first, mixed))


Op = tuple[str, Callable[..., Any], tuple, dict]


@dataclass
class ScoreMap:
    """Scores made by a product of two activations, in a canonical layout ``(*s, n, m)``: ``q``
    (*s, n) holds the query code of every slice and row, ``k`` (*s, m) the key code of every
    column; ``chain`` the data-movement ops from that layout to the tensor as it is now."""

    shape: tuple[int, ...]
    q: torch.Tensor
    k: torch.Tensor
    chain: tuple[Op, ...] = ()
    broken: str | None = None

    def then(self, op: Op) -> ScoreMap:
        return ScoreMap(self.shape, self.q, self.k, (*self.chain, op), self.broken)

    def fail(self, why: str) -> ScoreMap:
        return ScoreMap(self.shape, self.q, self.k, self.chain, self.broken or why)


def matmul_map(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> ScoreMap:
    """a (..., n, c) @ b (..., c, m) -> the score map of out (..., n, m)."""
    shape = tuple(out.shape)
    key = ("matmul", id(a), id(b), shape)
    hit = recall(key)
    if hit is not MISS:
        return hit
    return remember(key, (a, b), _matmul_map(a, b, shape))


def pair_map(code: torch.Tensor, axis: int, shape: tuple[int, ...], kept: bool) -> ScoreMap | None:
    """Scores made by a projection of paired features: ``code`` (the activation's codes) holds along ``axis``
    the features of two positions in every cell, one position varying along the cells' second-last axis and
    the other along their last (``cat([x_i, x_j])`` tiled over the (i, j) pairs: GAT's ``a^T [W h_i || W h_j]``,
    a concatenation non-local block's ``W_f [theta_i; phi_j]``). The ScoreMap of the projection's output
    ``shape`` (its features along ``axis`` where ``kept``, else none: a product with a vector), whose queries
    are the position along the rows and keys the one along the columns, each output feature a head of its
    own; None for any other codes."""
    key = ("pair", id(code), axis, shape, kept)
    hit = recall(key)
    if hit is not MISS:
        return hit
    return remember(key, (code,), _pair_map(code, axis, shape, kept))


def _pair_map(code: torch.Tensor, axis: int, shape: tuple[int, ...], kept: bool) -> ScoreMap | None:
    if code.dim() < 3 or not -code.dim() <= axis < code.dim():
        return None
    axis %= code.dim()
    c = code.movedim(axis, -1)  # (*cells, features)
    cells = tuple(c.shape[:-1])
    if int(c.shape[-1]) < 2 or min(cells[-2:]) < 1 or (not kept and tuple(shape) != cells):
        return None
    if kept and (len(shape) != code.dim() or tuple(s for i, s in enumerate(shape) if i != axis) != cells):
        return None
    a, b = c[..., :1] >> SHIFT, c[..., -1:] >> SHIFT
    if bool((a == b).all()):
        return None  # one position per cell (a projection's common case: its first and last features')
    pos = c >> SHIFT
    if not bool(((pos == a) | (pos == b)).all()):
        return None  # more than two
    a, b = a[..., 0], b[..., 0]
    for d in range(
        len(cells) - 2
    ):  # the cells' other axes: a batch (both positions vary along it), nothing else
        if cells[d] > 1 and not (
            bool((a != a.narrow(d, 0, 1)).any()) and bool((b != b.narrow(d, 0, 1)).any())
        ):
            return None  # (one of the pair along it, or heads the pairs repeat over: laid out otherwise)
    if bool((a == a[..., :1]).all()) and bool((b == b[..., :1, :]).all()):
        rows, cols = a[..., 0], b[..., 0, :]  # (*lead, n), (*lead, m)
    elif bool((b == b[..., :1]).all()) and bool((a == a[..., :1, :]).all()):
        rows, cols = b[..., 0], a[..., 0, :]
    else:
        return None
    if int(rows.shape[-1]) > 1 and not bool((rows != rows[..., :1]).any()):
        return None  # (one position on every row: a state tiled over the keys, additive attention's)
    heads = int(shape[axis]) if kept else 1
    f = torch.arange(heads, dtype=torch.int64, device=code.device)[:, None]  # each output feature a head
    q = (rows[..., None, :] << SHIFT) | f  # (*lead, heads, n)
    k = (cols[..., None, :] << SHIFT) | f  # (*lead, heads, m)
    if not kept:
        return ScoreMap(tuple(shape), q[..., 0, :], k[..., 0, :])
    canon = (*cells[:-2], heads, *cells[-2:])
    back: Op = ("movedim", torch.movedim, (len(canon) - 3, axis), {})
    return ScoreMap(canon, q, k, (back,) if len(canon) - 3 != axis else ())


def _matmul_map(a: torch.Tensor, b: torch.Tensor, shape: tuple[int, ...]) -> ScoreMap:
    q, mixed_q = reduced(a, -1)
    k, mixed_k = reduced(b, -2)
    lead = shape[:-2]
    q = q.expand(*lead, q.shape[-1]) if q.dim() - 1 <= len(lead) else q
    k = k.expand(*lead, k.shape[-1]) if k.dim() - 1 <= len(lead) else k
    smap = ScoreMap(shape, q, k)
    if mixed_q and mixed_k and _over_features(q, k):
        return smap.fail(OVER_FEATURES)
    if mixed_q or mixed_k:
        return smap.fail("the product multiplies features of different positions")
    return smap


OVER_FEATURES = (
    "the product sums over positions, and its rows and columns are features (channels) of one position each: "
    "a map over channels, as DANet's channel attention and a Gram matrix are, not over positions"
)


def _over_features(q: torch.Tensor, k: torch.Tensor) -> bool:
    """The rows of a product whose operands both summed over positions are features: every query row's code (the
    first element of its slice) and every key's is one position, the rows differing only in their feature."""
    if q.shape[-1] < 2 or k.shape[-1] < 2:
        return False
    pq, pk = q >> SHIFT, k >> SHIFT
    return (
        bool((pq == pq[..., :1]).all())
        and bool((pk == pk[..., :1]).all())
        and bool(((q & FEATURES) != (q[..., :1] & FEATURES)).any())
        and bool(((k & FEATURES) != (k[..., :1] & FEATURES)).any())
    )


def _explicit(equation: str, ndims: list[int]) -> str | None:
    """An einsum equation with its "..." written out as letters (aligned from the right, as
    broadcasting aligns them); None when it cannot be."""
    eq = equation.replace(" ", "")
    if "..." not in eq:
        return eq
    if "->" not in eq:
        return None
    lhs, rhs = eq.split("->")
    ops = lhs.split(",")
    if len(ops) != len(ndims):
        return None
    used = set(eq)
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used]
    widths = [n - len(op.replace("...", "")) for op, n in zip(ops, ndims, strict=True) if "..." in op]
    if not widths or min(widths) < 0 or max(widths) > len(free):
        return None
    full = free[: max(widths)]
    out_ops = []
    for op, n in zip(ops, ndims, strict=True):
        if "..." in op:
            w = n - len(op.replace("...", ""))
            op = op.replace("...", "".join(full[len(full) - w :]))
        out_ops.append(op)
    return ",".join(out_ops) + "->" + rhs.replace("...", "".join(full))


def einsum_projected(
    equation: str, code: torch.Tensor, first: bool, out: torch.Tensor, param_shape: tuple[int, ...] = ()
) -> tuple[torch.Tensor, bool] | None:
    """Codes of an einsum of an activation (with ``code``; the first operand when ``first``) and a
    parameter (of ``param_shape``): the activation's positions, the output's parameter-only letters
    numbered as features (Keras' ``"abc,cde->abde"``), and so the letters the parameter shares with the
    activation and the output where it holds other weights along them (per-head weights over an input
    repeated per head, ``"hbld,hde->hble"``: each head's outputs are features of their own). None when
    the equation is not of that form."""
    key = ("einsum_projected", equation, id(code), first, tuple(out.shape), tuple(param_shape))
    hit = recall(key)
    if hit is not MISS:
        return hit
    return remember(key, (code,), _einsum_projected(equation, code, first, out, tuple(param_shape)))


def _einsum_projected(
    equation: str, code: torch.Tensor, first: bool, out: torch.Tensor, param_shape: tuple[int, ...] = ()
) -> tuple[torch.Tensor, bool] | None:
    eq = equation.replace(" ", "")
    if "..." in eq and len(param_shape):  # Flax's DenseGeneral ported as ``einsum("...d,dhk->...hk", x, w)``
        dims = [code.dim(), len(param_shape)] if first else [len(param_shape), code.dim()]
        eq = _explicit(eq, dims) or eq
    if "->" not in eq or "." in eq:
        return None
    lhs, rhs = eq.split("->")
    ops = lhs.split(",")
    if len(ops) != 2 or len(rhs) != out.dim():
        return None
    letters = ops[0] if first else ops[1]
    if len(letters) != code.dim() or len(set(letters)) != len(letters):
        return None
    mixed = False
    for c in reversed([c for c in letters if c not in rhs]):  # contracted: one position per slice
        code, m = reduced(code, letters.index(c))
        letters = letters.replace(c, "")
        mixed = mixed or m
    sizes = dict(zip(rhs, out.shape, strict=True))
    p_letters = ops[1] if first else ops[0]
    per_slice = (
        {c for c in letters if c in rhs and c in p_letters and param_shape[p_letters.index(c)] > 1}
        if len(param_shape) == len(p_letters)
        else set()
    )
    feat = [c for c in rhs if c not in letters or c in per_slice]
    pos = (code >> SHIFT).permute([letters.index(c) for c in rhs if c in letters])
    pos = pos.reshape([sizes[c] if c in letters else 1 for c in rhs])
    f = torch.arange(math.prod(sizes[c] for c in feat), dtype=torch.int64, device=code.device)
    f = f.reshape([sizes[c] for c in feat]) if feat else f.reshape(())
    f = f.reshape([sizes[c] if c in feat else 1 for c in rhs])
    return ((pos << SHIFT) | f).expand(out.shape), mixed


def einsum_map(equation: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> ScoreMap | None:
    """The score map of ``einsum(equation, a, b)`` when its output has one query letter (only in a),
    one key letter (only in b) and shared letters (batch, heads); None otherwise."""
    key = ("einsum_map", equation, id(a), id(b), tuple(out.shape))
    hit = recall(key)
    if hit is not MISS:
        return hit
    return remember(key, (a, b), _einsum_map(equation, a, b, out))


def _einsum_map(equation: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> ScoreMap | None:
    eq = _explicit(equation, [a.dim(), b.dim()]) or ""
    if "->" not in eq or "." in eq:
        return None
    lhs, rhs = eq.split("->")
    ops = lhs.split(",")
    if len(ops) != 2 or len(rhs) != out.dim() or len(ops[0]) != a.dim() or len(ops[1]) != b.dim():
        return None
    la, lb = ops
    qs = [c for c in rhs if c in la and c not in lb]
    ks = [c for c in rhs if c in lb and c not in la]
    ss = [c for c in rhs if c in la and c in lb]
    if not qs or not ks or any(c not in la and c not in lb for c in rhs):
        return None
    # the last letter of one operand only is its query (key) axis; letters before it of that operand
    # only are axes the other one is broadcast over (multi-query attention's 'b h i d, b j d -> b h i j':
    # one key head for every query head)
    qa, kb = qs[:-1], ks[:-1]
    canon = [*ss, *qa, *kb, qs[-1], ks[-1]]
    sizes = dict(zip(rhs, out.shape, strict=True))
    shape = tuple(sizes[c] for c in canon)

    def side(code: torch.Tensor, letters: str, keep: list[str]) -> tuple[torch.Tensor, bool]:
        mixed = False
        for c in reversed([c for c in letters if c not in rhs]):  # contracted: one code per slice
            code, m = reduced(code, letters.index(c))
            letters = letters.replace(c, "")
            mixed = mixed or m
        code = code.permute([letters.index(c) for c in keep])
        return code, mixed

    q, mq = side(a, la, [*ss, *qa, qs[-1]])
    k, mk = side(b, lb, [*ss, *kb, ks[-1]])
    # shared letters one operand has once, broadcast over the other's (multi-query attention's single key
    # head kept as an axis of one: 'bhqd,bhkd->bhqk' with k (b, 1, n, d))
    lead = [sizes[c] for c in ss]
    q = q.expand(*lead, *q.shape[len(ss) :])
    k = k.expand(*lead, *k.shape[len(ss) :])
    if kb:  # (*ss, *qa, n) -> (*ss, *qa, *kb, n)
        q = q.reshape(*q.shape[:-1], *[1] * len(kb), q.shape[-1]).expand(*shape[:-1])
    if qa:  # (*ss, *kb, m) -> (*ss, *qa, *kb, m)
        k = k.reshape(*k.shape[: len(ss)], *[1] * len(qa), *k.shape[len(ss) :])
        k = k.expand(*shape[:-2], shape[-1])
    perm = [canon.index(c) for c in rhs]
    smap = ScoreMap(shape, q, k, (("permute", torch.Tensor.permute, (perm,), {}),))
    if mq and mk and _over_features(q, k):
        return smap.fail(OVER_FEATURES)
    return smap.fail("the product multiplies features of different positions") if mq or mk else smap


@dataclass
class Layout:
    """How a softmax's output maps onto (batch, head, query, key), found from lineage."""

    rows: torch.Tensor  # (B, H, q): the row of the (rows, keys) view of the softmax output
    dim: int  # the softmax's (key) dim
    keys: int
    key_labels: (
        tuple[str | None, ...] | None
    )  # None for the sequence's own positions, "<name i>" for learned ones
    query_labels: tuple[str | None, ...] | None
    cross: bool | None  # queries and keys come from different inputs
    ext: bool  # the keys include positions from outside the call (a KV cache, a memory)
    qcode: torch.Tensor  # (rows,) the query code of every row of the (rows, keys) view
    seq_keys: torch.Tensor | None = None  # (B, K) every sequence's key positions (-1 at learned keys)
    # the queries' features were never projected inside the call (handed in, or made where capture cannot see:
    # numpy, TorchScript), so whether they are the keys' own sequence cannot be told (``cross`` is None then)
    raw_queries: bool = False
    _in_order: bool | None = None

    def bhqk(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor shaped like the softmax input/output -> (B, H, q, k)."""
        if self.dim == t.dim() - 1 and t.shape[:-1] == self.rows.shape and self.in_order:
            return t  # already (B, H, q, k) in order (an expanded mask stays a view)
        flat = t.movedim(self.dim, -1).reshape(-1, self.keys)
        if self.in_order:  # the rows already are (B, H, q) in order: a view, no copy
            return flat.view(*self.rows.shape, self.keys)
        return flat[self.rows.to(flat.device)]

    @property
    def in_order(self) -> bool:
        if self._in_order is None:
            self._in_order = bool(torch.equal(self.rows.flatten(), torch.arange(self.rows.numel())))
        return self._in_order


_MIX = torch.tensor(0x9E3779B97F4A7C15 - (1 << 64), dtype=torch.int64)  # a 64-bit odd constant (row hashes)
_MIX2 = 0xBF58476D1CE4E5B9 - (1 << 64)  # splitmix64's multipliers, as int64
_MIX3 = 0x94D049BB133111EB - (1 << 64)


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """A non-linear 64-bit mix of every element (splitmix64's finalizer; int64 products wrap around)."""
    x = x ^ (x >> 30)
    x = x * _MIX2
    x = x ^ (x >> 27)
    x = x * _MIX3
    return x ^ (x >> 31)


def _replayed(smap: ScoreMap, shape: tuple[int, ...]) -> torch.Tensor | str:
    idx = torch.arange(math.prod(smap.shape), dtype=torch.int64).view(smap.shape)
    for name, fn, args, kwargs in smap.chain:
        try:
            idx = fn(idx, *args, **kwargs)
        except Exception as exc:  # an op whose replay needs more than its arguments
            return f"{name} on the scores could not be followed ({type(exc).__name__})"
    if tuple(idx.shape) != tuple(shape):
        return "the scores were reshaped in a way capture could not follow"
    return idx


def _heads_handed_in(kh: torch.Tensor, sources: Sources) -> bool:
    """The keys (B, H, K) of each head are rows of one tensor handed in from outside, head h's the K rows after
    head h - 1's: a (B, H, S, d) cache of keys projected before the call (a cross-attention's, computed once
    and handed to every decoding step), whose head axis the queries' heads, told by their features, line up
    with. Its positions are numbered row by row, so each head's keys got numbers of their own; they are one
    sequence's keys seen by every head."""
    if kh.dim() != 3 or int(kh.shape[1]) < 2 or not bool((kh >= 0).all()):
        return False
    src = sources.index(kh)
    if not bool((src == src.reshape(-1)[:1]).all()):
        return False
    source = sources.items[int(src.reshape(-1)[0])]
    if source.kind != "external":
        return False
    h, k = int(kh.shape[1]), int(kh.shape[2])
    step = torch.arange(h, dtype=kh.dtype, device=kh.device)[None, :, None] * k
    return bool((kh - kh[:, :1] == step).all())


def _copied_axis(smap: ScoreMap) -> int | None:
    """A lead axis of the product past its first (size > 1) along which every query and key code is the same:
    its slices cannot be told apart by lineage. (The first is the batch: a batch copied, as classifier-free
    guidance's ``cat([x, x])`` copies one sequence, is sequences of their own.)"""
    lead = smap.q.dim() - 1
    if smap.k.dim() - 1 != lead:
        return None
    for a in range(1, lead):
        if int(smap.q.shape[a]) < 2 or int(smap.k.shape[a]) not in (1, int(smap.q.shape[a])):
            continue
        if bool((smap.q == smap.q.narrow(a, 0, 1)).all()) and bool((smap.k == smap.k.narrow(a, 0, 1)).all()):
            return a
    return None


def keys_last(smap: ScoreMap, shape: tuple[int, ...]) -> bool | None:
    """Whether the scores' present layout ``shape`` holds the keys along its last dim (every element along it one
    slice's and query's, each another key), as the product made them; None where the chain cannot be replayed."""
    idx = _replayed(smap, shape)
    if isinstance(idx, str) or idx.dim() < 1:
        return None
    m = smap.shape[-1]
    row, key = idx // m, idx % m
    return (
        bool((row == row[..., :1]).all())
        and int(shape[-1]) == m
        and bool((key != key[..., :1]).any() or m == 1)
    )


def rebased(smap: ScoreMap, shape: tuple[int, ...]) -> ScoreMap | None:
    """The same score map with the scores' present layout ``shape`` as its canonical one (no chain),
    where that layout still has the product's queries along its second-last dim and its keys along
    the last (a permute of the batch and head dims); None otherwise."""
    idx = _replayed(smap, shape)
    if isinstance(idx, str) or idx.dim() < 2:
        return None
    n, m = smap.shape[-2], smap.shape[-1]
    sl, qi, kj = idx // (n * m), (idx // m) % n, idx % m
    if not (
        bool((sl == sl[..., :1, :1]).all())
        and bool((qi == qi[..., :1]).all())
        and bool((kj == kj[..., :1, :]).all())
    ):
        return None
    q = smap.q.reshape(-1, n)[sl[..., :, 0], qi[..., :, 0]]
    k = smap.k.reshape(-1, m)[sl[..., 0, :], kj[..., 0, :]]
    return ScoreMap(tuple(shape), q, k)


@dataclass(frozen=True)
class _Structure:
    """Where every row of a softmax sits in its product, from the replayed index (shape only)."""

    slice_: torch.Tensor  # (R,) the product slice of each row
    along: torch.Tensor  # (R,) the row's query index on the product's query axis
    swapped: bool  # keys first: the softmax runs over the product's rows
    key_row: torch.Tensor | None  # (K,) the key index of every column, when the same for every row
    key_idx: torch.Tensor | None  # (R, K) otherwise


_STRUCTURES: dict[
    tuple, _Structure | str
] = {}  # (shape, chain, dim) -> structure: layers and calls share one
_MAX_STRUCTURES = 64


def _structure(smap: ScoreMap, shape: tuple[int, ...], dim: int) -> _Structure | str:
    key = None
    if not any(isinstance(a, torch.Tensor) for op in smap.chain for a in (*op[2], *op[3].values())):
        key = (smap.shape, tuple((op[0], repr(op[2]), repr(sorted(op[3].items()))) for op in smap.chain),
               tuple(shape), dim, torch.is_inference_mode_enabled())  # fmt: skip
        hit = _STRUCTURES.get(key)
        if hit is not None:
            return hit
    found = _find_structure(smap, shape, dim)
    if key is not None and (isinstance(found, str) or found.key_idx is None):
        if len(_STRUCTURES) >= _MAX_STRUCTURES:
            _STRUCTURES.pop(next(iter(_STRUCTURES)))
        _STRUCTURES[key] = found
    return found


def _find_structure(smap: ScoreMap, shape: tuple[int, ...], dim: int) -> _Structure | str:
    idx = _replayed(smap, shape)
    if isinstance(idx, str):
        return idx
    n, m = smap.shape[-2], smap.shape[-1]
    keys = shape[dim]
    idx = idx.movedim(dim, -1).reshape(-1, keys)
    if not idx.numel():
        return "the scores are empty"
    sl, qi, kj = idx // (n * m), (idx // m) % n, idx % m
    if not bool((sl == sl[:, :1]).all()):
        return (
            "the softmax runs across slices of the query-key product (heads, sequences, or a second axis of "
            "queries or keys: attention over a grid laid out on two axes, as Keras' attention_axes), which "
            "capture cannot lay out as one query's keys"
        )
    if bool((qi == qi[:, :1]).all()):  # over the product's columns: q @ k.T
        along, key_idx, swapped = qi[:, 0], kj, False
    elif bool((kj == kj[:, :1]).all()):  # over its rows: keys first, k @ q.T softmaxed over dim -2
        along, key_idx, swapped = kj[:, 0], qi, True
    else:
        return "the softmax runs over a mix of query and key positions"
    regular = bool((key_idx == key_idx[:1]).all())
    return _Structure(sl[:, 0].contiguous(), along.contiguous(), swapped,
                      key_idx[0].contiguous() if regular else None, None if regular else key_idx)  # fmt: skip


RAW_QUERIES = "the queries were not projected inside the captured call, so their head axis cannot be traced"


def decode(smap: ScoreMap, shape: tuple[int, ...], dim: int, sources: Sources) -> Layout | str:
    """The layout of a softmax over ``dim`` of scores shaped ``shape``, or why it cannot be known.

    Key-side work runs on the distinct key rows of the product (one per slice when every row reads
    its keys in the same order), so a 512-token map costs about one pass over its rows."""
    if smap.broken:
        return smap.broken
    st = _structure(smap, shape, dim)
    if isinstance(st, str):
        return st
    n, m = smap.shape[-2], smap.shape[-1]
    keys = shape[dim]
    device = smap.q.device
    qtab, ktab = smap.q.reshape(-1, n), smap.k.reshape(-1, m)
    if st.swapped:
        qtab, ktab = ktab, qtab
    sl0, along = st.slice_.to(device), st.along.to(device)
    q = qtab[sl0, along]  # (R,)
    if st.key_row is not None:  # every row reads its slice's keys in one order: one key row per slice
        kbase, krow = ktab[:, st.key_row.to(device)], sl0  # (S, K), (R,)
    else:
        assert st.key_idx is not None
        kbase, krow = ktab[sl0[:, None], st.key_idx.to(device)], torch.arange(q.numel(), device=device)
    qf = q & FEATURES
    raw = bool((qf & RAW).any())
    if qtab.shape[0] > 1 and raw:  # (one slice, a 2-D product: one sequence, one head)
        return RAW_QUERIES
    qpos, kpos_b = q >> SHIFT, kbase >> SHIFT
    is_param_b = sources.learned(kpos_b)  # (U, K)
    used = torch.unique(krow)
    kf = kbase[used] & FEATURES
    projected_key = ~is_param_b[used] & ((kf & RAW) == 0)  # keys made by a projection inside the call
    big = torch.iinfo(torch.int64).max
    lo, hi = kf.masked_fill(~projected_key, big).amin(-1), kf.masked_fill(~projected_key, -1).amax(-1)
    if bool(((lo != hi) & projected_key.any(-1)).any()):
        return ("the keys of one query come from different heads' features: the heads were split across "
                "positions (a view to (B*H, L, d) without moving the head axis first?), or the keys are tokens "
                "made from one vector's features (a projection reshaped into tokens, as IP-Adapter's image "
                "tokens are), or keys of two projections joined whose heads sit at other features in each "
                "(GLIDE's encoder_kv joined to its qkv's keys), which lineage cannot tell apart")  # fmt: skip
    kh = lo[torch.searchsorted(used, krow)]  # each row's keys' head (their first feature), big: learned keys
    asks = (kh != big) & ~sources.learned(qpos)  # (a padded query cell's features are no head's)
    pairs = torch.unique(torch.stack([qf[asks], kh[asks]]), dim=1)
    by_keys = False  # the heads told by the keys' features: queries of one projection broadcast over the
    # heads, each over its own keys ((B, 1, L, d) @ (1, H, d, Lc)), where no row reads keys of two heads
    if bool((pairs[0, 1:] == pairs[0, :-1]).any()):  # (sorted by the queries' head first)
        by_keys = bool(asks.all()) and int(pairs[0].unique().numel()) == 1
        if not by_keys:
            return ("the queries of one head meet the keys of different heads in different rows: a head axis "
                    "left in another place on one side (the queries split into heads without their transpose?)")  # fmt: skip
    heads, h = torch.unique(kh if by_keys else qf, return_inverse=True)
    n_heads = int(heads.numel())
    # rows of one sequence have the same keys: group by (head, the keys' positions), learned keys
    # left out; where that puts one query position twice in a group (keys learned or broadcast over
    # the batch), the product's slices tell the sequences apart as well
    seq_b = kpos_b.masked_fill(is_param_b, -1)  # (U, K)
    # each (key slot, position) mixed on its own before the sum: a sum linear in the positions makes rows
    # that read other positions collide (beams whose histories weigh the same: 1*1 + 2*1 = 3*1)
    slots = torch.arange(1, keys + 1, dtype=torch.int64, device=device)
    key_hash = _mix64(seq_b * _MIX.to(device) + slots).sum(-1)[krow] ^ (h * 0x2545F491)
    # keys that are all learned (an induced summary, a latent array) name no sequence: the product's
    # slice does (a fold of the batch keeps one sequence per slice), so rows of different slices stay apart
    learned_only = (seq_b < 0).all(-1)[krow]
    if bool(learned_only.any()):
        key_hash = key_hash ^ torch.where(learned_only, (sl0 + 1) * 0x61C88647, 0)
    q_param = sources.learned(qpos)
    grouped = _groups(key_hash, qpos, kpos_b, krow)
    if grouped is None or (
        not isinstance(grouped, str) and _shared_keys(grouped[0], sl0, qpos, q_param, sources)
    ):
        copied = _copied_axis(smap)
        if copied is not None:
            return (
                f"the product's axis {copied} holds the same queries and keys at every index (heads whose "
                "projections lineage numbers alike, as a mixture of attention heads' experts are; one head copied; "
                "rows of a pair representation made as an outer sum, as AlphaFold's triangle attention reads them), "
                "so which of its slices are heads, sequences or rows cannot be told"
            )
        grouped = _groups(key_hash ^ (sl0 * 0x61C88647), qpos, kpos_b, krow)
    if isinstance(grouped, str) or grouped is None:
        return grouped or (
            "one position is several queries of one sequence and head (a learned vector or a padding position "
            "repeated among the tokens, as MAE's mask token fills every masked patch; a grid made from one "
            "vector's features, as a GAN generator reshapes its projected noise; features moved between "
            "positions, as a temporal shift moves channels between frames), so its rows cannot be told apart "
            "by position"
        )
    g, first, n_groups = grouped
    per_head = torch.zeros(n_heads, dtype=torch.int64, device=device).index_add_(
        0, h[first], torch.ones_like(first)
    )
    batch = int(per_head[0])
    rows_per_group = torch.bincount(g, minlength=n_groups)
    if not bool((per_head == batch).all()) or not bool((rows_per_group == rows_per_group[0]).all()):
        return "heads hold different numbers of sequences or queries"
    n_q = int(rows_per_group[0])
    # order: heads by feature; sequences in the model's own order: by the product's slice (a fold
    # keeps the batch order in every head), then by position where sequences share a slice
    gq = torch.full_like(first, big).scatter_reduce(0, g, qpos.masked_fill(q_param, big), "amin")
    gk = seq_b.masked_fill(is_param_b, big).amin(-1)[krow[first]]
    gs = torch.full_like(first, big).scatter_reduce(0, g, sl0, "amin")
    gh = h[first]
    key = list(zip(gh.tolist(), gs.tolist(), gq.tolist(), gk.tolist(), strict=True))
    order = sorted(range(n_groups), key=key.__getitem__)
    rank = torch.empty_like(first)
    for i, gi in enumerate(order):
        rank[gi] = i % batch
    r = torch.arange(g.numel(), device=device)
    # queries in the model's order: along the product's query axis (slice by slice)
    sort_key = ((h * batch + rank[g]) * (int(sl0.max()) + 1) + sl0) * (max(n, m) + 1) + along
    rows = r[torch.argsort(sort_key)].view(n_heads, batch, n_q).transpose(0, 1).contiguous()
    qp = qpos[rows]  # (B, H, q)
    if not bool((qp == qp[:, :1]).all()):
        return "the heads of one sequence hold different queries"
    why = _gathered(
        qp[:, 0], kpos_b[krow[rows[:, 0, 0]]], q_param[rows[:, 0]], is_param_b[krow[rows[:, 0, 0]]]
    )
    if why is not None:
        return why
    kh = seq_b[krow[rows[:, :, 0]]]  # (B, H, K)
    if not bool((kh == kh[:, :1]).all()) and not _heads_handed_in(kh, sources):
        return "the heads of one sequence see different keys"
    kp = kh[:, 0]  # (B, K)
    # slots of a buffer made in the model that a sequence left unwritten (HF LLaVA's merge into
    # ``torch.zeros``, a sequence padded where another holds its image) are padding positions of that
    # sequence, as a PAD token is: a slot empty in some sequence is labelled by none (F.pad's padding at
    # the edge windows of a map is not: the windows are no sequences of one length)
    k_pad, q_pad = sources.empty(kpos_b[krow[rows[:, 0, 0]]]), sources.empty(qp[:, 0])
    if batch > 1 and not bool(((kp >= 0) | k_pad == (kp[:1] >= 0) | k_pad[:1]).all()):
        return (
            "sequences have learned or padding keys in different places (windows padded at the edge of a "
            "map, as Swin pads it to whole windows): one map's key labels cannot hold them"
        )
    why = _reordered(qp[:, 0].masked_fill(q_param[rows[:, 0]], -1), sources) or _reordered(kp, sources)
    if why is not None:
        return why
    k0 = kpos_b[krow[rows[0, 0, 0]]]
    cross = _cross(qpos[rows[0, 0]], k0, sources)
    raw = raw and bool(cross)  # (other positions than the keys': from another input, or the same one unseen)
    return Layout(
        rows=rows.cpu(),
        dim=dim,
        keys=keys,
        key_labels=_unpadded(_labels(k0, sources), k_pad),
        query_labels=_unpadded(_labels(qpos[rows[0, 0]], sources, k0), q_pad),
        cross=cross,
        ext=cross is False and _extends(qpos[rows[0, 0]], k0, sources),
        qcode=q,
        seq_keys=kp,
        raw_queries=raw,
    )


def _unpadded(labels: tuple[str | None, ...] | None, pad: torch.Tensor) -> tuple[str | None, ...] | None:
    """``labels`` (the first sequence's) without the slots that are padding in other places across the
    sequences (B, n): None there, as for a sequence's own token; None when no label is left."""
    if labels is None or pad.shape[0] < 2 or bool((pad == pad[:1]).all()):
        return labels
    varies = (pad != pad[:1]).any(0).tolist()
    kept = tuple(None if varies[j] else lab for j, lab in enumerate(labels))
    return kept if any(kept) else None


def _gathered(
    qp: torch.Tensor, kp: torch.Tensor, q_learned: torch.Tensor, k_learned: torch.Tensor
) -> str | None:
    """Why rows that are a few of their own sequence's positions are no map capture can label, or None.
    ``qp`` (B, q) the query positions of each sequence, ``kp`` (B, K) its keys'. Fewer queries than
    keys of the same sequence are some of its keys in order, at the same places in every sequence (a
    chunk of queries, the last ones of a KV cache, a segment after its memory, every second position:
    LeViT's subsampled queries); queries picked per sequence (Informer's top-u ``Q[b, h, idx]``) are
    other positions in every sequence, in no order (a pick computed from the data is flagged where it is
    seen, one sequence too)."""
    if qp.shape[1] < 2 or bool(q_learned.any()):
        return None
    own = kp.masked_fill(k_learned, -1)
    if not bool((own >= 0).any()) or qp.shape[1] >= int((own >= 0).sum(-1).max()):
        return None
    eq = qp[:, :, None] == own[:, None, :]  # (B, q, K): which of its sequence's keys each query is
    if not bool(eq.any(-1).all()):
        return None  # other positions than the keys' own: cross-attention, not a selection
    at = eq.to(torch.int8).argmax(-1)  # each query's place among its sequence's keys
    if bool((at[:, 1:] > at[:, :-1]).all()) and bool((at == at[:1]).all()):
        return None  # the same places in every sequence, in order (a run, or a stride: LeViT's subsample)
    return ("the queries are a few of each sequence's positions picked by index (other positions in "
            "every sequence, or out of order: Informer's top-u queries), so the rows name no positions")  # fmt: skip


def _reordered(pos: torch.Tensor, sources: Sources) -> str | None:
    """Why rows or keys that hold a whole sequence's positions, in another order than the sequence's,
    are no map capture can label by its tokens, or None. ``pos`` (B, N): each record sequence's
    positions in the model's order (-1 at learned ones). A sequence gathered into another order
    (sorted into buckets, routed, flipped) would show its map as if it were in order; windows that
    hold part of a sequence (Swin's, rolled) are sequences of their own, in the model's order."""
    if pos.shape[-1] < 2 or not bool((pos >= 0).any()):
        return None
    own = pos >= 0
    seen = torch.where(own, pos, -1).cummax(-1).values  # the furthest position met so far, in each row
    if not bool((own[:, 1:] & (pos[:, 1:] <= seen[:, :-1])).any()):
        return None  # every position after the ones before it (the common case, learned ones aside)
    safe = pos.clamp_min(0)
    row = sources.rows(safe).masked_fill(~own, -1)  # (B, N): which source row each position is in
    per = torch.tensor([s.row or s.n for s in sources.items], dtype=torch.int64, device=pos.device)
    size = per[sources.index(safe)]  # positions in that row
    for b in range(pos.shape[0]):
        r, p, n = row[b][own[b]], pos[b][own[b]], size[b][own[b]]
        if r.numel() < 2:
            continue
        order = torch.argsort(r, stable=True)  # each row's positions, in the model's order
        r, p, n = r[order], p[order], n[order]
        back = (r[1:] == r[:-1]) & (p[1:] <= p[:-1])  # a position at or before the one met before it
        if not bool(back.any()):
            continue
        for rid in torch.unique(r[1:][back]).tolist():
            at = r == rid
            if int(torch.unique(p[at]).numel()) == int(n[at][0]) == int(at.sum()):  # the whole row, each
                # position once, out of order (a row twice in order, ``cat([x, h])``, is two runs of it)
                return ("the positions of a sequence were put in another order before the product "
                        "(gathered, sorted or flipped: buckets, routing), so the map's rows and keys are in "
                        "the model's order, not the sequence's")  # fmt: skip
    return None


def subset(kp: torch.Tensor, sources: Sources) -> str | None:
    """Why keys that are some of a sequence's positions, picked per sequence, are no map capture can label
    by its tokens, or None. ``kp`` (B, K): each record sequence's key positions (-1 at learned ones).
    Keys that leave out positions of their source row are picked: by the model's structure when the
    sequences of every row pick the same places (windows, blocks, patches merged 2 x 2, a cache that
    keeps its first and last tokens, ``x[:, 1:]``), by the data when rows pick different ones (tokens
    kept by a score as in DynamicViT, EViT or a mixture of depths, MAE's random visible patches, ToMe's
    merged tokens): those show as if they were the sequence's first tokens. One row alone cannot say
    which. Capture asks it of a whole record, once the pieces of one call (blocks, a loop over the
    sequences) are joined."""
    own = kp >= 0
    if not bool(own.any()):
        return None
    starts = torch.tensor([s.start for s in sources.items], dtype=torch.int64, device=kp.device)
    tokens = torch.tensor([s.kind == "tokens" for s in sources.items], dtype=torch.bool, device=kp.device)
    src = sources.index(kp.clamp_min(0))
    called = own & tokens[src]  # keys of tokens embedded in the call: earlier calls' first (a KV cache)
    tables = torch.tensor([s.table for s in sources.items], dtype=torch.int64, device=kp.device)[src]
    for table in torch.unique(tables[called]).tolist():  # (a cache's steps are looked up in one table;
        mine = called & (tables == table)  # ETC's global tokens before its long input are another input)
        at_call = torch.where(mine, starts[src], -1)
        back = (mine[:, 1:] & (at_call[:, 1:] < at_call.cummax(-1).values[:, :-1])).any(-1)
        for b in back.nonzero().flatten().tolist():
            calls = at_call[b][mine[b]]
            runs = 1 + int((calls[1:] != calls[:-1]).sum())
            if runs > int(torch.unique(calls).numel()):
                continue  # (a call's tokens in several runs: inputs interleaved, Gato's observations and actions
                # per timestep, not a cache's steps, each one run of slots)
            return ("the keys hold tokens of several calls (a cache of earlier steps) in another order than the "
                    "calls': a rotating cache read in its slots' order, so the map's keys are not in the "
                    "sequence's order")  # fmt: skip
    if kp.shape[0] < 2:
        return None

    pos = torch.unique(kp[own])  # the distinct positions the keys hold
    first_u, size_u = sources.span(pos)
    rows, at = torch.unique(first_u, return_inverse=True)
    if not bool((torch.bincount(at, minlength=rows.numel()) < size_u.new_zeros(rows.shape).scatter_reduce(
            0, at, size_u, "amax")).any()):  # fmt: skip
        return None  # every row the keys come from is there whole
    safe = kp.clamp_min(0)
    first, sizes = sources.span(safe)
    offsets = (safe - first).masked_fill(~own, -1)
    # source -> row -> the places each of the record's sequences picks from that row, in order
    picks: dict[int, dict[int, list[tuple]]] = {}
    for b in range(kp.shape[0]):
        m = own[b]
        for r in torch.unique_consecutive(first[b][m]).tolist():
            at_src = picks.setdefault(sources.at(r).start, {})
            row = m & (first[b] == r)
            got = tuple(offsets[b][row].tolist())
            size = int(sizes[b][row][0])
            if got == tuple(range(got[0], got[0] + len(got))) and (got[0] == 0 or got[-1] == size - 1):
                got = ("run from an end",)  # a sequence's padding cut (right or left), the same in kind
            at_src.setdefault(r, []).append(got)
    for by_row in picks.values():  # rows of one source (the batch of one input) picking other places
        lists = list(by_row.values())
        if len(lists) > 1 and any(len({x[j] for x in lists if len(x) > j}) > 1
                                  for j in range(max(len(x) for x in lists))):  # fmt: skip
            return ("the keys are some of a sequence's positions, picked differently in each sequence (tokens "
                    "kept by a score or sampled: pruned, routed, merged, MAE's visible patches), so the map's "
                    "keys name no tokens a trace could label")  # fmt: skip
    return None


@dataclass(frozen=True)
class Described:
    key_labels: tuple[str | None, ...] | None
    query_labels: tuple[str | None, ...] | None
    cross: bool | None
    ext: bool
    raw_queries: bool = False  # as Layout.raw_queries


def describe(q: torch.Tensor, k: torch.Tensor, sources: Sources) -> Described | None:
    """Labels, cross and cache of an attention call given its queries' and keys' codes (..., L, d)
    (SDPA's arguments): read off the first sequence and head."""
    if q.dim() < 2 or k.dim() < 2 or not q.numel() or not k.numel():
        return None
    qpos = (q[..., 0] >> SHIFT).reshape(-1, q.shape[-2])[0]
    kpos = (k[..., 0] >> SHIFT).reshape(-1, k.shape[-2])[0]
    cross = _cross(qpos, kpos, sources)
    raw = bool(cross) and bool(((q.reshape(-1, q.shape[-2], q.shape[-1])[0, :, 0] & FEATURES) & RAW).any())
    return Described(_labels(kpos, sources), _labels(qpos, sources, kpos), cross,
                     cross is False and _extends(qpos, kpos, sources), raw)  # fmt: skip


def _shared_keys(
    g: torch.Tensor, sl0: torch.Tensor, qpos: torch.Tensor, q_param: torch.Tensor, sources: Sources
) -> bool:
    """Whether a group of rows with the same keys spans several product slices with queries from
    several rows of their input: keys the batch shares (one passage for many questions, a memory
    expanded over beams), where the slices, not the keys, tell the sequences apart. (Queries of one
    row spread over slices are one sequence computed a chunk of queries per slice.)"""
    n = int(g.max()) + 1 if g.numel() else 0
    big = torch.iinfo(torch.int64).max

    def spans(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        lo = torch.full((n,), big, dtype=torch.int64, device=g.device)
        hi = torch.full((n,), -1, dtype=torch.int64, device=g.device)
        lo = lo.scatter_reduce(0, g, values.masked_fill(~keep, big), "amin")
        hi = hi.scatter_reduce(0, g, values.masked_fill(~keep, -1), "amax")
        return (hi >= 0) & (lo != hi)

    over_slices = spans(sl0, torch.ones_like(q_param))
    if not bool(over_slices.any()):
        return False
    return bool((over_slices & spans(sources.rows(qpos), ~q_param)).any())


def _groups(key_hash: torch.Tensor, qpos: torch.Tensor, kpos_b: torch.Tensor, krow: torch.Tensor):
    """(group of every row, each group's first row, the number of groups) for rows grouped by
    ``key_hash``; a string when rows of a group see different keys (row r's keys are
    ``kpos_b[krow[r]]``), None when a group holds one query position twice."""
    groups, g = torch.unique(key_hash, return_inverse=True)
    n = int(groups.numel())
    first = torch.full((n,), -1, dtype=torch.int64, device=g.device)
    first = first.scatter_reduce(0, g, torch.arange(g.numel(), device=g.device), "amin", include_self=False)
    width = int(krow.max()) + 1
    pairs = torch.unique(krow * width + krow[first[g]])  # (key row, its group's first key row)
    if not bool((kpos_b[pairs // width] == kpos_b[pairs % width]).all()):
        return "rows of one sequence and head see different keys"
    seen = torch.unique(g * (int(qpos.max()) + 1) + qpos)
    if seen.numel() != g.numel():
        return None
    return g, first, n


def _kinds(pos: torch.Tensor, sources: Sources) -> list[Source]:
    return [sources.items[i] for i in sources.index(pos).tolist()]


def _labels(
    pos: torch.Tensor, sources: Sources, keys: torch.Tensor | None = None
) -> tuple[str | None, ...] | None:
    """ "<name i>" for learned positions (i: the parameter's row, or where a row comes twice, numbered in
    order) and for positions pooled
    from a sequence (``"<pooled i>"``: a strided conv's, a pool's, a projection over positions': no
    token is one of them; ``"<final state i>"``: an RNN's), None for the sequence's own. ``keys``: the
    call's key positions, when ``pos`` are its queries: a query at one of the keys takes that key's label,
    and another one is numbered on after the keys' (a question pooled beside the sentences it reads, as
    MemN2N's: both were ``<pooled 0>``, one label for two positions)."""
    if keys is not None:
        key_labels = _labels(keys, sources)
        if key_labels is not None:
            both = _labels(torch.cat([keys, pos]), sources)
            taken = {int(p): lab for p, lab in zip(keys.tolist(), key_labels, strict=True) if lab is not None}
            if both is not None:
                mine = both[len(keys) :]
                named = [
                    taken.get(int(p), lab) if lab is not None else None
                    for p, lab in zip(pos.tolist(), mine, strict=True)
                ]
                return tuple(named) if any(lab is not None for lab in named) else None
    seen: dict[Any, int] = {}
    out: list[str | None] = []
    kinds = _kinds(pos, sources)
    # two learned tensors of one label among these (``enc.tok``, ``dec.tok``): each named by its path instead
    starts: dict[str, set[int]] = {}
    for s in kinds:
        if s.kind in LABELLED:
            starts.setdefault(s.label, set()).add(s.start)
    # a parameter's rows, each once among these, are numbered by their row (``img_queries[:, 1:]``: rows 1 to n,
    # as the queries that read all its rows name them); a row twice (one learned vector for two images'), in order
    rows: dict[int, list[int]] = {}
    for p, s in zip(pos.tolist(), kinds, strict=True):
        if s.kind == "param":
            rows.setdefault(s.start, []).append(int(p) - s.start)
    by_row = {start: len(set(r)) == len(r) for start, r in rows.items()}
    for p, s in zip(pos.tolist(), kinds, strict=True):
        if s.kind in LABELLED or s.kind in ("pooled", "state"):
            # (vectors pooled separately, DSIN's session means, are numbered on across their sources: each is a
            # key of its own; a parameter's rows are numbered within it)
            at: Any = s.start if s.kind in LABELLED else ("pooled", s.label)
            i = seen.get(at, 0)
            seen[at] = i + 1
            if by_row.get(s.start) and s.kind == "param":
                i = int(p) - s.start
            name = s.path if s.path and len(starts.get(s.label, ())) > 1 else s.label
            label, k = f"<{name} {i}>", 1
            while label in out:  # (every key a column of its own: two with one label would be drawn as one)
                label, k = f"<{name} {i}.{k}>", k + 1
            out.append(label)
        else:
            out.append(None)
    return tuple(out) if seen else None


def _pooled_from(kinds: list[Source]) -> set[int]:
    """The sources that positions pooled from a sequence (a strided conv, a pool, a mean) came from."""
    return {s.origin[1] for s in kinds if s.kind == "pooled" and isinstance(s.origin, tuple)}


def _cross(qpos: torch.Tensor, kpos: torch.Tensor, sources: Sources) -> bool | None:
    """Queries and keys from different inputs: no query position among the keys, and no key pooled
    from the queries' own sequence (PVT's and SegFormer's spatial reduction: self-attention over
    fewer keys)."""
    qkinds, kkinds = _kinds(qpos, sources), _kinds(kpos, sources)
    qs = {int(p) for p, s in zip(qpos.tolist(), qkinds, strict=True) if s.kind not in LABELLED}
    ks = {int(p) for p, s in zip(kpos.tolist(), kkinds, strict=True) if s.kind not in LABELLED}
    if qs and ks and _pooled_from(kkinds) & {s.start for s in qkinds if s.kind not in LABELLED}:
        return False
    if qs and ks and _pooled_from(qkinds) & {s.start for s in kkinds if s.kind not in LABELLED}:
        return False  # queries pooled from the keys' own sequence (Nystromformer's landmarks)
    if qs and ks and _pooled_from(qkinds) & _pooled_from(kkinds):
        return False  # both pooled from one sequence (landmarks over landmarks)
    if not ks:  # learned keys alone (a memory bank, a Set Transformer's induced summary): the tokens
        # reading them read another input than their own; learned queries over the same learned
        # positions (DETR's object queries among themselves) attend to each other; else unknown
        if qs:
            return True
        if len(qpos) > 1 and set(qpos.tolist()) == set(kpos.tolist()):
            return False
        if {s.start for s in qkinds}.isdisjoint({s.start for s in kkinds}):
            return True  # learned queries reading another parameter's positions (Crossformer's router)
        return None
    if not qs:  # learned queries reading the tokens (a Perceiver's latents, CrossViT's and CaiT's class
        return True  # token over itself and the patches: named cross-attention by the papers that use it)
    return qs.isdisjoint(ks)


def _extends(qpos: torch.Tensor, kpos: torch.Tensor, sources: Sources) -> bool:
    """The keys hold positions besides the queries' own (a KV cache, a memory of earlier positions)
    from another input than the queries'. Other positions of the queries' own input are not a cache:
    the queries are a part of their sequence (attention computed a chunk of queries at a time)."""
    qs = set(qpos.tolist())
    kinds = _kinds(qpos, sources)
    own = {s.start for s in kinds}  # with the inputs a pooled query was pooled from (CLIP's mean token)
    own |= _pooled_from(kinds)
    return any(
        s.kind not in LABELLED
        and p not in qs
        and s.start not in own
        and not (s.kind == "pooled" and isinstance(s.origin, tuple) and s.origin[1] in own)
        for p, s in zip(kpos.tolist(), _kinds(kpos, sources), strict=True)
    )
