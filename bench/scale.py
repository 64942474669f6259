"""Scale: a store of N synthetic sentences, ingest rate and driver memory, 10k pre-embedded queries exact vs IVF.

Phases (each timed; the JSON line lists them under `phase_s`):
  corpus   N sentences of synthetic markdown (documents of 20-400 sentences, sections with headings, paragraphs of
           1-8 sentences, sentences of 8-40 words from a seeded Zipf vocabulary) under WORK, reused when present;
  model    a randomly initialised 1-layer BERT (hidden 384, 6 heads, intermediate 384, seeded) with the MiniLM
           tokenizer, so that ingest measures the pipeline rather than MiniLM on 2 cores;
  ingest   `python -m qasc.jobs.cli ingest ... --local --index ivf --dtype-store float16` in a child process:
           sentences/s and the child's peak RSS (the driver: with --local it also embeds);
  exact    a child process: Engine.query_embedded (search + QASC + assembly) on --exact-queries noisy copies of
           stored vectors, exact search; its hits at the engine's depth are the ground truth for recall;
  ivf      a child process: the same on --queries queries through the store's IVF index (q/s, recall@depth vs
           exact, peak RSS; FAISS searches the index, engine.store.search), then --stream-queries queries'
           results streamed to Parquet (RSS growth);
  quality  real MiniLM (the default model) on a chroma_general store with an IVF index: share of queries whose
           top chunk is the same through IVF and exact search (skipped without ../shared).
Sizes in GiB (2^30 bytes). Targets (issue 14): IVF >= 2,000 q/s at 1M sentences, recall@depth >= 0.95, query peak
RSS <= 1.5 x stored embedding bytes + 1 GiB, RSS growth for 100k streamed queries <= 0.5 GiB, ingest driver <= 1 GiB.

    python -m bench.scale --quick                 # 20k sentences, 1k queries, 10k streamed: about 2 minutes
    python -m bench.scale --sentences 200000
    python -m bench.scale                         # 1M sentences, 10k queries, 100k streamed (see bench/RESULTS.md)
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.common import CHROMA, REPO, emit_json, machine_info, median, print_table

GiB = float(1 << 30)
CORPUS_VERSION = 3
GROWTH_QUERIES = 100_000  # the streamed batch: RSS growth is reported for this many queries
KEYS = ("ingest_sentences_per_s", "driver_peak_rss_gb", "query_per_s_exact", "query_per_s_ivf",
        "ivf_recall_at_depth", "peak_rss_gb", "rss_growth_100k_queries_gb")

# --------------------------------------------------------------------------------------------- synthetic corpus

_ONSETS = ("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br", "cl",
           "dr", "gr", "pl", "st", "tr", "sh", "ch", "th")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
_CODAS = ("", "", "", "n", "r", "s", "l", "m", "t", "nd", "st")


def vocabulary(size: int, rng: np.random.Generator) -> np.ndarray:
    """size distinct lowercase words, shuffled into Zipf rank order (object array): 80% whole words of the default
    model's vocab.txt (one token each), 20% pseudo-words of 2-3 syllables (several tokens each), so that a sentence
    has about 1.3 tokens per word as English text does."""
    from qasc.engine.embedder import resolve_model_path

    vocab = Path(resolve_model_path(None)) / "vocab.txt"
    real = sorted({w for w in vocab.read_text(encoding="utf-8").split() if w.isalpha() and w.isascii()
                   and w.islower() and len(w) >= 2})
    words = dict.fromkeys(rng.choice(np.array(real, dtype=object), size=min(len(real), size * 4 // 5),
                                     replace=False).tolist())
    while len(words) < size:
        words["".join(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))] +
                      _CODAS[rng.integers(len(_CODAS))] for _ in range(int(rng.integers(2, 4))))] = None
    out = np.array(list(words), dtype=object)
    rng.shuffle(out)
    return out


class SentenceSource:
    """Sentences of 8-40 words from a seeded vocabulary: words drawn by Zipf(1.1) rank, 40% of them from the
    document's topic (TOPIC_WORDS words of one of TOPICS topics), so that a document's sentences share words."""

    TOPICS, TOPIC_WORDS, TOPIC_SHARE = 1000, 200, 0.4

    def __init__(self, rng: np.random.Generator, vocab_size: int = 20000) -> None:
        self.rng = rng
        self.vocab = vocabulary(vocab_size, rng)
        p = 1.0 / np.arange(1, vocab_size + 1) ** 1.1
        self.p = p / p.sum()
        self.topics = rng.integers(500, vocab_size, size=(self.TOPICS, self.TOPIC_WORDS))  # beyond the commonest

    def sentences(self, n: int, topic: int) -> list[str]:
        rng = self.rng
        n_words = rng.integers(8, 41, size=n)
        total = int(n_words.sum())
        ids = rng.choice(len(self.vocab), size=total, p=self.p)
        own = rng.random(total) < self.TOPIC_SHARE
        ids[own] = self.topics[topic][rng.integers(0, self.TOPIC_WORDS, size=int(own.sum()))]
        words = self.vocab[ids]
        comma = rng.random(n) < 0.3  # a comma after the 3rd word of 30% of sentences
        question = rng.random(n) < 0.05
        ends = np.cumsum(n_words)
        out = []
        for i, (lo, hi) in enumerate(zip(ends - n_words, ends, strict=True)):
            w = words[lo:hi].tolist()
            w[0] = w[0].capitalize()
            if comma[i]:
                w[2] += ","
            out.append(" ".join(w) + ("?" if question[i] else "."))
        return out

    def heading(self, level: int, topic: int) -> str:
        ids = self.topics[topic][self.rng.integers(0, self.TOPIC_WORDS, size=int(self.rng.integers(2, 7)))]
        return "#" * level + " " + " ".join(self.vocab[ids].tolist()).capitalize()


def document(src: SentenceSource, n_sentences: int) -> str:
    """Markdown of about n_sentences sentences (headings count as one) on one topic: a title, sections of 2-8
    paragraphs under a `##` heading, paragraphs of 1-8 sentences on one line each, blank lines between blocks."""
    rng = src.rng
    topic = int(rng.integers(src.TOPICS))
    body = src.sentences(n_sentences, topic)[::-1]
    blocks, left = [src.heading(1, topic)], n_sentences - 1
    while left > 0:
        blocks.append(src.heading(2, topic))
        left -= 1
        for _ in range(int(rng.integers(2, 9))):
            if left <= 0:
                break
            k = min(left, int(rng.integers(1, 9)))
            blocks.append(" ".join(body.pop() for _ in range(k)))
            left -= k
    return "\n\n".join(blocks) + "\n"


def corpus_dir(work: Path, n: int, seed: int) -> Path:
    return work / f"corpus-{n}-s{seed}"


def write_corpus(root: Path, n_sentences: int, seed: int) -> dict:
    """Writes ~n_sentences sentences as .md documents under root/docs (500 per folder); root/corpus.json, written
    last, records what is there, and a folder whose corpus.json matches (n, seed, version) is reused as is."""
    marker = root / "corpus.json"
    want = {"version": CORPUS_VERSION, "n_sentences": n_sentences, "seed": seed}
    if marker.is_file():
        info = json.loads(marker.read_text())
        if all(info.get(k) == v for k, v in want.items()):
            return {**info, "reused": True}
    if root.exists():
        shutil.rmtree(root)
    docs = root / "docs"
    rng = np.random.default_rng(seed)
    src = SentenceSource(rng)
    written = n_docs = n_bytes = 0
    while written < n_sentences:
        k = min(int(rng.integers(20, 401)), n_sentences - written)
        folder = docs / f"{n_docs // 500:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        data = document(src, k).encode()
        (folder / f"doc{n_docs:07d}.md").write_bytes(data)
        written, n_docs, n_bytes = written + k, n_docs + 1, n_bytes + len(data)
    info = {**want, "documents": n_docs, "bytes": n_bytes}
    marker.write_text(json.dumps(info))
    return {**info, "reused": False}


# --------------------------------------------------------------------------------------------- tiny model


def tiny_model_path(work: Path, seed: int) -> Path:
    return work / f"bert-1layer-384-s{seed}"


def tiny_model(work: Path, seed: int) -> Path:
    """A randomly initialised 1-layer BERT (hidden 384, 6 heads, intermediate 384; weights seeded) with the default
    model's tokenizer files, saved under work once: a model folder `--model` accepts."""
    folder = tiny_model_path(work, seed)
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    from transformers import BertConfig, BertModel

    from qasc.engine.embedder import resolve_model_path

    minilm = Path(resolve_model_path(None))
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    base = json.loads((minilm / "config.json").read_text())
    config = BertConfig(vocab_size=base["vocab_size"], hidden_size=384, num_hidden_layers=1, num_attention_heads=6,
                        intermediate_size=384, max_position_embeddings=base["max_position_embeddings"])
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(tmp, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm / name, tmp / name)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


class TableEmbedder:
    """`--embedder table`: the tiny model's word-embedding table, mean-pooled over each sentence's tokens and
    L2-normalised (no transformer layer), vectorised in numpy: ingest then measures the pipeline (read, split,
    token cap, write, index) with the model's cost taken out. Handed to engine.store.ingest(embedder=...); the
    store records the tiny model's folder, so it serves this benchmark only."""

    def __init__(self, model: Path, max_length: int = 256) -> None:
        from safetensors.numpy import load_file

        from qasc.engine.tokencap import load_tokenizer

        self.tokenizer = load_tokenizer(str(model))
        self.table = load_file(str(model / "model.safetensors"))["embeddings.word_embeddings.weight"]  # (V, dim)
        self.dim, self.max_length = int(self.table.shape[1]), max_length

    def encode(self, texts: list[str], progress=None) -> np.ndarray:
        """texts (N) -> (N, dim) float32 unit vectors."""
        ids = self.tokenizer(list(texts), add_special_tokens=True, truncation=True, max_length=self.max_length,
                             return_attention_mask=False)["input_ids"]
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter((t for x in ids for t in x), dtype=np.int64, count=int(lengths.sum()))
        out = np.add.reduceat(self.table[flat], np.concatenate([[0], np.cumsum(lengths)[:-1]]), axis=0)
        out /= np.linalg.norm(out, axis=1, keepdims=True).clip(min=1e-12)
        if progress is not None:
            progress(len(texts))
        return out.astype(np.float32, copy=False)


def ingest_child(spec: dict) -> dict:
    """`--embedder table`: engine.store.ingest in this process with a TableEmbedder (the ingest CLI loads a model)."""
    from qasc.engine.config import EmbedderConfig, EngineConfig
    from qasc.engine.store import IngestConfig, IngestProgress, ingest

    model = Path(spec["model"])
    summary = ingest([spec["corpus"]], spec["store"], EngineConfig(embedder=EmbedderConfig(model=str(model))),
                     IngestConfig(index=spec["index"], dtype_store=spec["dtype_store"]),
                     embedder=TableEmbedder(model), progress=IngestProgress(bar=False))
    return {"summary": summary, "driver_peak_rss_bytes": proc_status("VmHWM")}


# --------------------------------------------------------------------------------------------- processes and memory


def proc_status(key: str) -> int:
    """Bytes of a /proc/self/status field (VmRSS, VmHWM); 0 where unavailable."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakRss:
    """RSS high-water mark over a `with` block: VmHWM after resetting it (/proc/self/clear_refs), and a sampling
    thread as the fallback where the reset is refused. `.before`, `.peak`, `.after` in bytes."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.every_s, self.peak, self._stop = every_s, 0, threading.Event()

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, proc_status("VmRSS"))

    def __enter__(self) -> PeakRss:
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.before = self.peak = proc_status("VmRSS")
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.after = proc_status("VmRSS")
        self.peak = max(self.peak, self.after, proc_status("VmHWM") if self.hwm_reset else 0)


def run_child(cmd: list[str], log: Path, env: dict | None = None) -> tuple[float, int]:
    """Runs cmd (cwd: the repository, output to log) -> (wall seconds, the child's peak RSS in bytes, from wait4).
    SystemExit with the log's tail when it fails."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:])
        raise SystemExit(f"bench.scale: {' '.join(cmd[:4])} ... failed (rc {proc.returncode}); {log}:\n{tail}")
    return wall, usage.ru_maxrss * 1024  # ru_maxrss is in KiB on Linux


# --------------------------------------------------------------------------------------------- ingest


def ingest_store(corpus: Path, store: Path, model: Path, args: argparse.Namespace) -> dict:
    """`qasc ingest` of the corpus into store in a child process -> its numbers (saved beside the store, reused with
    --reuse-store)."""
    record_path = store.with_name(store.name + ".ingest.json")
    if args.reuse_store and (store / "manifest.json").is_file() and record_path.is_file():
        return {**json.loads(record_path.read_text()), "reused": True}
    shutil.rmtree(store, ignore_errors=True)
    if args.embedder == "table":
        spec_path = store.with_name(store.name + ".ingest.spec.json")
        spec_path.write_text(json.dumps({"kind": "ingest", "corpus": str(corpus / "docs"), "store": str(store),
                                         "model": str(model), "index": args.index, "dtype_store": args.dtype_store,
                                         "out": str(store.with_name(store.name + ".ingest.out.json"))}))
        cmd = [sys.executable, "-m", "bench.scale", "--child", str(spec_path)]
    else:
        cmd = [sys.executable, "-m", "qasc.jobs.cli", "ingest", str(corpus / "docs"), "--store", str(store), "--model",
               str(model), "--index", args.index, "--dtype-store", args.dtype_store, "--no-progress"]
        cmd += ["--local"] if not args.ray else ["--workers", "1"]
        if args.batch_tokens:
            cmd += ["--batch-tokens", str(args.batch_tokens)]
    wall, maxrss = run_child(cmd, store.with_name(store.name + ".ingest.log"))
    # wait4's peak covers the child's own children too (the local ingest builds large indexes in one,
    # engine.store.index_child): the driver's own peak is its VmHWM, reported by the table child
    out_path = store.with_name(store.name + ".ingest.out.json")
    out = json.loads(out_path.read_text()) if args.embedder == "table" and out_path.is_file() else {}
    summary = out.get("summary", {})
    driver = out.get("driver_peak_rss_bytes") or maxrss
    manifest = json.loads((store / "manifest.json").read_text())
    n = int(manifest["counts"]["sentences"])
    record = {"sentences": n, "documents": int(manifest["counts"]["documents"]), "wall_s": wall,
              "ingest_sentences_per_s": n / wall, "driver_peak_rss_gb": driver / GiB,
              "process_tree_peak_rss_gb": maxrss / GiB, "index_peak_rss_gb": summary.get("index_peak_rss_gb"),
              "embedder": args.embedder,
              "mode": "ray" if args.ray and args.embedder == "model" else "local", "index": manifest["index"]["kind"],
              "index_params": manifest["index"]["params"],
              "dtype_store": manifest["dtype"], "dim": int(manifest["dim"]), "command": " ".join(cmd[1:])}
    record_path.write_text(json.dumps(record))
    return {**record, "reused": False}


# --------------------------------------------------------------------------------------------- queries


def spread(emb, sample: int = 20000, seed: int = 0) -> float:
    """emb (N, dim) tensor -> RMS distance of stored vectors from their mean (a seeded sample of rows): the scale
    of the store's own variation, which query noise is measured in."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, emb.shape[0], (min(sample, emb.shape[0]),), generator=g)
    x = emb[rows].float()
    return float((x - x.mean(0)).norm(dim=1).pow(2).mean().sqrt())


def noisy_queries(emb, n: int, noise: float, seed: int, scale: float | None = None):
    """emb (N, dim) tensor (any float dtype) -> queries (n, dim) float32 unit vectors, sources (n,) int64: each the
    stored vector of a random row plus a random direction of norm noise x scale (default scale: spread(emb)), then
    re-normalised. Relative to the spread, so that queries are as hard for a 1-layer random model's anisotropic
    vectors (spread ~0.2) as for MiniLM's (spread ~0.9)."""
    import torch

    scale = spread(emb) if scale is None else scale
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, emb.shape[0], (n,), generator=g)
    q = emb[src].float()
    q = q / q.norm(dim=1, keepdim=True).clamp_min(1e-12)
    d = torch.nn.functional.normalize(torch.randn(q.shape, generator=g), dim=1)
    return torch.nn.functional.normalize(q + noise * scale * d, dim=1), src


def blocked_exact_search(emb, query_emb: np.ndarray, k: int, block_elems: int = 1 << 24):
    """emb (N, dim) tensor, query_emb (Q, dim) float32, k -> exact top-k (scores (Q, k) float32, rows (Q, k) int64)
    by blocks of stored rows: at most block_elems similarities live at a time (no dense (Q, N) matrix)."""
    import torch

    q = torch.as_tensor(np.ascontiguousarray(query_emb, dtype=np.float32))
    n, k = emb.shape[0], min(k, emb.shape[0])
    step = max(k, block_elems // max(len(q), 1))
    best_s = torch.full((len(q), 0), -torch.inf)
    best_r = torch.zeros((len(q), 0), dtype=torch.long)
    for lo in range(0, n, step):
        s = q @ emb[lo : lo + step].float().T  # (Q, step)
        top_s, top_r = s.topk(min(k, s.shape[1]), dim=1)
        cat_s, cat_r = torch.cat([best_s, top_s], 1), torch.cat([best_r, top_r + lo], 1)
        best_s, pick = cat_s.topk(min(k, cat_s.shape[1]), dim=1)
        best_r = cat_r.gather(1, pick)
    return best_s.numpy(), best_r.numpy()


# ---- adapters: today's APIs, switched to issue 14's new ones where they exist (one place each) ----


def engine_exact_is_blocked() -> bool:
    """Whether a store opened without its index searches by blocks already (issue 14 item 1: index.exact_topk).
    Before that, index.exact_search builds a dense (Q, N) matrix (8 GB per 2048-query slice at 1M rows), so the
    benchmark swaps in blocked_exact_search."""
    from qasc.engine.store import index

    return hasattr(index, "exact_topk")


def open_engine(store_dir: Path, exact: bool, nprobe: int | None = None):
    """An Engine on the CPU over the store, without the query model (queries come pre-embedded); exact: the store is
    opened without its FAISS index, so that search is exact; nprobe: overrides the IVF index's (None: the store's)."""
    import torch

    from qasc.engine.query import Engine
    from qasc.engine.store.reader import Store

    if nprobe and not exact and "nprobe" in inspect.signature(Store.open).parameters:
        store = Store.open(store_dir, load_index=True, nprobe=nprobe)
    else:
        store = Store.open(store_dir, load_index=not exact)
        if nprobe and not exact and hasattr(store.index, "nprobe"):
            store.index.nprobe = nprobe
    engine = Engine(store, None, store.config, torch.device("cpu"))
    if exact and not engine_exact_is_blocked():
        store.search = lambda q, k: blocked_exact_search(engine.embeddings, q, k)
    return engine


def source_texts(engine, sources) -> list[str]:
    """sources (Q,) int64 store rows -> each row's sentence text: the question text of a query made from it."""
    out = []  # the engine's own per-row arrays: each row's document and that document's first row
    for r, d, first in zip(sources.tolist(), engine.doc_of_row[sources].tolist(), engine.doc_first[sources].tolist(),
                           strict=True):
        doc = engine.store.docs[d]
        out.append(doc.text[int(doc.char_start[r - first]) : int(doc.char_end[r - first])])
    return out


def _texts_kw(engine, texts) -> dict:
    return {"questions": texts} if texts is not None and "questions" in inspect.signature(
        engine.query_batches).parameters else {}


def answer(engine, query_emb, slice_size: int, texts: list[str] | None = None) -> int:
    """End to end (search + QASC + assembly) -> rows returned; Engine.query_batches (Arrow batches) when present;
    texts: the questions' texts (the gated lexical term runs), where the engine takes them."""
    if hasattr(engine, "query_batches"):
        return sum(b.num_rows for b in engine.query_batches(query_emb, slice_size=slice_size,
                                                            **_texts_kw(engine, texts)))
    return sum(len(c) for c in engine.query_embedded(query_emb, slice_size=slice_size))


def stream_results(engine, query_emb, path: Path, slice_size: int, texts: list[str] | None = None) -> int:
    """Results of query_emb written to path (.parquet) -> rows written. Engine.query_batches + jobs.results.
    ResultWriter (row groups as slices finish) when present, else today's path: query_embedded, rows, write_results
    (everything collected before the write)."""
    from qasc.jobs import results

    if hasattr(engine, "query_batches") and hasattr(results, "ResultWriter"):
        n = 0
        with results.ResultWriter(str(path)) as writer:
            for batch in engine.query_batches(query_emb, slice_size=slice_size, **_texts_kw(engine, texts)):
                writer.write(batch)
                n += batch.num_rows
        return n
    chunks = engine.query_embedded(query_emb, slice_size=slice_size)
    rows = results.result_rows([str(i) for i in range(len(chunks))], chunks)
    results.write_results(rows, str(path))
    return len(rows)


def query_api() -> str:
    from qasc.engine.query import Engine
    from qasc.jobs import results

    return ("query_batches" if hasattr(Engine, "query_batches") else "query_embedded") + (
        "+ResultWriter" if hasattr(results, "ResultWriter") else "+write_results")


# --------------------------------------------------------------------------------------------- the query child


def query_child(spec: dict) -> dict:
    """One query process (mode exact | ivf): open, warm up, time --repeats runs, save hits; ivf also streams."""
    import torch

    from qasc.engine.config import budget_setting

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    exact = spec["mode"] == "exact"
    t0 = time.perf_counter()
    engine = open_engine(Path(spec["store"]), exact, spec.get("nprobe"))
    if spec.get("budget_tokens"):  # every query with a token budget: the budget fill (passages) runs too, on the
        # setting `qasc query --budget-tokens N` answers with (the budget profile on the store's shipped setting)
        qasc, retrieval, _ = budget_setting(engine.config.qasc.replace(budget_tokens=spec["budget_tokens"]),
                                            engine.config.retrieval)
        engine.config = replace(engine.config, qasc=qasc, retrieval=retrieval)
    out = {"mode": spec["mode"], "open_s": time.perf_counter() - t0, "rss_open_gb": proc_status("VmRSS") / GiB,
           "api": query_api(), "exact_blocked_by_engine": engine_exact_is_blocked(),
           "nprobe": int(getattr(engine.store.index, "nprobe", 0) or 0)}
    depth = min(engine.config.retrieval.depth, engine.n_total)
    scale = spread(engine.embeddings)
    queries, sources = noisy_queries(engine.embeddings, spec["pool"], spec["noise"], spec["seed"], scale)
    queries, sources = queries[: spec["queries"]], sources[: spec["queries"]]  # exact: the first of the same pool
    src_vec = engine.embeddings[sources].float()
    out.update(depth=depth, spread=scale, query_source_cos=float(
        (queries * src_vec / src_vec.norm(dim=1, keepdim=True)).sum(1).mean()))
    del src_vec  # (Q, dim) float32: not part of the engine's memory
    t0 = time.perf_counter()
    hits = engine.search(queries, depth).cpu().numpy()
    out["search_s"] = time.perf_counter() - t0
    out["search_per_s"] = len(queries) / max(out["search_s"], 1e-9)
    np.save(spec["hits"], hits)
    out["source_in_hits"] = float((hits == sources.numpy()[:, None]).any(1).mean())
    texts = source_texts(engine, sources) if spec.get("texts") else None
    out["query_texts"] = texts is not None
    # warm-up: per-store dots and block stats; with texts the lexical BM25 index too (its build counts in the peak)
    answer(engine, queries[: min(len(queries), 256)], spec["slice"], texts and texts[:256])
    times, rows = [], 0
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        rows = answer(engine, queries, spec["slice"], texts)
        times.append(time.perf_counter() - t0)
    out.update(queries=len(queries), times_s=times, rows=rows, query_per_s=len(queries) / median(times),
               peak_rss_gb=proc_status("VmHWM") / GiB)
    if spec["stream"]:
        stream_q, stream_src = noisy_queries(engine.embeddings, spec["stream"], spec["noise"], spec["seed"] + 1, scale)
        st = source_texts(engine, stream_src) if texts is not None else None
        path = Path(spec["stream_path"])
        stream_results(engine, stream_q[: spec["slice"]], path, spec["slice"], st and st[: spec["slice"]])  # not growth
        path.unlink()
        n, sl = spec["stream"], spec["slice"]
        # below GROWTH_QUERIES a first point at n/4 queries (>= 2 slices: one slice's working memory is the same
        # at any Q) gives the slope; with fewer than 4 slices, the growth is scaled linearly (an upper bound)
        small = max(n // 4, 2 * sl) if 4 * sl <= n < GROWTH_QUERIES else 0
        method = "measured" if n >= GROWTH_QUERIES else "slope" if small else "linear"
        if small:
            with PeakRss() as mem:
                stream_results(engine, stream_q[:small], path, spec["slice"], st and st[:small])
            path.unlink()
            base, growth_small = mem.before, mem.peak - mem.before
        t0 = time.perf_counter()
        with PeakRss() as mem:
            n_rows = stream_results(engine, stream_q, path, spec["slice"], st)
        growth = mem.peak - (base if small else mem.before)  # against the first baseline: retained memory counts
        if method == "slope":
            at_target = growth + max(0, growth - growth_small) / (n - small) * (GROWTH_QUERIES - n)
        else:
            at_target = growth * GROWTH_QUERIES / n if method == "linear" else growth
        out.update(stream_queries=n, stream_rows=n_rows, stream_s=time.perf_counter() - t0,
                   stream_file_gb=path.stat().st_size / GiB, stream_rss_before_gb=mem.before / GiB,
                   stream_rss_peak_gb=mem.peak / GiB, rss_growth_stream_gb=growth / GiB,
                   rss_growth_after_gb=(mem.after - mem.before) / GiB, stream_hwm_reset=mem.hwm_reset,
                   stream_small_queries=small, rss_growth_small_gb=growth_small / GiB if small else None,
                   rss_growth_100k_gb=at_target / GiB, rss_growth_100k_method=method)
        path.unlink()
    return out


def run_query_child(mode: str, store: Path, work: Path, n_queries: int, stream: int, args) -> dict:
    base = work / f"{store.name}.query-{mode}"
    spec = {"mode": mode, "store": str(store), "queries": n_queries, "pool": args.queries, "noise": args.noise,
            "seed": args.seed + 7, "nprobe": args.nprobe, "repeats": args.repeats,
            "slice": args.slice,
            "threads": args.threads, "stream": stream, "hits": f"{base}.hits.npy", "budget_tokens": args.budget_tokens,
            "texts": args.query_texts, "stream_path": f"{base}.stream.parquet", "out": f"{base}.json"}
    spec_path = Path(f"{base}.spec.json")
    spec_path.write_text(json.dumps(spec))
    wall, maxrss = run_child([sys.executable, "-m", "bench.scale", "--child", str(spec_path)], Path(f"{base}.log"))
    rec = json.loads(Path(spec["out"]).read_text())
    # wait4's ru_maxrss is the high-water mark that PeakRss resets (clear_refs) before streaming: the max of all three
    peak = max(maxrss / GiB, rec["peak_rss_gb"], rec.get("stream_rss_peak_gb") or 0.0)
    return {**rec, "wall_s": wall, "process_peak_rss_gb": peak, "hits": spec["hits"]}


def recall_at_depth(approx: np.ndarray, exact: np.ndarray) -> float:
    """approx, exact (Q, k) int64 rows (-1 = none) -> mean share of each query's exact hits found by approx, over
    the first min(Q) queries (engine.store.index.recall_at_depth where it exists, the same measure)."""
    from qasc.engine.store import index

    q = min(len(approx), len(exact))
    if hasattr(index, "recall_at_depth"):
        return index.recall_at_depth(approx[:q], exact[:q])
    found = [len(set(a[a >= 0].tolist()) & set(e[e >= 0].tolist())) / max(int((e >= 0).sum()), 1)
             for a, e in zip(approx[:q], exact[:q], strict=True)]
    return float(np.mean(found)) if found else float("nan")


# --------------------------------------------------------------------------------------------- quality (MiniLM)


def quality_check(work: Path, args: argparse.Namespace) -> dict:
    """Real MiniLM on a chroma_general store with an IVF index: the top chunk through IVF vs exact search."""
    folder = Path(args.quality_corpora or CHROMA / "corpora")
    names = [n for n in args.quality_docs.split(",") if n] if args.quality_docs else None
    files = sorted(p for p in folder.glob("*.md") if names is None or p.stem in names)
    if not files:
        return {"skipped": f"no chroma_general corpora under {folder}"}
    import torch

    from qasc.engine.query import Engine
    from qasc.engine.store.reader import Store

    store = work / ("quality-" + "-".join(p.stem for p in files) + "-ivf")
    t0 = time.perf_counter()
    if not (store / "manifest.json").is_file():
        shutil.rmtree(store, ignore_errors=True)
        run_child([sys.executable, "-m", "qasc.jobs.cli", "ingest", *map(str, files), "--store", str(store), "--local",
                   "--index", "ivf", "--no-progress"], work / "quality-ingest.log")
    ingest_s = time.perf_counter() - t0
    ivf = Engine.open(str(store), device="cpu")
    plain = Store.open(store, load_index=False)
    exact = Engine(plain, None, plain.config, torch.device("cpu"))
    questions = _questions(folder.parent / "questions.csv", {p.stem for p in files})[: args.quality_queries]
    q_text = ivf.embed_queries(questions) if questions else torch.zeros((0, ivf.embeddings.shape[1]))
    n_noisy = max(0, args.quality_queries - len(questions))
    q_noisy, _ = noisy_queries(ivf.embeddings, n_noisy, args.noise, args.seed + 11)
    depth = min(ivf.config.retrieval.depth, ivf.n_total)
    params = ivf.store.manifest["index"]["params"]
    out = {"store": str(store), "sentences": ivf.n_total, "index_params": params, "ingest_s": ingest_s,
           "depth": depth, "probed_share": min(1.0, params.get("nprobe", 1) / params.get("nlist", 1))}
    for name, q in (("questions", q_text), ("noisy_sentences", q_noisy)):
        if not len(q):
            continue
        a, b = ivf.query_embedded(q), exact.query_embedded(q)
        same = [(x[0].doc_id, x[0].char_start, x[0].char_end) == (y[0].doc_id, y[0].char_start, y[0].char_end)
                if x and y else (not x and not y) for x, y in zip(a, b, strict=True)]
        out[name] = {"queries": len(q), "same_top_chunk": float(np.mean(same)),
                     "recall_at_depth": recall_at_depth(ivf.search(q, depth).numpy(), exact.search(q, depth).numpy())}
    out["wall_s"] = time.perf_counter() - t0
    return out


def _questions(path: Path, corpora: set[str]) -> list[str]:
    import csv

    if not path.is_file():
        return []
    with open(path, encoding="utf-8", newline="") as fh:
        return [r["question"] for r in csv.DictReader(fh) if r.get("corpus_id") in corpora]


# --------------------------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=1_000_000, help="sentences in the synthetic store (default 1M)")
    p.add_argument("--queries", type=int, default=10_000, help="pre-embedded queries timed through IVF (default 10k)")
    p.add_argument("--exact-queries", type=int, default=2000,
                   help="of those, the first N timed through exact search and used for recall (default 2000)")
    p.add_argument("--stream-queries", type=int, default=100_000,
                   help="queries whose results are streamed to Parquet for the RSS growth (default 100k; 0: skip)")
    p.add_argument("--noise", type=float, default=1.0, help="norm of the random direction added to each query's "
                   "source vector, in units of the store's spread (RMS distance from the mean), before "
                   "re-normalising (default 1.0: on MiniLM's chroma_general store the queries' best-hit cosine, 0.72, "
                   "and IVF recall@16, 0.946, match the real questions' 0.72 and 0.964)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per query mode (median; default 3)")
    p.add_argument("--slice", type=int, default=2048, help="queries per engine slice (default 2048)")
    p.add_argument("--threads", type=int, default=0, help="torch threads in the query processes (0: torch default)")
    p.add_argument("--nprobe", type=int, default=0, help="IVF lists probed per query (0: the store's setting)")
    p.add_argument("--query-texts", default=True, action=argparse.BooleanOptionalAction,
                   help="each query carries its source sentence's text as its question, as `qasc query`'s questions "
                        "do, so that the gated lexical term runs and its BM25 index (built on first use) counts in "
                        "the time and the peak RSS (default on; --no-query-texts: vectors only, the runs before "
                        "2026-12-03 18:40)")
    p.add_argument("--budget-tokens", type=int, default=0, help="a token budget on every query, so that the budget "
                   "fill runs (its passages loaded, ranked and appended), on the setting `qasc query --budget-tokens "
                   "N` answers with (the budget profile on a store of shipped settings; default 0: no budget, as "
                   "`qasc query` without --budget-tokens)")
    p.add_argument("--index", default="ivf", help="index kind of the store (default ivf)")
    p.add_argument("--dtype-store", default="float16", help="embedding storage type (default float16)")
    p.add_argument("--batch-tokens", type=int, default=0, help="ingest --batch-tokens (0: the default)")
    p.add_argument("--embedder", default="model", choices=("model", "table"),
                   help="ingest embedding: model = the 1-layer BERT through `qasc ingest` (default); table = its "
                        "word-embedding table mean-pooled, in numpy, through engine.store.ingest(embedder=...): the "
                        "pipeline without the model's cost (about 6x faster on this box), a separate store")
    p.add_argument("--ray", action="store_true", help="ingest through Ray (1 worker) instead of --local")
    p.add_argument("--seed", type=int, default=0, help="corpus, model and query seed (default 0)")
    p.add_argument("--work", default="/tmp/qasc-scale", help="work folder: corpus, model, stores (default "
                   "/tmp/qasc-scale); the corpus and model are reused when present")
    p.add_argument("--reuse-store", action="store_true", help="skip ingest when the store exists (its recorded "
                   "ingest numbers are reported, marked reused)")
    p.add_argument("--quality-queries", type=int, default=10_000,
                   help="quality check: chroma questions plus noisy copies of stored vectors (default 10k)")
    p.add_argument("--quality-docs", default="", help="quality check: comma-separated corpus names of "
                   "chroma_general (default: all)")
    p.add_argument("--quality-corpora", default=None, help="quality check: folder of *.md corpora (default "
                   "chroma_general's)")
    p.add_argument("--no-quality", action="store_true", help="skip the MiniLM quality check")
    p.add_argument("--quick", action="store_true", help="20k sentences, 1k queries (500 exact), 10k streamed, 1 "
                   "repeat, quality on state_of_the_union with 300 queries")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.budget_tokens < 0:
        p.error(f"--budget-tokens must be >= 0, got {args.budget_tokens}")
    if args.quick:
        args.sentences, args.queries, args.exact_queries = 20_000, 1000, 500
        args.stream_queries, args.repeats, args.quality_queries = 10_000, 1, 300
        args.quality_docs = args.quality_docs or "state_of_the_union"
    args.exact_queries = min(args.exact_queries, args.queries)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        spec = json.loads(Path(args.child).read_text())
        result = ingest_child(spec) if spec.get("kind") == "ingest" else query_child(spec)
        Path(spec["out"]).write_text(json.dumps(result))
        return {}
    work = Path(args.work).expanduser().absolute()
    work.mkdir(parents=True, exist_ok=True)
    phases: dict[str, float] = {}

    def phase(name, fn, *a):
        t0 = time.perf_counter()
        print(f"bench.scale: {name} ...", flush=True)
        res = fn(*a)
        phases[name] = round(time.perf_counter() - t0, 2)
        return res

    corpus = corpus_dir(work, args.sentences, args.seed)
    cinfo = phase("corpus", write_corpus, corpus, args.sentences, args.seed)
    model = phase("model", tiny_model, work, args.seed)
    table = "-table" if args.embedder == "table" else ""
    store = work / f"store-{args.sentences}-s{args.seed}-{args.index}-{args.dtype_store}{table}"
    ing = phase("ingest", ingest_store, corpus, store, model, args)
    ex = phase("exact", run_query_child, "exact", store, work, args.exact_queries, 0, args)
    iv = phase("ivf", run_query_child, "ivf", store, work, args.queries, args.stream_queries, args)
    recall = recall_at_depth(np.load(iv["hits"]), np.load(ex["hits"]))
    quality = {"skipped": "--no-quality"}
    if not args.no_quality:
        quality = phase("quality", quality_check, work, args)
    emb_bytes = ing["sentences"] * ing["dim"] * (2 if ing["dtype_store"] == "float16" else 4)
    growth = iv.get("rss_growth_stream_gb", float("nan"))
    growth_100k = iv.get("rss_growth_100k_gb", float("nan"))
    record = {
        "bench": "scale",
        "ingest_sentences_per_s": ing["ingest_sentences_per_s"],
        "driver_peak_rss_gb": ing["driver_peak_rss_gb"],
        "index_peak_rss_gb": ing.get("index_peak_rss_gb"),
        "query_per_s_exact": ex["query_per_s"],
        "query_per_s_ivf": iv["query_per_s"],
        "ivf_recall_at_depth": recall,
        "peak_rss_gb": iv["peak_rss_gb"],
        "rss_growth_100k_queries_gb": growth_100k,
        "rss_growth_stream_gb": growth,
        "rss_growth_100k_method": iv.get("rss_growth_100k_method"),  # measured | slope (n/4 -> n) | linear
        "stream_queries": args.stream_queries,
        "peak_rss_exact_gb": ex["peak_rss_gb"],
        "stream_peak_rss_gb": iv.get("stream_rss_peak_gb"),
        "stored_embedding_gb": emb_bytes / GiB,
        "rss_bound_gb": 1.5 * emb_bytes / GiB + 1.0,
        "sentences": ing["sentences"], "documents": ing["documents"], "queries": args.queries,
        "exact_queries": args.exact_queries, "budget_tokens": args.budget_tokens or None, "depth": iv["depth"],
        "query_texts": args.query_texts,
        "noise": args.noise, "repeats": args.repeats,
        "nprobe": iv["nprobe"], "index": ing["index"], "index_params": ing["index_params"],
        "dtype_store": ing["dtype_store"],
        "ingest": ing, "corpus": cinfo, "query_exact": ex, "query_ivf": iv,
        "quality": quality, "phase_s": phases,
        "api": iv["api"], "command": "python -m bench.scale " + " ".join(sys.argv[1:] if argv is None else argv),
        "host": machine_info(), "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }
    record["targets"] = {
        "query_per_s_ivf>=2000": record["query_per_s_ivf"] >= 2000,
        "ivf_recall_at_depth>=0.95": recall >= 0.95,
        "peak_rss<=1.5x_emb+1GiB": record["peak_rss_gb"] <= record["rss_bound_gb"],
        "rss_growth_100k<=0.5GiB": record["rss_growth_100k_queries_gb"] <= 0.5,
        "driver_peak_rss<=1GiB": record["driver_peak_rss_gb"] <= 1.0,
    }
    print_table([
        {"phase": "ingest" + (" (reused)" if ing.get("reused") else ""), "queries": "-",
         "rate/s": ing["ingest_sentences_per_s"], "seconds": ing["wall_s"], "peak RSS GiB": ing["driver_peak_rss_gb"],
         "note": f"{ing['sentences']:,} sentences, {ing['mode']}, {ing['embedder']}, {ing['index']} "
                 f"{ing['index_params']}" + (f"; index built in a child process (peak "
                                             f"{ing['index_peak_rss_gb']:.2f} GiB)" if ing.get("index_peak_rss_gb")
                                             else "")},
        {"phase": "query exact", "queries": ex["queries"], "rate/s": ex["query_per_s"],
         "seconds": median(ex["times_s"]),
         "peak RSS GiB": ex["peak_rss_gb"], "note": f"depth {ex['depth']}, {ex['api']}"},
        {"phase": "query ivf", "queries": iv["queries"], "rate/s": iv["query_per_s"],
         "seconds": median(iv["times_s"]),
         "peak RSS GiB": iv["peak_rss_gb"], "note": f"recall@{iv['depth']} {recall:.4f}, nprobe {iv['nprobe']}"},
        {"phase": "stream parquet", "queries": args.stream_queries,
         "rate/s": args.stream_queries / iv["stream_s"] if args.stream_queries else float("nan"),
         "seconds": iv.get("stream_s", float("nan")), "peak RSS GiB": iv.get("stream_rss_peak_gb", float("nan")),
         "note": f"growth {growth:.3f} GiB, {iv.get('stream_rows', 0):,} rows; per 100k queries "
                 f"{growth_100k:.3f} GiB ({record['rss_growth_100k_method']})"},
    ], title=f"bench.scale: {ing['sentences']:,} sentences, stored embeddings {emb_bytes / GiB:.3f} GiB "
             f"(RSS bound {record['rss_bound_gb']:.2f} GiB); phases {phases}")
    if "skipped" in quality:
        print(f"quality: skipped ({quality['skipped']})", flush=True)
    else:
        print_table([{"queries": k, "n": quality[k]["queries"], "same top chunk": quality[k]["same_top_chunk"],
                      "recall@depth": quality[k]["recall_at_depth"]} for k in ("questions", "noisy_sentences")
                     if k in quality], title=f"quality (MiniLM, {quality['sentences']:,} sentences, IVF "
                                             f"{quality['index_params']} vs exact; "
                                             f"{quality['probed_share']:.0%} of the lists probed)")
    emit_json(record)
    return record


if __name__ == "__main__":
    main()
