"""`qasc demo`: the main job on the built-in demo corpus: ingest into a store, then a query batch."""

from __future__ import annotations

import argparse
import tempfile
import time
from importlib.resources import files

from qasc.jobs.devices import add_device_argument

DEMO_QUESTIONS = [
    "How long should sourdough dough proof, and at what temperature is it baked?",
    "Who invented the lens that made lighthouse beams visible far out to sea?",
    "How do I size a rooftop solar array for my daily electricity use?",
    "When was the last staffed lighthouse in the UK automated?",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None, help="store folder to (re)use; default: a temporary folder")
    p.add_argument("--top-k", type=int, default=2, help="chunks printed per question")
    add_device_argument(p)


def run(args: argparse.Namespace) -> int:
    from qasc.engine.query import Engine
    from qasc.engine.store import IngestProgress, ingest
    from qasc.jobs.results import print_table

    corpus = files("qasc.engine") / "data" / "demo"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qasc-demo-") as tmp:
        store = args.store or f"{tmp}/store"
        summary = ingest([str(corpus)], store, progress=IngestProgress(bar=False))
        engine = Engine.open(store, device=args.device)
        params = engine.config.qasc.replace(top_k=args.top_k)
        results = engine.query(DEMO_QUESTIONS, params)
        print(f"demo store: {summary['documents']} documents, {summary['sentences']} sentences ({store})")
        print_table([str(i) for i in range(len(DEMO_QUESTIONS))], DEMO_QUESTIONS, results)
    print(f"\ndemo finished in {time.perf_counter() - started:.1f} s")
    return 0
