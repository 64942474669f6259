"""`qasc eval`'s model and engine: the embedder (dtype, large batches), the QASC store built or reused from the
cache, the store's sentence embeddings reused by the `sentences` baseline, and the cached question embeddings."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from qasc.engine.errors import QascError
from qasc.jobs.eval import baselines as B
from qasc.jobs.eval.data import Dataset, Question
from qasc.jobs.eval.retrieval import EvalCache, model_key, sha

# Embedding batches: much larger than the engine's CPU default (1024 padded tokens, 32 texts). Measured on
# this 2-core box in bf16: 16384 tokens per batch ran 2-6x faster than 1024 (oneDNN likes tall matrices).
EVAL_BATCH_TOKENS = 16384
EVAL_MAX_BATCH = 512


def resolve_eval_dtype(device: str, dtype: str) -> str:
    """'fast' -> 'bfloat16' on a CPU with native bf16 instructions (avx512_bf16 / amx), else 'auto'."""
    if dtype != "fast":
        return dtype
    from qasc.engine.cpu import cpu_has_native_bf16
    from qasc.engine.embedder import resolve_device

    if resolve_device(device).type != "cpu":
        return "auto"
    return "bfloat16" if cpu_has_native_bf16() else "auto"


def make_embedder(device: str = "cpu", dtype: str = "fast"):
    """The eval's embedder: the default model, `dtype` resolved as by --dtype, large batches."""
    from qasc.engine.embedder import Embedder

    return Embedder(device=device, dtype=resolve_eval_dtype(device, dtype), batch_tokens=EVAL_BATCH_TOKENS,
                    max_batch_size=EVAL_MAX_BATCH)


def default_engine_factory(dataset: Dataset, cache: EvalCache, out_dir: Path, device: str, dtype: str, log,
                           embedder=None):
    """Ingest the corpora into a store (reused from the cache when it exists) and open the query engine.

    `embedder` (same model and dtype as the store's config) is handed to the ingest so that it embeds with
    the eval's large batches (16384-token batches embed 2-6x faster in bf16 on this CPU than the default 32
    texts) instead of loading a second model with the engine's small CPU batches.
    """
    from qasc.engine.config import EmbedderConfig, EngineConfig
    from qasc.engine.embedder import model_fingerprint, resolve_model_path
    from qasc.engine.query import Engine
    from qasc.engine.store import IngestProgress, existing_manifest, ingest

    missing = [c for c in dataset.corpora if c not in dataset.files]
    if missing:
        raise QascError(f"QASC needs the corpus files; the data set has no path for {missing}")
    fp = model_fingerprint(resolve_model_path(None))
    root = cache.root / "stores" if cache.root else out_dir / "stores"
    from qasc.engine.splitter import SplitterConfig
    from qasc.engine.store.schema import FORMAT_VERSION

    splitter = sha(json.dumps(SplitterConfig().describe(), sort_keys=True))[:8]  # a new splitter default: new store
    # a new store format (2: heading paths) is a new store too
    store_dir = root / f"{dataset.name}-{dataset.corpora_fingerprint()}-{fp}-{dtype}-{splitter}-v{FORMAT_VERSION}"
    if existing_manifest(store_dir) is None:
        log(f"building the QASC store {store_dir}")
        t0 = time.perf_counter()
        config = EngineConfig(embedder=EmbedderConfig(device=device, dtype=dtype, batch_tokens=EVAL_BATCH_TOKENS))
        ingest([dataset.files[c] for c in sorted(dataset.corpora)], str(store_dir), config, embedder=embedder,
               progress=IngestProgress(bar=False, log=log), log=log)
        log(f"  store built in {time.perf_counter() - t0:.1f} s")
    engine = Engine.open(str(store_dir), device=device)
    texts = {d.doc_id: d.text for d in engine.store.docs}
    for cid, text in dataset.corpora.items():
        if texts.get(cid) != text:
            raise QascError(f"store {store_dir}: document {cid!r} differs from the data set's corpus text")
    return engine


def seed_sentence_cache(engine, embedder, dataset: Dataset, cache: EvalCache) -> int:
    """Reuse the store's sentence embeddings for the `sentences` baseline (same spans, same model)."""
    if engine is None or getattr(engine, "store", None) is None or cache.root is None:
        return 0
    if model_key(engine.embedder) != model_key(embedder):
        return 0
    store = engine.store
    chunker = B.SentenceChunker(embedder.tokenizer)
    seeded = 0
    for d, (lo, hi) in zip(store.docs, zip(store.doc_offsets[:-1], store.doc_offsets[1:], strict=True), strict=True):
        if d.doc_id not in dataset.corpora:
            continue
        spans = list(zip(d.char_start.tolist(), d.char_end.tolist(), strict=True))
        text = dataset.corpora[d.doc_id]
        key = f"{model_key(embedder)}|{chunker.key()}|{d.doc_id}|{sha(text)}|{sha(json.dumps(spans))}"
        if cache.load_arrays("emb", key) is None:
            cache.save_arrays("emb", key, emb=store.embedding_rows(lo, hi),  # host float32 wherever the vectors live
                              n_tokens=np.asarray(d.n_tokens, dtype=np.int32))
            seeded += 1
    return seeded


def query_embeddings(embedder, questions: Sequence[Question], cache: EvalCache) -> np.ndarray:
    texts = [q.text for q in questions]
    key = f"{model_key(embedder)}|queries|{sha(json.dumps(texts))}"
    got = cache.load_arrays("queries", key)
    if got is not None:
        return got["emb"]
    emb = embedder.encode(texts)
    cache.save_arrays("queries", key, emb=emb)
    return emb
