"""Any Hugging Face Transformer from a local folder, traced into the same AttentionTrace as core's models.

``registry.load(path)`` sends a folder whose config.json has a "model_type" here. Three shapes:

- encoder (BERT family): ``enc_self``. Output: the class label for ``*ForSequenceClassification``
  checkpoints, else the mean-pooled last hidden state ("embedding norm ...").
- decoder (GPT-2 family, causal LMs): the model's one self-attention goes in ``dec_self``.
  Choice: ``src_tokens`` is EMPTY and ``tgt_tokens`` holds the whole sequence the model read
  (the prompt, then the target when one is given), so ``trace.axes("dec_self")`` is
  ``(tgt_tokens, tgt_tokens)`` exactly as for seq2seq models, and no kind ever pairs tensors
  with tokens of another sequence. ``meta["prompt_len"]`` says where the prompt ends;
  ``out_tokens`` is the argmax next token at every position; ``output_text`` is the next token
  after the prompt (or, with a target, the model's argmax guesses for the target positions).
  ``predict`` continues the prompt greedily (bounded by ``max_new_tokens``).
- seq2seq (BART, T5, Marian, ...): ``enc_self``, ``dec_self``, ``cross``. Decoder input =
  ``decoder_start_token_id`` + target (HF's shift-right of the labels, so with a target its
  specials come from the tokenizer). Without a target the model generates greedily
  (``num_beams=1``, at most ``max_new_tokens``) and the trace is one teacher-forced forward pass
  over what it generated: decoder start + every generated token but the last.

Masks: inputs are right-padded and the attention_mask passed to the model comes from the true
lengths (T5 and Marian use PAD as decoder start, so PAD ids cannot tell). The trace stores the
same masks in our convention (bool, True = may attend): key padding for enc_self and cross,
causal AND key padding for dec_self, each narrowed to the local attention the config names where the
maps show it was applied (``_windowed``: sliding windows, Llama 4's chunks, an encoder's two-sided
window; per layer where only some layers use it). A learned attention sink (GPT-OSS) is a learned key
``"<sink>"`` (``{kind}_learned``): the weight Hugging Face's returned maps leave out.
Scores: Hugging Face returns post-softmax probabilities only, so ``*_scores`` are None
(``meta["has_scores"] = False``); masks and interventions of core's mask lab are refused.

Safety: only local folders; ``local_files_only=True`` and ``trust_remote_code=False`` always,
``HF_HUB_OFFLINE=1`` is set unless the environment already says otherwise (nothing is ever
downloaded); ``weights_only=True`` for ``pytorch_model.bin`` (safetensors preferred).
Attention runs with ``attn_implementation="eager"`` so the probabilities are the ones used.

Options: ``dtype`` "float32" (default) | "float16" | "bfloat16"; ``device_map`` (e.g. "auto")
is handed to ``from_pretrained`` and needs the ``accelerate`` package (not installed here, so
not tested: a GPU machine is needed to make it useful). Without device_map, ``device`` is used.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnscope.core.errors import InputError, ModelLoadError
from attnscope.core.families.capture import Captured, capture_attention, kind_value_norms
from attnscope.core.families.interface import (
    Family,
    ModelFacts,
    PositionTable,
    Side,
    find_position_table,
    package_trace,
    pad_rows,
    padding_masks,
    prediction_fields,
    prepare_targets,
)
from attnscope.core.families.native import Prepared, check_trace_budget, resolve_device, trace_bytes
from attnscope.core.traces.trace import AttentionTrace
from attnscope.core.transformer.checkpoint import _one_line

ARCHS = ("encoder", "decoder", "seq2seq")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MAX_NEW_TOKENS = 32  # generation bound when no target is given


HFArch = ModelFacts  # the facts of a Hugging Face model (attnscope.core.families.interface.ModelFacts)


def _first(config: Any, *names: str, default: Any = 0) -> Any:
    for n in names:
        value = getattr(config, n, None)
        if value is not None:
            return value
    return default


def detect_arch(config: Any) -> str:
    """encoder | decoder | seq2seq from a transformers config."""
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    archs = list(getattr(config, "architectures", None) or [])
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs) or getattr(config, "is_decoder", False):
        return "decoder"
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    mt = config.model_type
    if mt in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and mt not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "decoder"
    return "encoder"


def _arch_summary(name: str, config: Any, arch: str, tokenizer: Any, dtype: str, n_classes: bool) -> HFArch:
    n_layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    n_dec = _first(config, "decoder_layers", "num_decoder_layers", default=n_layers)
    max_len = _first(config, "max_position_embeddings", "n_positions", default=0)
    if not max_len:  # relative positions (T5): the tokenizer's limit, if it states a sane one
        tok_max = getattr(tokenizer, "model_max_length", 0) or 0
        max_len = tok_max if 0 < tok_max < 100_000 else 512
    pad = _first(config, "pad_token_id", default=None)
    if pad is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = _first(config, "eos_token_id", default=None)
    if isinstance(eos, list):
        eos = eos[0]
    if eos is None:
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else -1
    bos = _first(config, "decoder_start_token_id", "bos_token_id", default=None)
    if bos is None:
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else -1
    vocab = int(_first(config, "vocab_size"))
    if getattr(config, "relative_attention_num_buckets", None):
        pos = "relative"
    elif any(
        getattr(config, a, None) for a in ("rope_theta", "rope_scaling", "rotary_dim", "rope_parameters")
    ):
        pos = "rotary"
    elif config.model_type in ("marian", "fsmt", "m2m_100", "nllb_moe", "pegasus"):
        pos = "sinusoidal"
    else:
        pos = "learned"
    return HFArch(
        name=name,
        model_type=config.model_type,
        arch=arch,
        d_model=int(_first(config, "hidden_size", "d_model", "n_embd")),
        n_heads=int(_first(config, "num_attention_heads", "n_head", "num_heads")),
        n_enc_layers=0 if arch == "decoder" else int(n_layers),
        n_dec_layers={"encoder": 0, "decoder": int(n_layers), "seq2seq": int(n_dec)}[arch],
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        max_len=int(max_len),
        pad_id=int(pad if pad is not None else 0),
        bos_id=int(bos),
        eos_id=int(eos),
        dtype=dtype,
        pos_encoding=pos,
        scale_embeddings=bool(getattr(config, "scale_embedding", False)),
        pos_offset=2 if config.model_type in ("bart", "mbart") else 0,  # BART's learned table starts at 2
        n_classes=int(getattr(config, "num_labels", 0)) if n_classes else 0,
    )


@contextlib.contextmanager
def _quiet():
    """Silence transformers' info/warning logs and progress bars while loading."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


class HFTokenizerView:
    """A transformers tokenizer shaped like core's Tokenizer (encode without specials, tokens, decode, itos)."""

    kind = "hf"

    def __init__(self, tokenizer: Any):
        self.hf = tokenizer
        self._itos: list[str] | None = None

    @property
    def itos(self) -> list[str]:
        """id -> token string (built on first use)."""
        if self._itos is None:
            self._itos = [str(t) for t in self.hf.convert_ids_to_tokens(list(range(len(self.hf))))]
        return self._itos

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str, strict: bool = False) -> list[int]:
        return self.hf(text, add_special_tokens=False)["input_ids"]

    def tokens(self, ids) -> tuple[str, ...]:
        return tuple(self.hf.convert_ids_to_tokens([int(i) for i in ids]))

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=True)


@dataclass
class HFModel:
    """A Hugging Face model with the common interface (attnscope.core.families.interface.AttentionModel)."""

    name: str
    folder: Path | None
    cfg: HFArch
    model: Any  # transformers PreTrainedModel in eval mode
    tokenizer: Any  # transformers tokenizer
    card: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = MAX_NEW_TOKENS

    family: Family = "hf"
    injectable = False  # run by transformers: custom masks and interventions cannot go in
    thread_safe = False  # a library's model: whether its forward keeps state is not ours to say
    masks_from_ids = False  # the attention_mask argument says where PAD is

    def __post_init__(self) -> None:
        self._view = HFTokenizerView(self.tokenizer)
        # learned attention sinks (GPT-OSS: a ``sinks`` logit per head, softmaxed with the scores)
        self._has_sinks = any(
            isinstance(getattr(m, "sinks", None), torch.Tensor) for m in self.model.modules()
        )

    # -- facts ------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return self.cfg.arch

    def audit_facts(self) -> dict[str, Any]:
        cfg = self.cfg
        return {"pad_id": cfg.pad_id, "skip_ids": {cfg.pad_id, cfg.bos_id, cfg.eos_id}, "vocab": (None, None),
                "max_len": cfg.max_len}  # fmt: skip

    def position_table(self) -> PositionTable:
        cfg = self.cfg
        return find_position_table(self.model, cfg.pos_encoding, cfg.d_model, cfg.pos_offset)

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return self.model.named_parameters()

    def forward_outputs(self, src, tgt, src_real, tgt_real) -> dict[str, torch.Tensor]:
        """Last hidden states through the library's public call, attention_mask from ``*_real``."""
        m, arch = self.model, self.cfg.arch
        kw = dict(output_hidden_states=True, return_dict=True)
        with torch.no_grad():
            if arch == "encoder":
                return {"enc": m(input_ids=src, attention_mask=src_real.long(), **kw).hidden_states[-1]}
            if arch == "decoder":
                return {"dec": m(input_ids=tgt, attention_mask=tgt_real.long(), **kw).hidden_states[-1]}
            out = m(input_ids=src, attention_mask=src_real.long(), decoder_input_ids=tgt,
                    decoder_attention_mask=tgt_real.long(), **kw)  # fmt: skip
        return {"enc": out.encoder_last_hidden_state, "dec": out.decoder_hidden_states[-1]}

    @property
    def has_decoder(self) -> bool:
        return self.cfg.arch != "encoder"

    @property
    def has_encoder(self) -> bool:
        return self.cfg.arch != "decoder"

    @property
    def src_tok(self) -> HFTokenizerView:
        return self._view

    @property
    def tgt_tok(self) -> HFTokenizerView | None:
        return self._view if self.has_decoder else None

    @property
    def n_specials(self) -> int:
        return self.tokenizer.num_special_tokens_to_add(pair=False)

    @property
    def max_src_tokens(self) -> int:
        return self.cfg.max_len - self.n_specials

    @property
    def labels(self) -> list[str]:
        id2label = getattr(self.model.config, "id2label", None) or {}
        if self.meta.get("head") != "classifier":
            return []
        return [str(id2label[i]) for i in sorted(id2label)]

    @property
    def summary(self) -> str:
        return str(self.meta.get("summary", ""))

    @property
    def device(self) -> str:
        return str(self.model.device)

    def to(self, device: str) -> HFModel:
        other = copy.copy(self)
        other.model = copy.deepcopy(self.model).to(resolve_device(device)).eval()
        return other

    # -- input --------------------------------------------------------------------
    def _encode(self, text: str, what: str, specials: bool, limit: int, truncate: bool) -> Prepared:
        if text is None or not text.strip():
            raise InputError(f"the {what} text is empty")
        ids = self.tokenizer(text, add_special_tokens=specials)["input_ids"]
        own = self.tokenizer(text, add_special_tokens=False)["input_ids"] if specials and ids else ids
        if not own:  # (a tokenizer that drops every character of it: nothing for the model to read)
            raise InputError(
                f"the {what} text {_short(text, 60)!r} gives no tokens: this model's tokenizer reads nothing in it"
            )
        warnings = []
        if len(ids) > limit:
            if not truncate:
                raise InputError(f"the {what} has {len(ids)} tokens; this model takes at most {limit}")
            warnings.append(f"{what} truncated from {len(ids)} to {limit} tokens (the model's maximum)")
            ids = self.tokenizer(text, add_special_tokens=specials, truncation=True, max_length=limit)[
                "input_ids"
            ]
        return Prepared(list(ids), warnings)

    def prepare(self, text: str, truncate: bool = False) -> Prepared:
        """Token ids of one source text / prompt, with the tokenizer's special tokens."""
        return self._encode(text, "input", True, self.cfg.max_len, truncate)

    def prepare_target(self, text: str, truncate: bool = False) -> Prepared:
        """Target ids: labels with specials (seq2seq) or the continuation without (decoder-only)."""
        if not self.has_decoder:
            raise InputError("this model has no decoder, so it takes no target text")
        return self._encode(text, "target", self.cfg.arch == "seq2seq", self.cfg.max_len, truncate)

    def _pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ids and the attention mask (1 = real) from the true lengths."""
        ids, real = pad_rows(rows, self.cfg.pad_id, self.model.device)
        return ids, real.long()

    # -- running ---------------------------------------------------------------------
    @torch.no_grad()
    def trace(
        self,
        sources: list[str],
        targets: list[str] | None = None,
        truncate: bool = False,
        masks: Any = None,
        interv: Any = None,
    ) -> list[AttentionTrace]:
        """One AttentionTrace per text (padded batch: every trace keeps the padded length)."""
        if not sources:
            raise InputError("no input text given")
        if masks is not None or (interv is not None and interv.active):
            raise InputError(
                "custom masks and interventions work on core models only, not on Hugging Face models"
            )
        check_trace_budget(0, len(sources))
        prepared = [self.prepare(s, truncate) for s in sources]
        tp = None if targets is None else prepare_targets(self, prepared, targets, truncate)
        cfg, n_src = self.cfg, max(len(p.ids) for p in prepared)
        n_tgt = max(len(t.ids) for t in tp) + 1 if tp else min(self.max_new_tokens, cfg.max_len)
        if cfg.arch == "decoder":  # one sequence, prompt (+ target), in dec_self only
            n_seq = n_src + (n_tgt if tp else 0)
            nbytes = trace_bytes(0, cfg.n_dec_layers, cfg.n_heads, len(sources), 0, n_seq)
        else:
            n_dec = n_tgt if cfg.arch == "seq2seq" else 0
            nbytes = trace_bytes(cfg.n_enc_layers, cfg.n_dec_layers, cfg.n_heads, len(sources), n_src, n_dec)
        check_trace_budget(nbytes, len(sources))  # same limits as core's runner (ATTNSCOPE_MAX_TRACE_MB)
        run = {"encoder": self._run_encoder, "decoder": self._run_decoder, "seq2seq": self._run_seq2seq}
        return run[self.cfg.arch](prepared, tp)

    def _forward(self, names: dict[str, str], **kwargs) -> tuple[Any, float, _Moves]:
        """The model's output with its maps (``names``: its attributes that hold them -> kind), the
        forward's time, and what the heads move, from a capture of the same forward."""
        start = time.perf_counter()
        with capture_attention(self.model, scores=False) as cap:
            out = self.model(**kwargs, output_attentions=True, return_dict=True)
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1000
        return out, ms, _moves(out, cap, names, sinks=self._has_sinks)

    def _run_encoder(self, prepared: list[Prepared], tp) -> list[AttentionTrace]:
        if tp is not None:
            raise InputError("this model has no decoder, so it takes no target text")
        src, src_real = self._pad([p.ids for p in prepared])
        out, ms, moves = self._forward({"attentions": "enc_self"}, input_ids=src, attention_mask=src_real)
        stack = _stack_layers(out, "attentions")
        config = _side_config(self.model.config, "encoder")
        mask, layer_masks = _windowed(stack, padding_masks(src_real, None)["enc_self"], config, causal=False)
        maps = {"enc_self": (stack, None, mask, layer_masks)}
        self._sinks(maps, moves)
        side = Side(src, src_real, self.src_tok.tokens)
        traces = []
        for i, p in enumerate(prepared):
            fields: dict[str, Any] = {}
            meta = self._meta(ms, False, p.warnings)
            if self.meta.get("head") == "classifier":
                probs = out.logits[i].float().softmax(-1).cpu().numpy()
                labels = self.labels or [str(k) for k in range(len(probs))]
                k = int(probs.argmax())
                fields.update(out_tokens=(labels[k],), out_probs=probs)
                meta["labels"] = labels
                text = labels[k]
            else:
                h, w = out.last_hidden_state[i].float(), src_real[i].float()[:, None]
                emb = ((h * w).sum(0) / w.sum().clamp(min=1.0)).cpu().numpy()
                meta["embedding_norm"] = float(np.linalg.norm(emb))
                meta["embedding_head"] = [round(float(v), 6) for v in emb[:8]]
                text = f"embedding norm {np.linalg.norm(emb):.4f}"
            traces.append(self._make(i, side, None, maps, text, meta, moves, **fields))
        return traces

    def _run_decoder(self, prepared: list[Prepared], tp) -> list[AttentionTrace]:
        rows = [p.ids + (tp[i].ids if tp else []) for i, p in enumerate(prepared)]
        if max(len(r) for r in rows) > self.cfg.max_len:
            raise InputError(f"prompt and target together exceed the model's {self.cfg.max_len} tokens")
        seq, real = self._pad(rows)
        out, ms, moves = self._forward(
            {"attentions": "dec_self"}, input_ids=seq, attention_mask=real, use_cache=False
        )
        stack = _stack_layers(out, "attentions")
        config = _side_config(self.model.config, "decoder")
        mask, layer_masks = _windowed(stack, padding_masks(None, real)["dec_self"], config)
        maps = {"dec_self": (stack, None, mask, layer_masks)}
        self._sinks(maps, moves)
        side = Side(seq, real, self.src_tok.tokens)
        traces = []
        for i, p in enumerate(prepared):
            fields = prediction_fields(out.logits[i].float().softmax(-1), self.src_tok.tokens)
            n_prompt, n_real = len(p.ids), len(rows[i])
            guesses = fields["topk_ids"][:, 0]
            if tp:
                text = self.tokenizer.decode(guesses[n_prompt - 1 : n_real - 1], skip_special_tokens=True)
            else:
                text = self.tokenizer.decode(guesses[n_prompt - 1 : n_prompt], skip_special_tokens=False)
            meta = self._meta(ms, tp is not None, p.warnings)
            meta.update(prompt_len=n_prompt, decoder_only=True)
            traces.append(self._make(i, None, side, maps, text, meta, moves, **fields))
        return traces

    def _run_seq2seq(self, prepared: list[Prepared], tp) -> list[AttentionTrace]:
        src, src_real = self._pad([p.ids for p in prepared])
        start_id = self.cfg.bos_id
        if tp is not None:  # teacher forcing: decoder input = shift_right(labels)
            dec_rows = [[start_id] + t.ids[:-1] for t in tp]
        else:
            dec_rows = self._generate_rows(src, src_real)
        dec, dec_real = self._pad(dec_rows)
        out, ms, moves = self._forward(
            {"encoder_attentions": "enc_self", "decoder_attentions": "dec_self", "cross_attentions": "cross"},
            input_ids=src,
            attention_mask=src_real,
            decoder_input_ids=dec,
            decoder_attention_mask=dec_real,
            use_cache=False,
        )
        masks, config = padding_masks(src_real, dec_real), self.model.config
        enc_maps = _stack_layers(out, "encoder_attentions")
        dec_maps = _stack_layers(out, "decoder_attentions")
        enc_cfg, dec_cfg = _side_config(config, "encoder"), _side_config(config, "decoder")
        maps = {
            "enc_self": (enc_maps, None, *_windowed(enc_maps, masks["enc_self"], enc_cfg, causal=False)),
            "dec_self": (dec_maps, None, *_windowed(dec_maps, masks["dec_self"], dec_cfg)),
            "cross": (_stack_layers(out, "cross_attentions"), None, masks["cross"]),
        }
        self._sinks(maps, moves)
        src_side, dec_side = (
            Side(src, src_real, self.src_tok.tokens),
            Side(dec, dec_real, self.src_tok.tokens),
        )
        traces = []
        for i, p in enumerate(prepared):
            fields = prediction_fields(out.logits[i].float().softmax(-1), self.src_tok.tokens)
            n_real = int(dec_real[i].sum())
            text = self.tokenizer.decode(fields["topk_ids"][:n_real, 0], skip_special_tokens=True)
            meta = self._meta(ms, tp is not None, p.warnings)
            traces.append(self._make(i, src_side, dec_side, maps, text, meta, moves, **fields))
        return traces

    def _generate_rows(self, src: torch.Tensor, src_real: torch.Tensor) -> list[list[int]]:
        """Greedy generation -> decoder inputs (start + every generated token but the last)."""
        limit = max(1, min(self.max_new_tokens, self.cfg.max_len - 1))
        gen = self.model.generate(
            input_ids=src,
            attention_mask=src_real,
            max_new_tokens=limit,
            do_sample=False,
            num_beams=1,
            pad_token_id=self.cfg.pad_id,
            eos_token_id=self.cfg.eos_id,
        )
        rows = []
        for row in gen.tolist():
            new = row[1:]
            if self.cfg.eos_id in new:
                new = new[: new.index(self.cfg.eos_id) + 1]
            rows.append([row[0]] + new[:-1] if new else [row[0]])
        return rows

    # -- packaging -----------------------------------------------------------------------
    def _sinks(self, maps: dict[str, tuple[Any, ...]], moves: _Moves) -> None:
        """Where the model has learned attention sinks (GPT-OSS), the weight each row gave its head's sink,
        which Hugging Face leaves out of the weights it returns, goes in the trace as a learned key
        ``"<sink>"`` (``{kind}_learned``, ``meta["learned_keys"]``) of each kind whose rows fall short of 1:
        1 minus the row's sum, checked (up to rounding) to be at least 0 and to equal the share the model's
        own softmax gave the sink, read from the capture of the same forward (where it cannot be read, a
        warning says how the weight was obtained). Rows that see no key (padding) are no evidence: their
        weight is the rest of their row all the same, as the model left it."""
        if not self._has_sinks:
            return
        for kind, (stack, _, mask, *per_layer) in maps.items():
            layer_masks = per_layer[0] if per_layer else None
            rest = 1.0 - stack.sum(-1, keepdim=True, dtype=torch.float32)  # (B, layer, head, q, 1)
            allowed = layer_masks if layer_masks is not None else None if mask is None else mask[:, None]
            sees = (  # (B, layer or 1, 1, q, 1): the rows that see a key
                torch.ones_like(rest, dtype=torch.bool)
                if allowed is None
                else allowed.any(-1)[:, :, None, :, None].to(rest.device)
            )
            tol = max(1e-4, 4 * float(torch.finfo(stack.dtype).eps))
            real = rest.masked_fill(~sees, 0.0)
            if float(real.abs().max()) <= tol or float(real.min()) < -tol:
                continue  # (every row sums to 1: no sink here; one sums to more: no sink explains it)
            weights = rest.clamp(0.0, 1.0)
            captured = moves.sinks.get(kind)
            if captured is None:
                moves.notes.append(
                    f"{kind}'s weight on each head's learned attention sink is 1 minus its row's sum: Hugging Face "
                    "returns the weights without the sink, and the model's own softmax could not be read to confirm it"
                )
            elif (
                float((captured.float().to(rest.device) - weights).masked_fill(~sees, 0.0).abs().max()) > tol
            ):
                moves.notes.append(
                    f"{kind}'s rows do not sum to 1, and the model's softmax gave its attention sinks other weights "
                    "than the rest of each row: no sink weight is saved"
                )
                continue
            moves.learned[kind] = weights

    def _meta(self, forward_ms: float, teacher: bool, warnings: list[str]) -> dict[str, Any]:
        return {
            "forward_ms": round(forward_ms, 3),
            "teacher_forced": teacher,
            "warnings": list(warnings),
            "kind": "hf",
            "model_type": self.cfg.model_type,
            "arch": self.cfg.arch,
            "has_scores": False,
        }

    def _make(
        self, i, src: Side | None, tgt: Side | None, maps, text: str, meta, norms: _Moves, **fields
    ) -> AttentionTrace:
        for kind, (vn, _) in norms.norms.items():
            fields[f"{kind}_value_norms"] = vn[i].detach().float().cpu().numpy()
        if norms.norms:
            meta["value_norms"] = {kind: scope for kind, (_, scope) in norms.norms.items()}
        for kind, rn in norms.residual.items():
            fields[f"{kind}_residual_norms"] = rn[i].detach().float().cpu().numpy()
        for kind, sink in norms.learned.items():
            fields[f"{kind}_learned"] = sink[i].detach().float().cpu().numpy()
        if norms.learned:
            meta["learned_keys"] = {kind: ["<sink>"] for kind in norms.learned}
        if norms.notes:
            meta["warnings"] = [*meta.get("warnings", []), *norms.notes]
        return package_trace(
            i, model=self.name, config_name=self.cfg.model_type, device=self.device, src=src, tgt=tgt,
            maps=maps, output_text=text, meta=meta, **fields,
        )  # fmt: skip

    @torch.no_grad()
    def trace_continuation(self, sources: list[str], truncate: bool = False) -> list[AttentionTrace]:
        """Decoder-only models: each prompt continued greedily (at most ``max_new_tokens``, up to and
        including EOS), then prompt + continuation traced in one padded forward pass. Works on ids
        (no decode/re-encode round trip), so every step's attention is the one generation used.
        ``meta``: teacher_forced False, ``generated`` = new tokens."""
        if self.cfg.arch != "decoder":
            raise InputError("only decoder-only models continue a prompt; use trace() for this model")
        if not sources:
            raise InputError("no input text given")
        check_trace_budget(0, len(sources))
        prepared = [self.prepare(s, truncate) for s in sources]
        conts = []
        for p in prepared:  # one at a time: no padding question for the causal model
            room = min(self.max_new_tokens, self.cfg.max_len - len(p.ids))
            new: list[int] = []
            if room > 0:
                ids = torch.tensor([p.ids], device=self.model.device)
                gen = self.model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=room,
                    do_sample=False,
                    num_beams=1,
                    pad_token_id=self.cfg.pad_id,
                )
                new = gen[0, len(p.ids) :].tolist()
                if self.cfg.eos_id in new:
                    new = new[: new.index(self.cfg.eos_id) + 1]
            conts.append(Prepared(new))
        n_seq = max(len(p.ids) + len(c.ids) for p, c in zip(prepared, conts, strict=True))
        check_trace_budget(
            trace_bytes(0, self.cfg.n_dec_layers, self.cfg.n_heads, len(sources), 0, n_seq), len(sources)
        )
        traces = self._run_decoder(prepared, conts)
        return [
            t.replace(meta={**t.meta, "teacher_forced": False, "generated": len(c.ids)})
            for t, c in zip(traces, conts, strict=True)
        ]

    @torch.no_grad()
    def predict(self, sources: list[str]) -> list[str]:
        """Encoder: label / embedding; decoder-only: greedy continuation; seq2seq: greedy output."""
        if self.cfg.arch == "encoder":
            return [t.output_text for t in self.trace(sources)]
        prepared = [self.prepare(s) for s in sources]
        if self.cfg.arch == "seq2seq":
            src, src_real = self._pad([p.ids for p in prepared])
            return [
                self.tokenizer.decode(r[1:], skip_special_tokens=True)
                for r in self._generate_rows(src, src_real)
            ]
        answers = []
        for p in prepared:  # one at a time: no padding question for the causal model
            ids = torch.tensor([p.ids], device=self.model.device)
            gen = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max(1, min(self.max_new_tokens, self.cfg.max_len - len(p.ids))),
                do_sample=False,
                num_beams=1,
                pad_token_id=self.cfg.pad_id,
            )
            answers.append(self.tokenizer.decode(gen[0, len(p.ids) :], skip_special_tokens=True))
        return answers


@dataclass
class _Moves:
    """What a forward's heads move: kind -> ((B, layer, head, k) ||f_h(x_j)||, scope), and kind ->
    (B, layer, q) ||x_i|| of the residual stream each layer's attention output is added to (the
    norm-based rollout's identity term)."""

    norms: dict[str, tuple[torch.Tensor, str]]
    residual: dict[str, torch.Tensor]
    # kind -> (B, layer, head, q, 1): each row's weight on its head's learned attention sink, the column the
    # model's own softmax gave it (Hugging Face returns the weights without it); filled where the model has sinks
    sinks: dict[str, torch.Tensor] = field(default_factory=dict)
    # kind -> (B, layer, head, q, 1): the sink weights put in the trace (``HFModel._sinks``), and what to say
    learned: dict[str, torch.Tensor] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _sink_columns(layers: Any, records: list) -> torch.Tensor | None:
    """(B, layer, head, q, 1): the weight each layer's softmax gave its learned sink (GPT-OSS's ``sinks``, one
    logit per head, softmaxed with the scores and dropped from the weights returned), read from the captured
    record whose other columns are that layer's map element for element; None unless every layer has one."""
    used: set[int] = set()
    columns = []
    for layer in layers:
        shape = (*layer.shape[:-1], int(layer.shape[-1]) + 1)
        hit = None
        for n, r in enumerate(records):
            labels = r.key_labels
            if n in used or tuple(r.probs.shape) != shape or labels is None or len(labels) != shape[-1]:
                continue
            if labels[-1] is None or any(x is not None for x in labels[:-1]):
                continue  # (the last key is the one learned key, every other a position of the sequence)
            if torch.equal(r.probs[..., :-1], layer):
                hit = n
                break
        if hit is None:
            return None
        used.add(hit)
        columns.append(records[hit].probs[..., -1:])
    return torch.stack(columns, dim=1) if columns else None


def _moves(out: Any, cap: Captured, names: dict[str, str], sinks: bool = False) -> _Moves:
    """What moves, for each output ``names`` holds (its attribute -> kind). Each layer's record is the
    captured call whose weights are that layer's map, element for element (never matched by order
    alone); a kind with a layer unmatched, or values that could not be confirmed, has none (the
    dashboard then offers weights only). The residual norms are the capture's: the tensor the output
    projection's result was added to, found from lineage, for every layer of the kind or none. With
    ``sinks`` (a model with learned attention sinks), each kind's sink weights where every layer's
    record holds them (``_sink_columns``)."""
    records = [r for r in cap.records if r.values is not None]
    used: set[int] = set()
    result, residual = {}, {}
    for name, kind in names.items():
        layers = getattr(out, name, None)
        if not layers:
            continue
        matched = []
        for layer in layers:
            hit = next((i for i, r in enumerate(records) if i not in used
                        and tuple(r.probs.shape) == tuple(layer.shape)
                        and (r.probs is layer or torch.equal(r.probs, layer))), None)  # fmt: skip
            if hit is None:
                break
            used.add(hit)
            matched.append(records[hit])
        if len(matched) != len(layers):
            continue
        norms, scope = kind_value_norms(matched, [list(range(int(r.probs.shape[-1]))) for r in matched])
        if norms is None or scope is None:
            continue
        result[kind] = (norms, scope)
        rows = [r.residual for r in matched]
        if all(x is not None and tuple(x.shape) == (r.probs.shape[0], r.probs.shape[-2])
               for x, r in zip(rows, matched, strict=True)):  # fmt: skip
            residual[kind] = torch.stack([x for x in rows if x is not None], dim=1)
    found = {}
    for name, kind in names.items() if sinks else ():
        columns = _sink_columns(getattr(out, name, None) or [], cap.records)
        if columns is not None:
            found[kind] = columns
    return _Moves(result, residual, found)


# files a tokenizer's vocabulary is in (one of them beside the model: without, transformers builds an empty one)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model", "source.spm", "vocab.model", "spm.model")  # fmt: skip


def _short(text: str, most: int = 300) -> str:
    """``text`` cut to about ``most`` characters at the end of a sentence (never mid-word)."""
    if len(text) <= most:
        return text
    cut = text.rfind(". ", 0, most)
    return text[: cut + 1] if cut > most // 3 else text[:most].rsplit(" ", 1)[0] + " ..."


def _load_failed(folder: Path, exc: Exception) -> str:
    """One sentence for a model folder transformers could not load."""
    text = _one_line(exc)
    if "Weights only load failed" in text or "weights_only" in text:
        return (f"refused to load the weights in {folder}: the checkpoint is a pickle that holds more than tensors, "
                "and attnscope never unpickles code from a file (torch.load(weights_only=True)); save the model "
                "with safetensors (model.save_pretrained(folder, safe_serialization=True))")  # fmt: skip
    if "ignore_mismatched_sizes" in text or "size mismatch" in text:
        return (
            f"the weights in {folder} do not fit its config.json: some tensors have other shapes than the "
            "config calls for (a hidden size, head count or vocabulary size changed since they were saved)"
        )
    return f"cannot load the model in {folder}: {_short(text)}"


def _positive(value: Any) -> int | None:
    """``value`` when it is a positive int (a window or chunk size), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _side_config(config: Any, side: str) -> Any:
    """The ``side`` ("encoder" or "decoder") stack's own config where the model's config nests one (T5Gemma's
    ``config.encoder``; a decoder's ``text_config`` in a composite config, as Gemma 3's), else ``config`` itself
    (BART's ``encoder_layers`` is a number, not a config)."""
    from transformers import PretrainedConfig

    sub = getattr(config, side, None)
    if isinstance(sub, PretrainedConfig):
        return sub
    if side == "decoder" and isinstance(config, PretrainedConfig):
        with contextlib.suppress(ValueError, AttributeError):  # (ambiguous: several text configs)
            text = config.get_text_config(decoder=True)
            if isinstance(text, PretrainedConfig):
                return text
    return config


def _local_rules(config: Any, n_layers: int, causal: bool) -> list[tuple[str, int] | None]:
    """Each layer's local attention as the config states it, None where a layer attends to every key its
    plain mask allows. Causal self-attention: ``("window", w)``, the last ``w`` keys up to the query
    (``"sliding_attention"`` layers, or every layer where ``sliding_window`` is set without ``layer_types``
    and ``use_sliding_window`` is not False: Mistral); ``("chunk", c)``, the keys of the query's own chunk of
    ``c`` positions (Llama 4's ``"chunked_attention"`` layers, ``attention_chunk_size``). Bidirectional
    self-attention: ``("local", w)``, keys at most ``w`` positions away on either side (ModernBERT's and
    T5Gemma's encoder ``"sliding_attention"`` layers; ModernBERT's ``sliding_window`` is half its
    ``local_attention``). The same rules transformers' masking_utils builds these masks by."""
    window = _positive(getattr(config, "sliding_window", None))
    chunk = _positive(getattr(config, "attention_chunk_size", None)) if causal else None
    sliding = None if window is None else ("window" if causal else "local", window)
    types = getattr(config, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(types) == n_layers:
        rules: dict[Any, tuple[str, int] | None] = {
            "sliding_attention": sliding,
            "chunked_attention": ("chunk", chunk) if chunk else None,
        }
        return [rules.get(t) for t in types]
    if sliding and getattr(config, "use_sliding_window", True) is not False:
        return [sliding] * n_layers
    if chunk:
        return [("chunk", chunk)] * n_layers
    return [None] * n_layers


def _band(rule: tuple[str, int], q: int, k: int, device: Any) -> torch.Tensor:
    """(q, k) bool: the keys ``rule`` lets each query see (queries are the last ``q`` of the ``k`` positions)."""
    what, size = rule
    i = torch.arange(q, device=device)[:, None] + (k - q)
    j = torch.arange(k, device=device)[None, :]
    if what == "local":
        return (i - j).abs() <= size
    if what == "chunk":
        return (j <= i) & (j // size == i // size)
    return (j <= i) & (j > i - size)


def _windowed(
    stack: torch.Tensor, mask: torch.Tensor, config: Any, causal: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A self-attention mask ``(B, q, k)`` narrowed to the local attention the config's layers use (a
    sliding window, Llama 4's chunks, a two-sided window in an encoder: ``_local_rules``), where the maps
    ``stack`` ``(B, layer, head, q, k)`` show it was applied: no weight outside it in any layer that uses
    it, in every query row that has a key within it (a padding query that sees no key inside the window is
    spread by eager attention over every key; its row is not evidence, and its saved row is the narrowed,
    empty one, for the mask audit to report). A rule the maps contradict in any of its layers is not
    claimed anywhere. Where every layer is narrowed alike, the one mask and None; else the first layer's
    mask and every layer's ``(B, layer, q, k)``."""
    if stack.dim() != 5:
        return mask, None
    n_layers, q, k = int(stack.shape[1]), int(stack.shape[-2]), int(stack.shape[-1])
    rules = _local_rules(config, n_layers, causal)
    narrowed: dict[tuple[str, int], torch.Tensor] = {}
    for rule in dict.fromkeys(r for r in rules if r is not None):
        band = _band(rule, q, k, mask.device)
        if bool(band.all()):  # (the sequence is shorter than the window or chunk: nothing to narrow)
            continue
        windowed = mask & band
        beyond = (~band.to(stack.device))[None] & windowed.any(-1).to(stack.device)[:, :, None]  # (B, q, k)
        if any(  # (one layer at a time: no copy of every layer's maps)
            bool(stack[:, layer].masked_fill(~beyond[:, None], 0).ne(0).any())
            for layer, r in enumerate(rules)
            if r == rule
        ):
            continue  # (the maps put weight beyond it: the rule was not applied)
        narrowed[rule] = windowed
    if not narrowed:
        return mask, None
    per = [narrowed.get(r, mask) if r is not None else mask for r in rules]
    if all(m is per[0] for m in per):
        return per[0], None
    per_layer = torch.stack(per, dim=1)
    return per_layer[:, 0], per_layer


def _stack_layers(out: Any, name: str) -> torch.Tensor:
    """``out.<name>`` (one (B, head, q, k) tensor per layer) as one (B, layer, head, q, k) tensor, each
    layer freed as soon as it is copied: the peak is the maps once plus a layer, not twice the maps
    (a GPT-2-sized model at 1,024 tokens: 0.6 GB instead of 1.2 GB). The output no longer holds them."""
    layers = list(getattr(out, name))
    out[name] = None  # ModelOutput: the attribute and the mapping entry together
    first = layers[0]
    stacked = torch.empty(
        (first.shape[0], len(layers), *first.shape[1:]), dtype=first.dtype, device=first.device
    )
    for i in range(len(layers)):
        stacked[:, i] = layers[i]
        layers[i] = None  # the list held the only reference: this layer is freed
    return stacked


# -- loading ---------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def is_hf_folder(path: str | Path) -> bool:
    """A folder whose config.json names a Hugging Face "model_type" (core configs have none)."""
    return "model_type" in _read_json(Path(path) / "config.json")


def load_hf(
    folder: str | Path,
    name: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    device_map: str | dict | None = None,
    arch: str | None = None,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> HFModel:
    """Load a Hugging Face model folder (never downloads, never runs code from the folder)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = Path(folder).expanduser()
    if not folder.is_dir() or not is_hf_folder(folder):
        raise ModelLoadError(f"{folder} is not a Hugging Face model folder (config.json with model_type)")
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if arch is not None and arch not in ARCHS:
        raise ModelLoadError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    if device_map is not None and importlib.util.find_spec("accelerate") is None:
        raise ModelLoadError("device_map needs the accelerate package (pip install accelerate)")
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = _read_json(folder / "config.json").get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ModelLoadError(
            f"refused to load {folder}: model_type {model_type!r} is not a built-in transformers architecture "
            "and attnscope never runs code shipped in a model folder (trust_remote_code=False)"
        )
    common = {"local_files_only": True, "trust_remote_code": False}
    with _quiet():
        try:
            config = transformers.AutoConfig.from_pretrained(str(folder), **common)
        except Exception as exc:  # transformers raises OSError/ValueError/KeyError variants
            raise ModelLoadError(f"cannot read {folder / 'config.json'}: {_short(_one_line(exc))}") from exc
        arch = arch or detect_arch(config)
        head = "base"
        cls: Any  # a transformers Auto* class (their from_pretrained stubs disagree on what they return)
        if arch == "seq2seq":
            cls = transformers.AutoModelForSeq2SeqLM
        elif arch == "decoder":
            cls = transformers.AutoModelForCausalLM
        elif any(a.endswith("ForSequenceClassification") for a in (config.architectures or [])):
            cls, head = transformers.AutoModelForSequenceClassification, "classifier"
        else:
            cls = transformers.AutoModel
        kwargs: dict[str, Any] = dict(
            common, attn_implementation="eager", dtype=DTYPES[dtype], weights_only=True
        )
        if any(folder.glob("*.safetensors")):
            kwargs["use_safetensors"] = True
        if device_map is not None:
            kwargs["device_map"] = device_map
        try:
            model, info = cls.from_pretrained(str(folder), config=config, output_loading_info=True, **kwargs)
        except Exception as exc:  # shapes, truncated files, bad configs: one line for the user
            raise ModelLoadError(_load_failed(folder, exc)) from exc
        if not any((folder / f).is_file() for f in TOKENIZER_FILES) and not any(folder.glob("*.tiktoken")):
            raise ModelLoadError(
                f"{folder} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): attnscope reads text "
                "through the model's own tokenizer, so save it beside the model (tokenizer.save_pretrained(folder)); "
                "a model of images or sound has none, and is not a text model attnscope can read"
            )
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), **common)
        except Exception as exc:
            raise ModelLoadError(f"cannot load the tokenizer in {folder}: {_short(_one_line(exc))}") from exc
    missing = [k for k in info.get("missing_keys", []) if "pooler" not in k]
    if missing or info.get("mismatched_keys"):
        raise ModelLoadError(
            f"weights in {folder} do not fit the config: missing {sorted(missing)[:5]}, "
            f"mismatched {[m[0] if isinstance(m, tuple) else m for m in info.get('mismatched_keys', [])][:5]}"
        )
    if device_map is None:
        model = model.to(resolve_device(device))
    model.eval()
    name = name or folder.name
    cfg = _arch_summary(name, config, arch, tokenizer, dtype, head == "classifier")
    readme = folder / "README.md"
    card = readme.read_text(encoding="utf-8", errors="replace")[:20000] if readme.is_file() else ""
    layers = (
        f"{cfg.n_enc_layers}+{cfg.n_dec_layers}"
        if arch == "seq2seq"
        else max(cfg.n_enc_layers, cfg.n_dec_layers)
    )
    meta = {
        "kind": "hf",
        "model_type": cfg.model_type,
        "arch": arch,
        "head": head,
        "source": str(folder),
        "summary": f"Hugging Face {cfg.model_type} ({arch}): {layers} layers x {cfg.n_heads} heads, d_model {cfg.d_model}",
        "unused_weights": sorted(info.get("unexpected_keys", []))[:20],
        "missing_weights": sorted(info.get("missing_keys", []))[:20],
    }
    return HFModel(name, folder, cfg, model, tokenizer, card, meta, max_new_tokens)
