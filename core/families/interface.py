"""The one model interface every page, command and check is written against.

Four classes implement it: ``attnscope.core.families.native.LoadedModel`` (attnscope's own Transformer: the zoo and
core folders), ``attnscope.models.pretrained.BertEncoderModel`` (MiniLM in core's Transformer),
``attnscope.core.families.hf.HFModel`` (Hugging Face folders) and ``attnscope.core.families.adapter.AdapterModel`` (any PyTorch model
through an adapter file). Callers ask the model what it can do (``arch``, ``injectable``,
``masks_from_ids``) instead of probing its type.

What callers may use is declared here and nothing else: the family (``family``), whether masks and
head interventions can be put into the forward pass (``InjectableModel``, ``injectable``), whether two
threads may run it at once (``thread_safe``), the position table (``position_table()``) and the
parameters (``named_parameters()``). No caller reaches into the wrapped ``torch.nn.Module``.

Shared pieces live here too: ``ModelFacts`` (what a page shows about a model that is not a core
``TransformerConfig``), ``pad_rows`` (the one way a batch is right-padded, with the real positions
beside it) and ``prediction_fields`` (the top-k packaging of a model's output probabilities).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch

from attnscope.core.errors import InputError
from attnscope.core.families import values as values_
from attnscope.core.traces.trace import AttentionTrace

ARCHS = ("encoder", "decoder", "seq2seq")  # encoder only | decoder only | encoder-decoder
Family = Literal["core", "pretrained", "hf", "adapter"]
FAMILIES: tuple[Family, ...] = ("core", "pretrained", "hf", "adapter")
# Module names of position tables in Hugging Face and hand-written models (BERT, GPT-2, BART, ViT, ...).
POSITION_MODULES = ("position_embeddings", "wpe", "embed_positions", "pos_embed", "position_embedding")
POSITION_SCHEMES = {
    "relative": "relative position biases inside attention (T5 family): no table is added to the embeddings",
    "rotary": "rotary position embeddings (RoPE): positions rotate queries and keys inside attention, "
    "no table is added to the embeddings",
}
TOPK = 5


@dataclass(frozen=True)
class ModelFacts:
    """The facts a page shows about a model, named like TransformerConfig's fields."""

    name: str
    model_type: str  # Hugging Face model_type ("bert", "gpt2", ...) or "adapter"
    arch: str  # encoder | decoder | seq2seq
    d_model: int
    n_heads: int
    n_enc_layers: int  # 0 for decoder-only models
    n_dec_layers: int  # 0 for encoder-only models
    src_vocab_size: int
    tgt_vocab_size: int
    max_len: int  # longest sequence the position scheme takes (tokenizer limit for relative schemes)
    pad_id: int
    bos_id: int  # decoder start token (seq2seq) / BOS; -1 when the model has none
    eos_id: int  # -1 when the model has none
    dtype: str = "float32"
    pos_encoding: str = "learned"  # learned | sinusoidal | relative | rotary | unknown (descriptive only)
    scale_embeddings: bool = False
    pos_offset: int = 0
    n_classes: int = 0  # >0 for *ForSequenceClassification checkpoints
    pooling: str = "mean"  # what the embedding output of an encoder uses

    @property
    def is_encoder_only(self) -> bool:
        return self.arch == "encoder"

    @property
    def d_head(self) -> int:
        return self.d_model // max(self.n_heads, 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PositionTable:
    """A model's own position table, or why it has none."""

    table: np.ndarray | None  # (positions, d_model)
    scheme: str  # sinusoidal | learned | relative | rotary | none
    where: str  # module the table came from (or the reason there is none)
    offset: int = 0  # position ids start here (BART's learned table starts at 2)


def find_position_table(module: torch.nn.Module, scheme: str, d_model: int, offset: int = 0) -> PositionTable:
    """The position table a model adds to its token embeddings, found by module name (POSITION_MODULES)
    and shape (positions, d_model); none for relative and rotary schemes."""
    if scheme in POSITION_SCHEMES:
        return PositionTable(None, scheme, POSITION_SCHEMES[scheme], offset)
    for name, sub in module.named_modules():
        weight = getattr(sub, "weight", None)
        if (
            name.rsplit(".", 1)[-1] in POSITION_MODULES
            and isinstance(weight, torch.Tensor)
            and weight.dim() == 2
        ):
            if weight.shape[1] == d_model:
                return PositionTable(weight.detach().float().cpu().numpy(), scheme, name, offset)
    return PositionTable(None, "none", "no position table found in this model", offset)


class ModelConfig(Protocol):
    """What every family's ``cfg`` says (TransformerConfig for core models, ModelFacts otherwise)."""

    @property
    def d_model(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def n_enc_layers(self) -> int: ...
    @property
    def n_dec_layers(self) -> int: ...
    @property
    def src_vocab_size(self) -> int: ...
    @property
    def tgt_vocab_size(self) -> int: ...
    @property
    def max_len(self) -> int: ...
    @property
    def pad_id(self) -> int: ...
    @property
    def bos_id(self) -> int: ...
    @property
    def eos_id(self) -> int: ...
    @property
    def pos_encoding(self) -> str: ...
    @property
    def pos_offset(self) -> int: ...
    @property
    def n_classes(self) -> int: ...
    @property
    def pooling(self) -> str: ...
    def to_dict(self) -> dict[str, Any]: ...


@runtime_checkable
class AttentionModel(Protocol):
    """What the CLI, the audit, the lab and every dashboard page use of a loaded model."""

    name: str
    folder: Path | None
    card: str
    meta: dict[str, Any]

    @property
    def family(self) -> Family:
        """core (attnscope's Transformer) | pretrained (shipped by a package, run in core) | hf | adapter."""

    @property
    def arch(self) -> str:
        """encoder | decoder | seq2seq."""

    @property
    def cfg(self) -> ModelConfig:
        """TransformerConfig (core models) or ModelFacts: d_model, n_heads, n_*_layers, ids, max_len."""

    @property
    def src_tok(self) -> Any:
        """The input side's tokens: ``kind`` (char | word | wordpiece | hf), ``itos``, ``tokens(ids)``,
        ``decode(ids)``."""

    @property
    def tgt_tok(self) -> Any:
        """The decoder side's tokens (same members), or None for encoder-only models."""

    @property
    def injectable(self) -> bool:
        """True when custom masks and head interventions can be put into its forward pass: the model
        is an ``InjectableModel`` (core's Transformer)."""

    @property
    def thread_safe(self) -> bool:
        """True when two threads may run its forward pass at once (it keeps no state between calls)."""

    def position_table(self) -> PositionTable:
        """The table added to the token embeddings, or why there is none."""

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """Every parameter of the model, by module path (tied weights appear under each name)."""

    @property
    def masks_from_ids(self) -> bool:
        """True when the model computes its masks from the token ids itself (no attention_mask
        argument): changing what sits in PAD positions is then impossible to test."""

    @property
    def has_decoder(self) -> bool: ...

    @property
    def device(self) -> str: ...

    @property
    def max_src_tokens(self) -> int: ...

    @property
    def labels(self) -> list[str]: ...

    @property
    def summary(self) -> str: ...

    def prepare(self, text: str, truncate: bool = False) -> Any:
        """Token ids of one input (a ``attnscope.core.families.native.Prepared``); InputError with a message if unusable."""

    def prepare_target(self, text: str, truncate: bool = False) -> Any: ...

    def trace(
        self,
        sources: list[str],
        targets: list[str] | None = None,
        truncate: bool = False,
        masks: Any = None,
        interv: Any = None,
    ) -> list[AttentionTrace]:
        """One AttentionTrace per input (targets: teacher forcing, else the model's greedy output)."""

    def trace_continuation(self, sources: list[str], truncate: bool = False) -> list[AttentionTrace]:
        """Decoder-only models: each prompt continued greedily, then traced."""

    def predict(self, sources: list[str]) -> list[str]: ...

    def forward_outputs(
        self, src: torch.Tensor | None, tgt: torch.Tensor | None, src_real, tgt_real
    ) -> dict[str, torch.Tensor]:
        """Black-box outputs for the leak tests: {"enc": (B, S, ...), "dec": (B, T, ...)}."""

    def audit_facts(self) -> dict[str, Any]:
        """pad_id, skip_ids (specials), vocab (src, tgt sizes or None) and max_len for the leak tests."""

    def to(self, device: str) -> AttentionModel: ...


@runtime_checkable
class InjectableModel(AttentionModel, Protocol):
    """A model whose forward pass takes masks and head interventions from outside (attnscope's own
    Transformer): the mask lab's bugs and the ablations run through ``forward_with``."""

    def forward_with(
        self, src: torch.Tensor | None, tgt: torch.Tensor | None, masks: Any = None, interv: Any = None
    ) -> Any:
        """The model's ``ModelOutput`` with these masks (``attnscope.core.transformer.model.Masks``) and
        ``Intervention``, without gradients."""


def prepare_targets(
    model: AttentionModel, prepared: list, targets: list[str], truncate: bool = False
) -> list:
    """``model.prepare_target`` of each target, one per input; a target's warnings join its input's."""
    if len(targets) != len(prepared):
        raise InputError(f"{len(prepared)} inputs but {len(targets)} targets: give one target per input")
    tp = [model.prepare_target(t, truncate) for t in targets]
    for p, t in zip(prepared, tp, strict=True):
        p.warnings.extend(t.warnings)
    return tp


def pad_rows(rows: list[list[int]], pad_id: int, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (B, L) and the real positions (B, L) bool, from the true lengths."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        real[i, : len(r)] = True
    return ids.to(device), real.to(device)


def prediction_fields(probs: torch.Tensor, tokens) -> dict[str, Any]:
    """(L, V) output probabilities -> out_tokens, out_probs, topk_ids, topk_probs (numpy)."""
    top_p, top_i = probs.float().topk(min(TOPK, probs.shape[-1]), dim=-1)
    return {
        "out_tokens": tokens(top_i[:, 0].tolist()),
        "out_probs": top_p[:, 0].cpu().numpy(),
        "topk_ids": top_i.cpu().numpy(),
        "topk_probs": top_p.cpu().numpy(),
    }


@dataclass(frozen=True)
class Side:
    """One side of a padded batch: ids (B, L), real positions (B, L) bool, and ids -> token strings."""

    ids: torch.Tensor
    real: torch.Tensor
    tokens: Callable[[list[int]], Sequence[str]]
    # ids -> token strings for ids that are no row of the side (a position's top-k predictions), where
    # ``tokens`` reads a row with learned positions put in (a [CLS] the model joins); None: ``tokens``
    vocab: Callable[[list[int]], Sequence[str]] | None = None


def package_trace(
    i: int,
    *,
    model: str,
    config_name: str,
    device: str,
    src: Side | None,
    tgt: Side | None,
    maps: dict[str, tuple[Any, ...]],  # (probs, scores, mask) or (probs, scores, mask, layer_masks)
    output_text: str,
    meta: dict[str, Any],
    **fields: Any,
) -> AttentionTrace:
    """Sequence ``i`` of a batch as an AttentionTrace: the one way every model family packages one.

    maps: kind -> (probs (B, layer, head, q, k), scores of the same shape or None, mask (B, q, k) or None), and
    optionally every layer's mask (B, layer, q, k) or None, where the layers were masked differently.
    fields: further AttentionTrace fields, already for sequence ``i`` (predictions, labels...)."""
    kw: dict[str, Any] = dict(fields)
    for name, side in (("src", src), ("tgt", tgt)):
        if side is not None:
            ids = side.ids[i]
            kw[f"{name}_ids"] = ids.cpu().numpy()
            kw[f"{name}_tokens"] = side.tokens(ids.tolist())
            kw[f"{name}_real"] = side.real[i].bool().cpu().numpy()
    for kind, (probs, scores, mask, *per_layer) in maps.items():
        kw[kind] = probs[i].detach().float().cpu().numpy()
        kw[f"{kind}_scores"] = None if scores is None else scores[i].detach().float().cpu().numpy()
        if mask is not None:
            kw[f"{kind}_mask"] = mask[i].bool().cpu().numpy()
        layer_masks = per_layer[0] if per_layer else None
        if layer_masks is not None and not bool((layer_masks[i] == layer_masks[i, :1]).all()):
            kw[f"{kind}_layer_masks"] = layer_masks[i].bool().cpu().numpy()  # (layers masked differently)
            kw[f"{kind}_mask"] = kw[f"{kind}_layer_masks"][0]
    kw.setdefault("src_tokens", ())
    for kind in maps:  # NaN or infinity in the weights or the data: no norm to show (a file would not open)
        value, residual, dropped = values_.finite_norms(
            kind, kw.get(f"{kind}_value_norms"), kw.get(f"{kind}_residual_norms")
        )
        if dropped is None:
            continue
        for what, keep in (("value_norms", value), ("residual_norms", residual)):
            if keep is None:
                kw.pop(f"{kind}_{what}", None)
        if value is None:
            scopes = {k: v for k, v in (meta.get("value_norms") or {}).items() if k != kind}
            meta = (
                {**meta, "value_norms": scopes}
                if scopes
                else {k: v for k, v in meta.items() if k != "value_norms"}
            )
        meta = {**meta, "capture_notes": [*(meta.get("capture_notes") or []), dropped]}
    if tgt is not None and kw.get("topk_ids") is not None and kw.get("topk_tokens") is None:
        # a trace file carries no vocabulary: the top-k ids as tokens, for the Decoding page
        words = tgt.vocab or tgt.tokens
        kw["topk_tokens"] = np.array([words([int(x) for x in row]) for row in kw["topk_ids"]], dtype=str)
    return AttentionTrace(
        model=model, config_name=config_name, device=device, output_text=output_text, meta=meta, **kw
    )


def padding_masks(src_real: torch.Tensor | None, tgt_real: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The masks the real positions call for, (B, q, k) bool: keys must be real; decoder self-attention
    also causal. For models that report only probabilities (Hugging Face)."""
    out = {}
    if src_real is not None:
        s = src_real.bool()
        out["enc_self"] = s[:, None, :].expand(-1, s.shape[1], -1)
    if tgt_real is not None:
        t = tgt_real.bool()
        n = t.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=t.device).tril()
        out["dec_self"] = causal[None] & t[:, None, :]
        if src_real is not None:
            out["cross"] = src_real.bool()[:, None, :].expand(-1, n, -1)
    return out
