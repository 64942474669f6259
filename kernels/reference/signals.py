"""Loop twins of kernels.signals: the scoring model one entry at a time."""

from __future__ import annotations

import math

import torch

from qasc.kernels.reference._common import _rows, _to_tensor


def row_scores(model, cos, valid, c=None, path=None, hs=None, spread=None, cref=None, lex=None):
    """(plain, boost) (Q, L), one entry at a time: plain = cos - beta c hs (rows with a heading, heading weight
    w > 0) + alpha lex; boost = w spread (c - cref) on rows with a heading; both 0 where invalid."""
    q, n = cos.shape
    heading = c is not None and model.heading > 0
    plain, boost = [[0.0] * n for _ in range(q)], [[0.0] * n for _ in range(q)]
    for i in range(q):
        for j in range(n):
            if not bool(valid[i, j]):
                continue
            x = float(cos[i, j])
            if heading and int(path[i, j]) >= 0:
                cij = float(c[i, j])
                boost[i][j] = model.heading * float(spread[i]) * (cij - float(cref[i]))
                if model.residual > 0:
                    x -= model.residual * cij * float(hs[i, j])
            if lex is not None and model.lexical > 0:
                x += model.lexical * float(lex[i, j])
            plain[i][j] = x
    return (_to_tensor(plain, (q, n), cos.dtype, cos.device), _to_tensor(boost, (q, n), cos.dtype, cos.device))


def normalised_lexical(bm25, best):
    """(Q, L): each BM25 score over its query's best, 0 where the best is 0."""
    out = [[x / b if b > 0 else 0.0 for x in row] for row, b in zip(_rows(bm25), best.tolist(), strict=True)]
    return _to_tensor(out, tuple(bm25.shape), bm25.dtype, bm25.device)


def rerank_scores(first, cross, valid):
    """(Q, N) float32: per query, over its valid entries, z(first) + z(cross) with z(x) = (x - mean) / std
    (population std in Python floats; 0 where std <= 1e-6), -inf at invalid entries."""
    q, n = first.shape
    out = [[-math.inf] * n for _ in range(q)]
    for i in range(q):
        keep = [j for j in range(n) if bool(valid[i, j])]
        total = [0.0] * n
        for signal in (first, cross):
            values = [float(signal[i, j]) for j in keep]
            mean = sum(values) / len(values) if values else 0.0
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) if values else 0.0
            for j, v in zip(keep, values, strict=True):
                total[j] += (v - mean) / std if std > 1e-6 else 0.0
        for j in keep:
            out[i][j] = total[j]
    return _to_tensor(out, (q, n), torch.float32, first.device)
