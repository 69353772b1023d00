"""Every committed zoo model: loads, is big enough to be interesting, small enough to ship,
and still gets its held-out set right from the committed weights."""

from __future__ import annotations

import json

import pytest
import torch

from attnscope.core.families.interface import pad_rows
from attnscope.core.transformer import checkpoint
from attnscope.core.transformer.decode import greedy_decode
from attnscope.models import registry, train
from attnscope.models import tasks as T

NAMES = list(registry.ORDER)  # every zoo model must be there: a missing folder fails, never skips
MAX_FOLDER_BYTES = 3 * 2**20  # the model itself (config, weights, vocabularies, card)
MAX_SNAPSHOT_BYTES = 12 * 2**20  # its training snapshots (float16)
N_HELDOUT = 1000

HAND = {
    "reverse": [
        ("hello", "olleh"),
        ("attention", "noitnetta"),
        ("a", "a"),
        ("abcdefghijklmnopqrst", "tsrqponmlkjihgfedcba"),
        ("aaaaaaaaaabbbbbbbbbb", "bbbbbbbbbbaaaaaaaaaa"),
    ],
    "sort": [
        ("3141", "1134"),
        ("9876543210", "0123456789"),
        ("5", "5"),
        ("99999999990000000000", "00000000009999999999"),
        ("11111111111111111111", "11111111111111111111"),
    ],
    "dates": [
        ("21 Nov 2026", "2026-11-21"),
        ("21/11/2026", "2026-11-21"),
        ("November 21, 2026", "2026-11-21"),
        ("Saturday, 21 November 2026", "2026-11-21"),
        ("2026年11月21日", "2026-11-21"),
        ("1/2/1900", "1900-02-01"),
    ],
    "numbers": [
        ("1987", "one thousand nine hundred eighty-seven"),
        ("0", "zero"),
        ("999999", "nine hundred ninety-nine thousand nine hundred ninety-nine"),
        ("100100", "one hundred thousand one hundred"),
        ("15", "fifteen"),
    ],
    "brackets": [
        ("([]{})", "balanced"),
        ("([)]", "unbalanced"),
        ("((", "unbalanced"),
        ("{[()()]}[]", "balanced"),
    ],
}


def test_every_zoo_model_is_committed():
    missing = [n for n in NAMES if not (registry.ZOO_DIR / n / checkpoint.CONFIG).is_file()]
    assert not missing, f"zoo models missing from models/: {missing}"
    assert registry.zoo_names()[: len(NAMES)] == NAMES and registry.DEFAULT_MODEL in NAMES


@pytest.fixture(scope="module", params=NAMES)
def loaded(request):
    torch.set_num_threads(1)
    return registry.load(request.param)


def test_folder_complete_and_small(loaded):
    files = {p.name: p.stat().st_size for p in loaded.folder.iterdir() if p.is_file()}
    needed = {checkpoint.CONFIG, checkpoint.WEIGHTS, checkpoint.SRC_VOCAB, checkpoint.CARD, checkpoint.META}
    if loaded.has_decoder:
        needed.add(checkpoint.TGT_VOCAB)
    assert needed <= set(files)
    assert sum(files.values()) < MAX_FOLDER_BYTES
    snaps = sum(p.stat().st_size for p in (loaded.folder / registry.RUN).rglob("*") if p.is_file())
    assert 0 < snaps < MAX_SNAPSHOT_BYTES


def test_loads_both_ways_and_is_big_enough(loaded):
    cfg, model, src_tok, tgt_tok, card, meta = checkpoint.load_parts(loaded.folder)
    assert cfg == loaded.cfg and len(src_tok) == cfg.src_vocab_size
    assert cfg.n_enc_layers >= 2 and cfg.n_heads >= 4
    if cfg.is_encoder_only:
        assert cfg.n_classes == len(meta["labels"]) == 2
    else:
        assert cfg.n_dec_layers >= 2 and len(tgt_tok) == cfg.tgt_vocab_size
    task = T.get(loaded.name)
    assert cfg.max_len > max(task.max_src, task.max_tgt) + 1  # room for EOS in source and output


def test_meta_and_card(loaded):
    meta = json.loads((loaded.folder / checkpoint.META).read_text())
    assert meta["task"] == loaded.name and meta["summary"]
    metric = "heldout_accuracy" if meta["task"] == "brackets" else "heldout_exact_match"
    assert meta["metrics"]["n_heldout"] == N_HELDOUT and meta["metrics"]["eval_seed"] == T.EVAL_SEED
    assert meta["metrics"][metric] >= 0.99
    assert "training never draws one" in meta["metrics"]["heldout"]
    assert {"seed", "minutes", "steps", "device", "command"} <= set(meta["train"])
    assert meta["train"]["steps"] == train.RECIPES[loaded.name].steps  # a fixed step count, not a time budget
    assert meta["train"]["seed"] not in T.RESERVED_SEEDS
    if loaded.name == "brackets":
        assert meta["labels"] == ["unbalanced", "balanced"]
    assert f"python -m attnscope.models.train --task {loaded.name}" in loaded.card
    assert f"{meta['metrics'][metric]:.2%}" in loaded.card


@torch.no_grad()
def test_heldout_accuracy_from_committed_weights(loaded):
    """Re-measured exactly: the same never-seen inputs, the same number as the card (no slack)."""
    examples = T.heldout_set(loaded.name, N_HELDOUT)
    src = pad_rows([loaded.prepare(s).ids for s, _ in examples], 0)[0]  # text tokens + EOS, PAD = 0
    assert bool((src[:, 0] != loaded.cfg.bos_id).all())
    if loaded.has_decoder:
        out = greedy_decode(loaded.model, src).out_ids.tolist()
        preds = [loaded.tgt_tok.decode(row) for row in out]
    else:
        preds = [loaded.labels[k] for k in loaded.model(src).logits.argmax(-1).tolist()]
    acc = sum(T.check(loaded.name, s, p) for (s, _), p in zip(examples, preds, strict=True)) / N_HELDOUT
    metric = "heldout_accuracy" if loaded.name == "brackets" else "heldout_exact_match"
    assert acc >= 0.99
    assert round(acc, 4) == loaded.meta["metrics"][metric]  # the card's number is exactly this number
    assert f"**{acc:.2%}** on {N_HELDOUT:,} never-seen inputs" in loaded.card


def test_predict_hand_examples(loaded):
    sources, targets = zip(*HAND[loaded.name], strict=True)
    assert all(T.check(loaded.name, s, t) for s, t in HAND[loaded.name])
    preds = loaded.predict(list(sources))
    right = sum(p == t for p, t in zip(preds, targets, strict=True))
    # at most one miss in the hand-written set, and never on the first (the canonical example)
    assert preds[0] == targets[0] and right >= len(targets) - 1, list(zip(sources, preds, strict=True))
