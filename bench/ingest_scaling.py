"""Local ingest (split + embed + write + index, no Ray) at 1x, 2x, 4x corpus size: does sentences/s hold?

The 1x corpus is `--kb` KB of chroma_general text (default 200 KB) from `--corpora` (default: finance and
pubmed, the two corpora large enough for 4x without repeating text), cut into `--doc-kb` documents at line
breaks and taken round-robin across the corpora, so every scale has the same mix; 2x and 4x extend it.
Each ingest builds a fresh store. `sentences/s` is engine.store.ingest's own figure (model load included);
`steady sent/s` subtracts the fixed cost (model load, index, manifest), measured as the median ingest time
of a one-sentence corpus. Runs are interleaved (1x, 2x, 4x, then again) so load drift hits all scales alike.

    python -m bench.ingest_scaling
    python -m bench.ingest_scaling --quick
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import CHROMA, emit_json, machine_info, median, print_table


def pieces(text: str, size: int) -> list[str]:
    """text cut into pieces of about `size` characters, each ending at a line break when there is one."""
    out, pos = [], 0
    while pos < len(text):
        end = min(len(text), pos + size)
        if end < len(text):
            nl = text.rfind("\n", pos + size // 2, end)
            end = nl + 1 if nl > 0 else end
        out.append(text[pos:end])
        pos = end
    return out


def build_corpus(folder: Path, names: list[str], total_kb: int, doc_kb: int, corpora_dir: Path) -> int:
    """Write documents (round-robin across the corpora) until total_kb; returns the characters written."""
    cut = [pieces((corpora_dir / f"{n}.md").read_text(encoding="utf-8"), doc_kb * 1024) for n in names]
    folder.mkdir(parents=True, exist_ok=True)
    written, i = 0, 0
    while written < total_kb * 1024:
        src = [c[i] for c in cut if i < len(c)]
        if not src:
            raise SystemExit(f"the corpora {names} hold less than {total_kb} KB")
        for j, piece in enumerate(src):
            left = total_kb * 1024 - written
            if left <= 0:
                break
            if len(piece) > left:  # the last document is cut to size, at a line break when there is one
                nl = piece.rfind("\n", 0, left)
                piece = piece[: nl + 1 if nl > left // 2 else left]
            (folder / f"doc{i:04d}_{j}.md").write_text(piece, encoding="utf-8")
            written += len(piece)
        i += 1
    return written


def ingest_once(corpus: Path, work: Path) -> dict:
    from engine.store import ingest

    store = work / f"store-{time.monotonic_ns()}"
    try:
        return ingest([str(corpus)], str(store), local=True, progress=False, log=lambda _m: None)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kb", type=int, default=200, help="1x corpus size in KB")
    p.add_argument("--scales", default="1,2,4", help="multiples of --kb (comma list)")
    p.add_argument("--corpora", default="finance,pubmed", help="chroma_general corpora to draw from (comma list)")
    p.add_argument("--corpora-dir", default=str(CHROMA / "corpora"), help="folder of <name>.md corpora")
    p.add_argument("--doc-kb", type=int, default=20, help="document size in KB")
    p.add_argument("--repeats", type=int, default=2, help="ingests per scale (median)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--quick", action="store_true", help="tiny run: 8 KB x {1, 2}, 1 repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.kb, args.scales, args.repeats, args.doc_kb = 8, "1,2", 1, 4
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    scales = [int(x) for x in args.scales.split(",")]
    names = [n for n in args.corpora.split(",") if n]
    work = Path(tempfile.mkdtemp(prefix="qasc-ingest-scaling-"))
    try:
        corpora = {s: work / f"corpus-{s}x" for s in scales}
        chars = {s: build_corpus(corpora[s], names, args.kb * s, args.doc_kb, Path(args.corpora_dir)) for s in scales}
        tiny = work / "corpus-tiny"
        tiny.mkdir()
        (tiny / "one.md").write_text("One sentence only.\n", encoding="utf-8")
        ingest_once(tiny, work)  # warm-up: imports, model files in the page cache
        fixed, runs = [], {s: [] for s in scales}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            ingest_once(tiny, work)
            fixed.append(time.perf_counter() - t0)
            for s in scales:
                t0 = time.perf_counter()
                summary = ingest_once(corpora[s], work)
                runs[s].append((time.perf_counter() - t0, summary))
                print(f"{s}x: {summary['sentences']} sentences in {runs[s][-1][0]:.1f} s", flush=True)
        fixed_s = median(fixed)
        rows = []
        for s in scales:
            secs = median([t for t, _ in runs[s]])
            n = runs[s][0][1]["sentences"]
            rows.append({"scale": f"{s}x", "KB": chars[s] // 1024, "documents": runs[s][0][1]["documents"],
                         "sentences": n, "seconds": secs, "sentences/s": n / secs,
                         "steady sent/s": n / max(secs - fixed_s, 1e-9), "KB/s": chars[s] / 1024 / secs})
        base = rows[0]["steady sent/s"]
        for r in rows:
            r["vs 1x"] = r["steady sent/s"] / base
        spread = max(r["steady sent/s"] for r in rows) / min(r["steady sent/s"] for r in rows) - 1
        info = machine_info()
        print(f"\nlocal ingest (no Ray), corpora {names}, median of {args.repeats}; fixed cost {fixed_s:.2f} s "
              f"(one-sentence ingest); torch threads {torch.get_num_threads()}; load avg {info['load_avg']}")
        print_table(rows, ["scale", "KB", "documents", "sentences", "seconds", "sentences/s", "steady sent/s", "KB/s",
                           "vs 1x"])
        record = {"bench": "ingest_scaling", "kb": args.kb, "corpora": names, "repeats": args.repeats,
                  "fixed_s": fixed_s, "spread": spread, "within_20pct": spread <= 0.2, "machine": info, "rows": rows}
        emit_json(record)
        return record
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
