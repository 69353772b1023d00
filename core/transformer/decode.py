"""Greedy decoding: argmax tokens, one step at a time, until EOS."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnscope.core.transformer.model import Transformer


@dataclass(frozen=True)
class DecodeResult:
    ids: torch.Tensor  # (B, T) decoder input ids: BOS + generated tokens but the last, PAD after
    out_ids: torch.Tensor  # (B, T) generated ids incl. EOS at the end, PAD after
    lengths: list[int]  # generated tokens per sequence, EOS included


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: torch.Tensor,
    max_len: int | None = None,
) -> DecodeResult:
    """Generate argmax tokens until every sequence has produced EOS or max_len tokens.

    src: (B, S) ids. The encoder runs once; the decoder re-runs on the growing prefix.
    """
    cfg = model.cfg
    max_len = min(max_len or cfg.max_len - 1, cfg.max_len - 1)
    generator = model.decoder_parts()[2]
    b = src.shape[0]
    masks = model.make_masks(src)
    memory, _, _ = model.encode(src, masks.enc_self)
    ys = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(b, dtype=torch.bool, device=src.device)
    out_cols: list[torch.Tensor] = []
    for _ in range(max_len):
        m = model.make_masks(src, ys)
        if m.dec_self is None or m.cross is None:  # make_masks gives both when a decoder input is given
            raise ValueError("decoding needs the decoder's masks")
        hidden, _, _ = model.decode(ys, memory, m.dec_self, m.cross, return_attn=False)
        probs = generator(hidden[:, -1]).softmax(-1)  # (B, V)
        _, nxt = probs.max(-1)
        nxt = nxt.masked_fill(done, cfg.pad_id)
        out_cols.append(nxt)
        done = done | (nxt == cfg.eos_id)
        if bool(done.all()):
            break
        ys = torch.cat([ys, nxt.masked_fill(nxt == cfg.eos_id, cfg.pad_id)[:, None]], dim=1)
    out_ids = torch.stack(out_cols, dim=1)  # (B, steps)
    lengths = []
    for i in range(b):
        row = out_ids[i].tolist()
        # Up to EOS; a row that never wrote EOS ran every step (its PADs, if any, are what an
        # untrained model predicted, not padding), so all of it counts.
        lengths.append(row.index(cfg.eos_id) + 1 if cfg.eos_id in row else len(row))
    t = max(lengths)
    dec_in = torch.full((b, t), cfg.pad_id, dtype=torch.long, device=src.device)
    dec_in[:, 0] = cfg.bos_id
    for i, n in enumerate(lengths):
        dec_in[i, 1:n] = out_ids[i, : n - 1]  # BOS + every generated token but the last
    return DecodeResult(ids=dec_in, out_ids=out_ids[:, :t], lengths=lengths)
