"""The encoder-decoder Transformer of "Attention Is All You Need" (and encoder-only variants).

``forward(src, tgt, return_attn=True)`` returns every attention map the model
computed, stacked as ``[batch, layer, head, query, key]``, together with the
masks it used. Capture is by explicit return; nothing is stored on modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attnscope.core.families import map_pool
from attnscope.core.transformer import masks as M
from attnscope.core.transformer.attention import AttnMaps, Intervention
from attnscope.core.transformer.config import TransformerConfig
from attnscope.core.transformer.layers import DecoderLayer, EncoderLayer
from attnscope.core.transformer.positional import LearnedPositions, SinusoidalPositions


@dataclass(frozen=True)
class Masks:
    """The masks of one forward pass, bool ``[batch, query, key]``, True = may attend."""

    enc_self: torch.Tensor
    dec_self: torch.Tensor | None = None
    cross: torch.Tensor | None = None

    def get(self, kind: str) -> torch.Tensor | None:
        return getattr(self, kind)


@dataclass(frozen=True)
class ModelOutput:
    """logits: (B, T, V) for seq2seq, (B, n_classes) for a classifier, None otherwise.

    hidden: encoder (or, with a decoder, decoder) final states (B, L, D).
    attn: kind -> AttnMaps with tensors (B, layer, head, query, key); empty without capture.
    enc_hidden: with return_hidden, the embedding output and every encoder layer's output.
    """

    logits: torch.Tensor | None
    hidden: torch.Tensor
    memory: torch.Tensor
    masks: Masks
    attn: dict[str, AttnMaps]
    enc_hidden: tuple[torch.Tensor, ...] | None = None


def map_buffers(
    n_layers: int, shape: tuple[int, int, int, int], like: torch.Tensor
) -> tuple[AttnMaps, list[AttnMaps]]:
    """Empty (B, layer, H, Lq, Lk) scores and probabilities for ``shape`` = (B, H, Lq, Lk), and each
    layer's slice of them: the layers write their maps straight into these (attnscope.core.transformer.attention.
    scaled_dot_product's ``into``), so a trace holds the maps once and never stacks a copy of them.
    Stored layer-major, so a layer's slice is contiguous and a matmul writes it in place; returned as
    a (B, layer, ...) view (one sequence's maps are a strided view unless the batch is one sequence)."""
    b, h, lq, lk = shape
    full = (n_layers, b, h, lq, lk)
    scores = map_pool.empty(full, like.dtype, like.device)  # recycled memory when the pool is on
    probs = map_pool.empty(full, like.dtype, like.device)
    norms = torch.empty((n_layers, b, h, lk), dtype=like.dtype, device=like.device)  # value norms, per key
    resid = torch.empty((n_layers, b, lq), dtype=like.dtype, device=like.device)  # residual norms, per query
    return AttnMaps(
        scores.transpose(0, 1), probs.transpose(0, 1), norms.transpose(0, 1), resid.transpose(0, 1)
    ), [AttnMaps(scores[i], probs[i], norms[i], resid[i]) for i in range(n_layers)]


class Embeddings(nn.Module):
    """Token embedding (x sqrt(d_model) in the paper) + positions (+ token types), dropout."""

    def __init__(self, cfg: TransformerConfig, vocab_size: int, shared: nn.Embedding | None = None):
        super().__init__()
        self.tok = shared if shared is not None else nn.Embedding(vocab_size, cfg.d_model)
        pos_cls = SinusoidalPositions if cfg.pos_encoding == "sinusoidal" else LearnedPositions
        self.pos = pos_cls(cfg.max_len, cfg.d_model)
        self.types = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.embed_norm else None
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.offset = cfg.pos_offset
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor, token_types: torch.Tensor | None = None) -> torch.Tensor:
        """ids (B, L) -> (B, L, D)."""
        positions = torch.arange(ids.shape[1], device=ids.device)[None] + self.offset  # (1, L)
        x = self.tok(ids) * self.scale + self.pos(positions)
        if self.types is not None:
            tt = torch.zeros_like(ids) if token_types is None else token_types
            x = x + self.types(tt)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        shared = nn.Embedding(cfg.src_vocab_size, cfg.d_model) if cfg.share_vocab else None
        self.src_embed = Embeddings(cfg, cfg.src_vocab_size, shared)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_enc_layers))
        pre = cfg.norm == "pre"
        self.enc_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if pre else None
        self.tgt_embed = self.decoder = self.dec_norm = self.generator = self.classifier = None
        if not cfg.is_encoder_only:
            self.tgt_embed = Embeddings(cfg, cfg.tgt_vocab_size, shared)
            self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_dec_layers))
            self.dec_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if pre else None
            generator = nn.Linear(cfg.d_model, cfg.tgt_vocab_size)
            if shared is not None:  # share_vocab: tied output projection (paper, 3.4)
                generator.weight = shared.weight
            self.generator = generator
        elif cfg.n_classes:
            self.classifier = nn.Linear(cfg.d_model, cfg.n_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "pos.weight" not in name:
                nn.init.xavier_uniform_(p)

    # -- masks ----------------------------------------------------------------
    def make_masks(self, src: torch.Tensor, tgt: torch.Tensor | None = None) -> Masks:
        pad = self.cfg.pad_id
        if tgt is None:
            return Masks(enc_self=M.enc_self_mask(src, pad))
        return Masks(
            enc_self=M.enc_self_mask(src, pad),
            dec_self=M.dec_self_mask(tgt, pad),
            cross=M.cross_mask(tgt, src, pad),
        )

    # -- halves -----------------------------------------------------------------
    def encode(
        self,
        src: torch.Tensor,
        mask: torch.Tensor,
        return_attn: bool = False,
        token_types: torch.Tensor | None = None,
        interv: Intervention | None = None,
        return_hidden: bool = False,
    ) -> tuple[torch.Tensor, AttnMaps | None, tuple[torch.Tensor, ...] | None]:
        """src (B, S) ids, mask (B, S, S) -> memory (B, S, D), stacked maps, hidden states."""
        interv = interv or Intervention()
        keep = interv.head_mask.get("enc_self")
        x = self.src_embed(src, token_types)
        b, s = src.shape
        maps, into = (
            map_buffers(len(self.encoder), (b, self.cfg.n_heads, s, s), x) if return_attn else (None, None)
        )
        hidden = [x]
        for i, layer in enumerate(self.encoder):
            x, _ = layer(
                x,
                mask,
                return_attn,
                interv.neg_inf_fill,
                None if keep is None else keep[i],
                None if into is None else into[i],
            )
            hidden.append(x)
        if self.enc_norm is not None:
            x = self.enc_norm(x)
        return x, maps, (tuple(hidden) if return_hidden else None)

    def decoder_parts(self) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
        """(target embeddings, decoder layers, generator): what only an encoder-decoder has."""
        if self.tgt_embed is None or self.decoder is None or self.generator is None:
            raise ValueError(f"{self.cfg.name} is encoder-only: it has no decoder")
        return self.tgt_embed, self.decoder, self.generator

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        self_mask: torch.Tensor,
        cross_mask: torch.Tensor,
        return_attn: bool = False,
        interv: Intervention | None = None,
    ) -> tuple[torch.Tensor, AttnMaps | None, AttnMaps | None]:
        """tgt (B, T) ids, memory (B, S, D) -> states (B, T, D), self maps, cross maps."""
        interv = interv or Intervention()
        sk, ck = interv.head_mask.get("dec_self"), interv.head_mask.get("cross")
        tgt_embed, decoder, _ = self.decoder_parts()
        y = tgt_embed(tgt)
        (b, t), s, n = tgt.shape, memory.shape[1], len(decoder)
        self_maps, self_into = map_buffers(n, (b, self.cfg.n_heads, t, t), y) if return_attn else (None, None)
        cross_maps, cross_into = (
            map_buffers(n, (b, self.cfg.n_heads, t, s), y) if return_attn else (None, None)
        )
        for i, layer in enumerate(decoder):
            y, _, _ = layer(
                y,
                memory,
                self_mask,
                cross_mask,
                return_attn,
                interv.neg_inf_fill,
                None if sk is None else sk[i],
                None if ck is None else ck[i],
                None if self_into is None else self_into[i],
                None if cross_into is None else cross_into[i],
            )
        if self.dec_norm is not None:
            y = self.dec_norm(y)
        return y, self_maps, cross_maps

    def pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """hidden (B, S, D), real-token mask (B, S) -> (B, D)."""
        if self.cfg.pooling == "first":
            return hidden[:, 0]
        w = mask.to(hidden.dtype)[..., None]
        return (hidden * w).sum(1) / w.sum(1).clamp(min=1.0)

    # -- whole model ------------------------------------------------------------
    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor | None = None,
        return_attn: bool = False,
        masks: Masks | None = None,
        token_types: torch.Tensor | None = None,
        interv: Intervention | None = None,
        return_hidden: bool = False,
    ) -> ModelOutput:
        """src (B, S) ids; tgt (B, T) decoder input ids (BOS first) for seq2seq models.

        masks: override the masks built from PAD ids (mask lab); default = make_masks().
        """
        if tgt is None and not self.cfg.is_encoder_only:
            raise ValueError("this model has a decoder: pass tgt (decoder input ids)")
        masks = masks or self.make_masks(src, None if self.cfg.is_encoder_only else tgt)
        memory, enc_maps, enc_hidden = self.encode(
            src, masks.enc_self, return_attn, token_types, interv, return_hidden
        )
        attn: dict[str, AttnMaps] = {}
        if enc_maps is not None:
            attn["enc_self"] = enc_maps
        if self.cfg.is_encoder_only:
            logits = None
            if self.classifier is not None:
                real = masks.enc_self.any(dim=1)  # (B, S): keys some query may attend to
                logits = self.classifier(self.pool(memory, real))
            return ModelOutput(logits, memory, memory, masks, attn, enc_hidden)
        if tgt is None or masks.dec_self is None or masks.cross is None:
            raise ValueError("an encoder-decoder needs the decoder input (tgt) and its masks")
        hidden, self_maps, cross_maps = self.decode(
            tgt, memory, masks.dec_self, masks.cross, return_attn, interv
        )
        if self_maps is not None and cross_maps is not None:
            attn["dec_self"], attn["cross"] = self_maps, cross_maps
        return ModelOutput(self.decoder_parts()[2](hidden), hidden, memory, masks, attn, enc_hidden)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def parameters_by_module(model: Transformer) -> dict[str, int]:
    """Top-level module name -> parameter count (tied weights counted where first seen)."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        top = name.split(".")[0]
        out[top] = out.get(top, 0) + p.numel()
    return out
