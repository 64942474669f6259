"""`qasc verify --store DIR`: checksums, row counts, index vs sentences, model/dim, offsets; exit 0 only if all hold."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, metavar="DIR",
                   help="store folder to check, or a collection (its manifest and every partition)")
    p.add_argument("--sample", type=int, default=2000, metavar="N",
                   help="index rows compared against the stored embeddings (default 2000)")


def run(args: argparse.Namespace) -> int:
    from qasc.engine.errors import QascError
    from qasc.engine.store import verify_store
    from qasc.engine.store.collection import is_collection, verify_collection

    if args.sample < 1:
        raise QascError(f"--sample must be >= 1, got {args.sample}")
    check = verify_collection if is_collection(args.store) else verify_store
    results = check(args.store, sample=args.sample)
    for name, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name:<11} {detail}")
    failed = [name for name, ok, _ in results if not ok]
    if failed:
        print(f"store {args.store}: FAILED ({', '.join(failed)})")
        return 1
    print(f"store {args.store}: OK")
    return 0
