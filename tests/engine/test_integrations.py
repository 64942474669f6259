"""LangChain and LlamaIndex retrievers: the same chunks as Engine.query, one engine call per batch, complete
metadata, stable node ids, lazy imports, and the documented examples (extracted from README.md / docs/*.md
and run)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from qasc.engine.config import EmbedderConfig, EngineConfig, RetrievalConfig
from qasc.engine.integrations import POSITION_KEYS
from qasc.engine.query import Engine
from qasc.engine.types import Chunk
from qasc.kernels.params import QascParams
from tests.conftest import DEMO_CORPUS, REPO

pytestmark = pytest.mark.slow

QUESTIONS = [
    "How long should sourdough dough proof?",
    "Who invented the lens used in lighthouses?",
    "How big a solar array do I need?",
    "Why does the crust darken?",
]
PARAMS = QascParams(percentile=60, radius=2, extent="window", top_k=4, score_margin=None, focus_gap=None)
RETRIEVAL = RetrievalConfig(depth=8, neighbourhood=3)
CHUNK_KEYS = {"doc_id", *POSITION_KEYS}


class CountingEngine(Engine):
    """An Engine that counts its query calls (every retriever path goes through Engine.query).

    Results are compared with an Engine.query call over the same questions: a batch's scores may differ from
    one-at-a-time scores in the last float bits (padded embedding batches), so "the same chunks" is checked
    exactly against the same batch."""

    calls = 0

    def query(self, questions, params=None, retrieval=None):
        self.calls += 1
        return super().query(questions, params, retrieval)


@pytest.fixture(scope="module")
def lc():
    return pytest.importorskip("qasc.engine.integrations.langchain", reason="needs the 'langchain' extra (make install)",
                               exc_type=ImportError)


@pytest.fixture(scope="module")
def li():
    return pytest.importorskip("qasc.engine.integrations.llamaindex",
                               reason="needs the 'llamaindex' extra (make install)", exc_type=ImportError)


@pytest.fixture(scope="module")
def engine(demo_store) -> CountingEngine:
    return CountingEngine.open(str(demo_store), device="cpu")


@pytest.fixture(scope="module")
def meta_store(tmp_path_factory, tiny_model) -> Path:
    """The demo documents as JSON lines with extra columns (one clashing with a chunk field), tiny model."""
    from qasc.engine.store import ingest

    root = tmp_path_factory.mktemp("meta")
    with open(root / "docs.jsonl", "w", encoding="utf-8") as f:
        for i, path in enumerate(sorted(DEMO_CORPUS.glob("*.md"))):
            f.write(json.dumps({"id": path.stem, "text": path.read_text(encoding="utf-8"), "title": path.stem.title(),
                                "year": 2000 + i, "score": "stored", "source": "mine"}) + "\n")
    ingest([str(root / "docs.jsonl")], root / "store", EngineConfig(embedder=EmbedderConfig(model=tiny_model)),
           progress=False)
    return root / "store"


def _spans(chunks: list[Chunk]) -> list[tuple]:
    return [(c.doc_id, c.char_start, c.char_end, c.text, c.score, c.n_tokens, c.sentence_start, c.sentence_end)
            for c in chunks]


def _doc_spans(docs) -> list[tuple]:
    return [(d.metadata["doc_id"], d.metadata["char_start"], d.metadata["char_end"], d.page_content,
             d.metadata["score"], d.metadata["n_tokens"], d.metadata["sentence_start"], d.metadata["sentence_end"])
            for d in docs]


def _node_spans(nodes) -> list[tuple]:
    out = []
    for n in nodes:
        m = n.node.metadata
        assert n.score == m["score"] and (n.node.start_char_idx, n.node.end_char_idx) == (m["char_start"],
                                                                                           m["char_end"])
        out.append((m["doc_id"], m["char_start"], m["char_end"], n.node.text, m["score"], m["n_tokens"],
                    m["sentence_start"], m["sentence_end"]))
    return out


# ------------------------------------------------------------------------------------------------ LangChain

@pytest.mark.parametrize("overrides", [{}, {"params": PARAMS, "retrieval": RETRIEVAL}], ids=["store", "overrides"])
def test_langchain_invoke_equals_engine(lc, engine, overrides):
    retriever = lc.QascRetriever(engine=engine, **overrides)
    for question in QUESTIONS:
        chunks = engine.query([question], overrides.get("params"), overrides.get("retrieval"))[0]
        docs = retriever.invoke(question)
        assert chunks
        assert _doc_spans(docs) == _spans(chunks)
        assert all(set(d.metadata) >= CHUNK_KEYS for d in docs)


def test_langchain_batch_is_one_engine_call(lc, engine):
    retriever = lc.QascRetriever(engine=engine, params=PARAMS, retrieval=RETRIEVAL)
    expected = [_spans(c) for c in engine.query(QUESTIONS, PARAMS, RETRIEVAL)]
    before = engine.calls
    results = retriever.batch(QUESTIONS)
    assert engine.calls == before + 1
    assert [_doc_spans(d) for d in results] == expected
    results = asyncio.run(retriever.abatch(QUESTIONS))
    assert engine.calls == before + 2
    assert [_doc_spans(d) for d in results] == expected
    docs = asyncio.run(retriever.ainvoke(QUESTIONS[1]))
    assert engine.calls == before + 3
    assert retriever.batch([]) == [] and engine.calls == before + 3
    assert _doc_spans(docs) == _spans(engine.query([QUESTIONS[1]], PARAMS, RETRIEVAL)[0])


def test_langchain_batch_errors(lc, engine):
    retriever = lc.QascRetriever(engine=engine)
    from qasc.engine.errors import QascError

    with pytest.raises(QascError, match="query 1 is empty"):
        retriever.batch(["a real question", "  "])
    out = retriever.batch(["a real question", "  "], return_exceptions=True)
    assert len(out) == 2 and all(isinstance(e, QascError) for e in out)


def test_langchain_ids_stable_and_store_path(lc, engine, demo_store):
    a = lc.QascRetriever(engine=engine).invoke(QUESTIONS[0])
    b = lc.QascRetriever(store=demo_store, device="cpu").invoke(QUESTIONS[0])  # a second Engine
    assert [d.id for d in a] == [d.id for d in b] and len({d.id for d in a}) == len(a)
    assert _doc_spans(a) == _doc_spans(b)
    with pytest.raises(ValueError, match="either engine"):
        lc.QascRetriever()
    with pytest.raises(ValueError, match="either engine"):
        lc.QascRetriever(engine=engine, store=str(demo_store))


# ------------------------------------------------------------------------------------------------ LlamaIndex

@pytest.mark.parametrize("overrides", [{}, {"params": PARAMS, "retrieval": RETRIEVAL}], ids=["store", "overrides"])
def test_llamaindex_retrieve_equals_engine(li, engine, overrides):
    from llama_index.core.schema import QueryBundle

    retriever = li.QascRetriever(engine, **overrides)
    for question in QUESTIONS:
        chunks = engine.query([question], overrides.get("params"), overrides.get("retrieval"))[0]
        assert chunks
        assert _node_spans(retriever.retrieve(question)) == _spans(chunks)
        assert _node_spans(retriever.retrieve(QueryBundle(question))) == _spans(chunks)
        assert _node_spans(asyncio.run(retriever.aretrieve(question))) == _spans(chunks)


def test_llamaindex_retrieve_many_is_one_engine_call(li, engine):
    from llama_index.core.schema import QueryBundle

    retriever = li.QascRetriever(engine, params=PARAMS, retrieval=RETRIEVAL)
    expected = [_spans(c) for c in engine.query(QUESTIONS, PARAMS, RETRIEVAL)]
    before = engine.calls
    results = retriever.retrieve_many([QUESTIONS[0], QueryBundle(QUESTIONS[1]), *QUESTIONS[2:]])
    assert engine.calls == before + 1
    assert [_node_spans(n) for n in results] == expected
    results = asyncio.run(retriever.aretrieve_many(QUESTIONS))
    assert engine.calls == before + 2
    assert [_node_spans(n) for n in results] == expected
    assert retriever.retrieve_many([]) == [] and engine.calls == before + 2


def test_llamaindex_node_ids_stable(li, engine, demo_store):
    from llama_index.core.schema import NodeRelationship

    retriever = li.QascRetriever(engine)
    first = [n.node.node_id for q in QUESTIONS for n in retriever.retrieve(q)]
    again = [n.node.node_id for q in QUESTIONS for n in retriever.retrieve(q)]
    reopened = li.QascRetriever(store=demo_store, device="cpu")  # another Engine, same store
    other = [n.node.node_id for q in QUESTIONS for n in reopened.retrieve(q)]
    assert first == again == other
    many = [n.node.node_id for nodes in retriever.retrieve_many(QUESTIONS) for n in nodes]
    assert many == first
    # a node id names one span: equal ids <=> equal (doc_id, char range)
    spans = {}
    for q in QUESTIONS:
        for n in retriever.retrieve(q):
            m = n.node.metadata
            spans.setdefault(n.node.node_id, set()).add((m["doc_id"], m["char_start"], m["char_end"]))
    assert all(len(s) == 1 for s in spans.values())
    assert len({next(iter(s)) for s in spans.values()}) == len(spans)
    node = retriever.retrieve(QUESTIONS[0])[0].node
    assert node.ref_doc_id == node.metadata["doc_id"]
    assert node.relationships[NodeRelationship.SOURCE].node_id == node.metadata["doc_id"]
    # an LLM sees the document's metadata, not the chunk's offsets and score
    llm_text = node.get_content(metadata_mode="llm")
    assert "doc_id: " in llm_text and "char_start" not in llm_text and node.text in llm_text


# ------------------------------------------------------------------------------------------------ metadata

def test_metadata_complete(lc, li, meta_store):
    from qasc.engine.store import Store

    store = Store.open(meta_store)
    lc_retriever = lc.QascRetriever(store=str(meta_store), device="cpu")
    li_retriever = li.QascRetriever(lc_retriever.engine)
    for question in QUESTIONS:
        docs = lc_retriever.invoke(question)
        nodes = li_retriever.retrieve(question)
        assert docs and [d.metadata for d in docs] == [n.node.metadata for n in nodes]
        assert [d.id for d in docs] == [n.node.node_id for n in nodes]
        for d in docs:
            i = store.doc_ids.index(d.metadata["doc_id"])
            stored = store.metadata[i]
            assert set(stored) == {"title", "year", "score", "source"}
            assert set(d.metadata) == CHUNK_KEYS | set(stored)
            assert d.metadata["title"] == stored["title"] and d.metadata["year"] == stored["year"]
            assert d.metadata["source"] == store.sources[i] != "mine"  # the store's own source wins too
            assert isinstance(d.metadata["score"], float)  # the chunk's score wins over the stored column
            doc = store.docs[i]
            assert doc.text[d.metadata["char_start"] : d.metadata["char_end"]] == d.page_content
            assert doc.char_start[d.metadata["sentence_start"]] == d.metadata["char_start"]
            assert doc.char_end[d.metadata["sentence_end"]] == d.metadata["char_end"]


# ------------------------------------------------------------------------------------------------ imports

def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


@pytest.mark.timeout(300)
def test_import_engine_imports_no_integration_library():
    out = _python(
        "import sys, engine, engine.integrations, engine.query\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('langchain', 'langchain_core', 'llama_index'))\n"
        "print(bad)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("module, extra, blocked, package", [
    ("langchain", "langchain", "langchain_core", "langchain-core"),
    ("llamaindex", "llamaindex", "llama_index", "llama-index-core"),
])
def test_missing_extra_is_one_line(module, extra, blocked, package):
    # sys.modules[name] = None makes `import name` fail as if the package were not installed
    out = _python(f"import sys; sys.modules[{blocked!r}] = None\nimport engine.integrations.{module}")
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if "Error" in line or "error" in line]
    assert len(errors) == 1, out.stderr
    assert errors[0].startswith(f"ImportError: the {extra} integration needs {package} (")
    assert errors[0].endswith(f'): pip install -e ".[{extra}]"')


# ------------------------------------------------------------------------------------------------ README

README_MARK = "<!-- readme-test: "


def doc_files() -> list[Path]:
    """README.md and the docs/ pages it links to: where the documented examples and tables live."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def readme_examples() -> dict[str, str]:
    """The python blocks of README.md and docs/*.md that follow a `<!-- readme-test: NAME -->` line, by NAME."""
    examples: dict[str, str] = {}
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        found = re.findall(r"^<!-- readme-test: ([\w-]+) -->\n```python\n(.*?)^```$", text, flags=re.S | re.M)
        assert len(found) == text.count(README_MARK), f"{path.name}: a readme-test marker without a python block below"
        for name, code in found:
            assert name not in examples, f"two examples marked {README_MARK}{name} -->"
            examples[name] = code
    return examples


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["langchain", "llamaindex"])
def test_readme_example_runs(name, tmp_path, request):
    request.getfixturevalue({"langchain": "lc", "llamaindex": "li"}[name])  # skipped without the extra
    examples = readme_examples()
    assert name in examples, f"README.md and docs/*.md have no example marked {README_MARK}{name} -->"
    script = tmp_path / f"readme_{name}.py"
    script.write_text(examples[name], encoding="utf-8")
    # run as a user would: from the repository root, temporary files under tmp_path
    out = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip(), "the example printed nothing"
