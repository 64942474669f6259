"""`qasc refresh --store DIR`: save a store's query tables again with this engine's code, after an upgrade made them
stale (engine.store.mapped_write.refresh_tables); a collection's partitions each in turn."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, metavar="DIR", help="store folder, or a collection (every partition)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from qasc.engine.store.collection import is_collection, partition_paths, read_collection
    from qasc.engine.store.mapped_write import refresh_tables

    root = Path(args.store).expanduser().absolute()
    roots = partition_paths(root, read_collection(root)) if is_collection(root) else [root]
    for part in roots:
        summary = refresh_tables(part, lambda msg: print(msg, file=sys.stderr, flush=True))
        print(json.dumps(summary))
    return 0
