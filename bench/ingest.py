"""`qasc ingest` end to end vs the raw embedding rate of the texts it embeds, on the same corpus in the same run.

Per corpus folder: the model is loaded once (timed), then a fresh in-process ingest runs with it (what
`qasc ingest --local`, the default on one machine, does) and reports its phases (engine.store.progress.PhaseClock:
plan, model load, split, embed sentences / headings / passages, tables, term counts, write + checksums, commit,
index); then the engine's embedder encodes exactly the texts that ingest embedded (the same shards from the same
stage functions: each shard's sentences, its heading paths, its passages) with the
same encode calls, timed. Rates are in model tokens (special tokens included: what the model runs on) and in
sentences, and the ratio ingest / raw in tokens/s is the issue's target (>= 0.8). Runs alternate (ingest, raw,
ingest, raw, ...) so load drift hits both alike; figures are medians. `--ray` adds the same ingest on a local Ray
(`qasc ingest --ray`), model load included in its actors.

    python -m bench.ingest                                   # chroma_general and qasper_papers
    python -m bench.ingest --corpora DIR[,DIR] --repeats 3 --ray
    python -m bench.ingest --quick
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import CHROMA, emit_json, machine_info, median, print_table

DATA = CHROMA.parent


def embedded_texts(corpus: Path, work: Path) -> list[dict[str, list[str]]]:
    """Per shard, as ingest cuts it with the default settings: {sentences, headings, passages} texts it embeds."""
    from qasc.engine.config import EngineConfig
    from qasc.engine.passages import DEFAULT_PASSAGE_TOKENS, pack_passages
    from qasc.engine.store.ingest import DEFAULT_SHARD_CHARS, DEFAULT_UNIT_BYTES
    from qasc.engine.store.inputs import pack_units, plan_files
    from qasc.engine.store.records import ReadOptions
    from qasc.engine.store.stages import IngestContext, shard_heading_paths, split_shard, unit_shards
    from qasc.engine.tokencap import DEFAULT_MAX_SENTENCE_TOKENS, load_tokenizer

    opts = ReadOptions()
    segments, _, _ = plan_files([str(corpus)], opts, DEFAULT_UNIT_BYTES, exclude=work)
    ctx = IngestContext(EngineConfig(), opts, DEFAULT_MAX_SENTENCE_TOKENS, str(work), "float32", DEFAULT_SHARD_CHARS,
                        0, {}, DEFAULT_PASSAGE_TOKENS)
    tokenizer = load_tokenizer(None)
    shards = []
    for unit in pack_units(segments, DEFAULT_UNIT_BYTES):
        for _, docs in unit_shards(unit, ctx):
            sents = split_shard(docs, ctx, tokenizer)
            passages = []
            for s in sents:
                first, count = pack_passages(s.paragraph, s.n_tokens, DEFAULT_PASSAGE_TOKENS)
                passages += [s.text[s.char_start[a]:s.char_end[a + c - 1]]
                             for a, c in zip(first.tolist(), count.tolist(), strict=True)]
            shards.append({"sentences": [t for s in sents for t in s.texts()],
                           "headings": shard_heading_paths(sents)[0], "passages": passages})
    return shards


def raw_embed(embedder, shards: list[dict[str, list[str]]]) -> dict[str, float]:
    """The encode calls ingest makes, timed: seconds per kind of text and in all."""
    out = {"sentences": 0.0, "headings": 0.0, "passages": 0.0}
    for shard in shards:
        for kind, texts in shard.items():
            if texts:
                t0 = time.perf_counter()
                embedder.encode(texts)
                out[kind] += time.perf_counter() - t0
    out["all"] = sum(out.values())
    t0 = time.perf_counter()  # the tokenizer's share of it (encode tokenizes its texts first)
    for shard in shards:
        for texts in shard.values():
            embedder.tokenize(texts)
    out["tokenize (part of all)"] = time.perf_counter() - t0
    return out


def model_tokens(embedder, shards: list[dict[str, list[str]]]) -> dict[str, int]:
    """Tokens the model runs on (special tokens included, no padding) per kind of text, and in all."""
    out = {k: sum(len(ids) for s in shards for ids in embedder.tokenize(s[k])) for k in ("sentences", "headings",
                                                                                         "passages")}
    out["all"] = sum(out.values())
    return out


def ingest_local(corpus: Path, work: Path, embedder) -> dict:
    from qasc.engine.store import IngestProgress, ingest

    store = work / f"store-{time.monotonic_ns()}"
    quiet = lambda _m: None  # noqa: E731
    try:
        return ingest([str(corpus)], str(store), embedder=embedder, progress=IngestProgress(bar=False, log=quiet),
                      log=quiet)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def ingest_ray(corpus: Path, work: Path) -> float:
    """`qasc ingest --ray` in a fresh process: wall seconds (imports, Ray start and model load included)."""
    import subprocess
    import sys

    from bench.common import REPO

    store = work / f"ray-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-m", "qasc.jobs.cli", "ingest", str(corpus), "--store", str(store), "--ray",
                        "--no-progress"], cwd=REPO, check=True, capture_output=True, text=True)
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(store, ignore_errors=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", default=f"{CHROMA / 'corpora'},{DATA / 'qasper_papers' / 'corpora'}",
                   help="corpus folders (comma list)")
    p.add_argument("--repeats", type=int, default=1, help="alternated ingest / raw runs per corpus (median)")
    p.add_argument("--ray", action="store_true", help="also time `qasc ingest --ray` (a fresh process) per corpus")
    p.add_argument("--quick", action="store_true", help="tiny run: the built-in demo corpus, 1 repeat")
    args = p.parse_args(argv)
    if args.quick:
        from bench.common import REPO

        args.corpora, args.repeats = str(REPO / "engine" / "data" / "demo"), 1
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    from qasc.engine.embedder import Embedder

    t0 = time.perf_counter()
    embedder = Embedder(device="cpu")
    load_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="qasc-bench-ingest-") as tmp:
        record = measure(args, embedder, load_s, Path(tmp))
    emit_json(record)
    return record


def measure(args: argparse.Namespace, embedder, load_s: float, work: Path) -> dict:
    """Every corpus: alternated ingest / raw runs -> the bench record (printed as a table too)."""
    rows, records = [], []
    for folder in [Path(c) for c in args.corpora.split(",") if c]:
        shards = embedded_texts(folder, work)
        tokens = model_tokens(embedder, shards)
        runs, raws, rays = [], [], []
        for _ in range(args.repeats):
            runs.append(ingest_local(folder, work, embedder))
            raws.append(raw_embed(embedder, shards))
            if args.ray:
                rays.append(ingest_ray(folder, work))
        n = runs[0]["sentences"]
        if n != sum(len(s["sentences"]) for s in shards):
            raise SystemExit(f"{folder}: ingest stored {n} sentences, the bench re-split "
                             f"{sum(len(s['sentences']) for s in shards)}")
        ingest_s = median([r["seconds"] for r in runs]) + load_s  # end to end: the model load included
        raw_s = median([r["all"] for r in raws])
        phases = {k: median([r["phases"].get(k, 0.0) for r in runs]) for k in runs[0]["phases"]}
        phases["model load"] = load_s
        rec = {"corpus": str(folder), "sentences": n, "passages_embedded": sum(len(s["passages"]) for s in shards),
               "headings_embedded": sum(len(s["headings"]) for s in shards), "tokens": tokens,
               "ingest_s": ingest_s, "raw_embed_s": {k: median([r[k] for r in raws]) for k in raws[0]},
               "ingest_sentences_per_s": n / ingest_s, "embed_sentences_per_s": n / raw_s,
               "embed_only_sentences_per_s": n / median([r["sentences"] for r in raws]),
               "ingest_tokens_per_s": tokens["all"] / ingest_s, "embed_tokens_per_s": tokens["all"] / raw_s,
               "phases": phases}
        rec["ratio_tokens"] = rec["ingest_tokens_per_s"] / rec["embed_tokens_per_s"]
        if rays:
            rec["ray_ingest_s"] = median(rays)
            rec["ray_ingest_sentences_per_s"] = n / rec["ray_ingest_s"]
            rec["ray_ratio_tokens"] = tokens["all"] / rec["ray_ingest_s"] / rec["embed_tokens_per_s"]
        records.append(rec)
        rows.append({"corpus": folder.parent.name if folder.name == "corpora" else folder.name, "sentences": n,
                     "tokens": tokens["all"], "ingest s": ingest_s, "raw embed s": raw_s,
                     "ingest sent/s": rec["ingest_sentences_per_s"], "embed sent/s": rec["embed_sentences_per_s"],
                     "ingest tok/s": rec["ingest_tokens_per_s"], "embed tok/s": rec["embed_tokens_per_s"],
                     "ratio": rec["ratio_tokens"], **({"ray s": rec["ray_ingest_s"]} if rays else {})})
        print("phases (s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()), flush=True)
        print(json.dumps({"corpus_record": rec}, sort_keys=True, default=float), flush=True)  # kept if a later one dies
    info = machine_info()
    print(f"\nmedian of {args.repeats}; torch threads {info['torch_threads']}; load avg {info['load_avg']}")
    print_table(rows, list(rows[0]))
    first = records[0]
    keys = ("ingest_sentences_per_s", "embed_sentences_per_s", "ingest_tokens_per_s", "embed_tokens_per_s",
            "ratio_tokens")
    record = {"bench": "ingest", **{k: first[k] for k in keys}, "model_load_s": load_s, "repeats": args.repeats,
              "corpora": records, "machine": info}
    return record


if __name__ == "__main__":
    main()
