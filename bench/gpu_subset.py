"""End-to-end queries over a chroma_general subset, a store built in memory on the device; the CPU path beside it.

  build   split the corpora (engine.splitter, one document per file), embed every sentence on --device (Embedder;
          bfloat16 on CUDA), and keep them in a bench.query.TorchStore: exact top-k by a matmul on the device (the
          bare GPU machine has no FAISS; the on-disk store's ingest always builds a FAISS index)
  query   Engine.query(questions) end to end (query embedding included) and Engine.query_embedded on pre-embedded
          queries: queries/s at --batch (questions.csv repeated)
  equal   (a) the same store and query vectors on CPU: the chunks must be equal, scores within 1e-4;
          (b) the whole CPU path (float32 sentence and query vectors): the share of questions with the same chunks
              and with the same first chunk, the score difference where the chunks agree, and the lowest cosine of
              the device's vectors to the CPU's (the device runs bfloat16: near ties may rank differently)

    python -m bench.gpu_subset --device cuda --model .gpu-pack/model       # QASC_CHROMA_DIR: the corpora + questions
    python -m bench.gpu_subset --device cpu --max-chars 6000 --questions 8 --batch 64
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

from bench.common import CHROMA, emit_json, machine_info, median, sync, time_repeats


def build_docs(corpora_dir, max_chars: int, embedder) -> list:
    """chroma corpora -> Sentences per file (first max_chars characters when > 0), with token counts."""
    from bench.common import chroma_corpora
    from qasc.engine.splitter import split_sentences

    docs = []
    for path in chroma_corpora(corpora_dir):
        text = path.read_text(encoding="utf-8")
        if max_chars:
            text = text[:max_chars]
        sents = split_sentences(text, doc_id=path.stem)
        docs.append(sents.with_tokens(embedder.count_tokens(sents.texts())))
    return docs


def chunk_keys(results) -> list[list[tuple[str, int, int]]]:
    return [[(c.doc_id, c.char_start, c.char_end) for c in row] for row in results]


def max_score_diff(a, b) -> float:
    diffs = [abs(x.score - y.score) for ra, rb in zip(a, b, strict=True)
             if chunk_keys([ra]) == chunk_keys([rb]) for x, y in zip(ra, rb, strict=True)]
    return max(diffs, default=0.0)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--model", default=None, help="model folder (default: all-MiniLM-L6-v2 from its package)")
    p.add_argument("--corpora", default=None, help=f"folder of *.md corpora (default {CHROMA}/corpora)")
    p.add_argument("--questions-csv", default=None, help=f"questions (default {CHROMA}/questions.csv)")
    p.add_argument("--max-chars", type=int, default=0, help="keep the first N characters of each corpus (0: all)")
    p.add_argument("--questions", type=int, default=0, help="distinct questions used (0: all)")
    p.add_argument("--batch", type=int, default=10000, help="queries in the timed batch (questions repeated)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (median)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from bench.query import TorchStore, load_questions
    from qasc.engine.config import EngineConfig
    from qasc.engine.embedder import Embedder, resolve_device
    from qasc.engine.query import Engine

    device = resolve_device(args.device)
    cpu = torch.device("cpu")
    config = EngineConfig()
    record = {"bench": "gpu_subset", "device": str(device)}

    # build: split + embed on the device, the store in device memory
    t0 = time.perf_counter()
    emb_dev = Embedder(args.model, device=str(device))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    docs = build_docs(args.corpora, args.max_chars, emb_dev)
    texts = [t for d in docs for t in d.texts()]
    split_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    vec_dev = emb_dev.encode(texts)
    sync(device)
    embed_s = time.perf_counter() - t0
    engine = Engine(TorchStore(docs, vec_dev, str(device)), emb_dev, config, device)
    record.update({"model": emb_dev.path, "dtype": str(emb_dev.dtype).replace("torch.", ""),
                   "documents": len(docs), "sentences": len(texts), "model_load_s": load_s, "split_s": split_s,
                   "embed_s": embed_s, "build_sentences_per_s": len(texts) / max(split_s + embed_s, 1e-9)})
    print(f"store: {len(docs)} documents, {len(texts)} sentences; split {split_s:.2f} s, embed {embed_s:.2f} s on "
          f"{device} ({emb_dev.dtype})", flush=True)

    # query: end to end and pre-embedded
    qpath = Path(args.questions_csv) if args.questions_csv else None
    distinct = load_questions(args.questions or _all_questions(qpath), qpath)
    batch_q = [distinct[i % len(distinct)] for i in range(args.batch)]
    t_e2e = median(time_repeats(lambda: engine.query(batch_q), args.repeats, warmup=1, device=device))
    q_batch = engine.embed_queries(batch_q)
    t_pre = median(time_repeats(lambda: engine.query_embedded(q_batch), args.repeats, warmup=1, device=device))
    record.update({"questions": len(distinct), "batch": args.batch, "repeats": args.repeats,
                   "query_batch_qps": args.batch / t_e2e, "kernels_batch_qps": args.batch / t_pre})
    print(f"queries: {args.batch} (from {len(distinct)} questions): end to end {args.batch / t_e2e:,.0f} q/s, "
          f"pre-embedded {args.batch / t_pre:,.0f} q/s", flush=True)

    # equal (a): the same vectors, run on CPU
    q_dev = engine.embed_queries(distinct)
    out_dev = engine.query_embedded(q_dev)
    engine_cpu = Engine(TorchStore(docs, vec_dev, "cpu"), None, config, cpu)
    out_cpu_same = engine_cpu.query_embedded(q_dev.cpu())
    same = [a == b for a, b in zip(chunk_keys(out_dev), chunk_keys(out_cpu_same), strict=True)]
    diff_a = max_score_diff(out_dev, out_cpu_same)
    equal_a = {"same_chunks_share": sum(same) / len(same), "max_score_diff": diff_a,
               "outputs_equal": all(same) and diff_a <= 1e-4}

    # equal (b): the whole CPU path, float32 vectors of its own
    t0 = time.perf_counter()
    if device.type == "cpu" and emb_dev.dtype == torch.float32:
        emb_cpu, vec_cpu, note = emb_dev, vec_dev, "device is cpu/float32: the device path is the CPU path"
    else:
        emb_cpu = Embedder(args.model, device="cpu", dtype="float32")
        vec_cpu, note = emb_cpu.encode(texts), None
    cpu_path = Engine(TorchStore(docs, vec_cpu, "cpu"), emb_cpu, config, cpu)
    q_cpu = cpu_path.embed_queries(distinct)
    out_cpu = cpu_path.query_embedded(q_cpu)
    cpu_s = time.perf_counter() - t0
    keys_dev, keys_cpu = chunk_keys(out_dev), chunk_keys(out_cpu)
    equal_b = {
        "same_chunks_share": float(np.mean([a == b for a, b in zip(keys_dev, keys_cpu, strict=True)])),
        "same_first_chunk_share": float(np.mean([a[:1] == b[:1] for a, b in zip(keys_dev, keys_cpu, strict=True)])),
        "max_score_diff_same_chunks": max_score_diff(out_dev, out_cpu),
        "min_cosine_sentences": float((vec_dev * vec_cpu).sum(1).min()) if len(texts) else None,
        "min_cosine_queries": float((q_dev.float().cpu() * q_cpu.float()).sum(1).min()),
        "cpu_path_s": cpu_s, "note": note,
    }
    record.update({"equal_same_vectors": equal_a, "equal_cpu_path": equal_b,
                   "outputs_equal": equal_a["outputs_equal"], "machine": machine_info(device)})
    print(f"CPU == {device} on the same vectors: {equal_a}\nwhole CPU path vs {device}: {equal_b}", flush=True)
    emit_json(record)
    return record


def _all_questions(path) -> int:
    with open(path or CHROMA / "questions.csv", encoding="utf-8", newline="") as fh:
        return sum(1 for _ in csv.DictReader(fh))


if __name__ == "__main__":
    main()
