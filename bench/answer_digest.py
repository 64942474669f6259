"""Fingerprints of `qasc query`'s answers on the development stores: did a change move any answer?

For each development set, `qasc query --store S --queries questions.csv --out F --preset P` runs through the CLI (the
user's path) on the eval cache's store of that set (built by `qasc eval` / bench.scoring_lodo), and the result
file's sha256 is printed with its row count. Run it before and after a refactor: equal digests = byte-identical
answers (issue #44's acceptance). Ends with one JSON line {set/preset: digest}.

    python -m bench.answer_digest --out /tmp/digest-before
    python -m bench.answer_digest --out /tmp/digest-after --presets answers,context
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

SETS = ("chroma_general", "tatqa_finance", "medquad_health", "policyqa_privacy", "qasper_papers", "wiki_sentences")
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def find_store(stores: Path, name: str) -> Path:
    """The newest cached store of set `name` (eval cache layout: <set>-<corpus digest>-...-v<format>)."""
    found = sorted((p for p in stores.glob(f"{name}-*") if (p / "manifest.json").exists()),
                   key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no cached store of {name} under {stores}: build it with `qasc eval --data .../{name}` "
                         "or `python -m bench.scoring_lodo` first")
    return found[-1]


def digest(path: Path) -> tuple[str, int]:
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest()[:16], data.count(b"\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the result files")
    ap.add_argument("--sets", default=",".join(SETS), help="development sets (folders of --data)")
    ap.add_argument("--data", default=str(DATA), help="folder holding the sets (default ../shared/data)")
    ap.add_argument("--presets", default="answers", help="comma-separated presets to run (answers, context)")
    ap.add_argument("--cache-dir", default=os.environ.get("QASC_EVAL_CACHE", str(Path.home() / ".cache/qasc/eval")))
    ap.add_argument("--cli", default="qasc.jobs.cli",
                    help="module run with -m (jobs.cli for a checkout before the qasc namespace)")
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]),
                    help="checkout the CLI runs in (its working directory)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    digests = {}
    for name in args.sets.split(","):
        store = find_store(Path(args.cache_dir) / "stores", name)
        for preset in args.presets.split(","):
            result = out / f"{name}-{preset}.jsonl"
            result.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", args.cli, "query", "--store", str(store), "--queries",
                   str(Path(args.data) / name / "questions.csv"), "--out", str(result), "--preset", preset,
                   "--device", "cpu"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=args.repo)
            digests[f"{name}/{preset}"], rows = digest(result)
            print(f"{name:18s} {preset:8s} {rows:6d} rows  {digests[f'{name}/{preset}']}", flush=True)
    print(json.dumps(digests, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
