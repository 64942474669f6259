"""The rerank stage's cost: the engine's cross-encoder pairs/s against sentence-transformers' CrossEncoder.predict
on the same model, pairs and threads in the same run, and `qasc query`'s queries/s with and without the stage.

The model is a MiniLM-L6 cross-encoder in size (the shipped all-MiniLM-L6-v2 weights with a random one-label head,
saved to a temporary folder: the architecture and cost of cross-encoder/ms-marco-MiniLM-L-6-v2, which does not
ship offline). The pairs are real: each question of the store's data set with its first stage's best `--top`
chunks (heading path + text), as the stage reads them; without a store (the GPU check), runs of 1-8 consecutive
chroma_general sentences. The two scorers alternate, `--repeats` times each, and their medians are compared; both
agree on every score (max |sigmoid difference| reported). queries/s: the local path of `qasc query`
(Engine.query_stream -> ResultWriter, one engine opened each way), medians of `--repeats`, with a store only.

    python -m bench.rerank                         # the chroma_general store of the eval cache
    python -m bench.rerank --device cuda --model .gpu-pack/model --skip-query      # bench/gpu_check.sh
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

from bench.common import CHROMA, emit_json, machine_info, median, sync
from qasc.engine.columns import RERANK_COLUMNS

EVAL_STORES = Path.home() / ".cache" / "qasc" / "eval" / "stores"


def cross_encoder_folder(folder: Path, base: str | None = None) -> str:
    """The shipped MiniLM-L6 (or the encoder folder `base`) with a random one-label sequence-classification head,
    saved to `folder`."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from qasc.engine.embedder import resolve_model_path

    hf_logging.set_verbosity_error()  # "newly initialized: classifier.weight": the random head, on purpose
    torch.manual_seed(0)
    base = base or resolve_model_path(None)
    AutoModelForSequenceClassification.from_pretrained(base, num_labels=1).save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    return str(folder)


def find_store(store: str | None) -> str | None:
    """--store, else the chroma_general store of the eval cache, else None."""
    if store:
        return store
    from bench.answer_digest import find_store as cached

    try:
        return str(cached(EVAL_STORES, "chroma_general"))
    except SystemExit:
        return None


def corpus_pairs(questions: list[str], top: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Without a store (the GPU check): each question with `top` runs of 1-8 consecutive chroma_general sentences
    (the lengths of QASC's chunks, from one sentence to a section)."""
    import random

    from bench.common import chroma_sentences

    sentences = chroma_sentences(4000)
    rng = random.Random(seed)
    qs, texts = [], []
    for q in questions:
        for _ in range(top):
            i, k = rng.randrange(len(sentences) - 8), rng.choice([1, 1, 2, 3, 5, 8])
            qs.append(q)
            texts.append(" ".join(sentences[i : i + k]))
    return qs, texts


def load_questions(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8", newline="") as fh:
        return [row["question"] for row in csv.DictReader(fh)][:n]


def first_stage_pairs(engine, questions: list[str], top: int) -> tuple[list[str], list[str]]:
    """Each question with its first stage's best `top` chunks, as the stage reads them (heading path + text)."""
    from qasc.engine.assemble import ChunkColumns
    from qasc.engine.rerank import first_stage_params

    params = first_stage_params(engine.config.qasc, top)
    cols = ChunkColumns.concat([c for _, c in engine.query_columns(engine.embed_queries(questions), params,
                                                                    questions=questions)])
    paths = engine.chunk_paths(cols)
    return ([questions[q] for q in cols.query.tolist()],
            [f"{p}\n{t}" if p else t for p, t in zip(paths, cols.text, strict=True)])


def query_rate(engine, questions: list[str], out: Path, repeats: int) -> float:
    """queries/s of qasc query's local path: query_stream -> ResultWriter, median of `repeats`."""
    from qasc.jobs.results import ResultWriter

    ids = [str(i) for i in range(len(questions))]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        with ResultWriter(out, reranked=engine.reranker is not None) as writer:
            writer.write_all(engine.query_stream(questions, ids))
        times.append(time.perf_counter() - t0)
    return len(questions) / median(times)


def main(argv: list[str] | None = None) -> None:
    import numpy as np
    import torch

    from qasc.engine.query import Engine
    from qasc.engine.rerank import RERANK_TOP, Reranker

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default=None, help="a committed store (default: chroma_general of the eval cache)")
    ap.add_argument("--questions", default=str(CHROMA / "questions.csv"), help="questions.csv of the store's set")
    ap.add_argument("--queries", type=int, default=48, help="questions scored (their pairs: up to --top each)")
    ap.add_argument("--top", type=int, default=RERANK_TOP, help="candidates per question (the stage's rerank_top)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--st-batch", type=int, default=32, help="CrossEncoder.predict's batch_size (its default 32)")
    ap.add_argument("--batch-tokens", type=int, default=None, help="the engine's padded tokens per forward")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="the encoder folder the cross-encoder is made of (default: the "
                    "shipped MiniLM-L6)")
    ap.add_argument("--skip-query", action="store_true", help="pairs/s only (no qasc query timing)")
    ap.add_argument("--no-st", action="store_true", help="the engine only (no sentence-transformers)")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="qasc-bench-rerank-") as tmp_dir:
        tmp = Path(tmp_dir)
        model = cross_encoder_folder(tmp / "cross-encoder", args.model)
        store = find_store(args.store)
        questions = load_questions(Path(args.questions), args.queries)
        off = None if store is None else Engine.open(store, device=str(device))
        qs, texts = corpus_pairs(questions, args.top) if off is None else first_stage_pairs(off, questions, args.top)
        reranker = Reranker(model, device, args.top, args.batch_tokens)
        pairs = list(zip(qs, texts, strict=True))
        tokens = [len(x) for x in reranker.tokenizer(qs, texts, truncation="longest_first",
                                                     max_length=reranker.max_length)["input_ids"]]

        def engine_run():
            return reranker.score(qs, texts)

        runs = [engine_run]
        if not args.no_st:
            from sentence_transformers import CrossEncoder

            st = CrossEncoder(model, device=str(device), max_length=reranker.max_length,
                              model_kwargs={"dtype": reranker.dtype})  # the engine's dtype (fp32 on CPU)

            def st_run():
                return st.predict(pairs, batch_size=args.st_batch, show_progress_bar=False, convert_to_numpy=True)

            runs.append(st_run)
        outputs = [np.asarray(fn(), np.float64) for fn in runs]  # warm-up, and the agreement check
        agree = float(np.abs(1 / (1 + np.exp(-outputs[0])) - outputs[1]).max()) if len(outputs) > 1 and len(
            pairs) else None
        t_engine, t_st = [], []
        for _ in range(args.repeats):  # alternated: both see the same load
            for fn, times in zip(runs, (t_engine, t_st), strict=False):
                sync(device)
                t0 = time.perf_counter()
                fn()
                sync(device)
                times.append(time.perf_counter() - t0)
        record = {
            "bench": "rerank", "device": str(device), "threads": torch.get_num_threads(), "pairs": len(pairs),
            "queries": len(questions), "top": args.top, "store": store or "none: chroma_general sentence runs",
            "dtype": str(reranker.dtype).replace("torch.", ""), "pair_tokens_median": median(tokens),
            "pair_tokens_max": max(tokens, default=0), "engine_batch_tokens": reranker.batch_tokens,
            "st_batch": args.st_batch, "engine_pairs_per_s": len(pairs) / median(t_engine),
            "st_pairs_per_s": len(pairs) / median(t_st) if t_st else None, "max_abs_sigmoid_diff": agree,
            "engine_s": t_engine, "st_s": t_st,
        }
        record["ratio"] = record["engine_pairs_per_s"] / record["st_pairs_per_s"] if t_st else None
        if not args.skip_query and store is not None:
            on = Engine.open(store, device=str(device), reranker=model, rerank_top=args.top)
            out = tmp / "answers.parquet"
            rates_off, rates_on = [], []
            for _ in range(args.repeats):
                rates_off.append(query_rate(off, questions, out, 1))
                rates_on.append(query_rate(on, questions, out, 1))
            record.update(query_qps_off=median(rates_off), query_qps_on=median(rates_on),
                          query_columns_on=list(RERANK_COLUMNS))
        record["machine"] = machine_info(device)
        print(f"engine {record['engine_pairs_per_s']:.1f} pairs/s, CrossEncoder.predict "
              f"{record['st_pairs_per_s'] or float('nan'):.1f} pairs/s ({record['ratio'] or float('nan'):.2f}x), "
              f"{len(pairs)} pairs, {record['threads']} threads", flush=True)
        emit_json(record)


if __name__ == "__main__":
    main()
