"""A real store as a collection: the store split into N partition stores by shard ranges (copies of its own shard
files: the same vectors, a flat index built per partition), assembled in order into a collection; `qasc query` on
the store and on the collection with the store's questions, in each preset, compared byte for byte (sha256 of the
result files); the wall time and peak RSS of each run, and of one run per partition alone (what a process serving
only that partition would hold).

    python -m bench.partitions --store STORE --questions QUESTIONS.csv --partitions 4 --out /tmp/qasc-parts
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import shutil
import sys
from pathlib import Path

from bench.common import emit_json, machine_info, print_table
from bench.memory import run_child

SHARD_FILES = ("documents", "sentences", "headings", "passages", "lexical", "passage_lexical")


def split_store(store: Path, out: Path, n: int, index: str = "flat") -> list[Path]:
    """store -> min(n, shards) partition stores under out (contiguous runs of its shards), each a valid
    store: its shards' files copied, rebased doc_start/row_start, counts, checksums, an index of its rows of kind
    `index` (flat: exact; ivf: FAISS IVF trained on the partition's rows, its sizes chosen as ingest chooses)."""
    from qasc.engine.store.files import file_digest
    from qasc.engine.store.index_build import build_index_file
    from qasc.engine.store.manifest import read_manifest
    from qasc.engine.store.mapped_write import write_mapped

    manifest = read_manifest(store)
    shards = manifest["shards"]
    groups: list[list[dict]] = [[] for _ in range(min(n, len(shards)))]
    for i, shard in enumerate(shards):  # contiguous runs of shards, min(n, shards) of them, none empty
        groups[i * len(groups) // len(shards)].append(shard)
    paths = []
    for g, group in enumerate(groups):
        part = out / f"part-{g:04d}"
        part.mkdir(parents=True)
        own = copy.deepcopy(manifest)
        own["shards"], own["checksums"] = [], {}
        docs = rows = 0
        for shard in group:
            shard = {**shard, "doc_start": docs, "row_start": rows}
            for key in SHARD_FILES:
                if key in shard:
                    (part / shard[key]).parent.mkdir(exist_ok=True)
                    shutil.copyfile(store / shard[key], part / shard[key])
                    own["checksums"][shard[key]] = manifest["checksums"][shard[key]]
            own["shards"].append(shard)
            docs += int(shard["n_documents"])
            rows += int(shard["n_sentences"])
        own["counts"] = {"documents": docs, "sentences": rows, "shards": len(group)}
        index_file = "index-0001.faiss"
        own["index"] = build_index_file(part, own["shards"], None, index, int(manifest["dim"]), index_file)
        own["checksums"][index_file] = file_digest(part / index_file)
        if own.pop("mapped", None) is not None:  # the store's mapped arrays are its whole rows': the part's own
            own = write_mapped(part, own, lambda line: None)
        (part / "manifest.json").write_text(json.dumps(own, indent=1))
        paths.append(part)
    return paths


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--presets", default="answers,context")
    ap.add_argument("--out", required=True)
    ap.add_argument("--alone", action=argparse.BooleanOptionalAction, default=True,
                    help="also run each partition alone (its time and peak RSS; default on)")
    args = ap.parse_args(argv)
    from qasc.engine.store.collection import assemble

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    parts = split_store(Path(args.store), out / "parts", args.partitions)
    assemble(out / "collection", parts)
    qasc = [sys.executable, "-m", "qasc.jobs.cli", "query", "--queries", args.questions]
    rows, same = [], {}
    for preset in args.presets.split(","):
        digests = {}
        for name, target in (("store", Path(args.store)), ("collection", out / "collection"),
                             *((p.name, p) for p in parts if args.alone)):
            result = out / f"{name}-{preset}.parquet"
            wall, peak = run_child([*qasc, "--store", str(target), "--out", str(result), "--preset", preset],
                                   out / f"{name}-{preset}.log")
            digests[name] = hashlib.sha256(result.read_bytes()).hexdigest()[:16]
            rows.append({"preset": preset, "run": name, "s": wall, "peak GiB": peak / 2**30, "sha256": digests[name]})
        same[preset] = digests["store"] == digests["collection"]
    print_table(rows, ["preset", "run", "s", "peak GiB", "sha256"], title=f"{args.store}: {len(parts)} partitions")
    record = {"bench": "partitions", "store": args.store, "partitions": len(parts), "identical": same, "runs": rows,
              "machine": machine_info()}
    emit_json(record)
    return record


if __name__ == "__main__":
    main()
