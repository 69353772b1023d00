"""PyTorch's tutorial "Language Translation with nn.Transformer and torchtext", as users copy it:
SEQUENCE-first ``nn.Transformer`` (batch_first=False, ids (S, B)), ``create_mask`` with a float
``-inf`` future mask and ``(B, S)`` padding masks, a positional table of shape (maxlen, 1, emb),
torchtext's vocabularies given as DICTS token -> id (``vocab.get_stoi()``), ``UNK_IDX, PAD_IDX,
BOS_IDX, EOS_IDX = 0, 1, 2, 3``, and ``text_transform`` returning a 1-D TENSOR ``<bos> ids <eos>``.
The adapter's ``forward`` transposes to sequence-first and back. German -> English words, random
seeded weights.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

ARCH = "encoder-decoder"
UNK_IDX, PAD_IDX, BOS_IDX, EOS_IDX = 0, 1, 2, 3
SPECIALS = ["<unk>", "<pad>", "<bos>", "<eos>"]
_DE = "ein eine der die das mann frau hund katze sieht mag isst ball haus und rot blau".split()
_EN = "a the man woman dog cat sees likes eats ball house and red blue".split()
VOCAB = {t: i for i, t in enumerate(SPECIALS + _DE)}  # vocab_transform["de"].get_stoi()
TGT_VOCAB = {t: i for i, t in enumerate(SPECIALS + _EN)}  # vocab_transform["en"].get_stoi()
PAD, BOS, EOS = PAD_IDX, BOS_IDX, EOS_IDX
MAX_LEN = 40
EXAMPLES = ["ein mann sieht einen hund", "die katze isst"]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class PositionalEncoding(nn.Module):
    def __init__(self, emb_size: int, dropout: float, maxlen: int = 5000):
        super().__init__()
        den = torch.exp(-torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pos_embedding = torch.zeros((maxlen, emb_size))
        pos_embedding[:, 0::2] = torch.sin(pos * den)
        pos_embedding[:, 1::2] = torch.cos(pos * den)
        pos_embedding = pos_embedding.unsqueeze(-2)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", pos_embedding)

    def forward(self, token_embedding: Tensor):
        return self.dropout(token_embedding + self.pos_embedding[: token_embedding.size(0), :])


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size: int, emb_size):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.emb_size = emb_size

    def forward(self, tokens: Tensor):
        return self.embedding(tokens.long()) * math.sqrt(self.emb_size)


class Seq2SeqTransformer(nn.Module):
    def __init__(self, num_encoder_layers, num_decoder_layers, emb_size, nhead, src_vocab_size,
                 tgt_vocab_size, dim_feedforward=512, dropout=0.1):  # fmt: skip
        super().__init__()
        self.transformer = nn.Transformer(d_model=emb_size, nhead=nhead, num_encoder_layers=num_encoder_layers,
                                          num_decoder_layers=num_decoder_layers, dim_feedforward=dim_feedforward,
                                          dropout=dropout)  # fmt: skip
        self.generator = nn.Linear(emb_size, tgt_vocab_size)
        self.src_tok_emb = TokenEmbedding(src_vocab_size, emb_size)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, emb_size)
        self.positional_encoding = PositionalEncoding(emb_size, dropout=dropout)

    def forward(
        self, src, trg, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, memory_key_padding_mask
    ):
        src_emb = self.positional_encoding(self.src_tok_emb(src))
        tgt_emb = self.positional_encoding(self.tgt_tok_emb(trg))
        outs = self.transformer(src_emb, tgt_emb, src_mask, tgt_mask, None,
                                src_padding_mask, tgt_padding_mask, memory_key_padding_mask)  # fmt: skip
        return self.generator(outs)


def generate_square_subsequent_mask(sz):
    mask = (torch.triu(torch.ones((sz, sz), device=DEVICE)) == 1).transpose(0, 1)
    return mask.float().masked_fill(mask == 0, float("-inf")).masked_fill(mask == 1, 0.0)


def create_mask(src, tgt):
    src_seq_len, tgt_seq_len = src.shape[0], tgt.shape[0]
    tgt_mask = generate_square_subsequent_mask(tgt_seq_len)
    src_mask = torch.zeros((src_seq_len, src_seq_len), device=DEVICE).type(torch.bool)
    src_padding_mask = (src == PAD_IDX).transpose(0, 1)
    tgt_padding_mask = (tgt == PAD_IDX).transpose(0, 1)
    return src_mask, tgt_mask, src_padding_mask, tgt_padding_mask


def load() -> nn.Module:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(2, 2, 32, 4, len(VOCAB), len(TGT_VOCAB), dim_feedforward=64)
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return model.to(DEVICE)


def _text_transform(stoi: dict, text: str) -> Tensor:
    ids = [stoi.get(w, UNK_IDX) for w in text.lower().split()]  # token_transform + vocab_transform
    return torch.cat((torch.tensor([BOS_IDX]), torch.tensor(ids, dtype=torch.long), torch.tensor([EOS_IDX])))


def encode(text: str) -> Tensor:
    return _text_transform(VOCAB, text)


def encode_target(text: str) -> Tensor:
    return _text_transform(TGT_VOCAB, text)[1:]  # attnscope puts BOS in front


def forward(model: nn.Module, src: Tensor, tgt: Tensor) -> Tensor:
    src, tgt = src.T, tgt.T  # the tutorial is sequence-first: (S, B), (T, B)
    src_mask, tgt_mask, src_padding_mask, tgt_padding_mask = create_mask(src, tgt)
    logits = model(src, tgt, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, src_padding_mask)
    return logits.transpose(0, 1)  # (B, T, V)
