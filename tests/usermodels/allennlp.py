"""AllenNLP style (allennlp.nn.util.masked_softmax with its default ``memory_efficient=False``): the
softmax is taken over ``vector * mask`` (padded keys score 0, not -inf), then the weights are
multiplied by the mask and divided by their sums plus 1e-13, so the model attends with the
RENORMALIZED weights. A BiDAF-like reader: a shared ``MultiHeadSelfAttention`` encoder (fused
projection split with ``torch.split``, 3-D ``(B*H, T, d)`` heads, ``torch.bmm``) over the context
and over the question, then context-to-question attention ``torch.bmm(context, question^T)``
(3-D, one head). forward(context_ids, question_ids) -> span logits (B, Lc, 2).
"""

from __future__ import annotations

import torch
from torch import nn

PAD = 0
VOCAB_SIZE, DIM, N_HEADS = 20, 32, 4


def masked_softmax(
    vector: torch.Tensor, mask: torch.BoolTensor, dim: int = -1, memory_efficient: bool = False
):
    if mask is None:
        return torch.nn.functional.softmax(vector, dim=dim)
    while mask.dim() < vector.dim():
        mask = mask.unsqueeze(1)
    if not memory_efficient:
        # To limit numerical errors from large vector elements outside the mask, we zero these out.
        result = torch.nn.functional.softmax(vector * mask, dim=dim)
        result = result * mask
        return result / (result.sum(dim=dim, keepdim=True) + 1e-13)
    masked_vector = vector.masked_fill(~mask, torch.finfo(vector.dtype).min)
    return torch.nn.functional.softmax(masked_vector, dim=dim)


def weighted_sum(matrix: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    return attention.bmm(matrix)


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self._num_heads, self._attention_dim, self._values_dim = N_HEADS, DIM, DIM
        self._combined_projection = nn.Linear(DIM, 2 * DIM + DIM)
        self._scale = (DIM // N_HEADS) ** 0.5
        self._output_projection = nn.Linear(DIM, DIM)
        self.sink = sink

    def forward(self, inputs: torch.Tensor, mask: torch.BoolTensor) -> torch.Tensor:
        num_heads = self._num_heads
        batch_size, timesteps, _ = inputs.size()
        combined_projection = self._combined_projection(inputs)
        queries, keys, *values = combined_projection.split(self._attention_dim, -1)
        queries, keys = queries.contiguous(), keys.contiguous()
        values = torch.cat(values, -1).contiguous()

        def per_head(x, dim):
            x = x.view(batch_size, timesteps, num_heads, dim // num_heads).transpose(1, 2).contiguous()
            return x.view(batch_size * num_heads, timesteps, dim // num_heads)

        values_per_head = per_head(values, self._values_dim)
        queries_per_head, keys_per_head = (
            per_head(queries, self._attention_dim),
            per_head(keys, self._attention_dim),
        )
        scaled_similarities = torch.bmm(queries_per_head / self._scale, keys_per_head.transpose(1, 2))
        attention = masked_softmax(
            scaled_similarities, mask.repeat(1, num_heads).view(batch_size * num_heads, timesteps)
        )
        self.sink.append(
            ("enc_self", attention.detach().view(batch_size, num_heads, timesteps, timesteps).clone())
        )
        outputs = weighted_sum(values_per_head, attention)
        outputs = outputs.view(batch_size, num_heads, timesteps, -1).transpose(1, 2).contiguous()
        return self._output_projection(outputs.view(batch_size, timesteps, -1))


class Reader(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.text_field_embedder = nn.Embedding(VOCAB_SIZE, DIM, padding_idx=PAD)
        self.phrase_layer = MultiHeadSelfAttention(self.computed)
        self.norm = nn.LayerNorm(DIM)
        self.span_predictor = nn.Linear(2 * DIM, 2)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def encode(self, ids):
        mask = ids != PAD
        x = self.text_field_embedder(ids)
        return self.norm(x + self.phrase_layer(x, mask)), mask

    def forward(self, context_ids, question_ids):
        encoded_passage, _ = self.encode(context_ids)
        encoded_question, question_mask = self.encode(question_ids)
        passage_question_similarity = torch.bmm(
            encoded_passage, encoded_question.transpose(1, 2)
        )  # (B, Lc, Lq)
        passage_question_attention = masked_softmax(passage_question_similarity, question_mask)
        self.computed.append(("cross", passage_question_attention.detach().unsqueeze(1).clone()))
        passage_question_vectors = weighted_sum(encoded_question, passage_question_attention)
        return self.span_predictor(torch.cat([encoded_passage, passage_question_vectors], dim=-1))


def build(seed: int = 0) -> Reader:
    torch.manual_seed(seed)
    return Reader().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """context (3, 7) with 7, 5, 3 real tokens; question (3, 4) with 4, 3, 2."""
    context = torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]])
    question = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 0], [10, 11, 0, 0]])
    return context, question
