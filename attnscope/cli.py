"""Command line: ``attnscope run | view | models | predict | trace | audit | stats`` (also ``python -m attnscope ...``).

Every failure a user can cause ends with one line on stderr and exit code 2
(1 is kept for checks that ran and failed, e.g. ``audit``), never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed as one line."""


def _load(name: str, device: str):
    import warnings

    from attnscope.core.errors import ModelLoadError
    from attnscope.core.families.native import resolve_device
    from attnscope.models import registry

    if not name.strip():
        raise CliError(
            "the model name is empty: give a zoo name (see `models`), a model folder or an adapter file"
        )
    # torch's note on a checkpoint's pickle protocol would print before the sentence that refuses it (a
    # filter for the process: catch_warnings would also drop the filters the modules imported below set)
    warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
    try:
        lm = registry.load(name, device=resolve_device(device))
    except ModelLoadError as exc:
        raise CliError(str(exc)) from exc
    _weight_warnings(lm)
    return lm


def _weight_warnings(lm) -> None:
    """Weights that hold NaN or infinity make every output a non-number: said before any answer."""
    import torch

    bad_values, bad_names = 0, []
    params = getattr(lm, "named_parameters", None)
    for pname, p in params() if callable(params) else ():
        if not isinstance(p, torch.Tensor) or not p.is_floating_point() or p.is_meta:
            continue
        n = int((~torch.isfinite(p.detach())).sum())
        if n:
            bad_values += n
            bad_names.append(pname)
    if bad_names:
        print(f"warning: the model's weights hold NaN or infinite values ({bad_values:,} in "
              f"{len(bad_names)} tensor(s), first {bad_names[0]}): its outputs are not numbers",
              file=sys.stderr)  # fmt: skip


def _output_warnings(lm, said: set[str]) -> None:
    """What the model's forward returned that is not a number (adapters keep it), one line each, each
    said once (``said``: those already printed)."""
    notes = getattr(lm, "output_notes", None)
    if isinstance(notes, list):
        for note in notes:
            if note not in said:
                said.add(note)
                print(f"warning: {note}", file=sys.stderr)
        notes.clear()


def _writable(out: Path, flag: str = "--out") -> None:
    """--out can be written: checked before the model runs (a folder at the path, a parent that is
    not a folder, a place nothing can be created in), each one sentence."""
    if out.is_dir():
        raise CliError(f"{flag} {out} is a folder; give a file path")
    if not out.parent.exists():
        raise CliError(f"folder {out.parent} does not exist")
    if not out.parent.is_dir():
        raise CliError(f"{flag} {out}: {out.parent} is not a folder")
    existed = out.exists()
    if existed and not out.is_file():  # a FIFO or a device: opening it could block, writing is no file
        raise CliError(f"{flag} {out} is not a regular file; give a file path")
    try:
        with open(out, "ab"):
            pass
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror or exc}") from None
    if not existed:
        out.unlink(missing_ok=True)


def cmd_models(args: argparse.Namespace) -> int:
    from attnscope.models import registry

    if args.snapshots is not None:
        return _list_snapshots(args.snapshots)
    names = registry.zoo_names()
    if not names:
        print("no models in the zoo yet (train one: python -m attnscope.models.train --task reverse)")
    width = max((len(n) for n in names), default=0)
    for name in names:
        print(f"{name:<{width}}  {registry.zoo_summary(name)}")
    for extra, summary in getattr(registry, "EXTRA_MODELS", {}).items():
        print(f"{extra:<{width}}  {summary}")
    return 0


def _list_snapshots(name: str) -> int:
    """The training snapshots of one zoo model with the held-out accuracy measured at each."""
    from attnscope.core.errors import ModelLoadError
    from attnscope.models import registry

    if name not in registry.zoo_names():
        raise CliError(
            f"{name!r} is not a zoo model ({', '.join(registry.zoo_names())}); only they have snapshots"
        )
    try:
        snaps = registry.snapshots(name)
    except ModelLoadError as exc:
        raise CliError(str(exc)) from exc
    if not snaps:
        raise CliError(
            f"{name} has no training snapshots (retrain it: python -m attnscope.models.train --task {name})"
        )
    print(f"{'snapshot':<16}{'step':>8}  {'held-out':>9}  {'held-out loss':>13}")
    for snap in snaps:
        loss = snap.get("heldout_loss")
        print(
            f"{name}@{snap['step']:<{15 - len(name)}}{snap['step']:>8}  {snap['heldout']:>9.1%}  "
            + (f"{loss:>13.4f}" if isinstance(loss, (int, float)) else f"{'-':>13}")
        )
    print(f"held-out: never-seen inputs; {name}@{snaps[-1]['step']} is the model itself")
    return 0


def _capture_warnings(meta: dict) -> None:
    """What capture could not verify, one line each on stderr (the output still goes to stdout). ``meta`` as a
    model's or a trace's may hold it: a list's strings are notes (one string: one note), nothing else is."""
    from attnscope.core.traces.trace import head_masks_differ, meta_texts

    notes = meta_texts(meta, "capture_notes")
    if notes:
        count = f"{len(notes)} note" if len(notes) == 1 else f"{len(notes)} notes"
        print(
            f"warning: capture's notes on the model's attention, what it could not verify, left out, or drew "
            f"from another row or step ({count}, one per module and reason):",
            file=sys.stderr,
        )
    for note in notes:
        print(f"warning:   {note}", file=sys.stderr)
    layers = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in head_masks_differ(meta).items())
    if layers:  # heads masked differently: the masks saved are what they share
        print(f"warning: the heads of a layer were masked differently ({layers}); the masks saved are what "
              "every head may see", file=sys.stderr)  # fmt: skip


def cmd_predict(args: argparse.Namespace) -> int:
    lm = _load(args.model, args.device)
    _capture_warnings(getattr(lm, "meta", None) or {})
    if isinstance(getattr(lm, "output_notes", None), list):
        lm.output_notes.clear()  # the load check's (on the model's examples): the inputs' are said below
    said: set[str] = set()
    for text in args.text:
        answer = lm.predict([text])[0]
        _output_warnings(lm, said)
        print(answer)
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix not in (".npz", ".json"):
        raise CliError(f"--out must end in .npz or .json, got {out.name!r}")
    _writable(out)
    lm = _load(args.model, args.device)
    targets = [args.target] if args.target is not None else None
    trace = lm.trace([args.text], targets)[0]
    _capture_warnings(trace.meta)
    for problem in trace.problems():  # (NaN output among them: the trace holds the model's output)
        print(f"warning: {problem}", file=sys.stderr)
    try:
        trace.save(out)
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror or exc}") from None
    shapes = ", ".join(f"{k} {tuple(trace.probs(k).shape)}" for k in trace.kinds)
    print(f"wrote {out} ({shapes}); output: {trace.output_text}")
    return 0


def _server_flags(config: Path) -> list[str]:
    """The package's server defaults (dashboard/server.toml) as command-line flags: streamlit reads a
    config file only from the current folder, and ``attnscope run`` must serve the same way from any
    folder, from a checkout or an installed wheel."""
    import tomllib

    flags = []
    for section, options in tomllib.loads(config.read_text(encoding="utf-8")).items():
        for key, value in options.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            flags.append(f"--{section}.{key}={text}")
    return flags


def dashboard_command(port: int, address: str, extra: list[str] | None = None) -> list[str]:
    """The streamlit command that serves the dashboard (the installed package's app, from any folder)."""
    from attnscope import dashboard

    here = Path(dashboard.__file__).resolve().parent
    return [sys.executable, "-m", "streamlit", "run", str(here / "app.py"),
            *_server_flags(here / "server.toml"),
            f"--server.address={address}", f"--server.port={port}", *(extra or [])]  # fmt: skip


VIEW_ENV = "ATTNSCOPE_VIEW_TRACE"  # dashboard/opened.py opens this trace in every new session
RUN_ENV = "ATTNSCOPE_VIEW_RUN"  # dashboard/watched.py opens this run folder in every new session


def _passed_on(extra: list[str], flag: str) -> str | None:
    """The value streamlit takes for ``flag`` (``--server.port``) among the options passed on to it
    (``--flag VALUE`` or ``--flag=VALUE``; the last one given counts, as streamlit reads them), or None."""
    value = None
    for i, arg in enumerate(extra):
        if arg == flag:
            if i + 1 >= len(extra) or extra[i + 1].startswith("--"):
                raise CliError(f"{flag} needs a value")
            value = extra[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def _serve(args: argparse.Namespace, env: dict[str, str], what: str) -> int:
    if not 0 < args.port < 65536:
        raise CliError(f"--port must be between 1 and 65535, got {args.port}")
    cmd = dashboard_command(args.port, args.address, args.streamlit)
    # streamlit options passed on come after --port and --address in the command, so they win: the line says
    # where the server will be
    port = _passed_on(args.streamlit, "--server.port")
    address = _passed_on(args.streamlit, "--server.address")
    if port is not None and not (port.strip().isascii() and port.strip().isdigit() and 0 < int(port) < 65536):
        raise CliError(f"--server.port must be a port between 1 and 65535, got {port!r}")
    port = str(int(port)) if port is not None else str(args.port)
    address = address if address is not None else args.address
    print(f"attnscope: serving {what} on http://{address}:{port} (Ctrl+C stops it)", flush=True)
    os.execve(cmd[0], cmd, env)  # streamlit takes this process over: signals and the exit code are its own
    return 0  # not reached


def cmd_run(args: argparse.Namespace) -> int:
    env = {k: v for k, v in os.environ.items() if k not in (VIEW_ENV, RUN_ENV)}
    return _serve(args, env, "the dashboard")


def _view_run(args: argparse.Namespace, path: Path) -> int:
    """A run folder (attnscope.watch): checked here, then served open on the Training page."""
    from attnscope.core.runs.runfile import Run, RunFormatError

    try:
        run = Run.open(path)
        steps = run.steps()
    except RunFormatError as exc:
        raise CliError(str(exc)) from exc
    env = {k: v for k, v in os.environ.items() if k != VIEW_ENV}
    latest = f", latest {steps[-1]:,}" if steps else ""
    return _serve(args, {**env, RUN_ENV: str(path)}, f"run {run.name} ({len(steps)} watched steps{latest})")


def cmd_view(args: argparse.Namespace) -> int:
    """Check the trace file or run folder here (one line on a bad one, before any server starts), then
    serve it."""
    from attnscope.core.traces.trace import AttentionTrace

    given = Path(args.file).expanduser()  # named in messages as the user gave it (not a link's target)
    if not given.exists():
        raise CliError(f"{given} does not exist: give a trace file (.npz or .json) or a run folder")
    path = given.resolve()
    if path.is_dir():
        return _view_run(args, path)
    tr = AttentionTrace.load(given)
    for problem in tr.problems():
        print(f"warning: {problem}", file=sys.stderr)
    env = {k: v for k, v in os.environ.items() if k != RUN_ENV}
    return _serve(args, {**env, VIEW_ENV: str(path)}, f"{path.name} ({tr.model or 'trace'})")


def _prog() -> str:
    """How the user called us: ``attnscope`` (the installed command) or ``python -m attnscope``."""
    main_file = sys.argv[0] if sys.argv else ""
    if os.path.basename(main_file) == "__main__.py":
        return f"python -m {Path(main_file).resolve().parent.name}"
    return "attnscope"


def model_args(sp: argparse.ArgumentParser) -> None:
    """--model and --device, as every command that runs a model takes them."""
    sp.add_argument(
        "--model",
        required=True,
        help="zoo name (see `models`), NAME@STEP (a training snapshot, see `models --snapshots NAME`), "
        "model folder, or adapter file (.py, runs its code)",
    )
    sp.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=_prog(), description="attnscope: look inside a Transformer's attention")
    sub = p.add_subparsers(dest="command", required=True)

    def serve_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--port", type=int, default=8501, help="port (default 8501)")
        sp.add_argument("--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        sp.set_defaults(streamlit=[])  # further streamlit options (--server.x ...) pass through: see main

    sp = sub.add_parser(
        "run",
        help="serve the dashboard in the browser (from any folder); streamlit's --server.x options pass on",
    )
    serve_args(sp)
    sp.set_defaults(fn=cmd_run)

    sp = sub.add_parser(
        "view",
        help="serve the dashboard with a trace file (.npz/.json) or a run folder (attnscope.watch) open",
    )
    sp.add_argument(
        "file",
        help="a trace written by `trace --out`, a download button or trace.save(); or a run folder "
        "(the run_dir of attnscope.watch), shown on the Training page",
    )
    serve_args(sp)
    sp.set_defaults(fn=cmd_view)

    p_models = sub.add_parser("models", help="list the model zoo (--snapshots NAME: its training snapshots)")
    p_models.add_argument(
        "--snapshots",
        metavar="NAME",
        default=None,
        help="list NAME's training snapshots (load one as NAME@STEP)",
    )
    p_models.set_defaults(fn=cmd_models)

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
    from attnscope.stats_cli import add_stats_command

    add_stats_command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from attnscope.core.errors import (
        ConfigError,
        InputError,
        ModelLoadError,
        TokenizerError,
        TraceFormatError,
    )

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # streamlit's own options (e.g. --server.headless true) for run/view; nothing else
        if args.command not in ("run", "view") or not extra[0].startswith("--") or "." not in extra[0]:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.streamlit = extra
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
