"""The result rows of a query batch, one per returned chunk: their columns and Arrow schema.

Light on purpose (pyarrow loads on call): the CLI's argument parser and jobs/results.py import it.
"""

from __future__ import annotations

RESULT_COLUMNS = ("query_id", "rank", "doc_id", "char_start", "char_end", "score", "text", "n_tokens",
                  "seed_ids", "sentence_start", "sentence_end")
RERANK_COLUMNS = ("reranker", "rerank_score")  # after RESULT_COLUMNS, only with the rerank stage (engine.rerank)


def results_schema(reranked: bool = False):
    """-> pyarrow.Schema of RESULT_COLUMNS (README, "Quickstart: a query batch"); reranked: + RERANK_COLUMNS (the
    reranker's name, its score: null for the budget fill's rows)."""
    import pyarrow as pa

    rerank = [("reranker", pa.string()), ("rerank_score", pa.float32())] if reranked else []
    return pa.schema([
        ("query_id", pa.string()), ("rank", pa.int32()), ("doc_id", pa.string()), ("char_start", pa.int64()),
        ("char_end", pa.int64()), ("score", pa.float32()), ("text", pa.large_string()), ("n_tokens", pa.int32()),
        ("seed_ids", pa.list_(pa.int32())), ("sentence_start", pa.int32()), ("sentence_end", pa.int32()),
    ] + rerank)
