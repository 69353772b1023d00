"""PyTorch's "NLP From Scratch: Translation with a Sequence to Sequence Network and Attention" as its
readers adapt it: an EncoderRNN (embedding, GRU) and an AttnDecoderRNN with BahdanauAttention
(``Va(tanh(Wa(query) + Ua(keys)))``, ``scores.squeeze(2).unsqueeze(1)``, ``F.softmax``, ``torch.bmm``)
run one step at a time over the target (teacher forcing), with the source's padding masked. There is
no self-attention: the model's only maps are the decoder's steps over the source, one (B, 1, S) per
step. The model keeps the maps it computed (``computed``). forward -> log-probabilities (B, T, V).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ARCH = "encoder-decoder"
VOCAB = ["<pad>", "<sos>", "<eos>"] + list("abcdefgh ")
PAD, BOS, EOS = 0, 1, 2
EXAMPLES = ["abc", "hed cab"]
HID = 16
_STOI = {c: i for i, c in enumerate(VOCAB) if len(c) == 1}


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
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)

    def forward(self, input):
        return self.gru(self.embedding(input))


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden_size, output_size, sink):
        super().__init__()
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.attention = BahdanauAttention(hidden_size)
        self.gru = nn.GRU(2 * hidden_size, hidden_size, batch_first=True)
        self.out = nn.Linear(hidden_size, output_size)
        self.sink = sink

    def forward(self, encoder_outputs, encoder_hidden, target_tensor, pad):
        decoder_hidden = encoder_hidden
        decoder_outputs, attentions = [], []
        for i in range(target_tensor.size(1)):  # teacher forcing: the target is the next input
            decoder_input = target_tensor[:, i].unsqueeze(1)
            decoder_output, decoder_hidden, attn_weights = self.forward_step(
                decoder_input, decoder_hidden, encoder_outputs, pad
            )
            decoder_outputs.append(decoder_output)
            attentions.append(attn_weights)
        self.sink.append(("cross", torch.cat(attentions, dim=1).unsqueeze(1).detach()))
        return F.log_softmax(torch.cat(decoder_outputs, dim=1), dim=-1)

    def forward_step(self, input, hidden, encoder_outputs, pad):
        embedded = self.embedding(input)
        query = hidden.permute(1, 0, 2)
        context, attn_weights = self.attention(query, encoder_outputs, pad)
        output, hidden = self.gru(torch.cat((embedded, context), dim=2), hidden)
        return self.out(output), hidden, attn_weights


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.encoder = EncoderRNN(len(VOCAB), HID)
        self.decoder = AttnDecoderRNN(HID, len(VOCAB), self.computed)

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, src, tgt):
        encoder_outputs, encoder_hidden = self.encoder(src)
        return self.decoder(encoder_outputs, encoder_hidden, tgt, src == PAD)


def encode(text: str) -> list[int]:
    return [_STOI.get(c, PAD) for c in text] + [EOS]


def load() -> nn.Module:
    torch.manual_seed(0)
    return Seq2Seq().eval()


def forward(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    return model(src, tgt)
