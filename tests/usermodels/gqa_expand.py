"""A Mistral/Llama decoder as Hugging Face ports write it (modeling_mistral.py, eager attention):
grouped-query attention with 4 query heads sharing 2 key/value heads, ``repeat_kv`` written as
``hidden[:, :, None, :, :].expand(b, kv_heads, n_rep, slen, d).reshape(b, kv_heads * n_rep, slen, d)``,
rotary position embeddings (``rotate_half``) with position ids from the attention mask's cumsum,
``torch.matmul(q, k.transpose(2, 3)) / math.sqrt(head_dim)``, a 4-D additive float mask holding
``torch.finfo(dtype).min`` for a SLIDING-WINDOW causal mask (window 3) and for LEFT padding,
``nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)`` and RMSNorm.
Decoder-only LM: forward(input_ids, attention_mask) -> logits ``(B, L, VOCAB_SIZE)``; kind ``dec_self``.
The sample batch is LEFT-padded (PAD at the start of the shorter rows), as for batched generation.
"""

from __future__ import annotations

import math

import torch
from torch import nn

PAD = 0
VOCAB_SIZE = 20


class MistralConfig:
    def __init__(self, **kwargs):
        self.vocab_size = VOCAB_SIZE
        self.hidden_size = 32
        self.intermediate_size = 64
        self.num_hidden_layers = 2
        self.num_attention_heads = 4
        self.num_key_value_heads = 2
        self.sliding_window = 3
        self.rms_norm_eps = 1e-6
        self.rope_theta = 10000.0
        self.__dict__.update(kwargs)


class MistralRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class MistralRotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(batch, num_key_value_heads, seqlen, head_dim) -> (batch, num_attention_heads, seqlen, head_dim)"""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class MistralAttention(nn.Module):
    def __init__(self, config: MistralConfig, layer_idx: int, sink: list):
        super().__init__()
        self.config, self.layer_idx, self.sink = config, layer_idx, sink
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.hidden_size // self.num_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.q_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(self.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(self.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, self.hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask, position_embeddings):
        bsz, q_len, _ = hidden_states.size()

        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)

        query_states = query_states.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = key_states.view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        value_states = value_states.view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)

        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)

        if attention_mask is not None:  # no matter the length, we just slice it
            causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
            attn_weights = attn_weights + causal_mask

        # upcast attention to fp32
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        self.sink.append(("dec_self", attn_weights.detach().clone()))  # (bsz, num_heads, q_len, kv_len)
        attn_output = torch.matmul(attn_weights, value_states)

        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(bsz, q_len, self.hidden_size)
        return self.o_proj(attn_output), attn_weights


class MistralMLP(nn.Module):
    def __init__(self, config: MistralConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class MistralDecoderLayer(nn.Module):
    def __init__(self, config: MistralConfig, layer_idx: int, sink: list):
        super().__init__()
        self.self_attn = MistralAttention(config, layer_idx, sink)
        self.mlp = MistralMLP(config)
        self.input_layernorm = MistralRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = MistralRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask, position_embeddings):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states, attention_mask, position_embeddings)
        hidden_states = residual + hidden_states

        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states


def _prepare_4d_sliding_window_causal_mask(attention_mask, sequence_length, dtype, sliding_window):
    """(bsz, seq) 1/0 padding mask -> (bsz, 1, seq, seq) additive mask with finfo.min where not allowed."""
    min_dtype = torch.finfo(dtype).min
    bsz = attention_mask.shape[0]
    causal_mask = torch.full((sequence_length, sequence_length), fill_value=min_dtype, dtype=dtype)
    diagonal_attend_mask = torch.arange(sequence_length) > torch.arange(sequence_length).reshape(-1, 1)
    sliding_attend_mask = torch.arange(sequence_length) <= (
        torch.arange(sequence_length).reshape(-1, 1) - sliding_window
    )
    diagonal_attend_mask |= sliding_attend_mask
    causal_mask *= diagonal_attend_mask  # 0 where allowed, min where future or out of the window
    causal_mask = causal_mask[None, None, :, :].expand(bsz, 1, -1, -1).clone()
    padding_mask = causal_mask + attention_mask[:, None, None, :].to(dtype)
    padding_mask = padding_mask == 0
    causal_mask = causal_mask.masked_fill(padding_mask, min_dtype)  # also mask the (left) padding keys
    return causal_mask


class MistralForCausalLM(nn.Module):
    def __init__(self, config: MistralConfig | None = None):
        super().__init__()
        config = config or MistralConfig()
        self.config = config
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=PAD)
        self.layers = nn.ModuleList(
            [MistralDecoderLayer(config, i, self.computed) for i in range(config.num_hidden_layers)]
        )
        self.norm = MistralRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        head_dim = config.hidden_size // config.num_attention_heads
        self.rotary_emb = MistralRotaryEmbedding(head_dim, base=config.rope_theta)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        inputs_embeds = self.embed_tokens(input_ids)
        position_ids = attention_mask.long().cumsum(-1) - 1
        position_ids = position_ids.masked_fill(attention_mask == 0, 1)  # as in prepare_inputs_for_generation
        causal_mask = _prepare_4d_sliding_window_causal_mask(
            attention_mask, input_ids.shape[1], inputs_embeds.dtype, self.config.sliding_window
        )
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, causal_mask, position_embeddings)
        hidden_states = self.norm(hidden_states)
        return self.lm_head(hidden_states)  # (B, L, V)


def build(seed: int = 0) -> MistralForCausalLM:
    torch.manual_seed(seed)
    return MistralForCausalLM().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids (3, 7) with 7, 5, 3 real tokens, LEFT-padded with 0, and the 1/0 attention_mask."""
    input_ids = torch.tensor([[4, 5, 6, 7, 8, 9, 2], [0, 0, 10, 11, 12, 13, 2], [0, 0, 0, 0, 14, 15, 2]])
    return input_ids, (input_ids != PAD).long()
