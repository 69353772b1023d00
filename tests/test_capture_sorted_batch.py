"""A batch sorted by length inside the model (for ``pack_padded_sequence``) before an attention whose rows lineage
cannot place: sgrvinod's Hierarchical Attention Network sorts its documents (``documents[doc_sort_ind]``), packs
their sentences through a GRU and pools them with a learned context vector, and puts the documents back in order
only after the attention. Record row r was document ``doc_sort_ind[r]``, recorded exact with no word, and
``trace(b)`` drew another document's weights. Such a record is now flagged with the order; one the model put back
before its attention stays exact.

DTFD-MIL's MaxMinS pseudo-bag: instances sorted by a score and the highest and lowest picked
(``feats.index_select(0, sort_idx[...])``), then pooled by a gated attention with a learned query. The record's
keys are the instances in that order; where they were as many as the bag's, the trace drew them as a second layer
under the instances in their own order. Those keys' positions are now kept, and a trace leaves such a layer out.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from attnscope.core.families.capture import capture_attention

V, E, G, A = 40, 12, 8, 10


class SentencePooling(nn.Module):
    """HAN's sentence level, its word level reduced to a mean of word vectors (the sentence vectors)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.rnn = nn.GRU(E, G, bidirectional=True, batch_first=True)
        self.att, self.ctx = nn.Linear(2 * G, A), nn.Linear(A, 1, bias=False)
        self.kept: torch.Tensor | None = None

    def forward(self, documents: torch.Tensor, sentences_per_document: torch.Tensor):
        sentences_per_document, doc_sort_ind = sentences_per_document.sort(dim=0, descending=True)
        documents = documents[doc_sort_ind]
        packed = pack_padded_sequence(documents, lengths=sentences_per_document.tolist(), batch_first=True)
        sentences = self.emb(packed.data).mean(1)  # (n_sentences, E)
        packed_sentences, _ = self.rnn(PackedSequence(data=sentences, batch_sizes=packed.batch_sizes))
        att_s = self.ctx(torch.tanh(self.att(packed_sentences.data))).squeeze(1)
        att_s = torch.exp(att_s - att_s.max())
        att_s, _ = pad_packed_sequence(
            PackedSequence(data=att_s, batch_sizes=packed.batch_sizes), batch_first=True
        )
        sentence_alphas = att_s / torch.sum(att_s, dim=1, keepdim=True)
        docs, _ = pad_packed_sequence(
            PackedSequence(data=packed_sentences.data, batch_sizes=packed.batch_sizes), batch_first=True
        )
        docs = (docs * sentence_alphas.unsqueeze(2)).sum(dim=1)
        _, doc_unsort_ind = doc_sort_ind.sort(dim=0, descending=False)
        self.kept = sentence_alphas[doc_unsort_ind].detach().clone()
        return docs[doc_unsort_ind], sentence_alphas[doc_unsort_ind]


class SortedEncoder(nn.Module):
    """Sorted for the GRU, put back in the caller's order, then pooled by additive attention."""

    def __init__(self):
        super().__init__()
        self.emb, self.rnn, self.att = nn.Embedding(V, E), nn.GRU(E, E, batch_first=True), nn.Linear(E, 1)
        self.kept: torch.Tensor | None = None

    def forward(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        lens_sorted, idx = lens.sort(descending=True)
        out, _ = self.rnn(pack_padded_sequence(self.emb(ids[idx]), lens_sorted.tolist(), batch_first=True))
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        out = out[idx.argsort()]
        keep = torch.arange(ids.shape[1])[None] < lens[:, None]
        w = self.att(out).squeeze(-1).masked_fill(~keep, -1e9).softmax(-1)
        self.kept = w.detach().clone()
        return (w.unsqueeze(-1) * out).sum(1)


@pytest.mark.parametrize("batch", [2, 3, 4, 5])
def test_documents_sorted_before_an_unplaced_attention_are_flagged_with_the_order(batch):
    torch.manual_seed(batch)
    model = SentencePooling().eval()
    docs = torch.randint(1, V, (batch, 4, 5))
    per_doc = torch.tensor([1 + (3 * b) % 4 for b in range(batch)])  # not in descending order
    per_doc[0] = 1
    with torch.no_grad(), capture_attention(model) as cap:
        model(docs, per_doc)
    (rec,) = cap.records
    order = per_doc.sort(descending=True).indices
    assert not torch.equal(order, torch.arange(batch))
    for row in range(batch):  # the record holds the sorted documents (the test's check of the claim)
        n = int(per_doc[order[row]])
        torch.testing.assert_close(rec.probs[row, 0, 0, :n], model.kept[order[row], :n])
    assert not rec.exact and f"perm={order.tolist()}" in rec.flag and "record row b may be" in rec.flag
    assert any("had not put it back" in n for n in cap.notes)


def test_a_batch_sorted_and_put_back_before_its_attention_stays_exact():
    torch.manual_seed(0)
    model = SortedEncoder().eval()
    ids, lens = torch.randint(1, V, (4, 6)), torch.tensor([3, 6, 2, 4])
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, lens)
    (rec,) = cap.records
    assert rec.exact and rec.flag is None
    torch.testing.assert_close(rec.probs[:, 0, 0], model.kept)


def test_documents_already_in_order_stay_exact():
    torch.manual_seed(1)
    model = SentencePooling().eval()
    per_doc = torch.tensor([4, 3, 2, 1])
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, V, (4, 4, 5)), per_doc)
    (rec,) = cap.records
    assert rec.exact and rec.flag is None
    torch.testing.assert_close(rec.probs[:, 0, 0], model.kept)


class GatedPooling(nn.Module):
    """ABMIL's gated attention (``w^T (tanh(V h) * sigmoid(U h))``, softmax over the instances)."""

    def __init__(self, dim: int):
        super().__init__()
        self.V, self.U, self.w = nn.Linear(dim, 8), nn.Linear(dim, 8), nn.Linear(8, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (N, dim) -> (1, N)
        return F.softmax(self.w(torch.tanh(self.V(h)) * torch.sigmoid(self.U(h))).transpose(1, 0), dim=1)


class MaxMinPseudoBag(nn.Module):
    """DTFD-MIL's tier 1 and its MaxMinS selection: the instances a classifier scores highest and lowest, sorted,
    pooled again by tier 2."""

    def __init__(self, groups: int):
        super().__init__()
        self.reduce, self.cls = nn.Linear(20, 16), nn.Linear(16, 2)
        self.tier1, self.tier2 = GatedPooling(16), GatedPooling(16)
        self.groups = groups
        self.kept: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        h = self.reduce(feats)
        a1 = self.tier1(h).squeeze(0)
        score = torch.softmax(self.cls(torch.einsum("ns,n->ns", h, a1)), dim=1)[:, -1]
        sort_idx = torch.sort(score, descending=True)[1]
        pick = torch.cat([sort_idx[: self.groups], sort_idx[-self.groups :]])
        picked = h.index_select(dim=0, index=pick)
        a2 = self.tier2(picked).squeeze(0)
        self.kept = (a1.detach().clone(), a2.detach().clone(), pick)
        return self.cls(torch.mm(a2[None], picked))


@pytest.mark.parametrize("seed", range(4))
def test_instances_sorted_by_a_score_are_not_drawn_under_the_instances_in_order(seed):
    torch.manual_seed(seed)
    model = MaxMinPseudoBag(groups=3).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(6, 20))  # as many instances as tier 2 picks: its map stacks with tier 1's
    a1, a2, pick = model.kept
    first, second = cap.records
    torch.testing.assert_close(second.probs[0, 0, 0], a2)
    assert second.key_positions[0].tolist() == (first.key_positions[0][pick]).tolist()
    assert not torch.equal(pick, torch.arange(6))
    tr = cap.trace(0, src_tokens=[f"i{i}" for i in range(6)])
    assert tr.cross.shape == (1, 1, 1, 6)  # tier 1 alone, over the instances in their order
    torch.testing.assert_close(torch.tensor(tr.cross[0, 0, 0]), a1)
    assert any("tier2" in n and "another order" in n for n in tr.meta["capture_notes"])


# sgrvinod's two levels, as written there (word level on the packed sentences, sentence level on their vectors)
class WordAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.rnn = nn.GRU(E, G, bidirectional=True, batch_first=True)
        self.att = nn.Linear(2 * G, A)
        self.ctx = nn.Linear(A, 1, bias=False)

    def forward(self, sentences, words_per_sentence):
        words_per_sentence, sent_sort_ind = words_per_sentence.sort(dim=0, descending=True)
        sentences = sentences[sent_sort_ind]
        sentences = self.emb(sentences)
        packed_words = pack_padded_sequence(sentences, lengths=words_per_sentence.tolist(), batch_first=True)
        packed_words, _ = self.rnn(packed_words)
        att_w = self.att(packed_words.data)
        att_w = torch.tanh(att_w)
        att_w = self.ctx(att_w).squeeze(1)
        max_value = att_w.max()
        att_w = torch.exp(att_w - max_value)
        att_w, _ = pad_packed_sequence(
            PackedSequence(
                data=att_w,
                batch_sizes=packed_words.batch_sizes,
                sorted_indices=packed_words.sorted_indices,
                unsorted_indices=packed_words.unsorted_indices,
            ),
            batch_first=True,
        )
        word_alphas = att_w / torch.sum(att_w, dim=1, keepdim=True)
        sentences, _ = pad_packed_sequence(packed_words, batch_first=True)
        sentences = sentences * word_alphas.unsqueeze(2)
        sentences = sentences.sum(dim=1)
        _, sent_unsort_ind = sent_sort_ind.sort(dim=0, descending=False)
        return sentences[sent_unsort_ind], word_alphas[sent_unsort_ind]


class SentenceAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.word = WordAttention()
        self.rnn = nn.GRU(2 * G, G, bidirectional=True, batch_first=True)
        self.att = nn.Linear(2 * G, A)
        self.ctx = nn.Linear(A, 1, bias=False)
        self.kept = None

    def forward(self, documents, sentences_per_document, words_per_sentence):
        sentences_per_document, doc_sort_ind = sentences_per_document.sort(dim=0, descending=True)
        documents = documents[doc_sort_ind]
        words_per_sentence = words_per_sentence[doc_sort_ind]
        packed_sentences = pack_padded_sequence(
            documents, lengths=sentences_per_document.tolist(), batch_first=True
        )
        valid_bsz = packed_sentences.batch_sizes
        packed_wps = pack_padded_sequence(
            words_per_sentence, lengths=sentences_per_document.tolist(), batch_first=True
        )
        sentences, word_alphas = self.word(packed_sentences.data, packed_wps.data)
        packed_sentences, _ = self.rnn(PackedSequence(data=sentences, batch_sizes=valid_bsz))
        att_s = self.att(packed_sentences.data)
        att_s = torch.tanh(att_s)
        att_s = self.ctx(att_s).squeeze(1)
        max_value = att_s.max()
        att_s = torch.exp(att_s - max_value)
        att_s, _ = pad_packed_sequence(PackedSequence(data=att_s, batch_sizes=valid_bsz), batch_first=True)
        sentence_alphas = att_s / torch.sum(att_s, dim=1, keepdim=True)
        documents, _ = pad_packed_sequence(
            PackedSequence(data=packed_sentences.data, batch_sizes=valid_bsz), batch_first=True
        )
        documents = documents * sentence_alphas.unsqueeze(2)
        documents = documents.sum(dim=1)
        _, doc_unsort_ind = doc_sort_ind.sort(dim=0, descending=False)
        documents = documents[doc_unsort_ind]
        sentence_alphas = sentence_alphas[doc_unsort_ind]
        self.kept = sentence_alphas.detach().clone()
        return documents, sentence_alphas


def test_sentence_vectors_numbered_in_packed_order_are_no_keys_out_of_order():
    """The sentence level's keys are vectors the word level pooled, numbered in the packed order the model made them
    in: no caller's tokens out of their order, so a trace draws that level (flagged, its batch sorted), not leaves
    it out as keys in another order."""
    torch.manual_seed(0)
    model = SentenceAttention().eval()
    docs, per_doc = torch.randint(1, V, (4, 4, 5)), torch.tensor([1, 3, 3, 4])
    with torch.no_grad(), capture_attention(model) as cap:
        model(docs, per_doc, torch.randint(1, 6, (4, 4)))
    tr = cap.trace(1, src_tokens=["a", "b", "c"])
    notes = tr.meta["capture_notes"]
    assert not any("another order, or some of them twice" in n for n in notes), notes
    assert any("had not put it back" in n for n in [*notes, *cap.notes]), notes
