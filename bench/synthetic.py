"""The synthetic store that bench.scale, bench.ingest_memory, bench.ivf_sweep and bench.searchers_real share.

- the corpus: N sentences of synthetic markdown under WORK (documents of 20-400 sentences on one of 1000 topics,
  sections with `##` headings, paragraphs of 1-8 sentences, sentences of 8-40 words from a seeded Zipf vocabulary),
  written once and reused for the same size, seed and CORPUS_VERSION;
- the model: a randomly initialised 1-layer BERT (hidden 384, 6 heads, intermediate 384, seeded) with the MiniLM
  tokenizer, so that ingest measures the pipeline rather than MiniLM on 2 cores, and TableEmbedder, its
  word-embedding table mean-pooled in numpy (`--embedder table`: the pipeline without the model's cost);
- the queries: noisy copies of stored vectors, the noise measured in units of the store's spread.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

CORPUS_VERSION = 3

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
