"""`qasc eval`: QASC against chunk-then-retrieve baselines on Chroma-format data (metric, data, baselines,
retrieval with cached embeddings, leave-one-corpus-out cross-validation, report)."""

from qasc.jobs.eval.data import Dataset, Question, load_dataset
from qasc.jobs.eval.metrics import bootstrap_ci, intersection_length, merge_intervals, score_spans

__all__ = ["Dataset", "Question", "bootstrap_ci", "intersection_length", "load_dataset", "merge_intervals",
           "score_spans"]
