"""Hugging Face folders whose attention is local or has a learned sink (attnscope.core.families.hf): the saved
masks are the ones the model applied (sliding windows in a padded batch, Llama 4's chunks, ModernBERT's and
T5Gemma's two-sided windows in the encoder), a sink's weight is in the trace as a learned key (GPT-OSS), and a
text the tokenizer turns into no tokens is refused in one sentence.

Tiny randomly initialised models are built from configs and saved with test_hf's WordLevel tokenizer into
tmp_path; nothing is downloaded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_hf import SMALL, _tokenizer  # noqa: E402
from tokenizers import Regex, normalizers  # noqa: E402

import attnscope  # noqa: E402
from attnscope.core.errors import InputError  # noqa: E402
from attnscope.core.families import hf  # noqa: E402
from attnscope.core.traces.trace import AttentionTrace  # noqa: E402
from attnscope.models import registry  # noqa: E402

LONG, SHORT = "the cat sat on a mat dog ran", "hello world"  # 8 and 2 tokens: a padded batch
SPECIAL = dict(bos_token="<s>", eos_token="</s>")
COMMON = dict(**SMALL, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)  # fmt: skip


def _save(model, folder, template: str | None = None, **special):
    model.eval().save_pretrained(folder)
    _tokenizer(template, **(special or SPECIAL)).save_pretrained(folder)
    return registry.load(str(folder))


def _causal(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n), bool))


def _window(n: int, w: int) -> np.ndarray:
    """The last ``w`` keys up to each query."""
    return _causal(n) & ~np.tril(np.ones((n, n), bool), -w)


def _applied(trace: AttentionTrace, kind: str, layer: int) -> np.ndarray:
    """(q, k): the keys some head of ``layer`` gives weight, on the rows that see a key in the saved mask."""
    mask = trace.mask(kind, layer)
    return (trace.probs(kind)[layer] != 0).any(0) & mask.any(-1)[:, None]


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_a_sliding_window_stays_in_the_mask_of_a_padded_batch(tmp_path, arch):
    """A batch of texts of different lengths lost the window from every saved mask, silently: a padding query
    past the short text's window sees no key in it, and eager attention spreads such a row over every key,
    which the check on the maps read as weight beyond the window. Rows that see no key are no evidence."""
    torch.manual_seed(0)
    t = transformers
    if arch == "mistral":
        model = t.MistralForCausalLM(t.MistralConfig(**COMMON, sliding_window=3))
    else:
        model = t.Gemma2ForCausalLM(t.Gemma2Config(**COMMON, head_dim=4, sliding_window=3))
    long, short = _save(model, tmp_path).trace([LONG, SHORT])
    n = long.mask("dec_self").shape[-1]
    band, causal = _window(n, 3), _causal(n)
    windowed = [0, 1] if arch == "mistral" else [0]  # Gemma 2: sliding, then global
    for layer in range(2):
        assert np.array_equal(long.mask("dec_self", layer), band if layer in windowed else causal), layer
        assert np.array_equal(_applied(long, "dec_self", layer), long.mask("dec_self", layer)), layer
        # the short text: its 2 keys within the window; the padding queries past it see none (the windowed mask)
        want = (band if layer in windowed else causal) & np.array([True, True] + [False] * (n - 2))[None, :]
        assert np.array_equal(short.mask("dec_self", layer), want), layer
    assert long.masks_differ("dec_self") == (arch == "gemma2")
    assert not short.mask("dec_self", 0)[5:].any()  # rows 5.. see no real key within 3
    assert long.problems() == [] and short.problems() == [] and not long.meta["warnings"]


def test_a_window_the_maps_contradict_is_not_claimed_in_a_batch(tmp_path):
    """A config that names a window its model does not apply (Llama ignores ``sliding_window``) keeps the
    plain causal mask, in a padded batch too: the check still reads every row that sees a key."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**COMMON)
    config.sliding_window = 3
    long, _ = _save(transformers.LlamaForCausalLM(config), tmp_path).trace([LONG, SHORT])
    n = long.mask("dec_self").shape[-1]
    assert np.array_equal(long.mask("dec_self"), _causal(n)) and not long.masks_differ("dec_self")


def test_llama4_chunked_layers_are_in_their_saved_masks(tmp_path):
    """Llama 4's chunked layers attend within the query's own chunk of ``attention_chunk_size`` positions
    (transformers' ``chunked_overlay``: ``k // c == q // c``, causal): the saved mask was plain causal, so
    keys of earlier chunks showed as allowed with weight exactly 0."""
    torch.manual_seed(0)
    config = transformers.Llama4TextConfig(
        **COMMON, intermediate_size_mlp=32, head_dim=4, attention_chunk_size=3, num_local_experts=1,
        layer_types=["chunked_attention", "full_attention"], no_rope_layers=[1, 0],
    )  # fmt: skip
    lm = _save(transformers.Llama4ForCausalLM(config), tmp_path)
    for texts in ([LONG], [LONG, SHORT]):
        trace = lm.trace(texts)[0]
        n = trace.mask("dec_self").shape[-1]
        pos = np.arange(n)
        chunked = _causal(n) & (pos[:, None] // 3 == pos[None, :] // 3)
        assert trace.masks_differ("dec_self"), texts
        assert np.array_equal(trace.mask("dec_self", 0), chunked), texts
        assert np.array_equal(trace.mask("dec_self", 1), _causal(n)), texts
        for layer in range(2):
            assert np.array_equal(_applied(trace, "dec_self", layer), trace.mask("dec_self", layer)), texts
        assert trace.problems() == [] and not trace.meta["warnings"]
    verdicts = {v.name: v for v in attnscope.audit(lm, [LONG, SHORT])}  # a correct model passes, chunks named
    declared = verdicts["declared_mask[dec_self]"]
    assert declared.passed and "layer 0 attends within chunks of 3 positions" in declared.detail, (
        declared.line()
    )


def _modernbert():
    return transformers.ModernBertModel(transformers.ModernBertConfig(
        vocab_size=SMALL["vocab_size"], pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=4,
        sep_token_id=5, hidden_size=16, intermediate_size=32, num_attention_heads=4, num_hidden_layers=3,
        max_position_embeddings=64, local_attention=4, global_attn_every_n_layers=3,
    ))  # fmt: skip


def _t5gemma():
    side = dict(COMMON, head_dim=4, sliding_window=3, layer_types=["sliding_attention", "full_attention"])
    t = transformers
    return t.T5GemmaForConditionalGeneration(t.T5GemmaConfig(
        encoder=t.T5GemmaModuleConfig(**side), decoder=t.T5GemmaModuleConfig(**side), vocab_size=SMALL["vocab_size"],
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    ))  # fmt: skip


@pytest.mark.parametrize("arch", ["modernbert", "t5gemma"])
def test_an_encoders_local_layers_are_in_their_saved_masks(tmp_path, arch):
    """ModernBERT's local layers (every layer but each ``global_attn_every_n_layers``-th) attend to keys at most
    ``local_attention // 2`` positions away on either side, T5Gemma's encoder sliding layers within
    ``sliding_window`` on either side (and its decoder's within the last ``sliding_window`` keys): the saved
    encoder masks were every real key, since the encoder paths never narrowed a mask."""
    torch.manual_seed(0)
    if arch == "modernbert":
        lm = _save(_modernbert(), tmp_path, "[CLS] $A [SEP]", cls_token="[CLS]", sep_token="[SEP]")
        long, short = lm.trace([LONG, SHORT])
        half, local, n_layers = 2, [1, 2], 3  # layer_types: full, sliding, sliding
    else:
        lm = _save(_t5gemma(), tmp_path, "$A </s>")
        long, short = lm.trace([LONG, SHORT], targets=["a dog ran on the mat", "big"])
        half, local, n_layers = 3, [0], 2
    for trace in (long, short):
        real = trace.src_real
        n = len(real)
        d = np.arange(n)[:, None] - np.arange(n)[None, :]
        keys = np.broadcast_to(real[None, :], (n, n))
        assert trace.masks_differ("enc_self")
        for layer in range(n_layers):
            want = keys & (np.abs(d) <= half) if layer in local else keys
            assert np.array_equal(trace.mask("enc_self", layer), want), (arch, layer)
            assert np.array_equal(_applied(trace, "enc_self", layer), trace.mask("enc_self", layer)), layer
        assert trace.problems() == [] and not trace.meta["warnings"]
    if arch == "t5gemma":
        n = long.mask("dec_self").shape[-1]
        real = long.tgt_real[None, :]
        assert np.array_equal(long.mask("dec_self", 0), _window(n, 3) & real)
        assert np.array_equal(long.mask("dec_self", 1), _causal(n) & real)


def _gpt_oss(tmp_path):
    torch.manual_seed(0)
    config = transformers.GptOssConfig(
        **COMMON, head_dim=4, sliding_window=3, num_local_experts=2, num_experts_per_tok=1,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    model = transformers.GptOssForCausalLM(config)
    return model, _save(model, tmp_path)


def _reference_sinks(model, ids: torch.Tensor, real: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's (B, head, q) softmax share of the sink, from its module's ``sinks`` and its scores: the
    eager function the model runs, wrapped to redo the softmax over the masked scores and the sink logit."""
    from transformers.models.gpt_oss import modeling_gpt_oss as m

    shares, original = [], m.eager_attention_forward

    def wrapped(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
        scores = query @ m.repeat_kv(key, module.num_key_value_groups).transpose(2, 3) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        sink = module.sinks.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        shares.append(torch.cat([scores, sink], -1).softmax(-1)[..., -1])
        return original(module, query, key, value, attention_mask, scaling, dropout, **kw)

    m.eager_attention_forward = wrapped
    try:
        with torch.no_grad():
            model.config._attn_implementation = "eager"
            model(input_ids=ids, attention_mask=real.long(), use_cache=False)
    finally:
        m.eager_attention_forward = original
    return shares


def test_a_learned_sink_takes_the_rest_of_each_row(tmp_path):
    """GPT-OSS softmaxes each head's learned ``sinks`` logit with the scores and returns the weights without
    it: a correct model's trace said its rows do not sum to 1. The sink's weight is in the trace as a learned
    key "<sink>" (1 minus the row's sum, equal to the softmax's share of the sink), in a padded batch too."""
    model, lm = _gpt_oss(tmp_path)
    traces = lm.trace([LONG, SHORT])
    ids = torch.tensor(np.stack([t.tgt_ids for t in traces]))
    real = torch.tensor(np.stack([t.tgt_real for t in traces]))
    shares = torch.stack(_reference_sinks(model, ids, real), dim=1)  # (B, layer, head, q)
    for i, trace in enumerate(traces):
        assert trace.problems() == [] and not trace.meta["warnings"], trace.problems()
        labels, weights = trace.learned("dec_self")
        assert labels == ("<sink>",) and trace.meta["learned_keys"] == {"dec_self": ["<sink>"]}
        probs = trace.probs("dec_self")
        assert weights.shape == (*probs.shape[:3], 1)
        np.testing.assert_allclose(probs.sum(-1) + weights[..., 0], 1.0, atol=1e-6)
        np.testing.assert_allclose(weights[..., 0], shares[i].numpy(), atol=1e-5)
        assert (weights > 0.05).all()  # (a real share in every row: the sinks are not ~0)
        back = AttentionTrace.load(trace.save(tmp_path / f"t{i}.npz"))
        assert back.learned("dec_self")[0] == ("<sink>",) and back.problems() == []
    assert traces[1].mask("dec_self", 0)[5:].sum() == 0  # padding queries past the window see no key


def test_a_sink_share_that_cannot_be_read_from_the_forward_says_how_it_was_obtained(tmp_path, monkeypatch):
    """Where the model's own softmax cannot be read (no captured record with the sink's column), the weight is
    still 1 minus the row's sum, and a warning says so."""
    _, lm = _gpt_oss(tmp_path)
    monkeypatch.setattr(hf, "_sink_columns", lambda layers, records: None, raising=False)
    (trace,) = lm.trace([LONG])
    assert trace.learned("dec_self")[0] == ("<sink>",) and trace.problems() == []
    (warning,) = trace.meta["warnings"]
    assert "1 minus its row's sum" in warning and "could not be read" in warning


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_a_text_with_no_tokens_is_refused_in_one_sentence(tmp_path, arch):
    """A text the folder's tokenizer turns into no tokens (here a normalizer drops digits): traced alone, a
    decoder raised torch's "cannot reshape a tensor of 0 elements"; in a batch it came back as a trace of PAD
    only, and an encoder whose template adds [CLS] and [SEP] traced those two alone, with no warning."""
    torch.manual_seed(0)
    t = transformers
    if arch == "gpt2":
        model = t.GPT2LMHeadModel(t.GPT2Config(**SMALL, n_embd=16, n_layer=2, n_head=4, n_positions=32,
                                               bos_token_id=1, eos_token_id=2))  # fmt: skip
        template, special = None, SPECIAL
    else:
        model = t.BertModel(t.BertConfig(**SMALL, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=32, max_position_embeddings=32))  # fmt: skip
        template, special = "[CLS] $A [SEP]", dict(cls_token="[CLS]", sep_token="[SEP]")
    model.eval().save_pretrained(tmp_path)
    tok = _tokenizer(template, **special)
    tok.backend_tokenizer.normalizer = normalizers.Replace(Regex("[0-9]"), "")
    tok.save_pretrained(tmp_path)
    lm = registry.load(str(tmp_path))
    assert lm.trace([LONG])  # a text with tokens still traces
    for texts in (["2024"], [LONG, "2024"]):
        with pytest.raises(InputError) as err:
            lm.trace(texts)
        message = str(err.value)
        assert "'2024'" in message and "no tokens" in message and message.count(". ") == 0, message
