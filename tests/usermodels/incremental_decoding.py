"""fairseq-like incremental decoding (``fairseq/modules/multihead_attention.py`` with an
``incremental_state``), the whole greedy loop inside ONE forward call: forward(prompt_ids, steps) first
runs the prompt through the decoder (causal self-attention over the prompt, the mask fairseq's
``buffered_future_mask``: ``torch.triu(fill_with_neg_inf(torch.zeros(T, T)), 1)``), then generates
``steps`` tokens greedily. As in fairseq's ``TransformerDecoder.extract_features``, the decoder is always
given every token so far and, once the cache holds something, keeps only the newest one
(``prev_output_tokens[:, -1:]``, positions likewise), so each later call projects a single token; its
key and value are joined to the cached ones with ``torch.cat([prev_key, k], dim=2)`` (the cache: a dict
``incremental_state[layer_id] = {"prev_key": ..., "prev_value": ...}`` in (B, H, L, d)), the queries are
scaled in place (``q *= self.scaling``) and ``torch.matmul`` / ``F.softmax(attn_weights.float(), dim=-1)
.type_as(attn_weights)`` does the rest. Every call is "dec_self": the prompt's (B, H, P, P), then
(B, H, 1, P + 1), (B, H, 1, P + 2), ... per layer. No padding. forward -> generated ids (B, steps).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
VOCAB_SIZE, EMBED_DIM, N_HEADS, N_LAYERS, FFN_DIM, MAX_POSITIONS = 24, 32, 4, 2, 64, 32


def fill_with_neg_inf(t: torch.Tensor) -> torch.Tensor:
    return t.float().fill_(float("-inf")).type_as(t)


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, layer_id: int, sink: list):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self._incremental_state_id = f"MultiheadAttention.{layer_id}"
        self.sink = sink

    def _get_input_buffer(self, incremental_state) -> dict[str, torch.Tensor]:
        return incremental_state.get(self._incremental_state_id, {})

    def _set_input_buffer(self, incremental_state, buffer: dict[str, torch.Tensor]) -> None:
        incremental_state[self._incremental_state_id] = buffer

    def forward(self, query, incremental_state, attn_mask=None):
        bsz, tgt_len, embed_dim = query.size()
        q = self.q_proj(query)
        k = self.k_proj(query)
        v = self.v_proj(query)
        q *= self.scaling
        q = q.view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, d)
        k = k.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)
        saved_state = self._get_input_buffer(incremental_state)
        if "prev_key" in saved_state:
            prev_key = saved_state["prev_key"]
            k = torch.cat([prev_key, k], dim=2)
        if "prev_value" in saved_state:
            prev_value = saved_state["prev_value"]
            v = torch.cat([prev_value, v], dim=2)
        saved_state["prev_key"] = k
        saved_state["prev_value"] = v
        self._set_input_buffer(incremental_state, saved_state)
        attn_weights = torch.matmul(q, k.transpose(2, 3))  # (B, H, T, S)
        if attn_mask is not None:
            attn_weights += attn_mask.unsqueeze(0).unsqueeze(0)
        attn_weights_float = F.softmax(attn_weights.float(), dim=-1)
        attn_weights = attn_weights_float.type_as(attn_weights)
        self.sink.append(("dec_self", attn_weights.detach().clone()))
        attn = torch.matmul(attn_weights, v)  # (B, H, T, d)
        attn = attn.transpose(1, 2).contiguous().view(bsz, tgt_len, embed_dim)
        return self.out_proj(attn)


class TransformerDecoderLayer(nn.Module):
    def __init__(self, layer_id: int, sink: list):
        super().__init__()
        self.self_attn = MultiheadAttention(EMBED_DIM, N_HEADS, layer_id, sink)
        self.self_attn_layer_norm = nn.LayerNorm(EMBED_DIM)
        self.fc1, self.fc2 = nn.Linear(EMBED_DIM, FFN_DIM), nn.Linear(FFN_DIM, EMBED_DIM)
        self.final_layer_norm = nn.LayerNorm(EMBED_DIM)

    def forward(self, x, incremental_state, self_attn_mask=None):
        residual = x
        x = self.self_attn(self.self_attn_layer_norm(x), incremental_state, attn_mask=self_attn_mask)
        x = residual + x
        residual = x
        x = self.fc2(F.relu(self.fc1(self.final_layer_norm(x))))
        return residual + x


class TransformerDecoder(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB_SIZE, EMBED_DIM, padding_idx=PAD)
        self.embed_scale = math.sqrt(EMBED_DIM)
        self.embed_positions = nn.Embedding(MAX_POSITIONS, EMBED_DIM)
        self.layers = nn.ModuleList([TransformerDecoderLayer(i, sink) for i in range(N_LAYERS)])
        self.layer_norm = nn.LayerNorm(EMBED_DIM)
        self.output_projection = nn.Linear(EMBED_DIM, VOCAB_SIZE, bias=False)

    def buffered_future_mask(self, tensor: torch.Tensor) -> torch.Tensor:
        dim = tensor.size(1)
        return torch.triu(fill_with_neg_inf(torch.zeros([dim, dim], device=tensor.device)), 1)

    def forward(self, prev_output_tokens: torch.Tensor, incremental_state: dict) -> torch.Tensor:
        positions = torch.arange(prev_output_tokens.size(1), device=prev_output_tokens.device)
        positions = positions.unsqueeze(0).expand_as(prev_output_tokens)
        if incremental_state:  # the cache holds the earlier positions: only the newest token is new
            prev_output_tokens = prev_output_tokens[:, -1:]
            positions = positions[:, -1:]
        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        x = x + self.embed_positions(positions)
        self_attn_mask = self.buffered_future_mask(x) if x.size(1) > 1 else None
        for layer in self.layers:
            x = layer(x, incremental_state, self_attn_mask=self_attn_mask)
        return self.output_projection(self.layer_norm(x))  # (B, T, V)


class GreedyGenerator(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.decoder = TransformerDecoder(self.computed)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, prompt_ids: torch.Tensor, steps: int = 3) -> torch.Tensor:
        incremental_state: dict[str, dict[str, torch.Tensor]] = {}
        tokens = prompt_ids
        for _ in range(steps):
            lprobs = F.log_softmax(self.decoder(tokens, incremental_state)[:, -1, :], dim=-1)
            next_tokens = lprobs.argmax(dim=-1, keepdim=True)  # (B, 1)
            tokens = torch.cat([tokens, next_tokens], dim=1)
        return tokens[:, prompt_ids.size(1) :]  # (B, steps)


def build(seed: int = 0) -> GreedyGenerator:
    torch.manual_seed(seed)
    return GreedyGenerator().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """prompt_ids (3, 4), no padding."""
    return (torch.tensor([[2, 5, 6, 7], [2, 8, 9, 10], [2, 11, 12, 13]]),)
