"""Greedy decoding that records, step by step, what the new token attended to."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.model import Transformer


@dataclass(frozen=True)
class DecodeStep:
    """One decoding step for one sequence: the query is the last decoder input position."""

    token_id: int  # the token chosen at this step (argmax)
    prob: float  # its probability
    dec_self: torch.Tensor  # (layer, head, t+1): attention of the new position over the prefix
    cross: torch.Tensor  # (layer, head, S): its attention over the source


@dataclass(frozen=True)
class DecodeResult:
    ids: torch.Tensor  # (B, T) decoder input ids: BOS + generated tokens but the last, PAD after
    out_ids: torch.Tensor  # (B, T) generated ids incl. EOS at the end, PAD after
    lengths: list[int]  # generated tokens per sequence, EOS included
    steps: list[list[DecodeStep]] | None  # per sequence, per step (record=True)


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: torch.Tensor,
    max_len: int | None = None,
    record: bool = False,
) -> DecodeResult:
    """Generate argmax tokens until every sequence has produced EOS or max_len tokens.

    src: (B, S) ids. The encoder runs once; the decoder re-runs on the growing prefix,
    so the recorded attention of each step is exactly that of a full forward pass.
    """
    cfg = model.cfg
    max_len = min(max_len or cfg.max_len - 1, cfg.max_len - 1)
    b = src.shape[0]
    masks = model.make_masks(src)
    memory, _, _ = model.encode(src, masks.enc_self)
    ys = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(b, dtype=torch.bool, device=src.device)
    out_cols: list[torch.Tensor] = []
    steps: list[list[DecodeStep]] = [[] for _ in range(b)]
    for _ in range(max_len):
        m = model.make_masks(src, ys)
        hidden, self_maps, cross_maps = model.decode(ys, memory, m.dec_self, m.cross, return_attn=record)
        probs = model.generator(hidden[:, -1]).softmax(-1)  # (B, V)
        p, nxt = probs.max(-1)
        nxt = nxt.masked_fill(done, cfg.pad_id)
        if record:
            for i in range(b):
                if not done[i]:
                    steps[i].append(
                        DecodeStep(
                            token_id=int(nxt[i]),
                            prob=float(p[i]),
                            dec_self=self_maps.probs[i, :, :, -1].cpu(),  # (layer, head, t+1)
                            cross=cross_maps.probs[i, :, :, -1].cpu(),  # (layer, head, S)
                        )
                    )
        out_cols.append(nxt)
        done = done | (nxt == cfg.eos_id)
        if bool(done.all()):
            break
        ys = torch.cat([ys, nxt.masked_fill(nxt == cfg.eos_id, cfg.pad_id)[:, None]], dim=1)
    out_ids = torch.stack(out_cols, dim=1)  # (B, steps)
    lengths = []
    for i in range(b):
        row = out_ids[i].tolist()
        lengths.append(row.index(cfg.eos_id) + 1 if cfg.eos_id in row else sum(t != cfg.pad_id for t in row))
    t = max(lengths)
    dec_in = torch.full((b, t), cfg.pad_id, dtype=torch.long, device=src.device)
    dec_in[:, 0] = cfg.bos_id
    for i, n in enumerate(lengths):
        dec_in[i, 1:n] = out_ids[i, : n - 1]  # BOS + every generated token but the last
    return DecodeResult(ids=dec_in, out_ids=out_ids[:, :t], lengths=lengths, steps=steps if record else None)
