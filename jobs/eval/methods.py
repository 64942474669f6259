"""`qasc eval --methods`: a method's name -> its kind and size, and the chunkers the names make."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from qasc.engine.errors import QascError
from qasc.jobs.eval import baselines as B
from qasc.jobs.eval import peer_methods as PM
from qasc.jobs.eval.config import EvalConfig

_SIZED = {"fixed-": "fixed", "semchunk-": "semchunk", "recursive-": "recursive"}  # name prefix -> kind of <N>


def parse_method(name: str) -> tuple[str, float | None]:
    """A `--methods` name -> (kind, size): ("fixed", 64), ("recursive-c", 400), ("recursive-t", 200),
    ("semchunk", 128), ("semantic", 95.0), ("peer" | "sentences" | "qasc" | "llm-ppl" | "llm-agentic", None);
    QascError for a name `qasc eval` does not know (checked before any work, and by make_chunkers)."""
    if PM.is_peer(name):  # the peers' own code (peers.py, pipelines.py, hybrid.py)
        return "peer", None
    if name in ("sentences", "qasc", "llm-ppl", "llm-agentic"):
        return name, None
    if name == "semantic":
        return "semantic", 95.0
    for prefix, kind in _SIZED.items():
        if name.startswith(prefix):
            digits, unit = name[len(prefix):], ""
            if kind == "recursive":
                digits, unit = digits[:-1], digits[-1:]
            if digits.isdigit() and int(digits) > 0 and unit in (("c", "t") if kind == "recursive" else ("",)):
                return (f"recursive-{unit}" if unit else kind), int(digits)
    if name.startswith("semantic-p"):
        with contextlib.suppress(ValueError):
            pct = float(name[len("semantic-p"):])
            if 0 < pct < 100:
                return "semantic", pct
    from qasc.jobs.eval import hybrid, pipelines

    raise QascError(f"unknown method {name!r}; known: {', '.join(B.DEFAULT_METHODS)}, recursive-<N>t, "
                    f"semantic-p<P>, {pipelines.PATTERN}, {hybrid.PATTERN}")


def check_methods(names: Sequence[str]) -> None:
    """QascError naming the first method `qasc eval` does not know."""
    for name in names:
        parse_method(name)


def make_chunkers(names: Sequence[str], embedder, sentence_source, cfg: EvalConfig, log) -> list[B.Chunker]:
    out: list[B.Chunker] = []
    tok = embedder.tokenizer
    for name in names:
        kind, size = parse_method(name)
        if kind == "fixed":
            out.append(B.FixedTokenChunker(int(size), tok))
        elif kind == "recursive-c":
            out.append(B.RecursiveCharChunker(int(size)))
        elif kind == "recursive-t":
            out.append(B.RecursiveTokenChunker(int(size)))
        elif kind == "sentences":
            out.append(B.SentenceChunker(tok))
        elif kind == "semantic":
            out.append(B.SemanticChunker(sentence_source, float(size)))
        elif kind in ("peer", "semchunk"):
            out.append(PM.make_peer(name, embedder))
        elif kind == "llm-agentic":
            if not cfg.llm_url:
                log("llm-agentic skipped: it needs --llm-url")
                continue
            from qasc.jobs.eval.llm import ChatClient

            out.append(B.AgenticChunker(ChatClient(cfg.llm_url, cfg.llm_model), tok))
        # qasc runs through the engine; llm-ppl (the stand-in) runs on its subset
    return out
