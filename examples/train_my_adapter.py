"""Train the model of examples/my_adapter.py to reverse strings ("hello world" -> "dlrow olleh").

Seeded and CPU-only, a fixed number of steps: run it from anywhere and it rewrites
examples/my_adapter.safetensors beside the adapter file, then prints the held-out accuracy.

    .venv/bin/python examples/train_my_adapter.py
"""

import importlib.util
import random
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("my_adapter", HERE / "my_adapter.py")
ad = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ad)

STEPS, WARMUP, BATCH, LR = 3000, 300, 64, 1e-3
MIN_LEN, MAX_TEXT = 1, 20
CHARS = "".join(t for t in ad.VOCAB if len(t) == 1)  # a-z and space: VOCAB minus the specials
OUT = HERE / "my_adapter.safetensors"


def sample(rng: random.Random) -> str:
    return "".join(rng.choice(CHARS) for _ in range(rng.randint(MIN_LEN, MAX_TEXT)))


def pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [ad.PAD] * (width - len(r)) for r in rows])


def batch(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source = chars + EOS; decoder input = BOS + reversed chars; labels = reversed chars + EOS."""
    src = [ad.encode(t) for t in texts]
    rev = [ad.encode(t[::-1])[:-1] for t in texts]
    return pad(src), pad([[ad.BOS] + r for r in rev]), pad([r + [ad.EOS] for r in rev])


@torch.no_grad()
def greedy(model: nn.Module, texts: list[str]) -> list[str]:
    src = pad([ad.encode(t) for t in texts])
    tgt = torch.full((len(texts), 1), ad.BOS)
    for _ in range(ad.MAX_LEN - 1):
        nxt = model(src, tgt)[:, -1].argmax(-1, keepdim=True)
        tgt = torch.cat([tgt, nxt], dim=1)
        if (tgt == ad.EOS).any(dim=1).all():
            break
    out = []
    for row in tgt[:, 1:].tolist():
        row = row[: row.index(ad.EOS)] if ad.EOS in row else row
        out.append("".join(ad.VOCAB[i] for i in row))
    return out


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    rng = random.Random(0)
    model = ad.Model()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    warmup_then_decay = lambda s: min((s + 1) / WARMUP, max(0.05, 1 - s / STEPS))  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_then_decay)
    loss_fn = nn.CrossEntropyLoss(ignore_index=ad.PAD)
    start = time.perf_counter()
    model.train()
    for step in range(1, STEPS + 1):
        src, dec_in, labels = batch([sample(rng) for _ in range(BATCH)])
        loss = loss_fn(model(src, dec_in).flatten(0, 1), labels.flatten())
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 500 == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.perf_counter() - start:5.0f}s", flush=True)
    train_s = time.perf_counter() - start

    model.eval()
    test_rng = random.Random(1)  # a different seed from training
    held_out = [sample(test_rng) for _ in range(200)]
    hits = sum(p == t[::-1] for p, t in zip(greedy(model, held_out), held_out, strict=True))
    save_file({k: v.detach().float().contiguous() for k, v in model.state_dict().items()}, str(OUT))
    print(f"trained {STEPS} steps in {train_s:.0f}s")
    print(f"exact match on 200 held-out strings: {hits / 200:.1%}")
    print(f"wrote {OUT.name}: {OUT.stat().st_size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
