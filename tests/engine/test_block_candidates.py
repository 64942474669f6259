"""Whole blocks in the candidate region: a hit brings every row of its section (when the section can be a
block extent: at most BLOCK_ROWS_MAX rows and the token cap), so a section extent never depends on the
neighbourhood being as wide as the section."""

from __future__ import annotations

import pytest
import torch

from qasc.engine.config import EmbedderConfig, EngineConfig, RetrievalConfig
from qasc.engine.store import ingest
from qasc.kernels.params import QascParams
from tests.engine.test_store import write_corpus

pytestmark = pytest.mark.slow


def _sentences(topic: str, n: int) -> str:
    return " ".join(f"The {topic} note number {i} is here." for i in range(n))


DOC = (f"# Guide\n\n## Symptoms\n\n{_sentences('symptom', 10)}\n\n## Treatment\n\n{_sentences('treatment', 3)}\n\n"
       f"## Long\n\n{_sentences('long', 40)}\n")


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_model):
    from qasc.engine.query import Engine

    root = tmp_path_factory.mktemp("blocks")
    config = EngineConfig(embedder=EmbedderConfig(model=tiny_model))
    ingest([str(write_corpus(root / "src", {"guide": DOC, "other": "One line. Another line."}))], root / "store",
           config)
    return Engine.open(str(root / "store"), device="cpu", config=config)


def _section_rows(engine, word: str) -> list[int]:
    """The global rows of the section (its heading line included) whose sentences mention `word`."""
    for d, off in zip(engine.store.docs, engine.store.doc_offsets[:-1].tolist(), strict=True):
        texts = [d.text[s:e] for s, e in zip(d.char_start, d.char_end, strict=True)]
        rows = [off + i for i, t in enumerate(texts) if f"The {word} note" in t]
        if rows:
            sec = {int(d.section[r - off]) for r in rows}
            assert len(sec) == 1
            return [off + i for i in range(len(d)) if int(d.section[i]) in sec]
    raise AssertionError(word)


def _candidates(engine, hit: int, **params) -> list[int]:
    p = QascParams(context_weight=0.0, **params)
    q = torch.nn.functional.normalize(torch.randn(1, engine.embeddings.shape[1]), dim=1)
    _, cand = engine.run_batch(q, p, RetrievalConfig(depth=1, neighbourhood=0), pool=torch.tensor([[hit]]))
    return cand.rows[cand.valid].tolist()


def test_a_hit_brings_its_whole_section(engine):
    symptoms = _section_rows(engine, "symptom")
    assert len(symptoms) == 11  # the heading line and 10 sentences
    hit = symptoms[4]
    assert _candidates(engine, hit, block_extents="section") == symptoms
    # without block extents, or when the section is over the token cap, only the neighbourhood (here the hit)
    assert _candidates(engine, hit, block_extents="none") == [hit]
    assert _candidates(engine, hit, block_extents="section", max_tokens=30) == [hit]


def test_a_section_longer_than_the_row_cap_is_not_brought(engine):
    from qasc.engine.query import BLOCK_ROWS_MAX

    long = _section_rows(engine, "long")
    assert len(long) > BLOCK_ROWS_MAX
    assert _candidates(engine, long[20], block_extents="section") == [long[20]]
    first, last = engine.tables.block_bounds(("section",), 512)
    treatment = _section_rows(engine, "treatment")
    assert first[treatment].tolist() == [treatment[0]] * 4 and last[treatment].tolist() == [treatment[-1]] * 4
    assert first[long].tolist() == long and last[long].tolist() == long
