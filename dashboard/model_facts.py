"""What a loaded model has, for every family the dashboard shows (pure: no streamlit, no plotly).

Every model has the interface of attnscope.core.families.interface.AttentionModel: core models (zoo, core folders,
minilm) carry a TransformerConfig as ``cfg``, Hugging Face folders and adapter files a ModelFacts.
Pages ask here, so one page works for encoder-only, decoder-only and encoder-decoder models.

Decoder steps are counted from the ``dec_self`` mask (its diagonal: a real position may attend
to itself), never from PAD ids: T5 and Marian start the decoder with PAD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.core.families.interface import AttentionModel
from attnscope.core.traces.trace import KIND_LABELS as ATTENTION
from attnscope.core.traces.trace import AttentionTrace, head_masks_differ

ARCH_LABELS = {"encoder": "encoder only", "decoder": "decoder only", "seq2seq": "encoder-decoder"}
KIND_LABELS = {
    "zoo": "zoo",
    "pretrained": "pretrained",
    "hf": "Hugging Face",
    "core": "core folder",
    "upload": "upload",
    "adapter": "adapter file",
}


def arch(lm: Any) -> str:
    """'encoder', 'decoder' (decoder only, GPT-2 style) or 'seq2seq'."""
    return lm.arch


def maps_mb(lm: Any, n_tokens: int) -> float | None:
    """About how many MB of attention maps (probabilities and scores, float32) one input of
    ``n_tokens`` tokens costs this model (decoders: as many target tokens); None when the model
    does not say its layers and heads (an adapter file)."""
    from attnscope.core.families.native import trace_bytes

    cfg = lm.cfg
    n_heads = cfg.n_heads
    if not n_heads:
        return None
    a = arch(lm)
    enc = cfg.n_enc_layers if a != "decoder" else 0
    dec = cfg.n_dec_layers if a != "encoder" else 0
    if a == "decoder":  # one sequence, in decoder self-attention only
        return trace_bytes(0, dec, n_heads, 1, 0, n_tokens) / 2**20
    return trace_bytes(enc, dec, n_heads, 1, n_tokens, n_tokens if dec else 0) / 2**20


def limits_line(lm: Any) -> str:
    """The sidebar's statement of the limits: tokens per input and MB of maps per run (both refused
    with a message beyond them, never a frozen page), with what this model's longest input costs.
    A model with no length limit of its own (an adapter without MAX_LEN) is told how many tokens the
    map budget holds instead."""
    from attnscope.core.families import native as runner

    budget = f"{runner.MAX_TRACE_MB:,} MB of attention maps per run (ATTNSCOPE_MAX_TRACE_MB)"
    if getattr(lm, "max_len", 0) is None:  # no limit of its own: the budget is the limit
        fit = longest_within(lm, runner.MAX_TRACE_MB)
        line = "No token limit of its own (its adapter sets no MAX_LEN) and " + budget
        if fit is not None:
            line += f"; about {fit:,} tokens per input fit that budget"
        return line + ". Beyond it the run is refused with a message."
    line = f"At most {lm.max_src_tokens:,} tokens per input (longer inputs are truncated) and " + budget
    mb = maps_mb(lm, lm.max_src_tokens)
    if mb is not None:
        line += f"; this model's longest input needs about {mb:,.0f} MB"
    return line + ". Beyond a limit the run is refused with a message."


def longest_within(lm: Any, budget_mb: float) -> int | None:
    """The most tokens one input may have for its maps to fit ``budget_mb`` (None when the model does
    not say its layers and heads)."""
    if maps_mb(lm, 1) is None:
        return None
    lo, hi = 1, 1 << 24
    while lo < hi:  # the cost grows with the tokens: the largest n within the budget
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if (maps_mb(lm, mid) or 0) <= budget_mb else (lo, mid - 1)
    return lo


def trace_arch(trace: AttentionTrace) -> str:
    """The same as ``arch`` read from a trace's kinds."""
    if trace.dec_self is None and trace.cross is None:
        return "encoder"
    if trace.enc_self is None and trace.cross is None and not trace.src_tokens:
        return "decoder"
    return "seq2seq"


# -- real positions and decoding steps -----------------------------------------------------------


def head_masks_note(trace: AttentionTrace) -> str | None:
    """One sentence when capture saw the heads of a layer masked differently (the trace's masks are
    what every head may see), naming the layers; None otherwise, or when the trace's meta says it in
    a shape other than {kind: [module, ...]} (a file from outside)."""
    parts = []
    for kind, names in head_masks_differ(trace.meta).items():
        shown = [n or "(model)" for n in names[:4]]
        more = f" and {len(names) - 4} more" if len(names) > 4 else ""
        parts.append(f"{ATTENTION[kind]}: {', '.join(shown)}{more}")
    if not parts:
        return None
    return (
        "The heads of a layer were masked differently (" + "; ".join(parts) + "). The masks shown are what "
        "every head may see; each head's own mask shows in its map, as weight 0 where it was masked. A "
        "top-k per head does this by design; an attn_mask of shape (batch × heads, L, L) repeated over "
        "the heads in the wrong order (repeat where repeat_interleave was meant) does it by mistake."
    )


def real_source(trace: AttentionTrace) -> np.ndarray:
    """(S,) bool, True = real source token (keys some query may attend to, in every layer where the layers
    were masked differently: a layer that forgot the padding mask does not make PAD real)."""
    if trace.enc_self_layer_masks is not None:
        return np.asarray(np.asarray(trace.enc_self_layer_masks).any(axis=-2).all(axis=0), dtype=bool)
    if trace.enc_self_mask is not None:
        return np.asarray(np.asarray(trace.enc_self_mask).any(axis=0), dtype=bool)
    return np.ones(len(trace.src_tokens), dtype=bool)


def real_decoder(trace: AttentionTrace) -> np.ndarray:
    """(T,) bool, True = real decoder position (the diagonal of the causal dec_self mask; without
    decoder self-attention, an RNN decoder's say, the trace's own record of its real positions)."""
    if trace.dec_self_mask is None:
        if trace.tgt_real is not None and len(trace.tgt_real) == len(trace.tgt_tokens):
            return np.asarray(trace.tgt_real, dtype=bool).copy()
        return np.zeros(len(trace.tgt_tokens), dtype=bool)
    if trace.dec_self_layer_masks is not None:  # (layers masked differently: real where every layer says so)
        return np.asarray(np.diagonal(np.asarray(trace.dec_self_layer_masks), axis1=-2, axis2=-1).all(axis=0))
    return np.diagonal(np.asarray(trace.dec_self_mask)).copy()


def prompt_len(trace: AttentionTrace) -> int:
    """Decoder-only traces: tokens of the prompt (the rest is the continuation); else 0."""
    return int(trace.meta.get("prompt_len", 0)) if trace_arch(trace) == "decoder" else 0


@dataclass(frozen=True)
class Steps:
    """Greedy steps in a trace: step t (0-based) is decoder query ``first + t``."""

    first: int
    count: int


def decode_steps(trace: AttentionTrace) -> Steps:
    """Seq2seq: one step per real decoder position. Decoder only: the last prompt position
    writes the first new token, so steps run from there to the last real position."""
    n_real = int(real_decoder(trace).sum())
    if trace_arch(trace) == "decoder":
        first = max(prompt_len(trace) - 1, 0)
        return Steps(first, max(n_real - first, 0))
    return Steps(0, n_real)


@dataclass(frozen=True)
class DecodeStep:
    """Step t of greedy decoding, read from a trace of the greedy output (teacher forcing on it).

    The decoder query at step t is position t of the decoder input (BOS + generated prefix);
    causal masking makes its attention identical to the step's own forward pass.
    """

    step: int
    prefix: tuple[str, ...]  # decoder input tokens 0..t (what the step could see)
    query_token: str  # decoder input token at position t
    new_token: str  # argmax output at position t (the token this step generated)
    new_prob: float
    cross: np.ndarray | None  # (layer, head, S): the step's attention over the source; None: decoder only
    dec_self: (
        np.ndarray | None
    )  # (layer, head, t+1): its attention over the prefix; None: no self-attention (an RNN)
    topk_tokens: tuple[str, ...]
    topk_probs: np.ndarray  # (k,)


def _topk_tokens(trace: AttentionTrace, q: int, ids: np.ndarray, itos) -> tuple[str, ...]:
    """Names of the top-k ids at query q: from the model's vocabulary, else the names the trace
    stores (trace files), else the ids themselves."""
    if itos is not None:
        return tuple(itos[int(i)] if 0 <= int(i) < len(itos) else "<unk>" for i in ids)
    if trace.topk_tokens is not None:
        return tuple(str(t) for t in trace.topk_tokens[q])
    return tuple(f"#{int(i)}" for i in ids)


def decode_step(trace: AttentionTrace, t: int, itos=None) -> DecodeStep:
    """Step t (0-based) of a greedy trace; ``cross`` is None for decoder-only models."""
    steps = decode_steps(trace)
    if not 0 <= t < steps.count:
        raise IndexError(f"step {t} is outside 0..{steps.count - 1}")
    q = steps.first + t
    dec_self, topk_ids, topk_probs, out_probs = (
        trace.dec_self,
        trace.topk_ids,
        trace.topk_probs,
        trace.out_probs,
    )
    if (
        (dec_self is None and trace.cross is None)
        or topk_ids is None
        or topk_probs is None
        or out_probs is None
    ):
        raise ValueError("a decoding step needs a decoder trace with its top-k predictions")
    top = np.asarray(topk_ids[q])
    return DecodeStep(
        step=t,
        prefix=tuple(trace.tgt_tokens[: q + 1]),
        query_token=trace.tgt_tokens[q],
        new_token=trace.out_tokens[q],
        new_prob=float(out_probs[q]),
        cross=None if trace.cross is None else np.asarray(trace.cross[:, :, q, :]),
        dec_self=None if dec_self is None else np.asarray(dec_self[:, :, q, : q + 1]),
        topk_tokens=_topk_tokens(trace, q, top, itos),
        topk_probs=np.asarray(topk_probs[q]),
    )


# -- parameters -----------------------------------------------------------------------------------


def parameter_count(lm: AttentionModel) -> int:
    """Distinct parameters of the model (tied weights counted once)."""
    return sum(p.numel() for _, p in lm.named_parameters())  # torch lists a tied weight once


def parameter_groups(lm: AttentionModel, share: float = 0.9) -> dict[str, int]:
    """Module -> parameter count (tied weights counted once). When one top-level module holds
    most parameters (Hugging Face wrappers: ``model.``, ``transformer.``), its children are shown."""
    seen: set[int] = set()
    named = []
    for name, p in lm.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            named.append((name, p.numel()))
    total = sum(n for _, n in named) or 1
    top: dict[str, int] = {}
    for name, n in named:
        top[name.split(".")[0]] = top.get(name.split(".")[0], 0) + n
    big = {k for k, v in top.items() if v / total >= share}
    out: dict[str, int] = {}
    for name, n in named:
        parts = name.split(".")
        key = ".".join(parts[:2]) if parts[0] in big and len(parts) > 2 else parts[0]
        out[key] = out.get(key, 0) + n
    return out
