"""Transformer-XL (kimiyoung/transformer-xl, ``RelPartialLearnableMultiHeadAttn``): SEQUENCE-first
``(qlen, B)`` token ids, segment-level recurrence (each layer attends over ``torch.cat([mems, w], 0)``:
the previous segment's hidden states, then this one's, so ``klen = mlen + qlen``), relative
positions (the ``AC + BD`` terms, ``BD`` through ``_rel_shift``), einsum scores laid out
``"ibnd,jbnd->ijbn"`` (query, KEY, batch, head) with the softmax over ``dim=1``, and the mask of the
official TF code ``attn_score * (1 - attn_mask) - 1e30 * attn_mask`` (1 = masked: the future).
forward(data, mems=None) -> (hidden (qlen, B, D), new mems).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB_SIZE, D_MODEL, N_HEAD, D_HEAD, N_LAYER, MEM_LEN = 20, 32, 4, 8, 2, 5


class RelPartialLearnableMultiHeadAttn(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.n_head, self.d_head, self.scale = N_HEAD, D_HEAD, 1 / (D_HEAD**0.5)
        self.qkv_net = nn.Linear(D_MODEL, 3 * N_HEAD * D_HEAD, bias=False)
        self.r_net = nn.Linear(D_MODEL, N_HEAD * D_HEAD, bias=False)
        self.o_net = nn.Linear(N_HEAD * D_HEAD, D_MODEL, bias=False)
        self.layer_norm = nn.LayerNorm(D_MODEL)
        self.sink = sink

    @staticmethod
    def _rel_shift(x):
        zero_pad = torch.zeros((x.size(0), 1, *x.size()[2:]), device=x.device, dtype=x.dtype)
        x_padded = torch.cat([zero_pad, x], dim=1)
        x_padded = x_padded.view(x.size(1) + 1, x.size(0), *x.size()[2:])
        return x_padded[1:].view_as(x)

    def forward(self, w, r, r_w_bias, r_r_bias, attn_mask, mems=None):
        qlen, rlen, bsz = w.size(0), r.size(0), w.size(1)
        cat = w if mems is None else torch.cat([mems, w], 0)
        w_heads, r_head_k = self.qkv_net(cat), self.r_net(r)
        w_head_q, w_head_k, w_head_v = torch.chunk(w_heads, 3, dim=-1)
        w_head_q = w_head_q[-qlen:]
        klen = w_head_k.size(0)
        w_head_q = w_head_q.view(qlen, bsz, self.n_head, self.d_head)  # qlen x bsz x n_head x d_head
        w_head_k = w_head_k.view(klen, bsz, self.n_head, self.d_head)
        w_head_v = w_head_v.view(klen, bsz, self.n_head, self.d_head)
        r_head_k = r_head_k.view(rlen, self.n_head, self.d_head)
        AC = torch.einsum("ibnd,jbnd->ijbn", (w_head_q + r_w_bias, w_head_k))  # qlen x klen x bsz x n_head
        BD = self._rel_shift(torch.einsum("ibnd,jnd->ijbn", (w_head_q + r_r_bias, r_head_k)))
        attn_score = AC + BD
        attn_score.mul_(self.scale)
        mask = attn_mask[:, :, :, None]  # (qlen, klen, 1, 1) float, 1 = masked
        attn_score = attn_score * (1 - mask) - 1e30 * mask
        attn_prob = F.softmax(attn_score, dim=1)  # over the keys
        self.sink.append(("dec_self", attn_prob.detach().permute(2, 3, 0, 1).clone()))  # (B, H, q, k)
        attn_vec = torch.einsum("ijbn,jbnd->ibnd", (attn_prob, w_head_v))
        attn_vec = attn_vec.contiguous().view(qlen, bsz, self.n_head * self.d_head)
        return self.layer_norm(w + self.o_net(attn_vec))


class RelPartialLearnableDecoderLayer(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.dec_attn = RelPartialLearnableMultiHeadAttn(sink)
        self.pos_ff = nn.Sequential(nn.Linear(D_MODEL, 64), nn.ReLU(), nn.Linear(64, D_MODEL))
        self.norm = nn.LayerNorm(D_MODEL)

    def forward(self, dec_inp, r, r_w_bias, r_r_bias, dec_attn_mask, mems=None):
        output = self.dec_attn(dec_inp, r, r_w_bias, r_r_bias, attn_mask=dec_attn_mask, mems=mems)
        return self.norm(output + self.pos_ff(output))


class MemTransformerLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.word_emb = nn.Embedding(VOCAB_SIZE, D_MODEL)
        self.r_w_bias = nn.Parameter(torch.randn(N_HEAD, D_HEAD) * 0.02)
        self.r_r_bias = nn.Parameter(torch.randn(N_HEAD, D_HEAD) * 0.02)
        self.layers = nn.ModuleList(RelPartialLearnableDecoderLayer(self.computed) for _ in range(N_LAYER))
        self.register_buffer("inv_freq", 1 / (10000 ** (torch.arange(0.0, D_MODEL, 2.0) / D_MODEL)))

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, data, mems=None):
        qlen, _ = data.size()
        word_emb = self.word_emb(data) * D_MODEL**0.5  # qlen x bsz x d
        mlen = mems[0].size(0) if mems is not None else 0
        klen = mlen + qlen
        dec_attn_mask = torch.triu(word_emb.new_ones(qlen, klen), diagonal=1 + mlen)[:, :, None]  # 1 = future
        pos_seq = torch.arange(klen - 1, -1, -1.0, device=word_emb.device)
        sinusoid_inp = torch.ger(pos_seq, self.inv_freq)
        pos_emb = torch.cat([sinusoid_inp.sin(), sinusoid_inp.cos()], dim=-1)[:, None, :]  # klen x 1 x d
        hids, core_out = [word_emb], word_emb
        for i, layer in enumerate(self.layers):
            mems_i = None if mems is None else mems[i]
            core_out = layer(core_out, pos_emb, self.r_w_bias, self.r_r_bias, dec_attn_mask, mems=mems_i)
            hids.append(core_out)
        with torch.no_grad():  # _update_mems: keep the last MEM_LEN positions of every layer's input
            new_mems = [
                (h if mems is None else torch.cat([mems[i], h], dim=0))[-MEM_LEN:].detach()
                for i, h in enumerate(hids)
            ]
        return core_out, new_mems


def build(seed: int = 0) -> MemTransformerLM:
    torch.manual_seed(seed)
    return MemTransformerLM().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """data (qlen 6, B 3) sequence-first: one segment of three streams (no padding: streams are cut)."""
    return (
        torch.tensor([[4, 5, 6, 7, 8, 9], [10, 11, 12, 13, 2, 3], [14, 15, 2, 6, 7, 8]]).t().contiguous(),
    )
