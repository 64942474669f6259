"""A real store as a collection: the store split into N partition stores by shard ranges (copies of its own shard
files: the same vectors, a flat index built per partition), assembled in order into a collection; `qasc query` on
the store and on the collection with the store's questions, in each preset, compared byte for byte (sha256 of the
result files); the wall time and peak RSS of each run, and of one run per partition alone (what a process serving
only that partition would hold).

    python -m bench.partitions --store STORE --questions QUESTIONS.csv --partitions 4 --out /tmp/qasc-parts
    python -m bench.partitions ... --ray-nodes 2 --no-alone   # and served by Ray actors on a two-node cluster
    python -m bench.partitions ... --hashed CORPORA            # a hashed collection of the corpora vs one store
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


class StoreVectors:
    """An embedder that gives each text the vector a store holds for it (its sentences', passages' and heading
    paths' texts; the first where a text repeats), and any other text the model's vector encoded alone: the same
    text gets the same vector whatever batch or partition it is ingested in, so a store and a hashed collection
    ingested with it hold the same rows' vectors (docs/collections.md, "Where it is exact"), at the pipeline's
    speed, not the model's. Handed to ingest(embedder=...)."""

    def __init__(self, store: Path) -> None:
        import numpy as np

        from qasc.engine.embedder import Embedder
        from qasc.engine.store.reader import Store

        opened = Store.open(store, load_index=False)
        self.inner = Embedder(opened.manifest.get("model"), "cpu")
        emb = np.asarray(opened.embeddings, np.float32)
        self.vectors: dict[str, np.ndarray] = {}
        row = 0
        for doc in opened.docs:
            for a, b in zip(doc.char_start.tolist(), doc.char_end.tolist(), strict=True):
                self.vectors.setdefault(doc.text[a:b], emb[row])
                row += 1
        table = opened.docs
        passages = opened.passages
        if len(passages.first):
            offsets = np.asarray(opened.doc_offsets)
            for first, count, vec in zip(passages.first.tolist(), passages.count.tolist(),
                                         np.asarray(passages.emb, np.float32), strict=True):
                d = int(np.searchsorted(offsets, first, side="right") - 1)
                doc = table[d]
                a, b = int(doc.char_start[first - offsets[d]]), int(doc.char_end[first - offsets[d] + count - 1])
                self.vectors.setdefault(doc.text[a:b], vec)
        for text, vec in zip(opened.heading_paths, np.asarray(opened.heading_emb, np.float32), strict=True):
            self.vectors.setdefault(text, vec)
        self.missed = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, texts, *args, **kwargs):
        import numpy as np

        out = []
        for text in texts:
            vec = self.vectors.get(text)
            if vec is None:
                self.missed += 1
                vec = self.inner.encode([text])[0]
                self.vectors[text] = vec
            out.append(vec)
        progress = kwargs.get("progress") or (args[0] if args else None)
        if callable(progress):
            progress(len(texts))
        return np.stack(out).astype(np.float32) if out else np.zeros((0, self.inner.dim), np.float32)


def hashed_pair(store: Path, corpora: Path, out: Path, n: int) -> tuple[Path, Path]:
    """A store and a hashed collection of n partitions (`ingest_partitions`: documents by a hash of doc_id) of
    the *.md files under corpora, both ingested with the store's settings and `StoreVectors(store)`."""
    from qasc.engine.config import EngineConfig
    from qasc.engine.store import ingest
    from qasc.engine.store.collection import ingest_partitions
    from qasc.engine.store.manifest import read_manifest

    config = EngineConfig.from_dict(read_manifest(store)["config"])
    model = StoreVectors(store)
    files = [str(f) for f in sorted(corpora.glob("*.md"))]
    ingest(files, out / "single", config, embedder=model, progress=False)
    ingest_partitions(files, out / "hashed", n, config, embedder=model, progress=False)
    print(f"{store.name}: {model.missed} texts not in the store, encoded alone", file=sys.stderr)
    return out / "single", out / "hashed"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--presets", default="answers,context")
    ap.add_argument("--out", required=True)
    ap.add_argument("--alone", action=argparse.BooleanOptionalAction, default=True,
                    help="also run each partition alone (its time and peak RSS; default on)")
    ap.add_argument("--ray-nodes", type=int, default=0,
                    help="also answer with the collection's partitions on Ray actors, on a cluster of this many "
                         "nodes started here (ray.cluster_utils.Cluster: a raylet each, the machine's cores shared "
                         "out, a resource of its own each); 0: off (default)")
    ap.add_argument("--hashed", default=None, metavar="CORPORA",
                    help="instead of splitting the store: a store and a collection of --partitions partitions "
                         "(documents by a hash of doc_id, as `qasc ingest --partitions`) both ingested from the "
                         "*.md files under CORPORA with STORE's settings and vectors (`StoreVectors`)")
    args = ap.parse_args(argv)
    from qasc.engine.store.collection import assemble

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    single = Path(args.store)
    if args.hashed:
        single, coll = hashed_pair(single, Path(args.hashed), out, args.partitions)
        parts = sorted(p for p in coll.glob("part-*") if (p / "manifest.json").exists())
    else:
        parts = split_store(single, out / "parts", args.partitions)
        coll = out / "collection"
        assemble(coll, parts)
    qasc = [sys.executable, "-m", "qasc.jobs.cli", "query", "--queries", args.questions]
    cluster = start_cluster(args.ray_nodes) if args.ray_nodes else None
    runs = [("store", single, []), ("collection", coll, []),
            *((("collection-ray", coll, ["--ray-address", cluster.address]),) if cluster else ()),
            *((p.name, p, []) for p in parts if args.alone)]
    rows, same = [], {}
    try:
        for preset in args.presets.split(","):
            digests = {}
            for name, target, extra in runs:
                result = out / f"{name}-{preset}.parquet"
                log = out / f"{name}-{preset}.log"
                wall, peak = run_child([*qasc, "--store", str(target), "--out", str(result), "--preset", preset,
                                        *extra], log)
                digests[name] = hashlib.sha256(result.read_bytes()).hexdigest()[:16]
                summary = [line for line in log.read_text().splitlines() if "Ray actors" in line]
                rows.append({"preset": preset, "run": name, "s": wall, "peak GiB": peak / 2**30,
                             "sha256": digests[name], "ray": summary[-1].split(": ", 1)[-1] if summary else ""})
            same[preset] = all(digests[name] == digests["store"] for name in digests
                               if name.startswith("collection"))
    finally:
        if cluster is not None:
            cluster.shutdown()
    print_table(rows, ["preset", "run", "s", "peak GiB", "sha256", "ray"],
                title=f"{args.store}: {len(parts)} partitions")
    record = {"bench": "partitions", "store": args.store, "partitions": len(parts), "identical": same, "runs": rows,
              "ray_nodes": args.ray_nodes, "machine": machine_info()}
    emit_json(record)
    return record


def start_cluster(nodes: int):
    """A Ray cluster of `nodes` nodes on this machine (ray.cluster_utils.Cluster), the cores shared out (at least 1
    CPU a node), each node with a resource of its own (node_0, node_1, ...)."""
    import os

    from ray.cluster_utils import Cluster

    cpus = max(1, (os.cpu_count() or 1) // nodes)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "resources": {"node_0": 1},
                                                            "include_dashboard": False})
    for i in range(1, nodes):
        cluster.add_node(num_cpus=cpus, resources={f"node_{i}": 1})
    cluster.wait_for_nodes()
    return cluster


if __name__ == "__main__":
    main()
