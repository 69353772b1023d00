"""Character- and word-level tokenizers with PAD/BOS/EOS/UNK, saved as JSON beside a model."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from attnscope.core.errors import TokenizerError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3 in every vocabulary


class Tokenizer:
    """Base: a fixed vocabulary, specials first. Subclasses define how text splits."""

    kind = "base"

    def __init__(self, tokens: Iterable[str]):
        vocab = list(SPECIALS) + [t for t in tokens if t not in SPECIALS]
        if len(set(vocab)) != len(vocab):
            raise TokenizerError("vocabulary has duplicate tokens")
        self.itos: list[str] = vocab
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(vocab)}

    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def __len__(self) -> int:
        return len(self.itos)

    # -- splitting ------------------------------------------------------------
    def split(self, text: str) -> list[str]:
        raise NotImplementedError

    def join(self, tokens: list[str]) -> str:
        raise NotImplementedError

    # -- encode / decode --------------------------------------------------------
    def unknown(self, text: str) -> list[str]:
        """Distinct pieces of text that are not in the vocabulary, in order of appearance."""
        seen: list[str] = []
        for piece in self.split(text):
            if piece not in self.stoi and piece not in seen:
                seen.append(piece)
        return seen

    def encode(self, text: str, strict: bool = True) -> list[int]:
        """Text -> ids (no BOS/EOS). strict: raise TokenizerError on unknown pieces, else UNK."""
        pieces = self.split(text)
        if strict:
            bad = [p for p in dict.fromkeys(pieces) if p not in self.stoi]
            if bad:
                shown = ", ".join(repr(p) for p in bad[:10])
                raise TokenizerError(f"not in the {self.kind} vocabulary: {shown}")
        return [self.stoi.get(p, self.unk_id) for p in pieces]

    def decode(self, ids: Iterable[int], strip_specials: bool = True) -> str:
        toks = []
        for i in ids:
            i = int(i)
            if strip_specials and i == self.eos_id:
                break
            if strip_specials and i in (self.pad_id, self.bos_id):
                continue
            toks.append(self.itos[i] if 0 <= i < len(self.itos) else UNK)
        return self.join(toks)

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """Ids -> token strings, specials kept (for axis labels)."""
        return [self.itos[int(i)] if 0 <= int(i) < len(self.itos) else UNK for i in ids]

    # -- persistence ------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"kind": self.kind, "tokens": self.itos}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n")

    @staticmethod
    def from_dict(data: dict) -> Tokenizer:
        if not isinstance(data, dict) or "tokens" not in data:
            raise TokenizerError("vocabulary file must be a JSON object with 'kind' and 'tokens'")
        cls = {"char": CharTokenizer, "word": WordTokenizer}.get(str(data.get("kind")))
        if cls is None:
            raise TokenizerError(f"unknown tokenizer kind {data.get('kind')!r}")
        tokens = data["tokens"]
        if list(tokens[: len(SPECIALS)]) != list(SPECIALS):
            raise TokenizerError("vocabulary must start with <pad>, <bos>, <eos>, <unk>")
        return cls(tokens[len(SPECIALS) :])

    @staticmethod
    def load(path: str | Path) -> Tokenizer:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TokenizerError(f"cannot read vocabulary {path}: {exc}") from exc
        return Tokenizer.from_dict(data)


class CharTokenizer(Tokenizer):
    """One token per Unicode code point."""

    kind = "char"

    def split(self, text: str) -> list[str]:
        return list(text)

    def join(self, tokens: list[str]) -> str:
        return "".join(tokens)

    @classmethod
    def fit(cls, texts: Iterable[str]) -> CharTokenizer:
        return cls(sorted({c for t in texts for c in t}))


class WordTokenizer(Tokenizer):
    """One token per whitespace-separated word."""

    kind = "word"

    def split(self, text: str) -> list[str]:
        return text.split()

    def join(self, tokens: list[str]) -> str:
        return " ".join(tokens)

    @classmethod
    def fit(cls, texts: Iterable[str]) -> WordTokenizer:
        return cls(sorted({w for t in texts for w in t.split()}))
