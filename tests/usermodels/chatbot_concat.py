"""The PyTorch Chatbot Tutorial's Luong attention with attn_model='concat' (sequence-first, packed
bidirectional GRU encoder, directions summed): energy = self.attn(torch.cat((hidden.expand(S, -1, -1),
encoder_outputs), 2)).tanh(); scores = torch.sum(self.v * energy, dim=2) (S, B); .t(); softmax(dim=1)
(B, S); context = attn_weights.unsqueeze(1).bmm(encoder_outputs.transpose(0, 1)).
hidden is the decoder GRU's output for this step. Greedy decoding 3 steps. GT per step (B,1,1,S) cross."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD, SOS, V, H = 0, 1, 20, 12


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(2 * H, H)
        self.v = nn.Parameter(torch.randn(H))

    def forward(self, hidden, encoder_outputs):
        energy = self.attn(
            torch.cat((hidden.expand(encoder_outputs.size(0), -1, -1), encoder_outputs), 2)
        ).tanh()
        attn_energies = torch.sum(self.v * energy, dim=2).t()
        return F.softmax(attn_energies, dim=1).unsqueeze(1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.embedding = nn.Embedding(V, H)
        self.enc = nn.GRU(H, H, bidirectional=True)
        self.dec = nn.GRU(H, H)
        self.attn = Attn()
        self.concat = nn.Linear(2 * H, H)
        self.out = nn.Linear(H, V)

    def reset(self):
        self.computed.clear()

    def forward(self, input_seq, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(self.embedding(input_seq), lengths)
        outputs, hidden = self.enc(packed)
        outputs, _ = nn.utils.rnn.pad_packed_sequence(outputs)
        enc = outputs[:, :, :H] + outputs[:, :, H:]
        dh = hidden[:1]
        di = torch.full((1, input_seq.size(1)), SOS, dtype=torch.long)
        toks = []
        for _ in range(3):
            rnn_out, dh = self.dec(self.embedding(di), dh)
            w = self.attn(rnn_out, enc)
            self.computed.append(("cross", w.unsqueeze(1).clone()))
            ctx = w.bmm(enc.transpose(0, 1)).squeeze(1)
            o = torch.tanh(self.concat(torch.cat((rnn_out.squeeze(0), ctx), 1)))
            p = F.softmax(self.out(o), dim=1)
            _, di = torch.max(p, dim=1)
            toks.append(di)
            di = di.unsqueeze(0)
        return torch.stack(toks)


def build(seed=0):
    torch.manual_seed(seed)
    return Model().eval()


def sample_batch():
    seqs = torch.tensor([[4, 5, 6, 7, 2], [8, 9, 10, 2, 0], [11, 2, 0, 0, 0]]).t().contiguous()
    return seqs, torch.tensor([5, 4, 2])
