"""The harness end to end on a tiny synthetic data set, with a hashing embedder and a fake query engine.

Fast: no model is loaded (the MiniLM tokenizer only). The real model and data are in test_eval_slow.py.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from qasc.engine.errors import QascError
from qasc.engine.types import Chunk
from qasc.jobs.eval import qasc as Q
from qasc.jobs.eval.config import EvalConfig
from qasc.jobs.eval.data import load_dataset
from qasc.jobs.eval.harness import run_eval
from qasc.jobs.eval.retrieval import EvalCache, TokenCutter, build_chunkset, within_budget

CORPORA = {
    "boats": "# Boats\n\nA sailboat uses wind. The keel keeps it upright. Sails catch the wind.\n\n"
             "Rowing boats use oars. Oars are made of wood. A rower faces backwards.",
    "bread": "# Bread\n\nSourdough uses a starter. The starter holds wild yeast. Flour and water feed it.\n\n"
             "Bake bread in a hot oven. The crust browns as sugars caramelise. Let the loaf cool.",
    "stars": "# Stars\n\nStars burn hydrogen. Fusion makes helium in the core. Big stars die young.\n\n"
             "A supernova scatters heavy elements. Neutron stars are very dense. Some become black holes.",
}
QUESTIONS = [
    ("What keeps a sailboat upright?", "boats", ["The keel keeps it upright."]),
    ("What do rowers use?", "boats", ["Rowing boats use oars.", "Oars are made of wood."]),
    ("What feeds a sourdough starter?", "bread", ["Flour and water feed it."]),
    ("Why does the crust brown?", "bread", ["The crust browns as sugars caramelise."]),
    ("What do stars burn?", "stars", ["Stars burn hydrogen.", "Fusion makes helium in the core."]),
    ("What does a supernova scatter?", "stars", ["A supernova scatters heavy elements."]),
]


def write_dataset(root: Path) -> Path:
    (root / "corpora").mkdir(parents=True)
    for cid, text in CORPORA.items():
        (root / "corpora" / f"{cid}.md").write_text(text, encoding="utf-8")
    with open(root / "questions.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["question", "references", "corpus_id", "type"])
        for q, cid, refs in QUESTIONS:
            text = CORPORA[cid]
            w.writerow([q, json.dumps([{"content": r, "start_index": text.index(r),
                                        "end_index": text.index(r) + len(r)} for r in refs]), cid,
                        "factoid" if len(refs) == 1 else "multi-part"])
    return root


class HashEmbedder:
    """Bag-of-lowercased-words hashed into 64 dims, L2-normalised; the MiniLM tokenizer for token counts."""

    name, fingerprint, dim, dtype = "hash", "hash0001", 64, torch.float32

    def __init__(self):
        from qasc.engine.tokencap import load_tokenizer

        self.tokenizer = load_tokenizer(None)
        self.encoded = 0

    def encode(self, texts):
        self.encoded += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z]+", t.lower()):
                out[i, int(hashlib.md5(w[:5].encode()).hexdigest(), 16) % self.dim] += 1.0
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
        return out

    def count_tokens(self, texts):
        return np.asarray([len(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts], np.int32)


class FakeEngine:
    """Sentence retrieval with max_extent - 1 sentences each side of a hit, one chunk per hit (no merging), ranked by
    the hit's similarity: enough of the engine's interface (query_embedded) to drive the harness."""

    def __init__(self, dataset, embedder):
        from qasc.jobs.eval.baselines import sentence_spans

        self.docs = [sentence_spans(dataset.corpora[c], c, embedder.tokenizer) for c in sorted(dataset.corpora)]
        self.emb = [embedder.encode(d.texts()) for d in self.docs]
        self.calls = []

    def query_embedded(self, query_emb, params, retrieval, questions=None):
        self.calls.append((params, retrieval))
        q = query_emb.numpy()
        out = []
        for row in q:
            cands = [(float(e[i] @ row), d, i) for d, e in zip(self.docs, self.emb, strict=True)
                     for i in range(len(d))]
            cands.sort(key=lambda c: -c[0])
            chunks = []
            for score, d, i in cands[: retrieval.depth]:
                r = params.max_extent - 1
                a, b = max(0, i - r), min(len(d) - 1, i + r)
                s, e = int(d.char_start[a]), int(d.char_end[b])
                chunks.append(Chunk(d.doc_id, s, e, d.text[s:e], score, (i,), int(d.n_tokens[a:b + 1].sum()), a, b))
            out.append(chunks)
        return out


@pytest.fixture(scope="module")
def embedder():
    return HashEmbedder()


def fake_factory(engines):
    def factory(dataset, cache, out_dir, device, dtype, log, embedder=None):
        emb = HashEmbedder()
        engines.append(FakeEngine(dataset, emb))
        return engines[-1]

    return factory


def test_loader_reads_offsets_and_rejects_bad_ones(tmp_path):
    ds = load_dataset(write_dataset(tmp_path / "d"))
    assert sorted(ds.corpora) == ["boats", "bread", "stars"]
    assert len(ds.questions) == 6 and sum(q.multi for q in ds.questions) == 2
    q = ds.questions[0]
    s, e = q.evidence[0]
    assert ds.corpora[q.corpus_id][s:e] == "The keel keeps it upright."
    assert ds.subset(["boats"], max_questions=1).questions == (q,)
    bad = tmp_path / "bad"
    write_dataset(bad)
    rows = list(csv.reader(open(bad / "questions.csv", encoding="utf-8")))
    rows[1][1] = json.dumps([{"content": "nope", "start_index": 0, "end_index": 4}])
    with open(bad / "questions.csv", "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)
    with pytest.raises(QascError, match="does not match"):
        load_dataset(bad)
    with pytest.raises(QascError, match="not a Chroma-format"):
        load_dataset(tmp_path / "missing")


def _rewrite_first_row(root: Path, column: int, value: str, encoding: str = "utf-8") -> None:
    rows = list(csv.reader(open(root / "questions.csv", encoding="utf-8")))
    rows[1][column] = value
    with open(root / "questions.csv", "w", newline="", encoding=encoding) as fh:
        csv.writer(fh).writerows(rows)


@pytest.mark.parametrize("column, value, message", [
    (1, json.dumps([{"end_index": 4}]), r"questions\.csv:2: a reference has no start_index"),
    (1, json.dumps({"start_index": 0, "end_index": 4}), r"questions\.csv:2: references must be a JSON list, got dict"),
    (1, json.dumps([{"start_index": "abc", "end_index": 4}]), r"start_index / end_index must be integers"),
    (1, "null", r"references must be a JSON list, got NoneType"),
    (1, json.dumps(["text"]), r"each reference must be a JSON object"),
    (0, "  ", r"questions\.csv:2: empty question"),
])
def test_loader_names_the_row_of_a_malformed_question(tmp_path, column, value, message):
    root = write_dataset(tmp_path / "d")
    _rewrite_first_row(root, column, value)
    with pytest.raises(QascError, match=message):
        load_dataset(root)


def test_loader_refuses_ambiguous_or_unreadable_corpora_and_reads_a_bom(tmp_path):
    root = write_dataset(tmp_path / "d")
    _rewrite_first_row(root, 0, "What keeps a boat upright?", encoding="utf-8-sig")  # a spreadsheet's BOM
    assert len(load_dataset(root).questions) == 6
    (root / "corpora" / "boats.txt").write_text("Another boats file.", encoding="utf-8")
    with pytest.raises(QascError, match=r"boats\.md and boats\.txt have the same corpus_id 'boats'"):
        load_dataset(root)
    (root / "corpora" / "boats.txt").unlink()
    (root / "corpora" / "latin.md").write_bytes("Café".encode("latin-1"))
    with pytest.raises(QascError, match=r"latin\.md: not valid utf-8 \(byte 0xe9 at offset 3\)"):
        load_dataset(root)
    (root / "corpora" / "latin.md").unlink()
    rows = list(csv.reader(open(root / "questions.csv", encoding="utf-8-sig")))
    with open(root / "questions.csv", "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows[:1])
    with pytest.raises(QascError, match=r"questions\.csv: no questions"):
        load_dataset(root)


def test_cache_avoids_re_embedding(tmp_path, embedder):
    from qasc.jobs.eval.baselines import FixedTokenChunker

    cache = EvalCache(tmp_path / "cache")
    chunker = FixedTokenChunker(8, embedder.tokenizer)
    before = embedder.encoded
    first = build_chunkset(chunker, CORPORA, embedder, cache)
    assert embedder.encoded > before
    mid = embedder.encoded
    again = build_chunkset(chunker, CORPORA, embedder, cache)
    assert embedder.encoded == mid, "second build must come from the cache"
    np.testing.assert_array_equal(first.emb, again.emb)
    np.testing.assert_array_equal(first.n_tokens, again.n_tokens)
    sub = first.restrict(["bread"])
    assert set(sub.doc_ids) == {"bread"} and len(sub) < len(first)


def test_budget_rule_cuts_the_overflowing_chunk(embedder):
    text = CORPORA["boats"]
    cutter = TokenCutter(embedder.tokenizer, {"boats": text})
    n = int(embedder.count_tokens([text[:40]])[0])
    hits = [("boats", 0, 40, n, 0.9, 0), ("boats", 40, len(text), 30, 0.8, 0), ("boats", 0, 5, 1, 0.1, 0)]
    got = within_budget(hits, n + 3, cutter)
    assert got[0] == hits[0]
    assert len(got) == 2, "selection stops after the cut chunk"
    doc, s, e, toks, _, _ = got[1]
    assert (s, toks) == (40, 3)
    assert int(embedder.count_tokens([text[s:e]])[0]) == 3
    assert within_budget(hits, n + 3, None) == [hits[0]], "no cutter: the overflowing chunk is dropped"
    assert within_budget(hits, 10_000, cutter) == hits


def test_grid_and_selectors_are_declared():
    grid = Q.qasc_grid()
    keys = [s.key() for s in grid]
    assert len(keys) == len(set(keys)) and 20 <= len(grid) <= 450  # the warm suite stays near 15 min
    for s in grid:
        assert s.params.top_k is None and s.params.budget_tokens is None and s.params.score_margin is None
    hits = [("d", 0, 1, 1, 0.9, 1), ("d", 2, 3, 1, 0.86, 1), ("d", 4, 5, 1, 0.5, 1)]
    assert Q.select(hits, "k=2") == hits[:2]
    assert Q.select(hits, "margin=0.05") == hits[:2]
    runs = next(s for s in grid if s.params.max_extent > 1)
    sentences = next(s for s in grid if s.params.max_extent == 1)
    for label, change in Q.ABLATIONS:
        # every ablation applies to runs and to sentences alike (None would mean: not applicable)
        assert all(isinstance(change(base), Q.Setting) for base in (runs, sentences)), label


def test_run_eval_end_to_end(tmp_path, embedder):
    data = write_dataset(tmp_path / "data")
    out = tmp_path / "out"
    engines = []
    cfg = EvalConfig(data_dir=str(data), out_dir=str(out), cache_dir=str(tmp_path / "cache"),
                     methods=("fixed-8", "fixed-16", "recursive-60c", "sentences", "semantic", "qasc"),
                     ks=(1, 2, 3), budgets=(10, 20), n_boot=50, grid="quick")
    res = run_eval(cfg, engine_factory=fake_factory(engines), embedder=embedder, log=lambda m: None)
    held = res["heldout"]
    base = {"fixed-8", "fixed-16", "recursive-60c", "sentences", "semantic"}
    assert set(held) == base | {"qasc"} | {f"{m} + same context" for m in base}  # baselines with QASC's context
    for name, e in held.items():
        assert 0 <= e["f1"]["lo"] <= e["f1"]["mean"] <= e["f1"]["hi"] <= 100, name
        assert len(e["folds"]) == 3
        assert e["single"]["n"] == 4 and e["multi"]["n"] == 2
    assert engines and len(engines[0].calls) >= len(Q.qasc_grid(quick=True))
    assert all(c[0].top_k is None for c in engines[0].calls), "the harness applies selectors itself"
    for name in held:
        for b in ("10", "20"):
            assert res["budget"][name][b]["tokens"] <= int(b) + 1e-9
    assert res["ablations"] and {a["ablation"] for a in res["ablations"]} == {a for a, _ in Q.ABLATIONS}
    for f in ("report.md", "results.json", "spans.jsonl", "recall_vs_tokens.png", "f1_by_method.png",
              "ablations.png"):
        assert (out / f).stat().st_size > 0, f
    report = (out / "report.md").read_text()
    assert "density proxy" in report and "held out" in report and "By query type" in report
    assert held["qasc"]["by_type"]["multi-part"]["n"] == 2
    lines = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    assert len(lines) == 6 * len(held)
    texts = CORPORA
    for rec in lines:
        for sp in rec["spans"]:
            assert 0 <= sp["start"] < sp["end"] <= len(texts[sp["doc_id"]])
    # a perfect sentence-level question must be answerable by the sentence baseline in-sample
    assert res["in_sample"]["sentences"]["recall"]["mean"] > 0
    # the rerun comes from the cache: nothing is embedded again
    before = embedder.encoded
    run_eval(cfg, engine_factory=fake_factory([]), embedder=embedder, log=lambda m: None)
    assert embedder.encoded == before + 0


def test_one_corpus_of_questions_is_labelled_in_sample(tmp_path, embedder):
    data = write_dataset(tmp_path / "data")
    rows = list(csv.reader(open(data / "questions.csv", encoding="utf-8")))
    with open(data / "questions.csv", "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([rows[0]] + [r for r in rows[1:] if r[2] == "boats"])
    cfg = EvalConfig(data_dir=str(data), out_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                     methods=("sentences",), ks=(1, 2), budgets=(20,), n_boot=20)
    res = run_eval(cfg, embedder=embedder, log=lambda m: None)
    assert len(res["heldout"]["sentences"]["folds"]) == 1
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Results IN SAMPLE" in report and "Held-out results" not in report


class _ChatHandler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        reply = "0.75" if "grade" in prompt else "split_after: 1" if "split_after" in prompt else "an answer"
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def chat_server():
    server = HTTPServer(("127.0.0.1", 0), _ChatHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def test_agentic_chunker_and_judge_in_a_run(tmp_path, embedder, chat_server):
    data = write_dataset(tmp_path / "data")
    cfg = EvalConfig(data_dir=str(data), out_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                     methods=("sentences", "llm-agentic"), ks=(1, 2), budgets=(20,), n_boot=20,
                     llm_url=chat_server, judge_questions=4)
    res = run_eval(cfg, embedder=embedder, log=lambda m: None)
    assert "llm-agentic" in res["heldout"]
    assert res["faithfulness"]["questions"] == 4
    assert res["faithfulness"]["methods"]["sentences"]["mean"] == pytest.approx(75.0)
    assert "Generate-and-judge" in (tmp_path / "out" / "report.md").read_text()


def test_llm_client_and_judge_against_a_local_server():
    from qasc.jobs.eval.llm import ChatClient, generate_and_judge, parse_score

    server = HTTPServer(("127.0.0.1", 0), _ChatHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = ChatClient(f"http://127.0.0.1:{server.server_port}/v1", "m", timeout=5)
        assert client.chat("hello") == "an answer"
        got = generate_and_judge(client, "q?", ["ctx"], ["evidence"])
        assert got == {"answer": "an answer", "score": 0.75}
        assert client.calls == 3
    finally:
        server.shutdown()
    assert parse_score("Score: 1.5") == 1.0 and parse_score("none") == 0.0
    with pytest.raises(QascError):
        ChatClient("http://127.0.0.1:9/v1", retries=0, timeout=1).chat("x")
