"""Any PyTorch model through one Python file: the adapter.

An adapter file defines exactly these names (see README, "Your own model in 20 lines")::

    ARCH = "encoder-decoder"      # or "encoder" or "decoder" (decoder-only)
    def load(): ...               # -> torch.nn.Module with its weights
    VOCAB = [...]                 # id -> token string (source side, and target side unless TGT_VOCAB)
    TGT_VOCAB = None              # optional: id -> token string for the decoder side
    PAD, BOS, EOS = 0, 1, 2       # ids (BOS/EOS may be None when the model has none)
    def encode(text): ...         # -> list[int] with the model's specials; decoder input = [BOS] + encode_target(t)
    def encode_target(text): ...  # optional, default encode
    MAX_LEN = 64                  # optional
    EXAMPLES = ["..."]            # optional: inputs the dashboard offers (and the load check uses)
    LABELS = ["neg", "pos"]       # optional, "encoder" only: a classifier; forward returns [B, len(LABELS)]
    def forward(model, src, tgt): ...  # LongTensor [B, S], [B, T] right-padded with PAD (src None for
                                       # "decoder", tgt None for "encoder") -> logits or probabilities [B, L, V]

``load_adapter(path)`` runs the file (it is code: the dashboard only does so with
``ATTNSCOPE_ALLOW_CODE=1``), builds the model, and checks it once on an example: the names,
their types, the output shape and that attention was found. Every problem is one sentence
(``ModelLoadError``) naming what is wrong. Attention comes from ``core.capture`` around the
user's ``forward``; the model's code is never changed. The model computes its masks from the ids
itself, so the audit uses batch invariance and future invariance (``masks_from_ids``).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.capture import Captured, capture_attention
from core.checkpoint import ModelLoadError, _one_line
from core.interface import ModelFacts, Side, package_trace, pad_rows, prediction_fields, prepare_targets
from core.runner import InputError, Prepared, check_trace_budget, resolve_device, trace_bytes
from core.trace import KINDS, AttentionTrace

# nn.TransformerEncoder in eval mode announces its prototype nested-tensor fast path on every first
# call; it is noise about the user's model, not something they can act on here.
warnings.filterwarnings("ignore", message=r"The PyTorch API of nested tensors", category=UserWarning)

ARCHS = {"encoder-decoder": "seq2seq", "encoder": "encoder", "decoder": "decoder"}
REQUIRED = ("ARCH", "load", "VOCAB", "PAD", "BOS", "EOS", "encode", "forward")
MAX_NEW_TOKENS = 64  # greedy generation bound when MAX_LEN does not set a smaller one
SPECIAL_SHAPES = ("<", "[")  # tokens like <pad>, [CLS] are not offered as example text


class AdapterTokens:
    """An adapter's vocabulary shaped like core's Tokenizer (itos, encode, tokens, decode)."""

    def __init__(self, itos: list[str], encode, specials: set[int]):
        self.itos = list(itos)
        self._encode = encode
        self.specials = specials
        plain = [t for i, t in enumerate(self.itos) if i not in specials and not t.startswith(SPECIAL_SHAPES)]
        self.kind = "char" if plain and all(len(t) == 1 for t in plain) else "word"

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, strict: bool = False) -> list[int]:
        return list(self._encode(text))

    def tokens(self, ids) -> tuple[str, ...]:
        return tuple(self.itos[int(i)] if 0 <= int(i) < len(self.itos) else f"<{int(i)}?>" for i in ids)

    def decode(self, ids) -> str:
        sep = "" if self.kind == "char" else " "
        return sep.join(
            self.itos[int(i)] for i in ids if int(i) not in self.specials and 0 <= int(i) < len(self)
        )


def _import(path: Path):
    """Run the adapter file as a module (its folder on sys.path, so it can import its own code)."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"attnscope_adapter_{digest}", path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"{path} cannot be read as a Python file")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ModelLoadError(
            f"{path.name}: running the file raised {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    return module


def _check_names(module, name: str) -> None:
    missing = [n for n in REQUIRED if not hasattr(module, n)]
    if missing:
        raise ModelLoadError(
            f"{name} lacks {', '.join(missing)}: an adapter file defines {', '.join(REQUIRED)} "
            "(see the README, 'Your own model in 20 lines')"
        )
    if module.ARCH not in ARCHS:
        raise ModelLoadError(
            f"{name}: ARCH is {module.ARCH!r}; it must be one of {', '.join(map(repr, ARCHS))}"
        )
    for fn in ("load", "encode", "forward"):
        if not callable(getattr(module, fn)):
            raise ModelLoadError(f"{name}: {fn} must be a function")
    for vname in ("VOCAB", "TGT_VOCAB"):
        vocab = getattr(module, vname, None)
        if vocab is None and vname == "TGT_VOCAB":
            continue
        if not isinstance(vocab, (list, tuple)) or not vocab or not all(isinstance(t, str) for t in vocab):
            raise ModelLoadError(f"{name}: {vname} must be a non-empty list of token strings (id -> token)")
    for iname in ("PAD", "BOS", "EOS"):
        value = getattr(module, iname)
        if value is None and iname != "PAD":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(module.VOCAB):
            raise ModelLoadError(
                f"{name}: {iname} must be a token id between 0 and {len(module.VOCAB) - 1}, got {value!r}"
            )
    labels = getattr(module, "LABELS", None)
    if labels is not None:
        if ARCHS[module.ARCH] != "encoder":
            raise ModelLoadError(f"{name}: LABELS is for encoder classifiers (ARCH = 'encoder')")
        if not isinstance(labels, (list, tuple)) or not labels or not all(isinstance(t, str) for t in labels):
            raise ModelLoadError(f"{name}: LABELS must be a non-empty list of class names")
    if ARCHS[module.ARCH] == "seq2seq" and module.BOS is None:
        raise ModelLoadError(f"{name}: an encoder-decoder model needs BOS (the decoder input starts with it)")
    max_len = getattr(module, "MAX_LEN", None)
    if max_len is not None and (not isinstance(max_len, int) or max_len < 2):
        raise ModelLoadError(f"{name}: MAX_LEN must be an integer of at least 2, got {max_len!r}")


@dataclass
class AdapterModel:
    """A user's model run through its adapter file, with the common model interface."""

    name: str
    folder: Path | None
    path: Path
    module: Any
    model: nn.Module
    src_tok: AdapterTokens
    tgt_tok_: AdapterTokens
    facts: ModelFacts | None = None
    card: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    injectable = False  # masks and interventions go into core's own forward pass only
    masks_from_ids = True  # the model builds its masks from the ids: PAD content cannot be changed

    # -- facts ------------------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return ARCHS[self.module.ARCH]

    @property
    def cfg(self) -> ModelFacts:
        assert self.facts is not None, "checked at load"
        return self.facts

    @property
    def has_decoder(self) -> bool:
        return self.arch != "encoder"

    @property
    def tgt_tok(self) -> AdapterTokens | None:
        return self.tgt_tok_ if self.has_decoder else None

    @property
    def out_tok(self) -> AdapterTokens:
        """The vocabulary of forward's last axis."""
        return self.tgt_tok_ if self.has_decoder or getattr(self.module, "TGT_VOCAB", None) else self.src_tok

    @property
    def max_len(self) -> int | None:
        return getattr(self.module, "MAX_LEN", None)

    @property
    def max_src_tokens(self) -> int:
        return self.max_len or 10**9

    @property
    def labels(self) -> list[str]:
        """Class names of an encoder classifier (LABELS), else []."""
        return list(getattr(self.module, "LABELS", None) or [])

    @property
    def summary(self) -> str:
        return str(self.meta.get("summary", ""))

    @property
    def device(self) -> str:
        return str(next(self.model.parameters(), torch.empty(0)).device)

    def to(self, device: str) -> AdapterModel:
        other = copy.copy(self)
        other.model = copy.deepcopy(self.model).to(resolve_device(device)).eval()
        return other

    def audit_facts(self) -> dict[str, Any]:
        m = self.module
        skip = {i for i in (m.PAD, m.BOS, m.EOS) if i is not None}
        return {
            "pad_id": m.PAD,
            "skip_ids": skip,
            "vocab": (
                len(self.src_tok) if self.arch != "decoder" else None,
                len(self.out_tok) if self.has_decoder else None,
            ),
            "max_len": self.max_len,
        }

    # -- input ------------------------------------------------------------------------------------
    def _ids(self, fn, text: str, what: str, vocab: int, truncate: bool) -> Prepared:
        if text is None or not str(text).strip():
            raise InputError(f"the {what} text is empty: type some text for the model to read")
        try:
            ids = [int(i) for i in fn(text)]
        except Exception as exc:  # the user's encode: any error is a message about the text
            raise InputError(f"the {what} cannot be encoded: {type(exc).__name__}: {_one_line(exc)}") from exc
        if not ids:
            raise InputError(f"the {what} has no tokens the model can read")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise InputError(f"encode returned id {bad[0]}, outside the vocabulary of {vocab} tokens")
        warnings = []
        limit = self.max_len - (1 if what == "target" else 0) if self.max_len else None
        if limit and len(ids) > limit:
            if not truncate:
                raise InputError(f"the {what} has {len(ids)} tokens; this model takes at most {limit}")
            warnings.append(f"{what} truncated from {len(ids)} to {limit} tokens (MAX_LEN)")
            ids = ids[:limit]
        return Prepared(ids, warnings)

    def prepare(self, text: str, truncate: bool = False) -> Prepared:
        return self._ids(self.module.encode, text, "input", len(self.src_tok), truncate)

    def prepare_target(self, text: str, truncate: bool = False) -> Prepared:
        if not self.has_decoder:
            raise InputError("this model has no decoder, so it takes no target text")
        fn = getattr(self.module, "encode_target", None) or self.module.encode
        return self._ids(fn, text, "target", len(self.tgt_tok_), truncate)

    # -- running ----------------------------------------------------------------------------------
    def _forward(self, src, tgt) -> torch.Tensor:
        """The user's forward -> probabilities (B, L, V), its shape checked."""
        try:
            out = self.module.forward(self.model, src, tgt)
        except Exception as exc:
            raise InputError(
                f"forward(model, src, tgt) raised {type(exc).__name__}: {_one_line(exc)}"
            ) from exc
        ref = tgt if tgt is not None else src
        if self.labels:  # a classifier: one distribution over LABELS per sequence
            want = f"[{ref.shape[0]}, {len(self.labels)}] (one score per LABELS entry)"
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (ref.shape[0], len(self.labels)):
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise InputError(f"forward returned {got}; a classifier must return {want}")
            return _as_probs(out.detach().float())
        want = f"[{ref.shape[0]}, {ref.shape[1]}, {len(self.out_tok)}]"
        if not isinstance(out, torch.Tensor) or out.dim() != 3 or tuple(out.shape[:2]) != tuple(ref.shape):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise InputError(f"forward returned {got}; it must return logits or probabilities {want}")
        if out.shape[2] != len(self.out_tok):
            raise InputError(
                f"forward returned {tuple(out.shape)}: its last axis must be the vocabulary, {want}"
            )
        return _as_probs(out.detach().float())

    def forward_outputs(self, src, tgt, src_real=None, tgt_real=None) -> dict[str, torch.Tensor]:
        """Output probabilities at every position (the model builds its masks from the ids)."""
        with torch.no_grad():
            probs = self._forward(src if self.arch != "decoder" else None, tgt if self.has_decoder else None)
        if self.labels:  # one output per sequence: seen from every position, so position checks apply
            probs = probs[:, None, :].expand(-1, src.shape[1], -1)
        return {"dec" if self.has_decoder else "enc": probs}

    @torch.no_grad()
    def _greedy(self, src: torch.Tensor) -> list[list[int]]:
        """Seq2seq: decoder inputs of greedy decoding ([BOS] + every generated token but the last)."""
        m = self.module
        limit = min(MAX_NEW_TOKENS, (self.max_len or MAX_NEW_TOKENS + 1) - 1)
        rows = [[m.BOS] for _ in range(src.shape[0])]
        done = [False] * src.shape[0]
        for _ in range(limit):
            tgt, _ = pad_rows(rows, m.PAD, src.device)
            nxt = self._forward(src, tgt)[:, -1].argmax(-1).tolist()
            for i, t in enumerate(nxt):
                rows[i].append(m.PAD if done[i] else t)
                done[i] = done[i] or t in (m.EOS, m.PAD)  # PAD: the model says it is done
            if all(done):
                break
        out = []
        for r in rows:
            new = r[1:]
            if m.PAD in new:  # a generated PAD ends the output (it is not kept: the model would mask it)
                new = new[: new.index(m.PAD)] + [m.PAD]
            if m.EOS in new:
                new = new[: new.index(m.EOS) + 1]
            out.append([m.BOS] + new[:-1])
        return out

    @torch.no_grad()
    def _continue(self, ids: list[int]) -> list[int]:
        """Decoder only: greedy continuation of one prompt (up to and including EOS)."""
        m = self.module
        room = min(MAX_NEW_TOKENS, (self.max_len or 10**9) - len(ids))
        new: list[int] = []
        for _ in range(max(room, 0)):
            seq = torch.tensor([ids + new], device=self.device)
            t = int(self._forward(None, seq)[0, -1].argmax())
            if t == m.PAD:  # the model says it is done; PAD is never part of a sequence
                break
            new.append(t)
            if t == m.EOS:
                break
        return new

    def trace(self, sources, targets=None, truncate=False, masks=None, interv=None) -> list[AttentionTrace]:
        if not sources:
            raise InputError("no input text given")
        if masks is not None or (interv is not None and interv.active):
            raise InputError("custom masks and interventions work on core models only, not on adapter models")
        check_trace_budget(0, len(sources))
        prepared = [self.prepare(s, truncate) for s in sources]
        tp = None if targets is None else prepare_targets(self, prepared, targets, truncate)
        return self._trace_ids(prepared, tp, teacher=tp is not None)

    def trace_continuation(self, sources: list[str], truncate: bool = False) -> list[AttentionTrace]:
        if self.arch != "decoder":
            raise InputError("only decoder-only models continue a prompt; use trace() for this model")
        if not sources:
            raise InputError("no input text given")
        check_trace_budget(0, len(sources))
        prepared = [self.prepare(s, truncate) for s in sources]
        conts = [Prepared(self._continue(p.ids)) for p in prepared]
        traces = self._trace_ids(prepared, conts, teacher=False)
        return [
            t.replace(meta={**t.meta, "generated": len(c.ids)}) for t, c in zip(traces, conts, strict=True)
        ]

    def _trace_ids(
        self, prepared: list[Prepared], tp: list[Prepared] | None, teacher: bool
    ) -> list[AttentionTrace]:
        m, dev = self.module, self.device
        src = src_real = tgt = tgt_real = None
        if self.arch == "decoder":
            rows = [p.ids + (tp[i].ids if tp else []) for i, p in enumerate(prepared)]
            if self.max_len and max(map(len, rows)) > self.max_len:
                raise InputError(f"prompt and target together exceed the model's {self.max_len} tokens")
            tgt, tgt_real = pad_rows(rows, m.PAD, dev)
        else:
            src, src_real = pad_rows([p.ids for p in prepared], m.PAD, dev)
            if self.arch == "seq2seq":
                rows = [[m.BOS] + t.ids for t in tp] if tp else self._greedy(src)
                tgt, tgt_real = pad_rows(rows, m.PAD, dev)
        s_len = 0 if src is None else src.shape[1]
        t_len = 0 if tgt is None else tgt.shape[1]
        n_enc, n_dec, heads = (
            (self.facts.n_enc_layers, self.facts.n_dec_layers, self.facts.n_heads)
            if self.facts
            else (1, 1, 1)
        )
        check_trace_budget(trace_bytes(n_enc, n_dec, heads, len(prepared), s_len, t_len), len(prepared))
        start = time.perf_counter()
        with torch.no_grad(), capture_attention(self.model, lengths=[n for n in (s_len, t_len) if n]) as cap:
            probs = self._forward(src, tgt)
        ms = (time.perf_counter() - start) * 1000
        stacks = self._stacks(cap, s_len, t_len)
        src_side = None if src is None else Side(src, src_real, self.src_tok.tokens)
        tgt_side = None if tgt is None else Side(tgt, tgt_real, self.tgt_tok_.tokens)
        sources = {k: s for k, s in self._mask_sources(cap).items() if k in stacks}
        traces = []
        for i, p in enumerate(prepared):
            meta = {"forward_ms": round(ms, 3), "teacher_forced": teacher, "warnings": list(p.warnings),
                    "kind": "adapter", "arch": self.arch, "has_scores": True, "mask_sources": sources}  # fmt: skip
            if cap.notes:
                meta["capture_notes"] = cap.notes[:5]
            if self.labels:  # a classifier: the class and its distribution, like core classifiers
                k = int(probs[i].argmax())
                meta["labels"] = self.labels
                text = self.labels[k]
                fields = {"out_tokens": (self.labels[k],), "out_probs": probs[i].cpu().numpy()}
            else:
                fields = prediction_fields(probs[i], self.out_tok.tokens)
                guesses = fields["topk_ids"][:, 0]
                n_real = int((tgt_real if tgt is not None else src_real)[i].sum())
                if self.arch == "decoder":
                    n_prompt = len(p.ids)
                    meta.update(prompt_len=n_prompt, decoder_only=True)
                    if tp and teacher:
                        text = self.out_tok.decode(guesses[n_prompt - 1 : n_real - 1])
                    elif tp:  # a continuation: the generated tokens
                        text = self.out_tok.decode(tp[i].ids)
                    else:
                        text = self.out_tok.decode(guesses[n_prompt - 1 : n_prompt])
                else:
                    ids = list(guesses[:n_real])
                    if self.arch == "seq2seq" and m.EOS is not None and m.EOS in ids:
                        ids = ids[: ids.index(m.EOS)]
                    text = self.out_tok.decode(ids)
            traces.append(
                package_trace(
                    i,
                    model=self.name,
                    config_name="adapter",
                    device=dev,
                    src=src_side,
                    tgt=tgt_side,  # None for encoders
                    maps=stacks,
                    output_text=text,
                    meta=meta,
                    **fields,
                )  # fmt: skip
            )
        return traces

    def _mask_sources(self, cap: Captured) -> dict[str, str]:
        out: dict[str, str] = {}
        for r in cap.records:
            kind = self._kind(r)
            out.setdefault(kind, r.mask_source or "none")
        return out

    def _kind(self, record) -> str:
        return {"encoder": "enc_self", "decoder": "dec_self"}.get(self.arch, record.kind)

    def _stacks(self, cap: Captured, s_len: int, t_len: int) -> dict[str, tuple]:
        """kind -> (probs (B, layer, H, q, k), scores or None, mask (B, q, k)), checked against the lengths."""
        want = {"enc_self": (s_len, s_len), "dec_self": (t_len, t_len), "cross": (t_len, s_len)}
        by_kind: dict[str, list] = {}
        for r in cap.records:
            kind = self._kind(r)
            if tuple(r.probs.shape[-2:]) != want[kind]:
                continue  # e.g. attention over something that is not this call's sequences
            by_kind.setdefault(kind, []).append(r)
        if not by_kind:
            raise InputError(
                "no attention found in the forward pass: attnscope records nn.MultiheadAttention, "
                "F.scaled_dot_product_attention and softmax over (B, H, q, k) or (B*H, q, k) scores"
                + (f" ({'; '.join(cap.notes[:2])})" if cap.notes else "")
            )
        out = {}
        for kind in KINDS:
            recs = by_kind.get(kind)
            if not recs:
                continue
            heads = {r.probs.shape[1] for r in recs}
            if len(heads) > 1:
                raise InputError(
                    f"{kind} layers have different head counts {sorted(heads)}; attnscope shows one head count per kind"
                )
            probs = torch.stack([r.probs for r in recs], 1)
            scores = None if any(r.scores is None for r in recs) else torch.stack([r.scores for r in recs], 1)
            first = recs[0].mask
            b, (q, k) = probs.shape[0], want[kind]
            mask = torch.ones(b, q, k, dtype=torch.bool) if first is None else first.cpu()
            out[kind] = (probs, scores, mask)
        return out

    @torch.no_grad()
    def predict(self, sources: list[str]) -> list[str]:
        if self.arch == "decoder":
            return [self.out_tok.decode(self._continue(self.prepare(s).ids)) for s in sources]
        return [t.output_text for t in self.trace(sources)]


def _as_probs(out: torch.Tensor) -> torch.Tensor:
    """Logits, log-probabilities or probabilities (B, L, V) -> probabilities."""
    sums = out.sum(-1)
    if bool(((out >= 0) & (out <= 1)).all()) and bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-3)):
        return out
    return torch.softmax(out, dim=-1)  # logits; log-probabilities give the same probabilities


def _examples(module, tok: AdapterTokens) -> list[str]:
    given = [str(e) for e in getattr(module, "EXAMPLES", None) or [] if str(e).strip()]
    if given:
        return given
    plain = [
        t
        for i, t in enumerate(tok.itos)
        if i not in tok.specials and t.strip() and not t.startswith(SPECIAL_SHAPES)
    ]
    sep = "" if tok.kind == "char" else " "
    return [sep.join(plain[:5]), sep.join(plain[5:8] or plain[:3])]


def load_adapter(path: str | Path, name: str | None = None, device: str = "cpu") -> AdapterModel:
    """Run an adapter file, build its model and check it once on its examples."""
    path = Path(path).expanduser().resolve()
    if not path.is_file() or path.suffix != ".py":
        raise ModelLoadError(f"{path} is not a Python adapter file")
    module = _import(path)
    _check_names(module, path.name)
    try:
        model = module.load()
    except Exception as exc:
        raise ModelLoadError(f"{path.name}: load() raised {type(exc).__name__}: {_one_line(exc)}") from exc
    if not isinstance(model, nn.Module):
        raise ModelLoadError(
            f"{path.name}: load() returned {type(model).__name__}; it must return a torch.nn.Module"
        )
    model = model.eval().to(resolve_device(device))
    specials = {i for i in (module.PAD, module.BOS, module.EOS) if i is not None}
    src_tok = AdapterTokens(module.VOCAB, module.encode, specials)
    tgt_vocab = getattr(module, "TGT_VOCAB", None) or module.VOCAB
    tgt_tok = AdapterTokens(tgt_vocab, getattr(module, "encode_target", None) or module.encode, specials)
    doc = (module.__doc__ or "").strip()
    arch = ARCHS[module.ARCH]
    examples = _examples(module, src_tok)
    meta = {
        "kind": "adapter",
        "arch": arch,
        "source": str(path),
        "summary": (doc.splitlines()[0] if doc else f"adapter {path.name} ({module.ARCH})")[:200],
        "examples": examples,
    }
    lm = AdapterModel(name or path.stem, path.parent, path, module, model, src_tok, tgt_tok,
                      card=f"# {path.name}\n\n{doc}\n" if doc else f"# {path.name}\n", meta=meta)  # fmt: skip
    try:
        probe = lm.trace(examples[:2], truncate=True)
    except InputError as exc:
        raise ModelLoadError(f"{path.name}: checking the model on {examples[:2]!r} failed: {exc}") from exc
    tr = probe[0]
    n_heads = max(tr.probs(k).shape[1] for k in tr.kinds)
    d_model = next((mod.embedding_dim for mod in model.modules() if isinstance(mod, nn.Embedding)), 0)
    lm.facts = ModelFacts(
        name=lm.name,
        model_type="adapter",
        arch=arch,
        d_model=int(d_model),
        n_heads=int(n_heads),
        n_enc_layers=tr.probs("enc_self").shape[0] if "enc_self" in tr.kinds else 0,
        n_dec_layers=max((tr.probs(k).shape[0] for k in ("dec_self", "cross") if k in tr.kinds), default=0),
        src_vocab_size=len(src_tok),
        tgt_vocab_size=len(tgt_tok),
        max_len=int(lm.max_len or 0),
        pad_id=int(module.PAD),
        bos_id=-1 if module.BOS is None else int(module.BOS),
        eos_id=-1 if module.EOS is None else int(module.EOS),
        pos_encoding="unknown",
        n_classes=len(lm.labels),
    )
    lm.meta["kinds_found"] = list(tr.kinds)
    return lm
