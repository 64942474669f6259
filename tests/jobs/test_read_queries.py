"""`qasc query --queries`: ids and questions read as written, clear errors naming the row and its id."""

from __future__ import annotations

import json

import pytest

from qasc.engine.errors import QascError
from qasc.engine.query import MAX_QUERY_CHARS
from qasc.jobs.query_cmd import read_queries


def test_csv_ids_are_read_verbatim(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text('id,question\n007,2017\n008,"Who is the auditor, then?"\n1e3,revenue\nNA,penguins\n')
    ids, questions = read_queries(str(path))
    assert ids == ["007", "008", "1e3", "NA"]
    assert questions == ["2017", "Who is the auditor, then?", "revenue", "penguins"]


def test_jsonl_ids_of_mixed_types(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [{"id": 7, "question": "a?"}, {"id": "x8", "question": "b?"}, {}, {"id": 9, "query": "c?"}]
    path.write_text("\n".join(json.dumps(r) for r in rows if r) + "\n\n")
    with pytest.raises(QascError, match=r"row 2 \(id '9'\) has an empty question"):
        read_queries(str(path))  # a row with `query` where the others have `question`
    path.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n")
    assert read_queries(str(path)) == (["7", "x8"], ["a?", "b?"])


@pytest.mark.parametrize(
    "line, message",
    [
        ({"id": "a", "question": 42}, r"row 0 \(id 'a'\): the question is a int \(42\), not text"),
        ({"id": True, "question": "x"}, "row 0 has no usable id"),
        ({"id": "b", "question": "x" * (MAX_QUERY_CHARS + 1)}, r"row 0 \(id 'b'\): the question has 10,001"),
        ({"id": "c", "text": "x"}, r"no `question` or `query` column \(columns: id, text\)"),
    ],
)
def test_jsonl_bad_rows_are_named(tmp_path, line, message):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(QascError, match=message):
        read_queries(str(path))


def test_jsonl_line_that_is_not_json(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "ok"}\n{"question": \n')
    with pytest.raises(QascError, match="line 2 is not JSON"):
        read_queries(str(path))
