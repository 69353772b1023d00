"""One frozen configuration for every model core can build.

The defaults are the paper's ("Attention Is All You Need", base model); the
extra switches (learned positions, GELU, pre-LN, embedding LayerNorm, token
types) exist so that BERT-family weights can be loaded into the same code.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from attnscope.core.errors import ConfigError


@dataclass(frozen=True)
class TransformerConfig:
    name: str = "custom"  # human-readable name of the configuration
    src_vocab_size: int = 37000  # source vocabulary (shared with target if share_vocab)
    tgt_vocab_size: int = 37000  # target vocabulary (ignored for encoder-only models)
    share_vocab: bool = True  # one embedding matrix for source, target and output projection
    d_model: int = 512  # width of every residual stream
    n_heads: int = 8  # attention heads per layer; d_model must divide evenly
    d_ff: int = 2048  # hidden width of the position-wise feed-forward network
    n_enc_layers: int = 6  # encoder layers
    n_dec_layers: int = 6  # decoder layers; 0 = encoder-only model
    dropout: float = 0.1  # dropout on sub-layer outputs, embeddings and attention probs
    max_len: int = 512  # longest sequence positional encodings are built for
    pos_encoding: Literal["sinusoidal", "learned"] = "sinusoidal"  # paper = sinusoidal
    activation: Literal["relu", "gelu"] = "relu"  # feed-forward non-linearity (gelu = erf form)
    norm: Literal["post", "pre"] = "post"  # post-LN (paper) or pre-LN (Annotated Transformer)
    layer_norm_eps: float = 1e-5  # epsilon of every LayerNorm
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (paper)
    embed_norm: bool = False  # LayerNorm after embeddings + positions (BERT)
    type_vocab_size: int = 0  # token-type (segment) embeddings; 0 = none (BERT uses 2)
    pos_offset: int = 0  # first position id (0 for the paper and BERT)
    n_classes: int = 0  # >0: encoder-only classifier head over pooled output
    pooling: Literal["mean", "first"] = "mean"  # how the classifier pools the encoder output
    pad_id: int = 0  # id of PAD in both vocabularies
    bos_id: int = 1  # id of BOS (decoder start token)
    eos_id: int = 2  # id of EOS

    def __post_init__(self) -> None:
        self.validate()

    # -- checks -------------------------------------------------------------
    def validate(self) -> None:
        """Raise ConfigError with a readable message for impossible values."""
        ints = {
            "d_model": self.d_model,
            "n_heads": self.n_heads,
            "d_ff": self.d_ff,
            "src_vocab_size": self.src_vocab_size,
            "max_len": self.max_len,
        }
        for key, value in ints.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{key} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads != 0:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_enc_layers < 1:
            raise ConfigError(f"n_enc_layers must be at least 1, got {self.n_enc_layers}")
        if self.n_dec_layers < 0:
            raise ConfigError(f"n_dec_layers must be >= 0, got {self.n_dec_layers}")
        if self.n_dec_layers > 0 and self.tgt_vocab_size < 1:
            raise ConfigError("tgt_vocab_size must be positive for a model with a decoder")
        if self.n_dec_layers > 0 and self.n_classes > 0:
            raise ConfigError("n_classes is only for encoder-only models (n_dec_layers = 0)")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.pos_encoding not in ("sinusoidal", "learned"):
            raise ConfigError(f"pos_encoding must be 'sinusoidal' or 'learned', got {self.pos_encoding!r}")
        if self.activation not in ("relu", "gelu"):
            raise ConfigError(f"activation must be 'relu' or 'gelu', got {self.activation!r}")
        if self.norm not in ("post", "pre"):
            raise ConfigError(f"norm must be 'post' or 'pre', got {self.norm!r}")
        if self.pooling not in ("mean", "first"):
            raise ConfigError(f"pooling must be 'mean' or 'first', got {self.pooling!r}")
        if self.share_vocab and self.n_dec_layers > 0 and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError("share_vocab needs src_vocab_size == tgt_vocab_size")

    # -- properties ---------------------------------------------------------
    @property
    def is_encoder_only(self) -> bool:
        return self.n_dec_layers == 0

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    # -- serialisation ------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        if not isinstance(data, dict):
            raise ConfigError("config must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        try:
            return cls(**data)
        except TypeError as exc:  # wrong types that slipped past validate()
            raise ConfigError(str(exc)) from exc

    @classmethod
    def from_json(cls, path: str | Path) -> TransformerConfig:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> TransformerConfig:
        return dataclasses.replace(self, **changes)


def base(vocab_size: int = 37000) -> TransformerConfig:
    """The paper's base model (Table 3): N=6, d_model=512, h=8, d_ff=2048, shared vocab."""
    return TransformerConfig(
        name="base", src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, share_vocab=True
    )


def big(vocab_size: int = 37000) -> TransformerConfig:
    """The paper's big model (Table 3): d_model=1024, h=16, d_ff=4096, dropout 0.3."""
    return TransformerConfig(
        name="big",
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        d_model=1024,
        n_heads=16,
        d_ff=4096,
        dropout=0.3,
    )


def tiny(vocab_size: int = 32, **changes: Any) -> TransformerConfig:
    """A small seeded-test configuration (2 layers, 4 heads, d_model 16)."""
    cfg = TransformerConfig(
        name="tiny",
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        d_model=16,
        n_heads=4,
        d_ff=32,
        n_enc_layers=2,
        n_dec_layers=2,
        dropout=0.0,
        max_len=64,
    )
    return cfg.replace(**changes) if changes else cfg


PRESETS = {"base": base, "big": big, "tiny": tiny}
