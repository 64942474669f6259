"""`qasc` command line: one subcommand per module `jobs/<name>_cmd.py` with add_arguments() and run()."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from functools import partial

from qasc.jobs.env import set_env_defaults

COMMANDS = {
    "demo": "run the main job on the built-in demo corpus and print the top chunks",
    "ingest": "split, embed and index documents into a store",
    "query": "answer a batch of queries from a store with query-adapted chunks",
    "eval": "evaluate QASC against baselines on a Chroma-format data set",
    "verify": "check a store's checksums, counts, index and offsets",
    "collection": "assemble existing stores into one collection, answering as one store",
    "refresh": "save a store's query tables again with this engine's code (after an upgrade made them stale)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qasc", description="Query-adaptive semantic chunking engine.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        try:
            module = importlib.import_module(f"qasc.jobs.{name}_cmd")
        except ModuleNotFoundError as exc:
            if exc.name != f"qasc.jobs.{name}_cmd":
                raise
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def _one_line_warning(command: str, message, category, filename, lineno, line=None) -> str:
    """A warning at the command line: `qasc CMD: warning: ...`, one line, without the source line it came from."""
    return f"qasc {command}: warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    set_env_defaults()
    from qasc.engine.errors import QascError

    parser = build_parser()
    args = parser.parse_args(argv)
    caller_format, warnings.formatwarning = warnings.formatwarning, partial(_one_line_warning, args.command)
    try:
        return int(args._run(args) or 0)
    except QascError as exc:
        print(f"qasc {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"qasc {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:  # main() called in process (tests, notebooks): the caller's warning format comes back
        warnings.formatwarning = caller_format


if __name__ == "__main__":
    sys.exit(main())
