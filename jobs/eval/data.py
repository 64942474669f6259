"""Chroma chunking-evaluation format: `corpora/*.md` plus `questions.csv` (question, references, corpus_id).

`references` is a JSON list of {content, start_index, end_index}: character offsets into the corpus file
whose stem is `corpus_id`. An optional `type` (or `query_type`) column labels query types for a breakdown.
Files are read as UTF-8 with newlines kept as they are, so offsets are exact.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from qasc.engine.errors import QascError

CORPUS_EXTENSIONS = (".md", ".txt")


@dataclass(frozen=True)
class Question:
    """One question: its text, its corpus and its evidence spans [(start, end)) in that corpus."""

    qid: int
    text: str
    corpus_id: str
    evidence: tuple[tuple[int, int], ...]
    qtype: str | None = None  # the set's own query-type label (column `type` or `query_type`), when it has one

    @property
    def multi(self) -> bool:
        return len(self.evidence) >= 2


@dataclass(frozen=True)
class Dataset:
    """corpora: corpus_id -> text; files: corpus_id -> path; questions in file order; name: the folder's name."""

    name: str
    root: str
    corpora: dict[str, str]
    questions: tuple[Question, ...]
    files: dict[str, str] = field(default_factory=dict)

    def corpora_fingerprint(self) -> str:
        """sha256 (16 hex) over the corpus ids and texts: the key of a store built from them."""
        h = hashlib.sha256()
        for cid in sorted(self.corpora):
            h.update(cid.encode() + b"\0" + hashlib.sha256(self.corpora[cid].encode()).digest())
        return h.hexdigest()[:16]

    def fingerprint(self) -> str:
        """sha256 (16 hex) over every corpus text and the questions."""
        h = hashlib.sha256(self.corpora_fingerprint().encode())
        for q in self.questions:
            h.update(json.dumps([q.text, q.corpus_id, q.evidence]).encode())
        return h.hexdigest()[:16]

    @property
    def corpus_ids(self) -> list[str]:
        return sorted(self.corpora)

    def subset(self, corpus_ids: list[str] | None = None, max_questions: int | None = None) -> Dataset:
        """A smaller data set: only these corpora (and their questions), at most max_questions per corpus."""
        keep = set(corpus_ids or self.corpora)
        unknown = keep - set(self.corpora)
        if unknown:
            raise QascError(f"unknown corpora {sorted(unknown)}; the data set has {self.corpus_ids}")
        per: dict[str, int] = {}
        qs = []
        for q in self.questions:
            if q.corpus_id not in keep:
                continue
            per[q.corpus_id] = per.get(q.corpus_id, 0) + 1
            if max_questions is None or per[q.corpus_id] <= max_questions:
                qs.append(q)
        return Dataset(self.name, self.root, {c: t for c, t in self.corpora.items() if c in keep}, tuple(qs),
                       {c: p for c, p in self.files.items() if c in keep})


def corpus_text(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            return fh.read()
    except UnicodeDecodeError as exc:
        raise QascError(f"{path}: not valid utf-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                        f"the evaluation reads corpora as utf-8") from None


def _reference_span(ref: object, where: str) -> tuple[int, int]:
    """One entry of a `references` list -> (start_index, end_index); QascError naming the row when malformed."""
    if not isinstance(ref, dict):
        raise QascError(f"{where}: each reference must be a JSON object with start_index and end_index, got "
                        f"{type(ref).__name__}")
    try:
        s, e = ref["start_index"], ref["end_index"]
    except KeyError as exc:
        raise QascError(f"{where}: a reference has no {exc.args[0]}") from None
    if isinstance(s, bool) or isinstance(e, bool) or not isinstance(s, int | str) or not isinstance(e, int | str):
        raise QascError(f"{where}: start_index / end_index must be integers, got {s!r}, {e!r}")
    try:
        return int(s), int(e)
    except ValueError:
        raise QascError(f"{where}: start_index / end_index must be integers, got {s!r}, {e!r}") from None


def load_dataset(data_dir: str | Path, check_content: bool = True) -> Dataset:
    """A folder in the Chroma format -> Dataset. QascError on a missing file, bad JSON or offsets that do
    not point at the reference content (when `check_content`)."""
    root = Path(data_dir)
    corpora_dir, qfile = root / "corpora", root / "questions.csv"
    if not corpora_dir.is_dir() or not qfile.is_file():
        raise QascError(f"{root} is not a Chroma-format data set (needs corpora/ and questions.csv)")
    paths = [p for p in sorted(corpora_dir.iterdir()) if p.suffix in CORPUS_EXTENSIONS and p.is_file()]
    stems: dict[str, Path] = {}
    for p in paths:  # a corpus_id names a file by its stem: two files with one stem would be ambiguous
        if p.stem in stems:
            raise QascError(f"{corpora_dir}: {stems[p.stem].name} and {p.name} have the same corpus_id {p.stem!r}")
        stems[p.stem] = p
    corpora = {p.stem: corpus_text(p) for p in paths}
    files = {p.stem: str(p) for p in paths}
    if not corpora:
        raise QascError(f"{corpora_dir} holds no .md/.txt corpus")
    questions = []
    with open(qfile, encoding="utf-8-sig", newline="") as fh:  # -sig: a spreadsheet's byte-order mark
        reader = csv.DictReader(fh)
        missing = {"question", "references", "corpus_id"} - set(reader.fieldnames or [])
        if missing:
            raise QascError(f"{qfile} lacks column(s) {sorted(missing)}")
        for line, row in enumerate(reader, start=2):
            where = f"{qfile}:{line}"
            cid = row["corpus_id"]
            if cid not in corpora:
                raise QascError(f"{where}: corpus_id {cid!r} has no file in {corpora_dir}")
            try:
                refs = json.loads(row["references"])
            except json.JSONDecodeError as exc:
                raise QascError(f"{where}: references is not JSON ({exc.msg})") from None
            if not isinstance(refs, list):
                raise QascError(f"{where}: references must be a JSON list, got {type(refs).__name__}")
            if not (row["question"] or "").strip():
                raise QascError(f"{where}: empty question")
            spans = []
            text = corpora[cid]
            for ref in refs:
                s, e = _reference_span(ref, where)
                if not 0 <= s < e <= len(text):
                    raise QascError(f"{where}: reference [{s}, {e}) falls outside {cid} ({len(text)} chars)")
                if check_content and "content" in ref and text[s:e] != ref["content"]:
                    raise QascError(f"{where}: reference [{s}, {e}) does not match its content in {cid}")
                spans.append((s, e))
            if not spans:
                raise QascError(f"{where}: question without references")
            qtype = (row.get("type") or row.get("query_type") or "").strip() or None
            questions.append(Question(len(questions), row["question"], cid, tuple(spans), qtype))
    if not questions:
        raise QascError(f"{qfile}: no questions")
    return Dataset(root.name, str(root), corpora, tuple(questions), files)
