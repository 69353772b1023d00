"""``python -m attnscope audit``: the mask audit from the command line (for CI).

    python -m attnscope audit --model NAME|PATH [--inject BUG] [--target T ...] "text" ["text2" ...]
    python -m attnscope audit --list-bugs

Prints one line per check (``PASS|FAIL|SKIP|INFO name: detail``); exit code 0 when no check
fails, 1 when one does, 2 for input the command cannot use (one line on stderr).
Give two or more texts of different lengths to exercise padding in the static checks; the
leak tests append PAD columns of their own either way.
"""

from __future__ import annotations

import argparse

from attnscope import cli

EXIT_FAIL = 1


def cmd_audit(args: argparse.Namespace) -> int:
    from attnscope.core.analysis import audit, bugs
    from attnscope.core.traces.trace import meta_texts

    if args.list_bugs:
        width = max(len(n) for n in bugs.names())
        for name, listed in bugs.BUGS.items():
            print(f"{name:<{width}}  {listed.description}")
        return 0
    if not args.model:
        raise cli.CliError(
            "--model is required (a zoo name or a model folder); see `python -m attnscope models`"
        )
    if not args.text:
        raise cli.CliError(
            'give at least one input text, e.g. python -m attnscope audit --model NAME "some text"'
        )
    bug = None
    if args.inject:
        try:
            bug = bugs.get(args.inject)
        except bugs.UnknownBugError as exc:
            raise cli.CliError(str(exc)) from exc
    if args.target is not None and len(args.target) != len(args.text):
        raise cli.CliError(
            f"{len(args.text)} texts but {len(args.target)} --target values: give one per text"
        )
    lm = cli._load(args.model, args.device)
    if bug is not None and not lm.injectable:
        raise cli.CliError("--inject works on core models only (zoo models and folders saved by attnscope)")
    if bug is not None and bug.needs_decoder and not lm.has_decoder:
        raise cli.CliError(f"bug {bug.name!r} needs a decoder; model {lm.name!r} is encoder-only")
    report = audit.run_audit(lm, list(args.text), args.target, bug=bug)
    for line in report.lines():
        print(line)
    # what capture could not verify or left out of the traces the checks read (a layer of a kind the trace
    # could not stack with the others is not checked): said on stderr, as trace and predict say it
    notes = [n for tr in report.traces for n in meta_texts(tr.meta, "capture_notes")]
    cli._capture_warnings({"capture_notes": list(dict.fromkeys(notes))})
    return 0 if report.passed else EXIT_FAIL


def add_audit_command(sub) -> None:
    sp = sub.add_parser(
        "audit",
        help="check the model's masks: static checks and leak tests (exit 0 pass, 1 fail)",
        description="Mask audit: masked mass, row sums, fully masked rows, declared masks, NaN, "
        "causal and padding leak tests. One line per check; exit 0 when all pass, 1 otherwise.",
    )
    sp.add_argument(
        "--model",
        help="zoo name (see `models`), NAME@STEP (a training snapshot, see `models --snapshots NAME`), model "
        "folder, or adapter file (.py, runs its code)",
    )
    sp.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    sp.add_argument("--inject", metavar="BUG", help="inject a known mask bug (see --list-bugs)")
    sp.add_argument("--target", action="append", help="target text for teacher forcing, once per text")
    sp.add_argument("--list-bugs", action="store_true", help="list the bugs --inject knows and exit")
    sp.add_argument("text", nargs="*", help="input text(s); texts of different lengths exercise padding")
    sp.set_defaults(fn=cmd_audit)
