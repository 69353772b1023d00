"""The current official PyTorch tutorial "NLP From Scratch: Translation with a Sequence to Sequence
Network and Attention" (AttnDecoderRNN with BahdanauAttention): scores = self.Va(torch.tanh(
self.Wa(query) + self.Ua(keys))) (B, S, 1), scores = scores.squeeze(2).unsqueeze(1) (B, 1, S),
weights = F.softmax(scores, dim=-1), context = torch.bmm(weights, keys); the GRU decoder runs one
step at a time for MAX_LENGTH steps, feeding back its own argmax (no teacher forcing).  Here the
source is padded and the scores masked with masked_fill(mask, -inf) (the tutorial has no padding).
Ground truth per step (B, 1, 1, S) "cross".  forward(src) -> log-probs (B, steps, V)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD, SOS, V, HID, STEPS = 0, 1, 20, 16, 3


class BahdanauAttention(nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.Wa = nn.Linear(hidden_size, hidden_size)
        self.Ua = nn.Linear(hidden_size, hidden_size)
        self.Va = nn.Linear(hidden_size, 1)

    def forward(self, query, keys, pad):
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys)))
        scores = scores.squeeze(2).unsqueeze(1)
        scores = scores.masked_fill(pad.unsqueeze(1), float("-inf"))
        weights = F.softmax(scores, dim=-1)
        context = torch.bmm(weights, keys)
        return context, weights


class EncoderRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(V, HID)
        self.gru = nn.GRU(HID, HID, batch_first=True)

    def forward(self, x):
        return self.gru(self.embedding(x))


class AttnDecoderRNN(nn.Module):
    def __init__(self, sink):
        super().__init__()
        self.embedding = nn.Embedding(V, HID)
        self.attention = BahdanauAttention(HID)
        self.gru = nn.GRU(2 * HID, HID, batch_first=True)
        self.out = nn.Linear(HID, V)
        self.sink = sink

    def forward(self, encoder_outputs, encoder_hidden, pad):
        batch_size = encoder_outputs.size(0)
        decoder_input = torch.empty(batch_size, 1, dtype=torch.long).fill_(SOS)
        decoder_hidden = encoder_hidden
        decoder_outputs = []
        for _ in range(STEPS):
            decoder_output, decoder_hidden, attn_weights = self.forward_step(
                decoder_input, decoder_hidden, encoder_outputs, pad
            )
            self.sink.append(("cross", attn_weights.unsqueeze(1).detach().clone()))
            decoder_outputs.append(decoder_output)
            _, topi = decoder_output.topk(1)
            decoder_input = topi.squeeze(-1).detach()
        return F.log_softmax(torch.cat(decoder_outputs, dim=1), dim=-1)

    def forward_step(self, input, hidden, encoder_outputs, pad):
        embedded = self.embedding(input)
        query = hidden.permute(1, 0, 2)
        context, attn_weights = self.attention(query, encoder_outputs, pad)
        input_gru = torch.cat((embedded, context), dim=2)
        output, hidden = self.gru(input_gru, hidden)
        return self.out(output), hidden, attn_weights


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.encoder = EncoderRNN()
        self.decoder = AttnDecoderRNN(self.computed)

    def reset(self):
        self.computed.clear()

    def forward(self, src):
        enc_out, enc_hidden = self.encoder(src)
        return self.decoder(enc_out, enc_hidden, src == PAD)


def build(seed=0):
    torch.manual_seed(seed)
    return Seq2Seq().eval()


def sample_batch():
    return (torch.tensor([[4, 5, 6, 7, 2], [8, 9, 2, 0, 0], [10, 11, 12, 2, 0]]),)
