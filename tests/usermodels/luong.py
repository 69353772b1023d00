"""Luong et al. (2015) "general" global attention in an LSTM seq2seq decoded step by step with input
feeding (OpenNMT-py GlobalAttention / the PyTorch chatbot tutorial style): the encoder runs over
pack_padded_sequence(lengths, enforce_sorted=False) and pad_packed_sequence, the score is
torch.bmm(h_t.unsqueeze(1), self.W_a(enc).transpose(1, 2)) (B, 1, S), masked with
masked_fill_(~mask.unsqueeze(1), -inf) IN PLACE, F.softmax(dim=-1); context = bmm(align, enc),
attentional state h~ = tanh(W_c [c; h]). The last layer uses "dot" scoring on the memory bank directly.
forward(src, lengths, tgt) -> logits (B, T, V)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

PAD, V, H = 0, 20, 24


class GlobalAttention(nn.Module):
    def __init__(self, sink, attn_type):
        super().__init__()
        self.attn_type = attn_type
        if attn_type == "general":
            self.linear_in = nn.Linear(H, H, bias=False)
        self.linear_out = nn.Linear(2 * H, H, bias=False)
        self.sink = sink

    def score(self, h_t, h_s):
        if self.attn_type == "general":
            h_t = self.linear_in(h_t)
        return torch.bmm(h_t, h_s.transpose(1, 2))  # (B, 1, S)

    def forward(self, source, memory_bank, mask):
        # source (B, H) one decoder step, memory_bank (B, S, H)
        source = source.unsqueeze(1)
        align = self.score(source, memory_bank)
        align.masked_fill_(~mask.unsqueeze(1), -float("inf"))
        align_vectors = F.softmax(align, -1)
        self.sink.append(("cross", align_vectors.unsqueeze(1).detach().clone()))
        c = torch.bmm(align_vectors, memory_bank)
        attn_h = torch.tanh(self.linear_out(torch.cat([c, source], 2)))
        return attn_h.squeeze(1)


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.emb = nn.Embedding(V, H, padding_idx=PAD)
        self.encoder = nn.LSTM(H, H, batch_first=True)
        self.decoder = nn.LSTMCell(2 * H, H)
        self.attn = GlobalAttention(self.computed, "general")
        self.dot_attn = GlobalAttention(self.computed, "dot")
        self.gen = nn.Linear(H, V)

    def reset(self):
        self.computed.clear()

    def forward(self, src, lengths, tgt):
        packed = pack_padded_sequence(self.emb(src), lengths, batch_first=True, enforce_sorted=False)
        out, (h, c) = self.encoder(packed)
        memory_bank, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        mask = src != PAD
        h, c = h[0], c[0]
        input_feed = torch.zeros_like(h)
        logits = []
        for t in range(tgt.shape[1]):
            x = torch.cat([self.emb(tgt[:, t]), input_feed], dim=1)
            h, c = self.decoder(x, (h, c))
            attn_h = self.attn(h, memory_bank, mask)
            attn_h = self.dot_attn(attn_h, memory_bank, mask)
            input_feed = attn_h
            logits.append(self.gen(attn_h))
        return torch.stack(logits, 1)


def build(seed=0):
    torch.manual_seed(seed)
    return Seq2Seq().eval()


def sample_batch():
    src = torch.tensor([[4, 5, 6, 0, 0], [7, 8, 9, 10, 11], [12, 13, 0, 0, 0], [14, 15, 16, 17, 0]])
    lengths = torch.tensor([3, 5, 2, 4])
    tgt = torch.tensor([[1, 3, 4], [1, 5, 6], [1, 7, 0], [1, 8, 9]])
    return src, lengths, tgt
