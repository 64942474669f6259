"""Turn a QascBatch (row positions) back into Chunks (documents, character offsets, text)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from engine.types import Chunk, Sentences
from kernels.pipeline import QascBatch


def assemble_chunks(
    batch: QascBatch, docs: Sequence[Sentences], doc_index: torch.Tensor, sent_index: torch.Tensor
) -> list[list[Chunk]]:
    """batch over (Q, L) rows; doc_index/sent_index (Q, L) int64 map row positions to docs[d] sentence i.

    Returns, per query, the chosen chunks in rank order.
    """
    start = batch.start.cpu().numpy()
    end = batch.end.cpu().numpy()
    score = batch.score.float().cpu().numpy()
    tokens = batch.tokens.cpu().numpy()
    chosen = batch.chosen.cpu().numpy()
    piece = batch.piece.cpu().numpy()
    labels = batch.labels.cpu().numpy()
    kept = batch.kept.cpu().numpy()
    doc_index = doc_index.cpu().numpy()
    sent_index = sent_index.cpu().numpy()
    out: list[list[Chunk]] = []
    for q in range(start.shape[0]):
        row: list[Chunk] = []
        for k in np.flatnonzero(chosen[q]).tolist():
            s, e = int(start[q, k]), int(end[q, k])
            doc = docs[int(doc_index[q, s])]
            first, last = int(sent_index[q, s]), int(sent_index[q, e])
            c0, c1 = int(doc.char_start[first]), int(doc.char_end[last])
            seeds = np.flatnonzero(kept[q] & (labels[q] == piece[q, k]))
            row.append(Chunk(
                doc_id=doc.doc_id, char_start=c0, char_end=c1, text=doc.text[c0:c1],
                score=float(score[q, k]), seed_ids=tuple(int(sent_index[q, i]) for i in seeds),
                n_tokens=int(tokens[q, k]), sentence_start=first, sentence_end=last,
            ))
        out.append(row)
    return out
