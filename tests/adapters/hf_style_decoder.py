"""GPT-2 written the Hugging Face way (modeling_gpt2's eager attention) for a character vocabulary:
``forward(input_ids, attention_mask=None, past_key_values=None, use_cache=True)`` returns a
DATACLASS ``CausalLMOutputWithPast(logits, past_key_values)``; keys and values are joined to the
cache with ``torch.cat`` and returned; the causal ``bias`` buffer goes in with ``torch.where(...,
finfo.min)`` and the 1/0 ``attention_mask`` (built by the adapter from PAD) as an additive
``(1 - mask) * finfo.min``. Like GPT-2, ``<|endoftext|>`` is both BOS and EOS, and the PAD token
was added after it at the END of the vocabulary (PAD is the last id, not 0). ``encode`` returns
what ``tokenizer(text, return_tensors="pt")["input_ids"]`` does: a (1, L) tensor. Random seeded
weights; its embedding and logits have 32 ids, the 31 tokens padded to a multiple of 8 (as nanoGPT
pads GPT-2's 50257 to 50304). The model's own maps are in ``model.computed`` as ("dec_self", probs
(B, H, T, T)).

``CAUSAL_WITH_PADDING_MASK = False`` plants a refactoring slip: the causal ``bias`` is applied only
when no ``attention_mask`` is given (hf_style_decoder_nocausal.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

ARCH = "decoder"
_CHARS = list("abcdefghijklmnopqrstuvwxyz .,")
VOCAB = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(_CHARS)}}
VOCAB["<pad>"] = len(VOCAB)  # tokenizer.add_special_tokens({"pad_token": "<pad>"})
BOS = EOS = VOCAB["<|endoftext|>"]
PAD = VOCAB["<pad>"]
MAX_LEN = 48
VOCAB_SIZE = 32  # the model's: len(VOCAB) = 31 padded to a multiple of 8, as nanoGPT pads 50257 to 50304
EXAMPLES = ["hello world", "the cat"]
CAUSAL_WITH_PADDING_MASK = True


@dataclass
class CausalLMOutputWithPast:
    logits: torch.Tensor
    past_key_values: tuple | None = None


class GPT2Attention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, n_positions: int, sink: list, causal_with_mask: bool):
        super().__init__()
        self.register_buffer(
            "bias", torch.tril(torch.ones(n_positions, n_positions, dtype=torch.bool)).view(1, 1, n_positions, n_positions),
            persistent=False,
        )  # fmt: skip
        self.num_heads, self.head_dim, self.embed_dim = n_head, n_embd // n_head, n_embd
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.sink, self.causal_with_mask = sink, causal_with_mask

    def _split_heads(self, tensor):
        return tensor.view(tensor.size()[:-1] + (self.num_heads, self.head_dim)).permute(0, 2, 1, 3)

    def _attn(self, query, key, value, attention_mask=None):
        attn_weights = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(value.size(-1))
        query_length, key_length = query.size(-2), key.size(-2)
        if attention_mask is None or self.causal_with_mask:
            causal_mask = self.bias[:, :, key_length - query_length : key_length, :key_length]
            mask_value = torch.full([], torch.finfo(attn_weights.dtype).min, dtype=attn_weights.dtype,
                                    device=attn_weights.device)  # fmt: skip
            attn_weights = torch.where(causal_mask, attn_weights, mask_value)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        self.sink.append(("dec_self", attn_weights.detach().clone()))
        return torch.matmul(attn_weights, value)

    def forward(self, hidden_states, layer_past=None, attention_mask=None, use_cache=False):
        query, key, value = self.c_attn(hidden_states).split(self.embed_dim, dim=2)
        query, key, value = self._split_heads(query), self._split_heads(key), self._split_heads(value)
        if layer_past is not None:
            past_key, past_value = layer_past
            key, value = torch.cat((past_key, key), dim=-2), torch.cat((past_value, value), dim=-2)
        present = (key, value) if use_cache else None
        attn_output = self._attn(query, key, value, attention_mask)
        attn_output = attn_output.permute(0, 2, 1, 3).contiguous()
        return self.c_proj(attn_output.view(attn_output.size()[:-2] + (self.embed_dim,))), present


class GPT2Block(nn.Module):
    def __init__(self, n_embd, n_head, n_positions, sink, causal_with_mask):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = GPT2Attention(n_embd, n_head, n_positions, sink, causal_with_mask)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, hidden_states, layer_past=None, attention_mask=None, use_cache=False):
        attn_output, present = self.attn(self.ln_1(hidden_states), layer_past, attention_mask, use_cache)
        hidden_states = hidden_states + attn_output
        return hidden_states + self.mlp(self.ln_2(hidden_states)), present


class GPT2LMHeadModel(nn.Module):
    def __init__(self, vocab_size=VOCAB_SIZE, n_embd=32, n_head=4, n_layer=2, n_positions=MAX_LEN,
                 causal_with_mask=True):  # fmt: skip
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(n_positions, n_embd)
        self.h = nn.ModuleList(
            GPT2Block(n_embd, n_head, n_positions, self.computed, causal_with_mask) for _ in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.2)

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=True):
        past_length = 0 if past_key_values is None else past_key_values[0][0].size(-2)
        if past_key_values is None:
            past_key_values = tuple([None] * len(self.h))
        position_ids = torch.arange(past_length, input_ids.size(-1) + past_length, device=input_ids.device)
        if attention_mask is not None:
            attention_mask = attention_mask[:, None, None, :].to(dtype=self.wte.weight.dtype)
            attention_mask = (1.0 - attention_mask) * torch.finfo(self.wte.weight.dtype).min
        hidden_states = self.wte(input_ids) + self.wpe(position_ids)
        presents = () if use_cache else None
        for block, layer_past in zip(self.h, past_key_values, strict=True):
            hidden_states, present = block(hidden_states, layer_past, attention_mask, use_cache)
            if use_cache:
                presents = presents + (present,)
        logits = self.lm_head(self.ln_f(hidden_states))
        return CausalLMOutputWithPast(logits=logits, past_key_values=presents)


def load() -> nn.Module:
    torch.manual_seed(0)
    return GPT2LMHeadModel(causal_with_mask=CAUSAL_WITH_PADDING_MASK)


def encode(text: str) -> torch.Tensor:
    """tokenizer(text, return_tensors="pt")["input_ids"]: <|endoftext|> then the characters, (1, L);
    a character the vocabulary lacks is dropped (as a byte tokenizer without it would lose it)."""
    ids = [BOS] + [VOCAB[c] for c in text.lower() if c in VOCAB and len(c) == 1]
    return torch.tensor([ids])


def encode_target(text: str) -> torch.Tensor:
    return torch.tensor([[VOCAB[c] for c in text.lower() if c in VOCAB and len(c) == 1] + [EOS]])


def forward(model: nn.Module, src: None, tgt: torch.Tensor) -> CausalLMOutputWithPast:
    return model(tgt, attention_mask=(tgt != PAD).long())
