"""Model folders: config.json + model.safetensors + vocabularies + card.md (+ meta.json).

``load(folder)`` rebuilds a model from the folder alone and never unpickles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from attnscope.core.errors import ConfigError, ModelLoadError, TokenizerError
from attnscope.core.transformer.config import TransformerConfig
from attnscope.core.transformer.model import Transformer
from attnscope.core.transformer.tokenizer import Tokenizer

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
SRC_VOCAB = "src_vocab.json"
TGT_VOCAB = "tgt_vocab.json"
CARD = "card.md"
META = "meta.json"  # task, summary, class labels, measured metrics
TORCH_WEIGHTS = ("model.pt", "model.pth")  # read with weights_only when there is no safetensors file


def save(
    folder: str | Path,
    model: Transformer,
    src_tok: Tokenizer,
    tgt_tok: Tokenizer | None = None,
    card: str = "",
    meta: dict[str, Any] | None = None,
) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.cfg.to_json(folder / CONFIG)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.cfg.share_vocab and not model.cfg.is_encoder_only:
        # Tied tensors are stored once; load() re-ties them.
        state = {k: v for k, v in state.items() if k not in ("tgt_embed.tok.weight", "generator.weight")}
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt", "producer": "attnscope"})
    src_tok.save(folder / SRC_VOCAB)
    if tgt_tok is not None:
        tgt_tok.save(folder / TGT_VOCAB)
    if card:
        (folder / CARD).write_text(card)
    if meta is not None:
        (folder / META).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    return folder


def read_meta(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / META
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def load_weights(
    folder: str | Path, cfg: TransformerConfig, device: str = "cpu", weights: str | Path | None = None
) -> Transformer:
    """Build a Transformer from cfg and fill it strictly from the folder's weights.

    weights: a file to read instead of ``folder/model.safetensors``; ``.pt``/``.pth`` files go
    through ``load_torch_state`` (weights_only, never code). Without it, a folder that has no
    model.safetensors but a model.pt / model.pth is read the same safe way.
    """
    path = Path(weights) if weights is not None else Path(folder) / WEIGHTS
    if weights is None and not path.is_file():
        path = next((Path(folder) / n for n in TORCH_WEIGHTS if (Path(folder) / n).is_file()), path)
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no {WEIGHTS}")
    if path.suffix in (".pt", ".pth"):
        state = load_torch_state(path)
    else:
        try:
            state = load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(
                f"cannot read {path.name}: {_one_line(exc)} (truncated or not a safetensors file?)"
            ) from exc
    return model_from_state(cfg, state, device, source=path.name)


def model_from_state(
    cfg: TransformerConfig, state: dict[str, torch.Tensor], device: str = "cpu", source: str = WEIGHTS
) -> Transformer:
    """A Transformer built from cfg and filled from ``state``; every name and shape must match. The names
    and shapes are checked on a model built on the meta device (no memory): a config.json whose sizes
    disagree with the weights is refused before its model is allocated."""
    with torch.device("meta"):
        expected = Transformer(cfg).state_dict()
    tied = (
        {"tgt_embed.tok.weight", "generator.weight"} if cfg.share_vocab and not cfg.is_encoder_only else set()
    )
    missing = sorted(set(expected) - set(state) - tied)
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ModelLoadError(
            f"weights in {source} do not match config.json: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ModelLoadError(
                f"weights do not match config.json: {name} has shape {tuple(tensor.shape)}, "
                f"config needs {tuple(expected[name].shape)}"
            )
    model = Transformer(cfg)
    model.load_state_dict(state, strict=False)
    return model.to(device).eval()


def load_parts(
    folder: str | Path, device: str = "cpu", weights: str | Path | None = None
) -> tuple[TransformerConfig, Transformer, Tokenizer, Tokenizer | None, str, dict[str, Any]]:
    """(config, model in eval mode, source tokenizer, target tokenizer or None, card, meta).

    weights: optional weights file to use instead of the folder's (see load_weights).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"model folder {folder} does not exist")
    if not (folder / CONFIG).is_file():
        raise ModelLoadError(f"{folder} has no {CONFIG}")
    try:
        cfg = TransformerConfig.from_json(folder / CONFIG)
        src_tok = Tokenizer.load(folder / SRC_VOCAB)
        tgt_tok = Tokenizer.load(folder / TGT_VOCAB) if (folder / TGT_VOCAB).exists() else None
    except (ConfigError, TokenizerError) as exc:
        raise ModelLoadError(str(exc)) from exc
    if len(src_tok) != cfg.src_vocab_size:
        raise ModelLoadError(f"{SRC_VOCAB} has {len(src_tok)} tokens, config says {cfg.src_vocab_size}")
    if not cfg.is_encoder_only:
        if tgt_tok is None:
            tgt_tok = src_tok if cfg.share_vocab else None
        if tgt_tok is None or len(tgt_tok) != cfg.tgt_vocab_size:
            raise ModelLoadError(f"{TGT_VOCAB} missing or not of size {cfg.tgt_vocab_size}")
    model = load_weights(folder, cfg, device, weights)
    card = (folder / CARD).read_text(encoding="utf-8") if (folder / CARD).exists() else ""
    return cfg, model, src_tok, tgt_tok, card, read_meta(folder)


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (CLI errors are one line)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def load_torch_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Load a .pt/.pth state dict safely (weights_only=True): a pickle that would run code is refused.

    Accepts ``{name: tensor}`` or the common wrappers ``{"state_dict": {...}}`` / ``{"model": {...}}``.
    """
    import pickle

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"checkpoint {path} does not exist")
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        detail = next((ln.strip() for ln in text.splitlines() if "GLOBAL" in ln or "Unsupported" in ln), "")
        raise ModelLoadError(
            f"refused to load {path.name}: it holds Python objects that would run code when unpickled, "
            f"and attnscope loads only plain tensor state dicts (weights_only)"
            + (f" [{detail}]" if detail else "")
        ) from exc
    except Exception as exc:  # torch raises RuntimeError / EOFError / OSError variants
        raise ModelLoadError(
            f"cannot read {path.name} as a torch checkpoint (truncated or not a .pt file?): {_one_line(exc)[:200]}"
        ) from exc
    if isinstance(obj, dict) and len(obj) == 1 and next(iter(obj)) in ("state_dict", "model"):
        obj = next(iter(obj.values()))
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelLoadError(f"{path.name} is not a state dict of tensors")
    return obj
