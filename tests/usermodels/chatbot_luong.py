"""The official PyTorch "Chatbot Tutorial" (LuongAttnDecoderRNN with the `Attn` module, attn_model =
'dot'), sequence-first: the encoder is a bidirectional GRU over pack_padded_sequence whose two
directions are summed; per decoding step the score is torch.sum(hidden * encoder_output, dim=2)
(S, B) (an elementwise product and a sum, not a matmul), attn_energies.t() (B, S),
F.softmax(attn_energies, dim=1).unsqueeze(1) (B, 1, S), context = attn_weights.bmm(
encoder_outputs.transpose(0, 1)).  The tutorial does not mask padding; neither does this.
Greedy decoding for 3 steps inside forward.  Ground truth per step (B, 1, 1, S) "cross".
forward(input_seq (S, B), lengths) -> tokens (3, B)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD, SOS, V, HID = 0, 1, 20, 16


class Attn(nn.Module):
    def __init__(self, method, hidden_size):
        super().__init__()
        self.method = method

    def dot_score(self, hidden, encoder_output):
        return torch.sum(hidden * encoder_output, dim=2)

    def forward(self, hidden, encoder_outputs):
        attn_energies = self.dot_score(hidden, encoder_outputs)
        attn_energies = attn_energies.t()
        return F.softmax(attn_energies, dim=1).unsqueeze(1)


class LuongAttnDecoderRNN(nn.Module):
    def __init__(self, embedding, sink):
        super().__init__()
        self.embedding = embedding
        self.gru = nn.GRU(HID, HID, 1)
        self.concat = nn.Linear(HID * 2, HID)
        self.out = nn.Linear(HID, V)
        self.attn = Attn("dot", HID)
        self.sink = sink

    def forward(self, input_step, last_hidden, encoder_outputs):
        embedded = self.embedding(input_step)
        rnn_output, hidden = self.gru(embedded, last_hidden)
        attn_weights = self.attn(rnn_output, encoder_outputs)
        self.sink.append(("cross", attn_weights.unsqueeze(1).detach().clone()))
        context = attn_weights.bmm(encoder_outputs.transpose(0, 1))
        rnn_output = rnn_output.squeeze(0)
        context = context.squeeze(1)
        concat_output = torch.tanh(self.concat(torch.cat((rnn_output, context), 1)))
        output = F.softmax(self.out(concat_output), dim=1)
        return output, hidden


class EncoderRNN(nn.Module):
    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding
        self.gru = nn.GRU(HID, HID, 1, bidirectional=True)

    def forward(self, input_seq, input_lengths):
        embedded = self.embedding(input_seq)
        packed = nn.utils.rnn.pack_padded_sequence(embedded, input_lengths)
        outputs, hidden = self.gru(packed, None)
        outputs, _ = nn.utils.rnn.pad_packed_sequence(outputs)
        outputs = outputs[:, :, :HID] + outputs[:, :, HID:]
        return outputs, hidden


class GreedySearch(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.embedding = nn.Embedding(V, HID)
        self.encoder = EncoderRNN(self.embedding)
        self.decoder = LuongAttnDecoderRNN(self.embedding, self.computed)

    def reset(self):
        self.computed.clear()

    def forward(self, input_seq, input_length):
        encoder_outputs, encoder_hidden = self.encoder(input_seq, input_length)
        decoder_hidden = encoder_hidden[:1]
        decoder_input = torch.ones(1, input_seq.shape[1], dtype=torch.long) * SOS
        tokens = []
        for _ in range(3):
            decoder_output, decoder_hidden = self.decoder(decoder_input, decoder_hidden, encoder_outputs)
            _, decoder_input = torch.max(decoder_output, dim=1)
            tokens.append(decoder_input)
            decoder_input = torch.unsqueeze(decoder_input, 0)
        return torch.stack(tokens)


def build(seed=0):
    torch.manual_seed(seed)
    return GreedySearch().eval()


def sample_batch():
    seqs = torch.tensor([[4, 5, 6, 7, 2], [8, 9, 10, 2, 0], [11, 2, 0, 0, 0]]).t().contiguous()
    return seqs, torch.tensor([5, 4, 2])
