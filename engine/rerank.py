"""The rerank stage: a user's cross-encoder scores each query's best first-stage chunks; the order fuses both scores.

    engine = Engine.open(store, reranker="/models/ms-marco-MiniLM-L-6-v2")     # qasc query --reranker PATH

The candidates of a query are its first stage's chunks that pass the selection's score margin, the best
`top` of them (RERANK_TOP) by the first stage's score: the first stage runs with top_k = `top` and no token
budget (`first_stage_params`); the budget still caps a chunk's length. A cross-encoder (any transformers
sequence classifier with one label) scores (question, heading path + chunk text) pairs; the final order is the
scoring model's fusion (kernels.signals.rerank_scores: z(first) + z(cross) over the query's candidates), then
the selection's top_k and token budget in that order (kernels.selection.select_chunks). The `score` column keeps
the first stage's score; rows get the cross-encoder's logit (`rerank_score`) and the reranker's name.

Batched across a slice's queries: every pair tokenized at once (no padding), sorted by token count and cut into
buckets of at most `batch_tokens` padded tokens, one forward per bucket under torch.inference_mode(), bf16/fp16
on CUDA, fp32 on CPU; the engine's thread governor steps after each bucket; a progress bar (stderr, terminals
only) from PROGRESS_MIN_PAIRS pairs on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from qasc.engine.assemble import ChunkColumns
from qasc.engine.errors import QascError
from qasc.kernels.selection import select_chunks
from qasc.kernels.signals import rerank_scores

RERANK_TOP = 20  # candidates a query's cross-encoder scores (the best by the first stage's score)
MAX_LENGTH = 512  # tokens of a pair at most (the model's own limit when lower)
BATCH_TOKENS_CPU = 2048  # padded tokens per forward on CPU (8192 was the slowest measured: bench/RESULTS.md, issue 51)
BATCH_TOKENS_GPU = 262_144
MAX_BATCH_PAIRS = 1024  # pairs per forward at most
PROGRESS_MIN_PAIRS = 4096  # a slice with this many pairs shows a progress bar (on a terminal)


def _looks_like_path(name: str) -> bool:
    """A name that can only be a folder (absolute, ./, ~, or more than one '/'): never tried on the hub."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def first_stage_params(params, top: int):
    """The first stage's settings under the rerank: the best `top` chunks within the score margin, no token budget
    (a chunk still fits the budget: max_tokens at most budget_tokens, as run_qasc does)."""
    cap = params.max_tokens if params.budget_tokens is None else min(params.max_tokens, params.budget_tokens)
    return params.replace(top_k=top, budget_tokens=None, max_tokens=cap)


def resolve_reranker(name: str):
    """A reranker's folder or hub name -> (what transformers loads it from, its config), reading its config only;
    QascError naming it for a missing folder, a folder without a model, a hub name while the hub is offline
    (HF_HUB_OFFLINE=1 and not in the local cache), a model that is not a sequence classifier with one label."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if not isinstance(name, str) or not name.strip():
        raise QascError(f"reranker: give a model folder or hub name, got {name!r}")
    folder = Path(name).expanduser()
    if folder.exists() and not folder.is_dir():
        raise QascError(f"reranker {name}: not a folder (a model folder holds config.json and the weights)")
    if not folder.exists() and _looks_like_path(name):
        raise QascError(f"reranker {name}: no such folder")
    path = str(folder) if folder.is_dir() else name
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        if folder.is_dir():
            raise QascError(f"reranker {name}: not a transformers model folder ({_first(exc)})") from None
        if offline:
            raise QascError(f"reranker {name}: not a local folder, and the model hub is offline "
                            f"(HF_HUB_OFFLINE=1); give the model's folder") from None
        raise QascError(f"reranker {name}: cannot load it from the hub ({_first(exc)})") from None
    kinds = [a for a in (config.architectures or []) if a.endswith("ForSequenceClassification")]
    if not kinds:
        raise QascError(f"reranker {name}: not a sequence classifier (architectures: "
                        f"{', '.join(config.architectures or ['none'])}); a cross-encoder is a "
                        f"*ForSequenceClassification model")
    if config.num_labels != 1:
        raise QascError(f"reranker {name}: {config.num_labels} labels; a cross-encoder gives one relevance "
                        f"score (num_labels=1)")
    return path, config


class Reranker:
    """A loaded cross-encoder: `score(questions, texts)` -> (P,) float32 logits, pairs batched by token count.

    name: a local folder or a hub name (the hub only where reachable; HF_HUB_OFFLINE=1 looks in the local cache
    only). device: a torch.device. top: candidates per query. Anything that is not a sequence classifier with one
    label is refused with a QascError naming it."""

    def __init__(self, name: str, device: torch.device | str = "cpu", top: int = RERANK_TOP,
                 batch_tokens: int | None = None) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from qasc.engine.embedder import resolve_dtype

        if not isinstance(top, int) or isinstance(top, bool) or top < 1:
            raise QascError(f"rerank top must be an integer >= 1, got {top!r}")
        self.name, self.top = name, top
        self.device = torch.device(device)
        path, config = resolve_reranker(name)
        self.dtype = resolve_dtype("auto", self.device)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=self.dtype)
        except (OSError, ValueError) as exc:
            raise QascError(f"reranker {name}: cannot load it ({_first(exc)})") from None
        self.model.to(self.device).eval()
        limits = [MAX_LENGTH, int(getattr(self.tokenizer, "model_max_length", MAX_LENGTH) or MAX_LENGTH),
                  int(getattr(config, "max_position_embeddings", MAX_LENGTH) or MAX_LENGTH)]
        self.max_length = min(limits)
        gpu = self.device.type == "cuda"
        self.batch_tokens = max(batch_tokens or (BATCH_TOKENS_GPU if gpu else BATCH_TOKENS_CPU), self.max_length)

    def buckets(self, lengths: np.ndarray) -> list[np.ndarray]:
        """lengths (P,) -> index buckets in ascending length, each with size x longest <= batch_tokens."""
        order = np.argsort(lengths, kind="stable")
        out, lo = [], 0
        while lo < len(order):
            hi = lo + 1
            while hi < len(order) and hi - lo < MAX_BATCH_PAIRS and (hi + 1 - lo) * lengths[order[hi]] <= (
                    self.batch_tokens):
                hi += 1
            out.append(order[lo:hi])
            lo = hi
        return out

    @torch.inference_mode()
    def score(self, questions: Sequence[str], texts: Sequence[str],
              step: Callable[[], object] | None = None) -> np.ndarray:
        """questions (P), texts (P) -> (P,) float32 the model's logit per (question, text) pair, in input order.
        step: called after each forward (the thread governor's step)."""
        from tqdm import tqdm

        n = len(texts)
        out = np.zeros(n, dtype=np.float32)
        if n == 0:
            return out
        enc = self.tokenizer(list(questions), list(texts), truncation="longest_first", max_length=self.max_length)
        ids, types = enc["input_ids"], enc.get("token_type_ids")
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=n)
        pad = self.tokenizer.pad_token_id or 0
        bar = tqdm(total=n, desc="rerank", unit="pair", file=sys.stderr, leave=False,
                   disable=True if n < PROGRESS_MIN_PAIRS else None)
        for batch in self.buckets(lengths):
            width = int(lengths[batch[-1]])
            input_ids = np.full((len(batch), width), pad, dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.int64)
            token_types = np.zeros((len(batch), width), dtype=np.int64) if types is not None else None
            for row, i in enumerate(batch.tolist()):
                input_ids[row, : lengths[i]] = ids[i]
                mask[row, : lengths[i]] = 1
                if token_types is not None:
                    token_types[row, : lengths[i]] = types[i]
            inputs = {"input_ids": torch.from_numpy(input_ids).to(self.device),
                      "attention_mask": torch.from_numpy(mask).to(self.device)}
            if token_types is not None:
                inputs["token_type_ids"] = torch.from_numpy(token_types).to(self.device)
            logits = self.model(**inputs).logits
            out[batch] = logits[:, 0].float().cpu().numpy()
            bar.update(len(batch))
            if step is not None:
                step()
        bar.close()
        return out

    def rerank(self, cols: ChunkColumns, questions: Sequence[str], paths: Sequence[str], top_k: int | None,
               budget_tokens: int | None, step: Callable[[], object] | None = None) -> ChunkColumns:
        """A block's first-stage chunks (cols, each query's in rank order), its questions (Q) and each chunk's
        heading path ("" without one) -> the chunks the fused order keeps (top_k, budget_tokens), ranked by it,
        each with its cross-encoder logit (`rerank`). Only the first `top` chunks of a query (by rank) are scored."""
        if len(cols) and int(cols.rank.max()) >= self.top:
            keep = np.flatnonzero(cols.rank < self.top)
            cols, paths = take_columns(cols, keep, cols.rank[keep], None), [paths[j] for j in keep.tolist()]
        texts = [f"{p}\n{t}" if p else t for p, t in zip(paths, cols.text, strict=True)]
        cross = self.score([questions[q] for q in cols.query.tolist()], texts, step)
        return fuse_columns(cols, cross, top_k, budget_tokens)


def fuse_columns(cols: ChunkColumns, cross: np.ndarray, top_k: int | None, budget_tokens: int | None) -> ChunkColumns:
    """cols (M chunks, query order then first-stage rank), cross (M,) their cross-encoder scores -> the chunks the
    fused order keeps, ranked by it (kernels.signals.rerank_scores; then top_k / budget_tokens, select_chunks),
    `rerank` = cross."""
    q = cols.n_queries
    bounds = np.searchsorted(cols.query, np.arange(q + 1))
    counts = np.diff(bounds)
    width = int(counts.max()) if q else 0
    slot = np.arange(len(cols.query)) - bounds[cols.query]  # each chunk's place in its query's row
    grid = lambda values, fill, dtype: _grid(q, width, cols.query, slot, values, fill, dtype)  # noqa: E731
    valid = torch.from_numpy(grid(np.ones(len(slot), bool), False, bool))
    fused = rerank_scores(torch.from_numpy(grid(cols.score, 0.0, np.float32)),
                          torch.from_numpy(grid(cross, 0.0, np.float32)), valid)
    tokens = torch.from_numpy(grid(cols.n_tokens, 0, np.int64))
    order, chosen = select_chunks(fused, tokens, top_k, budget_tokens)
    qi, ki = np.nonzero(chosen.numpy())
    take = bounds[qi] + order.numpy()[qi, ki]
    rank = (np.cumsum(chosen.numpy(), axis=1) - 1)[qi, ki].astype(np.int32)
    return take_columns(cols, take, rank, cross[take].astype(np.float32))


def _grid(q: int, width: int, rows: np.ndarray, cols: np.ndarray, values: np.ndarray, fill, dtype) -> np.ndarray:
    out = np.full((q, width), fill, dtype=dtype)
    out[rows, cols] = values
    return out


def take_columns(cols: ChunkColumns, take: np.ndarray, rank: np.ndarray, rerank: np.ndarray) -> ChunkColumns:
    """The chunks `take` (indices into cols, query order kept) with new ranks and rerank scores."""
    starts, ends = cols.seed_offsets[take], cols.seed_offsets[take + 1]
    offsets = np.zeros(len(take) + 1, np.int64)
    np.cumsum(ends - starts, out=offsets[1:])
    seeds = np.concatenate([cols.seed_ids[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
                           ) if len(take) else np.zeros(0, np.int32)
    return ChunkColumns(
        n_queries=cols.n_queries, query=cols.query[take], rank=rank, doc=cols.doc[take],
        char_start=cols.char_start[take], char_end=cols.char_end[take], score=cols.score[take],
        n_tokens=cols.n_tokens[take], sentence_start=cols.sentence_start[take], sentence_end=cols.sentence_end[take],
        seed_offsets=offsets.astype(np.int32), seed_ids=seeds.astype(np.int32), text=[cols.text[j] for j in take],
        rerank=rerank)


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
