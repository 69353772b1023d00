"""``attnscope stats`` / ``python -m attnscope stats``: per-head statistics over a corpus (core/analysis/corpus.py).

One process:  python -m attnscope stats --model minilm --input-file lines.txt --out stats.parquet
Many:         torchrun --nproc_per_node=N -m attnscope stats --model minilm --input-file lines.txt --out stats.parquet
              (lines are sharded i mod N; sums reduced with torch.distributed: gloo on CPU, nccl on GPU;
              across machines add torchrun's --nnodes/--node_rank/--rdzv_endpoint flags)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path


def add_stats_command(sub) -> None:
    from attnscope.cli import model_args

    sp = sub.add_parser(
        "stats",
        help="per-head statistics over every line of a file, to Parquet (runs under torchrun too)",
        description=(__doc__ or "").split("\n\n")[0],
    )
    model_args(sp)
    sp.add_argument("--input-file", required=True, help="UTF-8 text, one input per line")
    sp.add_argument("--out", required=True, help="output .parquet file")
    sp.add_argument("--batch", type=int, default=32, help="inputs per forward pass (default 32)")
    sp.add_argument("--resume", action="store_true", help="continue an interrupted run from OUT.partial.json")
    sp.add_argument("--top-k", type=int, default=5, help="most atypical inputs kept per head and statistic")
    sp.set_defaults(fn=cmd_stats)


def _world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) when run alone."""
    return (
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_RANK", 0)),
    )


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def cmd_stats(args: argparse.Namespace) -> int:
    from attnscope.cli import CliError, _load, _writable
    from attnscope.core.analysis import corpus

    src, out = Path(args.input_file), Path(args.out)
    if out.suffix != ".parquet":
        raise CliError(f"--out must end in .parquet, got {out.name!r}")
    if not src.exists():
        raise CliError(f"input file {src} does not exist")
    if src.is_dir():
        raise CliError(f"input file {src} is a folder; give a text file, one input per line")
    if not src.is_file():
        raise CliError(f"input file {src} is not a regular file; give a text file, one input per line")
    _writable(out)
    if args.batch < 1 or args.top_k < 1:
        raise CliError("--batch and --top-k must be at least 1")
    rank, world, local = _world()
    device = args.device
    dist_on = world > 1
    if dist_on:
        import torch
        import torch.distributed as dist

        cuda = device in ("cuda", "auto") and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local)
            device = f"cuda:{local}"
        dist.init_process_group("nccl" if cuda else "gloo")
    try:
        lines = corpus.read_lines(src)
        if not any(line.strip() for line in lines):
            raise CliError(f"input file {src} has no text: give one input per line")
        lm = _load(args.model, device)
        meta = {"model": args.model, "input_file": src.name, "input_sha256": _file_digest(src),
                "n_lines": len(lines), "world": world}  # fmt: skip
        partial = out.with_name(out.name + (f".rank{rank}of{world}" if dist_on else "") + ".partial.json")
        shard = corpus.Shard(rank, world)
        bar = _progress(len(shard.mine(len(lines))), enabled=rank == 0, what=f"{args.model} stats")
        try:
            acc = corpus.run(
                lm, lines, batch=args.batch, shard=shard, partial=partial, resume=args.resume,
                progress=bar, meta=meta, top_k=args.top_k,
            )  # fmt: skip
        except ValueError as exc:  # a partial file from another run
            raise CliError(str(exc)) from exc
        except KeyboardInterrupt:
            print(f"error: interrupted; rerun with --resume to continue from {partial.name}", file=sys.stderr)
            return 130
        finally:
            bar(None, None)
        total = corpus.reduce(acc, shard)
        if total is not None and total.n_inputs == 0:  # nothing to write: no file is left behind
            partial.unlink(missing_ok=True)
            why = ", ".join(f"{n} {reason}" for reason, n in sorted(total.skipped.items())) or "none read"
            raise CliError(
                f"no line of {src.name} could be used, so there are no statistics (lines skipped: {why})"
            )
        if total is not None:
            frame = corpus.write(total, lines, out, meta)
            skipped = ", ".join(f"{n} {why}" for why, n in sorted(total.skipped.items())) or "none"
            print(
                f"wrote {out}: {total.n_inputs:,} inputs, {len(frame):,} rows "
                f"({frame['kind'].nunique()} kinds x layers x heads x {frame['stat'].nunique()} statistics); "
                f"lines skipped: {skipped}"
            )
            print(corpus.parked_summary(frame))
        partial.unlink(missing_ok=True)
    finally:
        if dist_on:
            dist.destroy_process_group()
    return 0


def _progress(total: int, enabled: bool, what: str):
    """A tqdm bar on stderr (rank 0 only); call bar(done, total) to move it, bar(None, None) to close."""
    from tqdm import tqdm

    bar = tqdm(total=total, disable=not enabled, unit="input", desc=what, file=sys.stderr, mininterval=1.0)

    def update(done, _total) -> None:
        if done is None:
            bar.close()
        else:
            bar.update(done - bar.n)

    return update
