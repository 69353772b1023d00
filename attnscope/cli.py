"""Command line: ``python -m core models | predict | trace``.

Every failure a user can cause ends with one line on stderr and exit code 2
(1 is kept for checks that ran and failed, e.g. ``audit``), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed as one line."""


def _load(name: str, device: str):
    from core.checkpoint import ModelLoadError
    from core.runner import resolve_device
    from models import registry

    try:
        return registry.load(name, device=resolve_device(device))
    except ModelLoadError as exc:
        raise CliError(str(exc)) from exc


def cmd_models(args: argparse.Namespace) -> int:
    from models import registry

    names = registry.zoo_names()
    if not names:
        print("no models in the zoo yet (train one: python -m models.train --task reverse)")
    width = max((len(n) for n in names), default=0)
    for name in names:
        print(f"{name:<{width}}  {registry.zoo_summary(name)}")
    for extra, summary in getattr(registry, "EXTRA_MODELS", {}).items():
        print(f"{extra:<{width}}  {summary}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    lm = _load(args.model, args.device)
    for text in args.text:
        print(lm.predict([text])[0])
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix not in (".npz", ".json"):
        raise CliError(f"--out must end in .npz or .json, got {out.name!r}")
    if not out.parent.exists():
        raise CliError(f"folder {out.parent} does not exist")
    lm = _load(args.model, args.device)
    targets = [args.target] if args.target is not None else None
    trace = lm.trace([args.text], targets)[0]
    trace.save(out)
    shapes = ", ".join(f"{k} {tuple(trace.probs(k).shape)}" for k in trace.kinds)
    print(f"wrote {out} ({shapes}); output: {trace.output_text}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m core", description="attnscope: look inside a Transformer's attention"
    )
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("models", help="list the model zoo").set_defaults(fn=cmd_models)

    def model_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--model",
            required=True,
            help="zoo name (see `models`), model folder, or adapter file (.py, runs its code)",
        )
        sp.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")

    sp = sub.add_parser("predict", help="print the model's output for each text")
    model_args(sp)
    sp.add_argument("text", nargs="+", help="input text(s)")
    sp.set_defaults(fn=cmd_predict)

    sp = sub.add_parser("trace", help="write the full attention trace to .npz or .json")
    model_args(sp)
    sp.add_argument("text", help="input text")
    sp.add_argument("--target", help="target text (teacher forcing); default: the model's greedy output")
    sp.add_argument("--out", required=True, help="output file, .npz or .json")
    sp.set_defaults(fn=cmd_trace)

    from attnscope.audit_cli import add_audit_command  # audit_cli uses CliError/_load from here

    add_audit_command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from core.checkpoint import ModelLoadError
    from core.config import ConfigError
    from core.runner import InputError
    from core.tokenizer import TokenizerError
    from core.trace import TraceFormatError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (CliError, InputError, ModelLoadError, ConfigError, TokenizerError, TraceFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug of ours: still one line, with where to look
        print(f"error: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
