"""Local ingest (split + embed + write + index, no Ray) at 1x, 2x, 4x corpus size: does sentences/s hold?

The largest corpus is max(scales) x `--kb` KB (default 4 x 200 KB) of chroma_general text from `--corpora`
(default: finance and pubmed, the two corpora large enough for 4x without repeating text), cut into `--doc-kb`
documents at line breaks, one piece of each corpus per round; scale s takes every (max/s)-th round, so every
scale samples the same stretch of every corpus (same mix, same kind of text).
Each ingest builds a fresh store. `sentences/s` is engine.store.ingest's own figure (model load included);
`steady sent/s` subtracts the fixed cost (model load, index, manifest), measured as the median ingest time
of a one-sentence corpus; `best steady sent/s` is the same for the fastest run (robust to load spikes).
Runs are interleaved (1x, 2x, 4x, then again) so load drift hits all scales alike.

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


def plan_rounds(names: list[str], total_kb: int, doc_kb: int, corpora_dir: Path) -> list[list[str]]:
    """Rounds of documents (one ~doc_kb piece of each corpus per round), total_kb in all (the largest scale)."""
    cut = [pieces((corpora_dir / f"{n}.md").read_text(encoding="utf-8"), doc_kb * 1024) for n in names]
    rounds: list[list[str]] = []
    written, i = 0, 0
    while written < total_kb * 1024:
        src = [c[i] for c in cut if i < len(c)]
        if not src:
            raise SystemExit(f"the corpora {names} hold less than {total_kb} KB")
        rounds.append(src)
        written += sum(len(x) for x in src)
        i += 1
    return rounds


def write_corpus(folder: Path, rounds: list[list[str]], stride: int) -> int:
    """Write every `stride`-th round (so that each scale samples the whole span of every corpus alike)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for i, docs in enumerate(rounds[::stride]):
        for j, text in enumerate(docs):
            (folder / f"doc{i:04d}_{j}.md").write_text(text, encoding="utf-8")
            written += len(text)
    return written


def ingest_once(corpus: Path, work: Path) -> dict:
    """One fresh local ingest; its summary plus `tokens` (model tokens of every stored sentence)."""
    from qasc.engine.store import IngestProgress, Store, ingest

    store = work / f"store-{time.monotonic_ns()}"
    try:
        quiet = lambda _m: None  # noqa: E731
        summary = ingest([str(corpus)], str(store), progress=IngestProgress(bar=False, log=quiet), log=quiet)
        summary["tokens"] = int(sum(int(d.n_tokens.sum()) for d in Store.open(store, load_index=False).docs))
        return summary
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
        top = max(scales)
        rounds = plan_rounds(names, args.kb * top, args.doc_kb, Path(args.corpora_dir))
        # every (top/s)-th round; a scale that does not divide the largest takes a prefix instead
        chars = {s: write_corpus(corpora[s], rounds, top // s) if top % s == 0 else
                 write_corpus(corpora[s], rounds[: max(1, len(rounds) * s // top)], 1) for s in scales}
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
            n, tok = runs[s][0][1]["sentences"], runs[s][0][1]["tokens"]
            rows.append({"scale": f"{s}x", "KB": chars[s] // 1024, "documents": runs[s][0][1]["documents"],
                         "sentences": n, "tok/sent": tok / max(n, 1), "seconds": secs, "sentences/s": n / secs,
                         "steady sent/s": n / max(secs - fixed_s, 1e-9),
                         "steady tok/s": tok / max(secs - fixed_s, 1e-9), "KB/s": chars[s] / 1024 / secs,
                         "best steady sent/s": n / max(min(t for t, _ in runs[s]) - fixed_s, 1e-9)})
        base = rows[0]["steady sent/s"]
        for r in rows:
            r["vs 1x"] = r["steady sent/s"] / base
        spread = max(r["steady sent/s"] for r in rows) / min(r["steady sent/s"] for r in rows) - 1
        spread_best = max(r["best steady sent/s"] for r in rows) / min(r["best steady sent/s"] for r in rows) - 1
        info = machine_info()
        print(f"\nlocal ingest (no Ray), corpora {names}, median of {args.repeats}; fixed cost {fixed_s:.2f} s "
              f"(one-sentence ingest); torch threads {torch.get_num_threads()}; load avg {info['load_avg']}")
        print_table(rows, ["scale", "KB", "documents", "sentences", "tok/sent", "seconds", "sentences/s",
                           "steady sent/s", "steady tok/s", "KB/s", "vs 1x", "best steady sent/s"])
        print(f"spread (max/min - 1) of steady sent/s: median {100 * spread:.0f}%, best run {100 * spread_best:.0f}%")
        record = {"bench": "ingest_scaling", "kb": args.kb, "corpora": names, "repeats": args.repeats,
                  "fixed_s": fixed_s, "spread": spread, "spread_best": spread_best,
                  "within_20pct": spread <= 0.2, "machine": info, "rows": rows}
        emit_json(record)
        return record
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
