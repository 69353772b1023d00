"""Train one zoo model on CPU: ``python -m models.train --task NAME [--seed S] [--minutes M] [--out DIR]``.

Examples are drawn fresh every step from the task's seeded generator (models/tasks.py).
Adam with the paper's schedule (linear warm-up, then 1/sqrt(step) decay), cross-entropy
that ignores PAD. Every ``eval_every`` steps the model decodes a validation set
(VAL_SEED); training stops when it gets >= 99.8% right or the time budget is spent. The
best checkpoint is then measured on 1,000 held-out examples (EVAL_SEED) and saved with
core.checkpoint.save together with card.md and meta.json.

Data format (what core.runner.LoadedModel uses at inference):
source = text tokens + [EOS] (no BOS); decoder input = [BOS] + target; labels = target + [EOS]; PAD = 0.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from core import checkpoint
from core.config import TransformerConfig
from core.decode import greedy_decode
from core.model import Transformer, count_parameters
from core.tokenizer import CharTokenizer, Tokenizer, WordTokenizer
from models import tasks as T

ZOO = Path(__file__).resolve().parent
TARGET_VAL = 0.998  # stop when the validation set is this right (99.5% left too little margin on held-out)
N_VAL = 1000
N_HELDOUT = 1000


@dataclass(frozen=True)
class Recipe:
    """How one task's model is built and trained."""

    model: dict[str, Any]  # TransformerConfig fields (vocab sizes and max_len are filled in)
    batch: int = 128
    lr: float = 1e-3  # peak learning rate, reached at the end of warm-up
    warmup: int = 400  # steps of linear warm-up; then lr * sqrt(warmup / step) (paper, 5.3)
    label_smoothing: float = 0.0
    eval_every: int = 250
    curriculum: tuple[int, ...] = ()  # max source lengths to step through (classifier only)
    extra: dict[str, Any] = field(default_factory=dict)


_S2S = dict(n_heads=4, n_enc_layers=2, n_dec_layers=2, dropout=0.0, norm="pre")
RECIPES: dict[str, Recipe] = {
    "reverse": Recipe(dict(_S2S, d_model=64, d_ff=256)),
    "sort": Recipe(dict(_S2S, d_model=64, d_ff=256)),
    "numbers": Recipe(dict(_S2S, d_model=64, d_ff=256)),
    "dates": Recipe(dict(_S2S, d_model=96, d_ff=384)),
    "brackets": Recipe(
        dict(n_heads=4, n_enc_layers=4, n_dec_layers=0, d_model=128, d_ff=512, dropout=0.0,
             norm="pre", pos_encoding="learned", n_classes=2, pooling="mean"),
        batch=128, lr=1e-3, warmup=500, curriculum=(10, 20, 30, 40),
    ),
}


# -- data --------------------------------------------------------------------------------


def tokenizers(task: T.Task) -> tuple[Tokenizer, Tokenizer | None]:
    src = CharTokenizer(task.src_tokens)
    if task.kind == "classify":
        return src, None
    tgt = (WordTokenizer if task.tgt_level == "word" else CharTokenizer)(task.tgt_tokens)
    return src, tgt


def _pad(rows: list[list[int]], pad: int = 0) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def encode_batch(
    task: T.Task, examples: list[T.Example], src_tok: Tokenizer, tgt_tok: Tokenizer | None, eos: int = 2
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> src (B, S) = tokens + EOS; then decoder input (B, T) = BOS + target and labels
    (B, T) = target + EOS for seq2seq, or class ids (B,) and None for a classifier."""
    src = _pad([src_tok.encode(s) + [eos] for s, _ in examples])
    if task.kind == "classify":
        return src, torch.tensor([task.labels.index(t) for _, t in examples]), None
    tgt = [tgt_tok.encode(t) for _, t in examples]
    return src, _pad([[1] + t for t in tgt]), _pad([t + [eos] for t in tgt])


# -- measuring ---------------------------------------------------------------------------


@torch.no_grad()
def predict(model: Transformer, task: T.Task, sources: list[str], src_tok: Tokenizer,
            tgt_tok: Tokenizer | None, batch: int = 500) -> list[str]:
    """Batched greedy decoding (or argmax class) -> output texts."""
    model.eval()
    outs: list[str] = []
    for i in range(0, len(sources), batch):
        chunk = sources[i : i + batch]
        src = _pad([src_tok.encode(s) + [model.cfg.eos_id] for s in chunk])
        if task.kind == "classify":
            outs += [task.labels[k] for k in model(src).logits.argmax(-1).tolist()]
        else:
            res = greedy_decode(model, src)
            outs += [tgt_tok.decode(row) for row in res.out_ids.tolist()]
    return outs


def accuracy(model: Transformer, task: T.Task, examples: list[T.Example], src_tok, tgt_tok) -> float:
    preds = predict(model, task, [s for s, _ in examples], src_tok, tgt_tok)
    return sum(T.check(task.name, s, p) for (s, _), p in zip(examples, preds, strict=True)) / len(examples)


# -- training ----------------------------------------------------------------------------


def lr_at(step: int, recipe: Recipe) -> float:
    """Paper's schedule with an explicit peak: linear warm-up, then inverse square root."""
    step = max(step, 1)
    return recipe.lr * min(step / recipe.warmup, math.sqrt(recipe.warmup / step))


def build_config(task: T.Task, recipe: Recipe, src_tok: Tokenizer, tgt_tok: Tokenizer | None) -> TransformerConfig:
    longest = max(task.max_src, task.max_tgt) + 1  # + EOS
    return TransformerConfig(
        name=f"zoo-{task.name}",
        src_vocab_size=len(src_tok),
        tgt_vocab_size=len(tgt_tok) if tgt_tok is not None else len(src_tok),
        share_vocab=False,
        max_len=longest + 3,  # a little room: greedy_decode runs up to max_len - 1 steps
        **recipe.model,
    )


def train(task_name: str, seed: int, minutes: float, out: Path, log=print, threads: int = 1) -> dict[str, Any]:
    if seed in T.RESERVED_SEEDS:
        raise SystemExit(f"seed {seed} is reserved for validation/evaluation; pick another")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    task, recipe = T.get(task_name), RECIPES[task_name]
    rng = random.Random(seed)
    src_tok, tgt_tok = tokenizers(task)
    cfg = build_config(task, recipe, src_tok, tgt_tok)
    model = Transformer(cfg)
    log(f"[{task.name}] {count_parameters(model):,} parameters; config {json.dumps(recipe.model)}")
    opt = torch.optim.Adam(model.parameters(), lr=recipe.lr, betas=(0.9, 0.98), eps=1e-9)
    val = T.generate(task.name, N_VAL, T.VAL_SEED)
    levels = list(recipe.curriculum) or [None]
    level = 0
    best_acc, best_state, best_step = -1.0, None, 0
    start = time.perf_counter()
    step = 0
    while True:
        step += 1
        limit = levels[level]
        examples = [task.sample(rng) if limit is None else task.sample(rng, limit) for _ in range(recipe.batch)]
        src, y_in, y_out = encode_batch(task, examples, src_tok, tgt_tok, cfg.eos_id)
        model.train()
        if task.kind == "classify":
            logits = model(src).logits
            loss = F.cross_entropy(logits, y_in, label_smoothing=recipe.label_smoothing)
        else:
            logits = model(src, y_in).logits
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y_out.reshape(-1),
                ignore_index=cfg.pad_id, label_smoothing=recipe.label_smoothing,
            )
        for g in opt.param_groups:
            g["lr"] = lr_at(step, recipe)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        elapsed = (time.perf_counter() - start) / 60
        out_of_time = elapsed >= minutes
        if step % recipe.eval_every == 0 or out_of_time:
            acc = accuracy(model, task, val, src_tok, tgt_tok)
            at_full = level == len(levels) - 1
            log(f"step {step:6d}  {elapsed:5.2f} min  loss {loss.item():.4f}  lr {lr_at(step, recipe):.2e}  "
                f"val {acc:.4f}  max_len {limit or 'all'}")
            if at_full and acc > best_acc:
                best_acc, best_state, best_step = acc, copy.deepcopy(model.state_dict()), step
            if at_full and acc >= TARGET_VAL:
                break
            if not at_full:
                part = [e for e in val if len(e[0]) <= limit]
                if accuracy(model, task, part, src_tok, tgt_tok) >= 0.98:
                    level += 1
                    log(f"curriculum: now up to {levels[level] or 'all'} characters")
            sys.stdout.flush()
        if out_of_time:
            break
    train_minutes = (time.perf_counter() - start) / 60
    if best_state is not None:
        model.load_state_dict(best_state)
    heldout = T.generate(task.name, N_HELDOUT, T.EVAL_SEED)
    acc = accuracy(model, task, heldout, src_tok, tgt_tok)
    log(f"[{task.name}] best val {best_acc:.4f} at step {best_step}; held-out {acc:.4f} "
        f"({N_HELDOUT} examples, seed {T.EVAL_SEED}); {train_minutes:.2f} min, {step} steps")
    overlap = overlap_with_training(task, seed, heldout, step * recipe.batch)
    meta = make_meta(task, seed, train_minutes, step, best_step, acc)
    card = make_card(task, recipe, cfg, model, seed, train_minutes, step, best_step, best_acc, acc, overlap)
    checkpoint.save(out, model, src_tok, tgt_tok, card=card, meta=meta)
    log(f"saved {out}")
    return meta


def overlap_with_training(task: T.Task, seed: int, heldout: list[T.Example], n_seen: int) -> float:
    """Share of held-out sources that also occur in (up to 200k of) the training stream."""
    rng = random.Random(seed)
    seen = {task.sample(rng)[0] for _ in range(min(n_seen, 200_000))}
    return sum(s in seen for s, _ in heldout) / len(heldout)


# -- card and meta -----------------------------------------------------------------------


def make_meta(task: T.Task, seed: int, minutes: float, steps: int, best_step: int, acc: float) -> dict[str, Any]:
    metric = "heldout_accuracy" if task.kind == "classify" else "heldout_exact_match"
    meta: dict[str, Any] = {
        "task": task.name,
        "summary": task.summary,
        "metrics": {metric: round(acc, 4), "n_heldout": N_HELDOUT, "eval_seed": T.EVAL_SEED},
        "train": {
            "seed": seed,
            "minutes": round(minutes, 2),
            "steps": steps,
            "best_step": best_step,
            "device": f"cpu (2 cores, {torch.get_num_threads()} torch thread{'s' if torch.get_num_threads() > 1 else ''})",
            "val_seed": T.VAL_SEED,
        },
    }
    if task.kind == "classify":
        meta["labels"] = list(task.labels)
    return meta


def make_card(task, recipe, cfg, model, seed, minutes, steps, best_step, best_val, acc, overlap) -> str:
    metric = "accuracy" if task.kind == "classify" else "exact match"
    shape = (f"encoder-only classifier, {cfg.n_enc_layers} layers, {cfg.pooling} pooling, labels {list(task.labels)}"
             if task.kind == "classify" else
             f"encoder-decoder, {cfg.n_enc_layers} + {cfg.n_dec_layers} layers")
    fields = ", ".join(f"{k}={v}" for k, v in recipe.model.items())
    sched = (f"Adam (0.9, 0.98, eps 1e-9), peak lr {recipe.lr:g} after {recipe.warmup} warm-up steps then "
             f"1/sqrt(step) decay, batch {recipe.batch}, gradient clip 1.0, label smoothing {recipe.label_smoothing:g}")
    if recipe.curriculum:
        sched += f", curriculum over source length {list(recipe.curriculum)} (next level at 98% on the validation part)"
    return f"""# {task.name}

{task.summary[0].upper() + task.summary[1:]}.

## Right attention
{task.attention}

## Model
{shape}; {count_parameters(model):,} parameters.
Config: {fields}, max_len={cfg.max_len}, vocab {cfg.src_vocab_size} source / {cfg.tgt_vocab_size if not cfg.is_encoder_only else '-'} target.

## Data
Generator `models.tasks.{task.sample.__name__}` (exact checker `models.tasks.{task.answer.__name__}`),
fresh examples every step from `random.Random({seed})`: {steps:,} steps x {recipe.batch} = {steps * recipe.batch:,} examples seen.
Early stopping at {TARGET_VAL:.1%} right on {N_VAL:,} validation examples (seed {T.VAL_SEED}); held-out set: {N_HELDOUT:,} examples (seed {T.EVAL_SEED}).
Held-out sources that also occur in the training stream: {overlap:.1%} (mostly the shortest inputs, which are few).

## Training
{sched}. Source = tokens + EOS; decoder input = BOS + target; labels = target + EOS; loss ignores PAD.
Stopped at step {steps:,} after {minutes:.1f} minutes on a 2-core CPU shared with other jobs (torch threads: {torch.get_num_threads()}); kept step {best_step:,}
(validation {metric} {best_val:.2%}). Seed {seed}.

## Result
Held-out {metric}: **{acc:.2%}** on {N_HELDOUT:,} examples (eval seed {T.EVAL_SEED}, greedy decoding).

## Reproduce
`python -m models.train --task {task.name} --seed {seed}`
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.train", description=__doc__.splitlines()[0])
    p.add_argument("--task", required=True, choices=sorted(T.TASKS))
    p.add_argument("--seed", type=int, default=T.TRAIN_SEED)
    p.add_argument("--minutes", type=float, default=14.0, help="training time budget (default 14)")
    p.add_argument("--out", type=Path, default=None, help="model folder (default models/<task>)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a 2-core CPU shared with other jobs, 2 threads "
                   "were 5-10x slower per step than 1)")
    args = p.parse_args(argv)
    train(args.task, args.seed, args.minutes, args.out or ZOO / args.task,
          log=lambda m: print(m, flush=True), threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
