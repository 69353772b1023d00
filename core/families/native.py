"""From text to AttentionTrace: tokenise, run the model with capture, package the result.

A ``LoadedModel`` is what the CLI and the dashboard hold: the model in eval
mode with its tokenizers and card. It is shared read-only between sessions.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnscope.core.errors import InputError, TokenizerError
from attnscope.core.families.interface import (
    Family,
    PositionTable,
    Side,
    package_trace,
    pad_rows,
    prediction_fields,
    prepare_targets,
)
from attnscope.core.traces.trace import AttentionTrace
from attnscope.core.transformer import checkpoint
from attnscope.core.transformer.attention import Intervention
from attnscope.core.transformer.config import TransformerConfig
from attnscope.core.transformer.decode import greedy_decode
from attnscope.core.transformer.model import Masks, ModelOutput, Transformer
from attnscope.core.transformer.tokenizer import Tokenizer

# Attention maps a single trace may hold (probs + scores, all kinds); beyond it the runner refuses
# with a message instead of running the machine out of memory. Override: ATTNSCOPE_MAX_TRACE_MB.
MAX_TRACE_MB = int(os.environ.get("ATTNSCOPE_MAX_TRACE_MB", "2048"))
MAX_BATCH = int(os.environ.get("ATTNSCOPE_MAX_BATCH", "64"))


def trace_bytes(
    n_enc_layers: int, n_dec_layers: int, n_heads: int, batch: int, src_len: int, tgt_len: int = 0
) -> int:
    """Bytes of the float32 attention maps (probs and scores) one batched trace holds."""
    per_map = src_len * src_len * n_enc_layers + (tgt_len * tgt_len + tgt_len * src_len) * n_dec_layers
    return batch * n_heads * per_map * 4 * 2


def check_trace_budget(nbytes: int, batch: int) -> None:
    """Raise InputError when a trace would exceed MAX_TRACE_MB or the batch MAX_BATCH."""
    if batch > MAX_BATCH:
        raise InputError(f"{batch} inputs in one batch; the limit is {MAX_BATCH}: split the batch")
    if nbytes > MAX_TRACE_MB * 2**20:
        raise InputError(
            f"these inputs would need {nbytes / 2**20:,.0f} MB of attention maps; the limit is "
            f"{MAX_TRACE_MB:,} MB: use fewer or shorter inputs"
        )


def resolve_device(device: str = "auto") -> str:
    """'auto' -> 'cuda' when available else 'cpu'; 'cuda' without a GPU is an InputError."""
    device = (device or "auto").lower()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("CUDA was requested but no CUDA device is available; use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise InputError(f"unknown device {device!r}; use cpu, cuda or auto")
    return device


@dataclass
class Prepared:
    """Token ids for one text, with warnings about what was changed (truncation)."""

    ids: list[int]
    warnings: list[str] = field(default_factory=list)


@dataclass
class Batch:
    """Padded ids of one batch: src (B, S), decoder input (B, T) or None, and the prepared texts."""

    src: torch.Tensor
    tgt: torch.Tensor | None
    prepared: list[Prepared]
    teacher: bool  # tgt is the given targets (else the model's greedy output)


@dataclass
class LoadedModel:
    name: str
    folder: Path | None
    cfg: TransformerConfig
    model: Transformer
    src_tok: Tokenizer
    tgt_tok: Tokenizer | None
    card: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    family: Family = "core"
    injectable = True  # custom masks and head interventions go into core's forward pass (forward_with)
    thread_safe = True  # the forward pass keeps no state: two threads may run it at once
    masks_from_ids = False  # masks come from real-position vectors (the leak tests can change PAD content)

    # -- facts ------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return "encoder" if self.cfg.is_encoder_only else "seq2seq"

    @property
    def has_decoder(self) -> bool:
        return not self.cfg.is_encoder_only

    def audit_facts(self) -> dict[str, Any]:
        """pad id, ids the leak tests never write (specials and <unk>), vocab sizes, max length."""
        cfg = self.cfg
        return {
            "pad_id": cfg.pad_id,
            "skip_ids": {cfg.pad_id, cfg.bos_id, cfg.eos_id, 3},
            "vocab": (cfg.src_vocab_size, cfg.tgt_vocab_size if self.has_decoder else None),
            "max_len": cfg.max_len,
        }

    def _decoder_tok(self) -> Tokenizer:
        """The decoder's vocabulary (a model with a decoder always has one: checked at load)."""
        if self.tgt_tok is None:
            raise RuntimeError(f"{self.name} has a decoder but no target vocabulary")
        return self.tgt_tok

    def forward_with(self, src, tgt, masks=None, interv=None) -> ModelOutput:
        """Core's forward pass with these masks and head intervention (InjectableModel), no gradients."""
        with torch.no_grad():
            return self.model(src, tgt, masks=masks, interv=interv)

    def position_table(self) -> PositionTable:
        """Core's own table (``src_embed.pos``): sinusoidal or learned."""
        table = self.model.src_embed.pos.table().detach().float().cpu().numpy()
        return PositionTable(table, self.cfg.pos_encoding, "src_embed.pos", self.cfg.pos_offset)

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return self.model.named_parameters()

    def forward_outputs(self, src, tgt, src_real, tgt_real) -> dict[str, torch.Tensor]:
        """Encoder memory and decoder hidden states, masks built from the real-position vectors."""
        from attnscope.core.analysis.bugs import reference_masks

        with torch.no_grad():
            out = self.model(src, tgt, masks=reference_masks(src_real, tgt_real))
        return {"enc": out.memory} if tgt is None else {"enc": out.memory, "dec": out.hidden}

    def trace_continuation(self, sources: list[str], truncate: bool = False) -> list[AttentionTrace]:
        raise InputError("only decoder-only models continue a prompt; use trace() for this model")

    @property
    def max_src_tokens(self) -> int:
        """Longest text (in tokens) the encoder takes: max_len minus the EOS it appends."""
        return self.cfg.max_len - 1

    @property
    def labels(self) -> list[str]:
        return list(self.meta.get("labels", []))

    @property
    def summary(self) -> str:
        if self.meta.get("summary"):
            return str(self.meta["summary"])
        for line in self.card.splitlines():
            if line.strip() and not line.startswith("#"):
                return line.strip()
        return ""

    @property
    def device(self) -> str:
        return str(next(self.model.parameters()).device)

    def to(self, device: str) -> LoadedModel:
        """A copy on another device (the original stays where it is)."""
        import copy

        other = copy.copy(self)
        other.model = copy.deepcopy(self.model).to(device).eval()
        return other

    # -- input --------------------------------------------------------------------
    def prepare(self, text: str, truncate: bool = False) -> Prepared:
        """Validate and tokenise one source text (EOS appended)."""
        if text is None or not text.strip():
            raise InputError("the input text is empty: type some text for the model to read")
        try:
            ids = self.src_tok.encode(text, strict=True)
        except TokenizerError as exc:
            allowed = "".join(t for t in self.src_tok.itos[4:] if len(t) == 1)
            hint = f" (this model reads: {allowed[:80]})" if allowed else ""
            raise InputError(f"unknown characters in the input, {exc}{hint}") from exc
        warnings: list[str] = []
        return Prepared(self._fit(ids, truncate, warnings) + [self.cfg.eos_id], warnings)

    def _fit(self, ids: list[int], truncate: bool, warnings: list[str]) -> list[int]:
        """``ids`` within ``max_src_tokens``: cut with a warning (``truncate``), else an InputError."""
        limit = self.max_src_tokens
        if len(ids) <= limit:
            return ids
        if not truncate:
            raise InputError(f"the input has {len(ids)} tokens; this model takes at most {limit}")
        warnings.append(f"input truncated from {len(ids)} to {limit} tokens (the model's maximum)")
        return ids[:limit]

    def prepare_target(self, text: str, truncate: bool = False) -> Prepared:
        if self.tgt_tok is None:
            raise InputError("this model has no decoder, so it takes no target text")
        if not text.strip():
            raise InputError("the target text is empty: leave it out to let the model generate")
        try:
            ids = self.tgt_tok.encode(text, strict=True)
        except TokenizerError as exc:
            raise InputError(f"unknown tokens in the target: {exc}") from exc
        warnings = []
        limit = self.cfg.max_len - 1
        if len(ids) > limit:
            if not truncate:
                raise InputError(f"the target has {len(ids)} tokens; this model takes at most {limit}")
            warnings.append(f"target truncated from {len(ids)} to {limit} tokens")
            ids = ids[:limit]
        return Prepared(ids, warnings)

    # -- running ---------------------------------------------------------------------
    def _pad(self, rows: list[list[int]]) -> torch.Tensor:
        return pad_rows(rows, self.cfg.pad_id, self.device)[0]

    def batch(self, sources: list[str], targets: list[str] | None = None, truncate: bool = False) -> Batch:
        """The padded ids a trace runs on: sources (EOS appended) and the decoder input, BOS first
        (teacher forcing on ``targets``, else the model's greedy output). The one place a batch is built."""
        if not sources:
            raise InputError("no input text given")
        if len(sources) > MAX_BATCH:
            check_trace_budget(0, len(sources))
        prepared = [self.prepare(s, truncate) for s in sources]
        src_len = max(len(p.ids) for p in prepared)
        teacher = targets is not None
        tp = (
            prepare_targets(self, prepared, targets, truncate)
            if targets is not None and self.has_decoder
            else None
        )
        if tp is not None:  # the decoder input is known: BOS + the longest target
            tgt_guess = 1 + max(len(t.ids) for t in tp)
        else:  # greedy output: as long as the source, a guess (checked again once decoded)
            tgt_guess = src_len if self.has_decoder else 0
        cfg = self.cfg
        check_trace_budget(
            trace_bytes(
                cfg.n_enc_layers,
                cfg.n_dec_layers,
                cfg.n_heads,
                len(sources),
                src_len,
                min(tgt_guess, cfg.max_len),
            ),
            len(sources),
        )
        src = self._pad([p.ids for p in prepared])
        if not self.has_decoder:
            tgt = None
        elif tp is not None:
            tgt = self._pad([[self.cfg.bos_id] + t.ids for t in tp])
        else:
            with torch.no_grad():
                tgt = greedy_decode(self.model, src).ids
            real = trace_bytes(
                cfg.n_enc_layers, cfg.n_dec_layers, cfg.n_heads, len(sources), src_len, tgt.shape[1]
            )
            check_trace_budget(real, len(sources))  # the output's real length, before any map is kept
        return Batch(src, tgt, prepared, teacher)

    def trace(
        self,
        sources: list[str],
        targets: list[str] | None = None,
        truncate: bool = False,
        masks: Masks | None = None,
        interv: Intervention | None = None,
    ) -> list[AttentionTrace]:
        """One AttentionTrace per source text (targets: teacher forcing, else greedy output)."""
        return self.trace_batch(self.batch(sources, targets, truncate), masks, interv)

    @torch.no_grad()
    def trace_batch(
        self, b: Batch, masks: Masks | None = None, interv: Intervention | None = None
    ) -> list[AttentionTrace]:
        """Run one built batch with capture (masks/interv: the mask lab's and ablation's way in)."""
        start = time.perf_counter()
        out = self.model(b.src, b.tgt, return_attn=True, masks=masks, interv=interv)
        if out.hidden.is_cuda:
            torch.cuda.synchronize()
        forward_ms = (time.perf_counter() - start) * 1000
        return [
            self._package(i, b.src, b.tgt, out, forward_ms, b.teacher, p.warnings)
            for i, p in enumerate(b.prepared)
        ]

    def _package(self, i, src, tgt, out, forward_ms, teacher, warnings) -> AttentionTrace:
        pad = self.cfg.pad_id
        maps = {kind: (m.probs, m.scores, out.masks.get(kind)) for kind, m in out.attn.items()}
        fields: dict[str, Any] = {}
        for (
            kind,
            m,
        ) in out.attn.items():  # what attention moves: value norms per key, residual norms per query
            if m.value_norms is not None:
                fields[f"{kind}_value_norms"] = m.value_norms[i].float().cpu().numpy()
            if m.residual_norms is not None:
                fields[f"{kind}_residual_norms"] = m.residual_norms[i].float().cpu().numpy()
        if "enc_self" not in out.attn:
            fields["enc_self_mask"] = out.masks.enc_self[i].cpu().numpy()
        meta = {"forward_ms": round(forward_ms, 3), "teacher_forced": teacher, "warnings": list(warnings)}
        src_side = Side(src, src != pad, self.src_tok.tokens)
        tgt_side = None
        if self.has_decoder:
            tgt_real = tgt != pad
            tgt_real[:, 0] = True  # BOS (some configs share the PAD id)
            tgt_tok = self._decoder_tok()
            tgt_side = Side(tgt, tgt_real, tgt_tok.tokens)
            fields.update(prediction_fields(out.logits[i].float().softmax(-1), tgt_tok.tokens))
            n_real = int(tgt_real[i].sum())
            output_text = tgt_tok.decode(fields["topk_ids"][:n_real, 0])
        elif out.logits is not None:
            probs = out.logits[i].float().softmax(-1).cpu().numpy()
            labels = self.labels or [str(k) for k in range(len(probs))]
            k = int(probs.argmax())
            fields.update(out_tokens=(labels[k],), out_probs=probs)
            meta["labels"] = labels
            output_text = labels[k]
        else:
            mask = src[i] != pad
            emb = self.model.pool(out.hidden[i : i + 1], mask[None])[0].float().cpu().numpy()
            meta["embedding_norm"] = float(np.linalg.norm(emb))
            meta["embedding_head"] = [round(float(v), 6) for v in emb[:8]]
            output_text = f"embedding norm {np.linalg.norm(emb):.4f}"
        return package_trace(
            i,
            model=self.name,
            config_name=self.cfg.name,
            device=str(src.device),
            src=src_side,
            tgt=tgt_side,
            maps=maps,
            output_text=output_text,
            meta=meta,
            **fields,
        )

    @torch.no_grad()
    def predict(self, sources: list[str]) -> list[str]:
        """The model's answers as text (greedy decoding / class label)."""
        prepared = [self.prepare(s) for s in sources]
        src = self._pad([p.ids for p in prepared])
        if self.has_decoder:
            res = greedy_decode(self.model, src)
            return [self._decoder_tok().decode(row) for row in res.out_ids.tolist()]
        return [t.output_text for t in self.trace(sources)]


def load_folder(folder: str | Path, name: str | None = None, device: str = "cpu") -> LoadedModel:
    cfg, model, src_tok, tgt_tok, card, meta = checkpoint.load_parts(folder, resolve_device(device))
    folder = Path(folder)
    return LoadedModel(name or folder.name, folder, cfg, model, src_tok, tgt_tok, card, meta)
