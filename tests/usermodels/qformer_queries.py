"""A BLIP-2 Q-Former-like block (salesforce/LAVIS ``Qformer.py``, a BERT with cross-attention): no tokens
at all. Learned query tokens ``nn.Parameter(torch.zeros(1, NUM_QUERY_TOKENS, d))`` (then
``normal_(std=0.02)``, as BLIP-2 initializes them) are ``expand``-ed over the batch and LayerNorm-ed,
attend to each other (BERT self-attention: ``transpose_for_scores`` with ``view`` + ``permute``,
``torch.matmul`` scores over ``sqrt(head_size)``, an all-ones query attention mask turned into an
additive ``(1.0 - mask) * -10000.0``, ``nn.Softmax(dim=-1)``), then cross-attend to image features
that come in as a float tensor (B, 6, d_img), LayerNorm-ed (``ln_vision``) and projected to keys and
values by ``nn.Linear(encoder_width, d)`` inside the cross-attention (``image_atts`` all ones).
So both the queries of every map and (in self-attention) its keys are learned rows, not tokens.
forward(image_feats) -> query outputs (B, NUM_QUERY_TOKENS, d).
"""

from __future__ import annotations

import math

import torch
from torch import nn

D_MODEL, D_IMG, N_HEADS, N_LAYERS, NUM_QUERY_TOKENS, N_PATCHES = 32, 24, 4, 2, 4, 6


class BertSelfAttention(nn.Module):
    def __init__(self, kind: str, sink: list, is_cross_attention: bool = False):
        super().__init__()
        self.num_attention_heads = N_HEADS
        self.attention_head_size = D_MODEL // N_HEADS
        self.all_head_size = D_MODEL
        self.kind, self.sink = kind, sink
        self.query = nn.Linear(D_MODEL, self.all_head_size)
        kv_width = D_IMG if is_cross_attention else D_MODEL
        self.key = nn.Linear(kv_width, self.all_head_size)
        self.value = nn.Linear(kv_width, self.all_head_size)
        self.dropout = nn.Dropout(0.1)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        x = x.view(*new_x_shape)
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask, encoder_hidden_states=None):
        if encoder_hidden_states is not None:
            key_layer = self.transpose_for_scores(self.key(encoder_hidden_states))
            value_layer = self.transpose_for_scores(self.value(encoder_hidden_states))
        else:
            key_layer = self.transpose_for_scores(self.key(hidden_states))
            value_layer = self.transpose_for_scores(self.value(hidden_states))
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        attention_scores = attention_scores + attention_mask  # (B, 1, 1, Lk) additive
        attention_probs = nn.Softmax(dim=-1)(attention_scores)
        self.sink.append((self.kind, attention_probs.detach().clone()))
        attention_probs_dropped = self.dropout(attention_probs)
        context_layer = torch.matmul(attention_probs_dropped, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        return context_layer.view(*new_context_layer_shape)


class BertAttention(nn.Module):
    def __init__(self, kind: str, sink: list, is_cross_attention: bool = False):
        super().__init__()
        self.self = BertSelfAttention(kind, sink, is_cross_attention)
        self.output_dense = nn.Linear(D_MODEL, D_MODEL)
        self.output_norm = nn.LayerNorm(D_MODEL, eps=1e-12)

    def forward(self, hidden_states, attention_mask, encoder_hidden_states=None):
        ctx = self.self(hidden_states, attention_mask, encoder_hidden_states)
        return self.output_norm(self.output_dense(ctx) + hidden_states)


class QFormerLayer(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.attention = BertAttention("enc_self", sink)
        self.crossattention = BertAttention("cross", sink, is_cross_attention=True)
        self.intermediate_query = nn.Linear(D_MODEL, 4 * D_MODEL)
        self.output_query = nn.Linear(4 * D_MODEL, D_MODEL)
        self.output_norm = nn.LayerNorm(D_MODEL, eps=1e-12)

    def forward(self, query_embeds, query_mask, image_embeds, image_mask):
        x = self.attention(query_embeds, query_mask)
        x = self.crossattention(x, image_mask, encoder_hidden_states=image_embeds)
        h = self.output_query(nn.functional.gelu(self.intermediate_query(x)))
        return self.output_norm(h + x)


def get_extended_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    extended = attention_mask[:, None, None, :].float()  # (B, 1, 1, L)
    return (1.0 - extended) * -10000.0


class QFormer(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.query_tokens = nn.Parameter(torch.zeros(1, NUM_QUERY_TOKENS, D_MODEL))
        self.query_tokens.data.normal_(mean=0.0, std=0.02)
        self.ln_vision = nn.LayerNorm(D_IMG)
        self.embed_norm = nn.LayerNorm(D_MODEL, eps=1e-12)
        self.layer = nn.ModuleList([QFormerLayer(self.computed) for _ in range(N_LAYERS)])

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, image_feats: torch.Tensor) -> torch.Tensor:
        image_embeds = self.ln_vision(image_feats)  # (B, N_PATCHES, D_IMG)
        image_atts = torch.ones(image_embeds.size()[:-1], dtype=torch.long, device=image_embeds.device)
        query_tokens = self.query_tokens.expand(image_embeds.shape[0], -1, -1)  # (B, Q, D)
        query_atts = torch.ones(query_tokens.size()[:-1], dtype=torch.long, device=image_embeds.device)
        hidden = self.embed_norm(query_tokens)
        query_mask = get_extended_attention_mask(query_atts)
        image_mask = get_extended_attention_mask(image_atts)
        for layer_module in self.layer:
            hidden = layer_module(hidden, query_mask, image_embeds, image_mask)
        return hidden  # (B, Q, D)


def build(seed: int = 0) -> QFormer:
    torch.manual_seed(seed)
    return QFormer().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """image_feats (3, 6, D_IMG): a frozen image encoder's patch features (no padding)."""
    g = torch.Generator().manual_seed(1)
    return (torch.randn(3, N_PATCHES, D_IMG, generator=g),)
