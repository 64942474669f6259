"""Token cap: cut sentences longer than the embedding model's limit at the tokenizer's offsets.

The splitter (engine/splitter.py) cuts at characters; this second pass counts model tokens and cuts the
sentences above `max_tokens` exactly where a token starts, so `text[char_start:char_end]` stays exact and
the model never truncates a sentence. Used by the store's split stage and by the evaluation baselines.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from qasc.engine.errors import QascError, first_line
from qasc.engine.splitter import trim_span
from qasc.engine.types import Sentences

DEFAULT_MAX_SENTENCE_TOKENS = 128


@lru_cache(maxsize=4)
def load_tokenizer(model: str | None):
    """The embedding model's fast tokenizer (offset mappings are needed to cut long sentences exactly)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from qasc.engine.embedder import resolve_model_path

    hf_logging.set_verbosity_error()  # "sequence longer than max length" is expected: we count, then cut
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))
    except (OSError, ValueError) as exc:
        raise QascError(f"cannot load the tokenizer of model {model!r}: {first_line(exc)}") from None
    if not tokenizer.is_fast:
        raise QascError(f"model {model!r} has no fast tokenizer; offsets for cutting long sentences need one")
    return tokenizer


def count_tokens(tokenizer, texts: list[str]) -> np.ndarray:
    """texts -> (N,) int32 content tokens, the same count as Embedder.count_tokens."""
    if not texts:
        return np.zeros(0, dtype=np.int32)
    enc = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)
    return np.fromiter((len(ids) for ids in enc["input_ids"]), dtype=np.int32, count=len(texts))


def _cut_at_tokens(text: str, start: int, end: int, offsets: Sequence[tuple[int, int]],
                   limit: int) -> list[tuple[int, int]]:
    """[start, end) with token offsets (relative to start) -> pieces of <= limit tokens, cut before a token.

    Prefers a word start (whitespace before the token) in the second half of each window.
    """
    cuts = [start]
    i, n = 0, len(offsets)
    while n - i > limit:
        j = i + limit
        for b in range(i + limit, i + limit // 2, -1):
            if offsets[b][0] > offsets[b - 1][1]:
                j = b
                break
        cuts.append(start + offsets[j][0])
        i = j
    pieces = []
    for a, b in zip(cuts, cuts[1:] + [end], strict=True):
        a, b = trim_span(text, a, b)
        if b > a:
            pieces.append((a, b))
    return pieces


def _offsets(tokenizer, texts: list[str]) -> list[list[tuple[int, int]]]:
    """texts -> per text, the (start, end) character offsets of its content tokens (no specials)."""
    if not texts:
        return []
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False)
    return enc["offset_mapping"]


def cap_tokens(sents: Sentences, tokenizer, max_tokens: int) -> Sentences:
    """Sentences -> Sentences with n_tokens filled, none above max_tokens: long ones are cut at token offsets.

    One tokenizer pass over every sentence (with offsets), then one over the pieces of the long ones: a
    piece's count is its own tokenization, exactly what Embedder.count_tokens gives. A piece that tokenizes
    longer on its own than inside its sentence (a cut inside a word) is cut again with a tighter limit.
    Pieces keep their sentence's paragraph and section; text[char_start:char_end] stays exact.
    """
    text = sents.text
    segs = list(zip(sents.char_start.tolist(), sents.char_end.tolist(), sents.paragraph.tolist(),
                    sents.section.tolist(), strict=True))
    offs = _offsets(tokenizer, [text[s:e] for s, e, _, _ in segs])
    counts = [len(o) for o in offs]
    limits = [max_tokens] * len(segs)
    for _ in range(64):
        over = [i for i, n in enumerate(counts) if n > max_tokens]
        if not over:
            break
        pieces: dict[int, list[tuple[int, int, int, int]]] = {}
        for i in over:
            s, e, para, sect = segs[i]
            pieces[i] = [(a, b, para, sect) for a, b in _cut_at_tokens(text, s, e, offs[i], limits[i])]
        flat = [p for i in over for p in pieces[i]]
        enc = iter(_offsets(tokenizer, [text[a:b] for a, b, _, _ in flat]))
        new_segs, new_offs, new_counts, new_limits = [], [], [], []
        for i, seg in enumerate(segs):
            if i not in pieces:
                new_segs.append(seg)
                new_offs.append(offs[i])
                new_counts.append(counts[i])
                new_limits.append(limits[i])
                continue
            for piece in pieces[i]:
                o = next(enc)
                new_segs.append(piece)
                new_offs.append(o if len(o) > max_tokens else ())
                new_counts.append(len(o))
                new_limits.append(max(1, limits[i] - max(1, len(o) - max_tokens)) if len(o) > max_tokens
                                  else max_tokens)
        segs, offs, counts, limits = new_segs, new_offs, new_counts, new_limits
    else:
        raise QascError(f"{sents.doc_id}: could not cut a sentence below {max_tokens} tokens")
    cols = np.asarray(segs, dtype=np.int64).reshape(-1, 4)
    return Sentences(sents.doc_id, text, cols[:, 0].copy(), cols[:, 1].copy(), cols[:, 2].astype(np.int32),
                     cols[:, 3].astype(np.int32), np.asarray(counts, dtype=np.int32))
