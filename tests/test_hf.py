"""Hugging Face models from local folders (attnscope.core.families.hf): traces equal the model's own output_attentions.

Tiny randomly initialised BERT, GPT-2, BART, T5 and Marian models are built from configs here and
saved with a tiny WordLevel tokenizer into tmp_path; nothing is downloaded.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers, processors  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from attnscope.core.errors import ModelLoadError  # noqa: E402
from attnscope.core.families.hf import HFModel, load_hf  # noqa: E402
from attnscope.core.traces.trace import AttentionTrace  # noqa: E402
from attnscope.models import registry  # noqa: E402

WORDS = "the cat sat on a mat dog ran hello world is big small".split()
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "[CLS]", "[SEP]"]
VOCAB = {w: i for i, w in enumerate(SPECIALS + WORDS)}
V = len(VOCAB)
TEXTS = ["the cat sat on a mat", "hello world"]  # different lengths: a padded batch
TARGETS = ["a dog ran", "big"]
SMALL = dict(vocab_size=V, pad_token_id=0)
SEQ2SEQ = dict(
    SMALL,
    d_model=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=32,
    eos_token_id=2,
)


def _tokenizer(template: str | None, **special) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if template:
        names = [t for t in template.split() if t != "$A"]
        tok.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[(t, VOCAB[t]) for t in names]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", **special)


def _specs():
    t = transformers
    seq2seq_tok = dict(bos_token="<s>", eos_token="</s>")
    return {
        "bert": (
            t.BertModel,
            t.BertConfig(
                **SMALL, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
                max_position_embeddings=32,
            ),
            _tokenizer("[CLS] $A [SEP]", cls_token="[CLS]", sep_token="[SEP]"),
        ),
        "bert_cls": (
            t.BertForSequenceClassification,
            t.BertConfig(
                **SMALL, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
                max_position_embeddings=32, num_labels=3, id2label={0: "neg", 1: "neutral", 2: "pos"},
                label2id={"neg": 0, "neutral": 1, "pos": 2},
            ),
            _tokenizer("[CLS] $A [SEP]", cls_token="[CLS]", sep_token="[SEP]"),
        ),
        "gpt2": (
            t.GPT2LMHeadModel,
            t.GPT2Config(**SMALL, n_embd=16, n_layer=2, n_head=4, n_positions=32, bos_token_id=1, eos_token_id=2),
            _tokenizer(None, **seq2seq_tok),
        ),
        "llama": (  # grouped-query attention: 4 query heads share 2 key/value heads
            t.LlamaForCausalLM,
            t.LlamaConfig(**SMALL, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=32, bos_token_id=1, eos_token_id=2),
            _tokenizer(None, **seq2seq_tok),
        ),
        "bart": (
            t.BartForConditionalGeneration,
            t.BartConfig(**SEQ2SEQ, bos_token_id=1, decoder_start_token_id=2, forced_eos_token_id=2),
            _tokenizer("<s> $A </s>", **seq2seq_tok),
        ),
        "t5": (
            t.T5ForConditionalGeneration,
            t.T5Config(
                **SMALL, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=4,
                eos_token_id=2, decoder_start_token_id=0,
            ),
            _tokenizer("$A </s>", **seq2seq_tok),
        ),
        "marian": (
            t.MarianMTModel,
            t.MarianConfig(**SEQ2SEQ, decoder_start_token_id=0, forced_eos_token_id=2),
            _tokenizer("$A </s>", **seq2seq_tok),
        ),
    }  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for name, (cls, cfg, tok) in _specs().items():
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(name)
        cls(cfg).eval().save_pretrained(folder)
        tok.save_pretrained(folder)
        out[name] = folder
    return out


@pytest.fixture(scope="module")
def loaded(folders):
    return {name: registry.load(str(folder)) for name, folder in folders.items()}


def _stack(attentions, i):
    return torch.stack(attentions, dim=1)[i].numpy()  # (layer, head, q, k)


def _check_mask_is_used(trace, kind, atol=1e-5):
    probs, mask = trace.probs(kind), trace.mask(kind)
    assert probs.shape[-2:] == mask.shape
    assert (probs[:, :, ~mask] == 0).all(), f"{kind}: attention on masked keys"
    rows = mask.any(-1)
    np.testing.assert_allclose(probs.sum(-1)[:, :, rows], 1.0, atol=atol)


def _key_mask(real_keys, n_queries):
    return np.broadcast_to(np.asarray(real_keys, bool)[None, :], (n_queries, len(real_keys)))


@pytest.mark.parametrize("name", ["bert", "bert_cls"])
def test_encoder_trace_equals_output_attentions(loaded, name):
    lm = loaded[name]
    assert isinstance(lm, HFModel) and lm.cfg.arch == "encoder" and not lm.has_decoder
    traces = lm.trace(TEXTS)
    enc = lm.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = lm.model(**enc, output_attentions=True)
    for i, t in enumerate(traces):
        assert t.kinds == ("enc_self",)
        np.testing.assert_array_equal(t.src_ids, enc["input_ids"][i].numpy())
        assert t.src_tokens == tuple(lm.tokenizer.convert_ids_to_tokens(enc["input_ids"][i]))
        np.testing.assert_array_equal(t.probs("enc_self"), _stack(ref.attentions, i))
        n = len(t.src_tokens)
        np.testing.assert_array_equal(t.mask("enc_self"), _key_mask(enc["attention_mask"][i].bool(), n))
        _check_mask_is_used(t, "enc_self")
        assert t.enc_self_scores is None and t.meta["has_scores"] is False
    assert traces[1].src_tokens[-1] == "<pad>"  # PAD stays visible in the padded batch
    assert traces[0].src_tokens[0] == "[CLS]" and "[SEP]" in traces[0].src_tokens
    assert lm.cfg.n_classes == (3 if name == "bert_cls" else 0) and lm.cfg.pos_encoding == "learned"
    assert lm.src_tok.itos[:2] == ["<pad>", "<s>"] and len(lm.src_tok) == V
    if name == "bert_cls":
        assert lm.labels == ["neg", "neutral", "pos"]
        probs = ref.logits.softmax(-1)
        assert traces[0].output_text == lm.labels[int(probs[0].argmax())]
        np.testing.assert_allclose(traces[0].out_probs, probs[0].numpy(), atol=1e-6)


def test_decoder_only_trace(loaded):
    lm = loaded["gpt2"]
    assert lm.cfg.arch == "decoder" and lm.has_decoder and not lm.has_encoder
    traces = lm.trace(TEXTS)
    enc = lm.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = lm.model(**enc, output_attentions=True, use_cache=False)
    for i, t in enumerate(traces):
        assert t.kinds == ("dec_self",) and t.src_tokens == ()
        q, k = t.axes("dec_self")
        assert q == k == t.tgt_tokens == tuple(lm.tokenizer.convert_ids_to_tokens(enc["input_ids"][i]))
        np.testing.assert_array_equal(t.probs("dec_self"), _stack(ref.attentions, i))
        real = enc["attention_mask"][i].bool().numpy()
        n = len(real)
        expected = np.tril(np.ones((n, n), bool)) & real[None, :]
        np.testing.assert_array_equal(t.mask("dec_self"), expected)
        _check_mask_is_used(t, "dec_self")
        assert t.meta["prompt_len"] == int(real.sum())
        assert t.n_layers == 2 and t.n_heads == 4
        nxt = ref.logits[i, int(real.sum()) - 1].argmax().item()
        assert t.output_text == lm.tokenizer.decode([nxt])
    # a target continues the prompt (teacher forcing), still in dec_self
    (t,) = lm.trace(["the cat"], ["sat on"])
    assert t.tgt_tokens == ("the", "cat", "sat", "on") and t.meta["teacher_forced"]


@pytest.mark.parametrize("name", ["bart", "t5", "marian"])
def test_seq2seq_teacher_forced_trace_equals_output_attentions(loaded, name):
    lm = loaded[name]
    assert lm.cfg.arch == "seq2seq" and lm.cfg.n_enc_layers == lm.cfg.n_dec_layers == 2
    assert lm.cfg.pos_encoding == {"bart": "learned", "t5": "relative", "marian": "sinusoidal"}[name]
    traces = lm.trace(TEXTS, TARGETS)
    enc = lm.tokenizer(TEXTS, padding=True, return_tensors="pt")
    labels = lm.tokenizer(text_target=TARGETS, padding=True, return_tensors="pt")
    start = lm.model.config.decoder_start_token_id
    lab_len = labels["attention_mask"].sum(-1)
    dec = torch.full_like(labels["input_ids"], lm.cfg.pad_id)
    dec_real = torch.zeros_like(labels["input_ids"])
    for i, n in enumerate(lab_len.tolist()):  # shift right: start + labels[:-1]
        dec[i, 0], dec[i, 1:n] = start, labels["input_ids"][i, : n - 1]
        dec_real[i, :n] = 1
    with torch.no_grad():
        ref = lm.model(
            **enc,
            decoder_input_ids=dec,
            decoder_attention_mask=dec_real,
            output_attentions=True,
            use_cache=False,
        )
    for i, t in enumerate(traces):
        assert t.kinds == ("enc_self", "dec_self", "cross")
        np.testing.assert_array_equal(t.src_ids, enc["input_ids"][i].numpy())
        np.testing.assert_array_equal(t.tgt_ids, dec[i].numpy())
        assert t.tgt_tokens[0] == lm.tokenizer.convert_ids_to_tokens(start)
        np.testing.assert_array_equal(t.probs("enc_self"), _stack(ref.encoder_attentions, i))
        np.testing.assert_array_equal(t.probs("dec_self"), _stack(ref.decoder_attentions, i))
        np.testing.assert_array_equal(t.probs("cross"), _stack(ref.cross_attentions, i))
        src_real, tgt_real = enc["attention_mask"][i].bool().numpy(), dec_real[i].bool().numpy()
        s, n = len(src_real), len(tgt_real)
        np.testing.assert_array_equal(t.mask("enc_self"), _key_mask(src_real, s))
        np.testing.assert_array_equal(t.mask("dec_self"), np.tril(np.ones((n, n), bool)) & tgt_real[None, :])
        np.testing.assert_array_equal(t.mask("cross"), _key_mask(src_real, n))
        for kind in t.kinds:
            _check_mask_is_used(t, kind)
            q, k = t.axes(kind)
            assert t.probs(kind).shape[-2:] == (len(q), len(k))
        top = ref.logits[i].argmax(-1)
        assert t.out_tokens == tuple(lm.tokenizer.convert_ids_to_tokens(top))


@pytest.mark.parametrize("name", ["bart", "marian"])
def test_seq2seq_generates_without_target(loaded, name):
    lm = loaded[name]
    traces = lm.trace(TEXTS[:1])
    (t,) = traces
    enc = lm.tokenizer(TEXTS[:1], return_tensors="pt")
    gen = lm.model.generate(**enc, max_new_tokens=lm.max_new_tokens, do_sample=False, num_beams=1)[0].tolist()
    new = gen[1:]
    if lm.cfg.eos_id in new:
        new = new[: new.index(lm.cfg.eos_id) + 1]
    assert list(t.tgt_ids) == [gen[0]] + new[:-1]  # decoder start + every generated token but the last
    assert not t.meta["teacher_forced"] and len(t.tgt_ids) <= lm.max_new_tokens
    dec = torch.tensor([list(t.tgt_ids)])
    with torch.no_grad():
        ref = lm.model(**enc, decoder_input_ids=dec, output_attentions=True, use_cache=False)
    np.testing.assert_array_equal(t.probs("cross"), _stack(ref.cross_attentions, 0))
    np.testing.assert_array_equal(t.probs("dec_self"), _stack(ref.decoder_attentions, 0))
    assert lm.predict(TEXTS[:1]) == [lm.tokenizer.decode(new, skip_special_tokens=True)]


def test_trace_roundtrip_and_cli(folders, tmp_path, capsys):
    from attnscope.cli import main
    from attnscope.core.traces.trace import AttentionTrace

    out = tmp_path / "t.npz"
    assert main(["trace", "--model", str(folders["gpt2"]), "the cat sat", "--out", str(out)]) == 0
    t = AttentionTrace.load(out)
    assert t.kinds == ("dec_self",) and t.src_tokens == () and t.tgt_tokens == ("the", "cat", "sat")
    assert t.axes("dec_self") == (t.tgt_tokens, t.tgt_tokens)
    out2 = tmp_path / "t2.json"
    assert (
        main(["trace", "--model", str(folders["t5"]), "hello world", "--target", "big", "--out", str(out2)])
        == 0
    )
    assert AttentionTrace.load(out2).kinds == ("enc_self", "dec_self", "cross")
    assert "wrote" in capsys.readouterr().out


def test_routing_and_options(folders, tmp_path):
    assert registry.model_kind(str(folders["bert"])) == "hf"
    assert registry.model_kind(str(tmp_path)) == "core"
    lm = load_hf(folders["gpt2"], dtype="bfloat16")
    assert os.environ.get("HF_HUB_OFFLINE")  # set by load_hf unless the environment chose already
    assert next(lm.model.parameters()).dtype == torch.bfloat16 and lm.cfg.dtype == "bfloat16"
    (t,) = lm.trace(["the cat"])
    assert t.probs("dec_self").dtype == np.float32
    _check_mask_is_used(t, "dec_self", atol=1e-2)  # bfloat16 keeps 8 bits of mantissa
    with pytest.raises(ModelLoadError, match="dtype"):
        load_hf(folders["gpt2"], dtype="float8")
    try:
        import accelerate  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(ModelLoadError, match="accelerate"):
            load_hf(folders["gpt2"], device_map="auto")


def test_refuses_what_hf_models_cannot_do(loaded, monkeypatch):
    from attnscope.core.errors import InputError
    from attnscope.core.transformer.attention import Intervention

    lm = loaded["bert"]
    with pytest.raises(InputError, match="core models only"):
        lm.trace(["the cat"], interv=Intervention(neg_inf_fill=True))
    with pytest.raises(InputError, match="no decoder"):
        lm.trace(["the cat"], ["a dog"])
    with pytest.raises(InputError, match="at most 32"):
        lm.trace([" ".join(["cat"] * 40)])
    (t,) = lm.trace([" ".join(["cat"] * 40)], truncate=True)
    assert len(t.src_tokens) == 32 and t.meta["warnings"]
    monkeypatch.setattr(
        "attnscope.core.families.native.MAX_TRACE_MB", 0
    )  # the runner's memory budget applies here too
    with pytest.raises(InputError, match="MB of attention maps"):
        loaded["t5"].trace(["the cat"])


# -- what moves: ||f_h(x_j)|| = ||(x_j W_V,h + b_V,h) W_O,h||, from the weights of each family ---------------
def _head_norms(v: torch.Tensor, w_o: torch.Tensor, heads: int) -> torch.Tensor:
    """v (B, L, H*dh) the values of every head, w_o (D, H*dh) F.linear's weight -> (B, H, L)."""
    b, n, c = v.shape
    dh = c // heads
    f = torch.einsum("blhe,dhe->bhld", v.view(b, n, heads, dh), w_o.view(w_o.shape[0], heads, dh))
    return f.norm(dim=-1)


def _reference_norms(lm, src, src_real, dec, dec_real) -> dict[str, list[torch.Tensor]]:
    """kind -> per layer (B, H, key) norms, from each family's own modules and hidden states."""
    m, h = lm.model, lm.cfg.n_heads
    if lm.cfg.model_type == "bert":
        bert = getattr(m, "bert", m)
        hs = bert(input_ids=src, attention_mask=src_real, output_hidden_states=True).hidden_states
        return {"enc_self": [_head_norms(lay.attention.self.value(hs[i]), lay.attention.output.dense.weight, h)
                             for i, lay in enumerate(bert.encoder.layer)]}  # fmt: skip
    if lm.cfg.model_type == "llama":  # pre-RMSNorm; head h reads key/value head h // (H / kv_heads)
        hs = m.model(input_ids=dec, attention_mask=dec_real, output_hidden_states=True).hidden_states
        out = []
        for i, lay in enumerate(m.model.layers):
            v = lay.self_attn.v_proj(lay.input_layernorm(hs[i]))  # (B, L, kv * dh)
            b, n, c = v.shape
            kv = m.config.num_key_value_heads
            v = v.view(b, n, kv, c // kv).repeat_interleave(h // kv, dim=2).reshape(b, n, -1)
            out.append(_head_norms(v, lay.self_attn.o_proj.weight, h))
        return {"dec_self": out}
    if lm.cfg.model_type == "gpt2":
        hs = m.transformer(input_ids=dec, attention_mask=dec_real, output_hidden_states=True).hidden_states
        out = []
        for i, blk in enumerate(m.transformer.h):
            v = blk.attn.c_attn(blk.ln_1(hs[i])).split(m.config.n_embd, dim=-1)[2]
            out.append(_head_norms(v, blk.attn.c_proj.weight.t(), h))  # Conv1D: x @ W
        return {"dec_self": out}
    o = m(input_ids=src, attention_mask=src_real, decoder_input_ids=dec, decoder_attention_mask=dec_real,
          output_hidden_states=True, use_cache=False)  # fmt: skip
    enc_hs, dec_hs, memory = o.encoder_hidden_states, o.decoder_hidden_states, o.encoder_last_hidden_state
    ref: dict[str, list[torch.Tensor]] = {"enc_self": [], "dec_self": [], "cross": []}
    if lm.cfg.model_type == "t5":
        for i, blk in enumerate(m.encoder.block):
            sa = blk.layer[0]
            ref["enc_self"].append(
                _head_norms(sa.SelfAttention.v(sa.layer_norm(enc_hs[i])), sa.SelfAttention.o.weight, h)
            )
        for i, blk in enumerate(m.decoder.block):
            sa, ca = blk.layer[0], blk.layer[1]
            ref["dec_self"].append(
                _head_norms(sa.SelfAttention.v(sa.layer_norm(dec_hs[i])), sa.SelfAttention.o.weight, h)
            )
            ref["cross"].append(_head_norms(ca.EncDecAttention.v(memory), ca.EncDecAttention.o.weight, h))
        return ref
    model = m.model  # BART, Marian: post-LN, every attention reads its layer's input
    for i, lay in enumerate(model.encoder.layers):
        ref["enc_self"].append(_head_norms(lay.self_attn.v_proj(enc_hs[i]), lay.self_attn.out_proj.weight, h))
    for i, lay in enumerate(model.decoder.layers):
        ref["dec_self"].append(_head_norms(lay.self_attn.v_proj(dec_hs[i]), lay.self_attn.out_proj.weight, h))
        ref["cross"].append(_head_norms(lay.encoder_attn.v_proj(memory), lay.encoder_attn.out_proj.weight, h))
    return ref


@pytest.mark.parametrize("name", ["bert", "bert_cls", "gpt2", "llama", "bart", "t5", "marian"])
def test_value_norms_equal_each_familys_own_weights(loaded, name):
    """Every kind of every family carries ||f_h(x_j)|| with its output projection, equal to the norms
    computed from the family's own value and output projections on the same padded batch."""
    lm = loaded[name]
    traces = lm.trace(TEXTS, TARGETS) if lm.cfg.arch == "seq2seq" else lm.trace(TEXTS)

    def batch(field):
        rows = [getattr(t, field) for t in traces]
        return None if rows[0] is None else torch.as_tensor(np.stack(rows)).long()

    src, src_real, dec, dec_real = batch("src_ids"), batch("src_real"), batch("tgt_ids"), batch("tgt_real")
    with torch.no_grad():
        ref = _reference_norms(lm, src, src_real, dec, dec_real)
    for i, t in enumerate(traces):
        assert set(t.kinds) == set(ref)
        for kind, layers in ref.items():
            assert t.value_norms_scope(kind) == "with the output projection"
            want = torch.stack([layer[i] for layer in layers]).numpy()  # (layer, head, key)
            np.testing.assert_allclose(t.value_norms(kind), want, rtol=1e-4, atol=1e-5)
            moves = t.moves(kind)  # weights times the norms
            np.testing.assert_allclose(moves, t.probs(kind) * want[:, :, None, :], rtol=1e-4, atol=1e-6)
    # padding: the PAD keys of the shorter text carry norms too (the weights on them are 0)
    assert (
        traces[1].value_norms(traces[1].kinds[0]).shape[-1]
        == traces[0].value_norms(traces[0].kinds[0]).shape[-1]
    )


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "bart", "t5"])
def test_decomposition_rebuilds_each_attention_output(loaded, name):
    """sum_h sum_j alpha_ij f_h(x_j) + b_O equals the output projection's output, for every call of a
    padded batch (the records the traces' norms come from)."""
    from transformers.pytorch_utils import Conv1D

    from attnscope.core.families.capture import capture_attention

    lm = loaded[name]
    enc = lm.tokenizer(TEXTS, padding=True, return_tensors="pt")
    kw = dict(enc)
    if lm.cfg.arch == "seq2seq":
        kw.update(
            decoder_input_ids=enc["input_ids"][:, :3], decoder_attention_mask=enc["attention_mask"][:, :3]
        )
    outs: list[torch.Tensor] = []
    hooks = [mod.register_forward_hook(lambda _m, _a, o: outs.append(o.detach()))
             for mod in lm.model.modules() if isinstance(mod, (torch.nn.Linear, Conv1D))]  # fmt: skip
    try:
        with torch.no_grad(), capture_attention(lm.model) as cap:
            lm.model(**kw, use_cache=False) if lm.cfg.arch != "encoder" else lm.model(**kw)
    finally:
        for hk in hooks:
            hk.remove()
    assert len(cap.records) == {"encoder": 2, "decoder": 2, "seq2seq": 6}[lm.cfg.arch]
    for rec in cap.records:
        hv = rec.values
        assert hv is not None and hv.w_o is not None
        want = torch.einsum("bhqk,bhkd->bqd", rec.probs, hv.vectors())
        want = want + hv.b_o if hv.b_o is not None else want
        assert any(o.shape == want.shape and torch.allclose(o, want, atol=1e-5) for o in outs), rec.name


@pytest.mark.parametrize("name", ["bert", "t5", "gpt2", "bart"])
def test_residual_norms_are_each_layers_input_and_the_norm_rollout_runs(loaded, name):
    """The residual norms are ||x_i|| of the stream each attention output is added to: for self-attention,
    each layer's input (post-LN BERT, pre-LN T5 and GPT-2 alike), found by capture, never assumed; every
    kind carries them, so the norm-based rollout is offered, its rows summing to 1 over the real tokens."""
    from attnscope.core.analysis.analytics import has_norms, trace_rollout

    lm = loaded[name]
    traces = lm.trace(TEXTS, TARGETS) if lm.cfg.arch == "seq2seq" else lm.trace(TEXTS)
    side = "tgt" if lm.cfg.arch == "decoder" else "src"
    ids = torch.as_tensor(np.stack([getattr(t, f"{side}_ids") for t in traces])).long()
    real = torch.as_tensor(np.stack([getattr(t, f"{side}_real") for t in traces])).long()
    with torch.no_grad():
        if lm.cfg.arch == "decoder":
            hs = lm.model.transformer(
                input_ids=ids, attention_mask=real, output_hidden_states=True
            ).hidden_states
        else:
            encoder = lm.model.get_encoder() if lm.cfg.arch == "seq2seq" else lm.model
            hs = encoder(input_ids=ids, attention_mask=real, output_hidden_states=True).hidden_states
    kind = "dec_self" if lm.cfg.arch == "decoder" else "enc_self"
    n_layers = lm.cfg.n_dec_layers if lm.cfg.arch == "decoder" else lm.cfg.n_enc_layers
    for i, t in enumerate(traces):
        want = torch.stack([h[i].norm(dim=-1) for h in hs[:n_layers]]).numpy()
        np.testing.assert_allclose(t.residual_norms(kind), want, rtol=1e-5)
        for k in t.kinds:
            assert t.residual_norms(k).shape == t.probs(k).shape[:1] + t.probs(k).shape[2:3]
        if kind == "enc_self":
            assert has_norms(t, "enc_self")
            roll = trace_rollout(t, valid=t.src_real, method="norm")
            np.testing.assert_allclose(roll[-1].sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_a_sliding_window_is_in_the_saved_mask_of_the_layers_that_use_it(tmp_path, arch):
    """Mistral's sliding window hides keys more than ``sliding_window`` back: the saved mask was plain causal,
    so those keys showed as allowed with weight 0. Where every layer uses the window it is the mask; where
    only some do (Gemma 2 alternates), the trace holds each layer's mask: the window in those layers, causal
    in the others (it held the causal one for all, with a warning)."""
    torch.manual_seed(0)
    t = transformers
    common = dict(**SMALL, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                  sliding_window=3)  # fmt: skip
    if arch == "mistral":
        model = t.MistralForCausalLM(t.MistralConfig(**common))
    else:
        model = t.Gemma2ForCausalLM(t.Gemma2Config(**common, head_dim=4))
    model.eval().save_pretrained(tmp_path)
    _tokenizer(None, bos_token="<s>", eos_token="</s>").save_pretrained(tmp_path)
    (trace,) = registry.load(str(tmp_path)).trace(["the cat sat on a mat dog ran"])
    mask, probs = trace.mask("dec_self"), trace.probs("dec_self")
    n = mask.shape[-1]
    causal = np.tril(np.ones((n, n), bool))
    band = causal & ~np.tril(np.ones((n, n), bool), -3)  # the last 3 keys up to each query
    assert not trace.meta["warnings"]
    if arch == "mistral":
        assert np.array_equal(mask, band) and not trace.masks_differ("dec_self")
        assert (probs[:, :, ~band] == 0).all()
    else:
        assert trace.masks_differ("dec_self")
        assert np.array_equal(trace.mask("dec_self", 0), band) and np.array_equal(mask, band)
        assert np.array_equal(trace.mask("dec_self", 1), causal)
        assert (probs[0][:, ~band] == 0).all() and (probs[1][:, ~band] > 0).any()
        assert trace.problems() == []  # every layer's weights within its own mask
        assert AttentionTrace.load(trace.save(tmp_path / "t.npz")).masks_differ("dec_self")


class _RunsCode:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_hugging_face_folders_that_cannot_be_read_say_why_in_one_sentence(folders, tmp_path):
    """A folder with no tokenizer files was read through an empty tokenizer transformers built (every word
    [UNK], or no token at all); a pickled checkpoint's refusal passed on torch's advice to unpickle it; weights
    that do not fit the config pointed to a report nobody sees; long messages were cut mid-word."""
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(folders["bert"], bare)
    for f in bare.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab")):
            f.unlink()
    with pytest.raises(ModelLoadError, match="has no tokenizer files"):
        registry.load(str(bare))

    evil = tmp_path / "evil"
    shutil.copytree(folders["bert"], evil)
    (evil / "model.safetensors").unlink()
    marker = tmp_path / "pwned.txt"
    torch.save({"embeddings.word_embeddings.weight": _RunsCode(marker)}, evil / "pytorch_model.bin")
    with pytest.raises(ModelLoadError) as refused:
        registry.load(str(evil))
    said = str(refused.value)
    assert "pickle" in said and "never unpickles" in said and "weights_only=False" not in said
    assert not marker.exists()

    grown = tmp_path / "grown"
    shutil.copytree(folders["bert"], grown)
    cfg = (grown / "config.json").read_text()
    (grown / "config.json").write_text(cfg.replace('"intermediate_size": 32', '"intermediate_size": 48'))
    with pytest.raises(ModelLoadError, match="do not fit its config.json"):
        registry.load(str(grown))
