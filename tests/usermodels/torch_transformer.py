"""The "use the library" style: ``nn.Transformer(batch_first=True)`` (post-norm, final encoder and
decoder norms) between embeddings and an output ``nn.Linear``, called with bool padding masks
(True = PAD) for source, target and memory and a bool causal ``tgt_mask`` (True = masked).
forward(src, tgt) -> logits (B, T, V).

The model keeps no ``computed`` list (its attention lives in ``nn.MultiheadAttention``); instead
``reference_maps(model, src, tgt)`` walks the layers itself and asks each attention module for its
per-head weights (``need_weights=True, average_attn_weights=False``), PyTorch's own implementation.
Call it outside any capture: those calls are attention too.
"""

from __future__ import annotations

import torch
from torch import nn

PAD, BOS = 0, 1
VOCAB_SIZE = 20


class Seq2Seq(nn.Module):
    def __init__(self, vocab: int = VOCAB_SIZE, d_model: int = 16, max_len: int = 64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d_model)
        self.transformer = nn.Transformer(
            d_model=16,
            nhead=4,
            num_encoder_layers=2,
            num_decoder_layers=2,
            dim_feedforward=32,
            dropout=0.0,
            batch_first=True,
        )
        self.out = nn.Linear(d_model, vocab)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))  # (B, L, D)

    def masks(self, src: torch.Tensor, tgt: torch.Tensor) -> dict[str, torch.Tensor]:
        T = tgt.shape[1]
        return dict(
            tgt_mask=torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1),  # (T, T) True = masked
            src_key_padding_mask=src == PAD,  # (B, S) True = PAD
            tgt_key_padding_mask=tgt == PAD,  # (B, T)
            memory_key_padding_mask=src == PAD,  # (B, S)
        )

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        m = self.masks(src, tgt)
        h = self.transformer(self.embed(src), self.embed(tgt), tgt_is_causal=True, **m)
        return self.out(h)  # (B, T, V)


@torch.no_grad()
def reference_maps(model: Seq2Seq, src: torch.Tensor, tgt: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """[(label, probs (B, H, q, k))] in call order: every encoder layer, then per decoder layer
    dec_self and cross. Runs on PyTorch's slow path (fast path off while it runs), so padded query
    rows are computed like real ones rather than dropped as nested tensors."""
    tf, m = model.transformer, model.masks(src, tgt)
    was = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        maps: list[tuple[str, torch.Tensor]] = []
        x = model.embed(src)
        for layer in tf.encoder.layers:
            _, w = layer.self_attn(
                x,
                x,
                x,
                key_padding_mask=m["src_key_padding_mask"],
                need_weights=True,
                average_attn_weights=False,
            )
            maps.append(("enc_self", w))  # (B, H, S, S)
            x = layer(x, src_key_padding_mask=m["src_key_padding_mask"])
        memory = tf.encoder.norm(x) if tf.encoder.norm is not None else x
        y = model.embed(tgt)
        for layer in tf.decoder.layers:  # norm_first=False: each sublayer's input is the previous output
            sa, w = layer.self_attn(
                y,
                y,
                y,
                attn_mask=m["tgt_mask"],
                key_padding_mask=m["tgt_key_padding_mask"],
                need_weights=True,
                average_attn_weights=False,
            )
            maps.append(("dec_self", w))  # (B, H, T, T)
            y1 = layer.norm1(y + sa)
            _, w = layer.multihead_attn(
                y1,
                memory,
                memory,
                key_padding_mask=m["memory_key_padding_mask"],
                need_weights=True,
                average_attn_weights=False,
            )
            maps.append(("cross", w))  # (B, H, T, S)
            y = layer(
                y,
                memory,
                tgt_mask=m["tgt_mask"],
                tgt_key_padding_mask=m["tgt_key_padding_mask"],
                memory_key_padding_mask=m["memory_key_padding_mask"],
                tgt_is_causal=True,
            )
        return maps
    finally:
        torch.backends.mha.set_fastpath_enabled(was)


def build(seed: int = 0) -> Seq2Seq:
    torch.manual_seed(seed)
    return Seq2Seq().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """src (3, 7) with 7, 5, 3 real tokens; tgt (3, 6) with BOS first and 6, 4, 2 real tokens."""
    src = torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]])
    tgt = torch.tensor([[1, 3, 4, 5, 6, 7], [1, 8, 9, 10, 0, 0], [1, 11, 0, 0, 0, 0]])
    return src, tgt
