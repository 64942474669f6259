"""`qasc collection --out DIR STORE...`: existing stores assembled into one collection (engine.store.collection)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("stores", nargs="+", metavar="STORE",
                   help="store folders, in the collection's global order (the first store's documents first); "
                        "they stay where they are: the collection lists their absolute paths")
    p.add_argument("--out", required=True, metavar="DIR", help="the collection folder to write (new or empty)")


def run(args: argparse.Namespace) -> int:
    from qasc.engine.store.collection import assemble

    manifest = assemble(args.out, args.stores)
    print(f"collection {args.out}: {manifest['documents']} documents in {len(manifest['partitions'])} partitions")
    return 0
