"""AttentionTrace -> the arguments of bertviz's ``head_view`` / ``model_view`` (pure: no streamlit, no display).

bertviz takes one torch tensor ``[1, head, query, key]`` per layer plus the tokens:
- self-attention models (encoder-only: enc_self; decoder-only: dec_self): ``attention``, ``tokens``;
- encoder-decoder models: ``encoder_attention``, ``decoder_attention``, ``cross_attention``,
  ``encoder_tokens``, ``decoder_tokens``.

    args = bertviz_args(trace, view="model")
    html = bertviz.model_view(**args.kwargs, html_action="return").data

bertviz writes every number into the page as JSON and draws with d3, so long inputs freeze the
browser. Above ``max_tokens`` tokens (100) a warning is returned and only a subset goes to
bertviz: the layers asked for (default: the first), then as many heads as fit in ``max_cells``
numbers, and if even one head does not fit, the first tokens only. Layer labels stay the model's
(bertviz's ``include_layers``); in the head view, whose bertviz API has no ``include_heads``,
a head subset is passed pre-sliced and ``BertvizArgs.heads`` says which heads they are.
Trailing PAD positions (keys no query may attend to) are left out by default.
"""

from __future__ import annotations

import warnings as _warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.core.traces.trace import AttentionTrace

MAX_TOKENS = 100  # above this, warn and show a subset
MAX_CELLS = 250_000  # numbers handed to bertviz for a long input (layers x heads x query x key, all kinds)
VIEWS = ("head", "model")


@dataclass(frozen=True)
class BertvizArgs:
    view: str  # "head" or "model"
    kwargs: dict[str, Any]  # bertviz.<view>_view(**kwargs, html_action="return")
    layers: list[int]  # the model's layer indices shown
    heads: list[int]  # the model's head indices shown
    n_tokens: dict[str, int]  # tokens shown per axis ("tokens" or "encoder"/"decoder")
    warnings: list[str] = field(default_factory=list)

    @property
    def fn_name(self) -> str:
        return f"{self.view}_view"


def _trailing_pad(mask: np.ndarray | None) -> int:
    """Keys at the end that no query may attend to (right padding)."""
    if mask is None:
        return 0
    usable = np.asarray(np.asarray(mask).any(axis=0), dtype=bool)  # (key,)
    n = len(usable)
    while n > 0 and not usable[n - 1]:
        n -= 1
    return len(usable) - n


def _to_torch(arr: np.ndarray):
    import torch

    with _warnings.catch_warnings():  # trace arrays are read-only; bertviz only reads them
        _warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def bertviz_args(
    trace: AttentionTrace,
    view: str = "model",
    include_layers: list[int] | None = None,
    include_heads: list[int] | None = None,
    max_tokens: int = MAX_TOKENS,
    max_cells: int = MAX_CELLS,
    drop_padding: bool = True,
) -> BertvizArgs:
    """What bertviz needs to draw this trace (see the module docstring for the limits)."""
    if view not in VIEWS:
        raise ValueError(f"view must be 'head' or 'model', got {view!r}")
    kinds = trace.kinds
    if not kinds:
        raise ValueError("this trace holds no attention")
    notes: list[str] = []
    seq2seq = "cross" in kinds or ("enc_self" in kinds and "dec_self" in kinds)
    nan = [k for k in kinds if np.isnan(np.asarray(trace.probs(k), dtype=np.float32)).any()]
    if nan:
        notes.append(f"the {', '.join(nan)} maps hold NaN (not numbers, as the model computed them): bertviz "
                     "cannot draw NaN, so it shows those cells as 0")  # fmt: skip

    # -- tokens per axis, trailing PAD dropped ---------------------------------------------
    src, tgt = list(trace.src_tokens), list(trace.tgt_tokens)
    if drop_padding:
        if "enc_self" in kinds:
            src = src[: len(src) - _trailing_pad(trace.mask("enc_self"))]
        if "dec_self" in kinds:
            tgt = tgt[: len(tgt) - _trailing_pad(trace.mask("dec_self"))]
    axis_len = {"src": len(src), "tgt": len(tgt)}
    kind_axes = {"enc_self": ("src", "src"), "dec_self": ("tgt", "tgt"), "cross": ("tgt", "src")}

    # -- layers and heads --------------------------------------------------------------------
    n_layers = min(trace.probs(k).shape[0] for k in kinds)
    n_heads = min(trace.probs(k).shape[1] for k in kinds)
    if len({trace.probs(k).shape[0] for k in kinds}) > 1:
        notes.append(f"encoder and decoder have different layer counts; showing the first {n_layers} of each")
    layers = list(range(n_layers)) if include_layers is None else [int(i) for i in include_layers]
    heads = list(range(n_heads)) if include_heads is None else [int(h) for h in include_heads]
    bad = [i for i in layers if not 0 <= i < n_layers] + [h for h in heads if not 0 <= h < n_heads]
    if bad or not layers or not heads:
        raise ValueError(
            f"include_layers must be within 0..{n_layers - 1} and include_heads within 0..{n_heads - 1}"
        )

    longest = max(axis_len.values())
    if longest > max_tokens:
        per_head = sum(axis_len[q] * axis_len[k] for q, k in (kind_axes[kind] for kind in kinds))
        if include_layers is None:
            layers = layers[:1]
        fit_heads = max(1, max_cells // max(per_head * len(layers), 1))
        if len(heads) > fit_heads:
            heads = heads[:fit_heads]
        shown = (
            f"layer(s) {layers}, head(s) {heads[0]}..{heads[-1]}"
            if len(heads) > 1
            else f"layer(s) {layers}, head {heads[0]}"
        )
        notes.append(f"{longest} tokens is long for bertviz (more than {max_tokens}): showing {shown} only")
        if per_head * len(layers) * len(heads) > max_cells:
            keep = max(1, int((max_cells / (len(layers) * len(heads) * max(len(kinds), 1))) ** 0.5))
            for axis in axis_len:
                axis_len[axis] = min(axis_len[axis], keep)
            notes.append(f"and only the first {keep} tokens (rows do not sum to 1 after cropping)")
    src, tgt = src[: axis_len["src"]], tgt[: axis_len["tgt"]]

    # -- tensors -------------------------------------------------------------------------------
    slice_heads = view == "head" and heads != list(range(n_heads))

    def layers_of(kind: str) -> tuple:
        q_axis, k_axis = kind_axes[kind]
        arr = trace.probs(kind)[:n_layers, :, : axis_len[q_axis], : axis_len[k_axis]]
        if slice_heads:
            arr = arr[:, heads]
        return tuple(_to_torch(arr[i][None]) for i in range(arr.shape[0]))  # each (1, head, q, k)

    if seq2seq:
        kwargs: dict[str, Any] = {"encoder_tokens": src, "decoder_tokens": tgt}
        for kind, key in (
            ("enc_self", "encoder_attention"),
            ("dec_self", "decoder_attention"),
            ("cross", "cross_attention"),
        ):
            if kind in kinds:
                kwargs[key] = layers_of(kind)
        n_tokens = {"encoder": len(src), "decoder": len(tgt)}
    else:
        (kind,) = kinds
        tokens = src if kind == "enc_self" else tgt
        kwargs = {"attention": layers_of(kind), "tokens": tokens}
        n_tokens = {"tokens": len(tokens)}
    kwargs["include_layers"] = layers
    if view == "model":
        kwargs["include_heads"] = heads
    return BertvizArgs(view, kwargs, layers, heads, n_tokens, notes)
