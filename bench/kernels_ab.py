"""A kernel change, before vs after: the kernels/ of a git ref against the working tree's, in one process.

The ref's kernels/ is exported (`git archive`) to a temporary folder as the package `kernels_ab_ref` (its
`kernels.` imports renamed), so both pipelines run on the same synthetic batches (`bench.kernels.synthetic_batch`)
interleaved round-robin: load on a shared machine hits both alike. Per setting: whether every QascBatch field
is bit-identical (else allclose, else which field differs), the median us/query of each side by the wall clock
and by process CPU time (with --threads 1 the steadier of the two on a loaded machine: time spent descheduled
is not counted), and the ratio of each setting to the first one, per side and clock.

    python -m bench.kernels_ab --ref 332025e --settings pooled-focus,sections-far,blocks-far --qs 1000 --ls 256
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

from bench.common import REPO, emit_json, machine_info, median, print_table
from bench.kernels import SETTINGS, synthetic_batch

FIELDS = ("start", "end", "score", "tokens", "chosen", "piece", "labels", "kept", "tau")


def load_ref(ref: str, folder: Path):
    """kernels/ at git `ref`, imported as `kernels_ab_ref.pipeline`."""
    blob = subprocess.run(["git", "-C", str(REPO), "archive", ref, "kernels"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(folder, filter="data")
    pkg = folder / "kernels"
    for path in pkg.glob("*.py"):
        path.write_text(re.sub(r"\bfrom (?:qasc\.)?kernels(\.| import)", r"from kernels_ab_ref\1", path.read_text()))
    pkg.rename(folder / "kernels_ab_ref")
    sys.path.insert(0, str(folder))
    return importlib.import_module("kernels_ab_ref.pipeline")


def call(pipeline, b: dict[str, torch.Tensor], params):
    return pipeline.run_qasc(b["sims"], b["valid"], b["region"], b["paragraph"], b["section"], b["n_tokens"], params,
                             dots=b["dots"], blocks={k: (b[f"{k}_sizes"], b[f"{k}_norms"]) for k in
                                                     ("paragraph", "section")})


def compare(old, new) -> str:
    """'bit-identical', 'allclose', or the first field that differs."""
    close = True
    for name in FIELDS:
        x, y = getattr(old, name), getattr(new, name)
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"differs: {name} shape/dtype"
        if torch.equal(x, y):
            continue
        if not (x.is_floating_point() and torch.allclose(x, y, rtol=1e-6, atol=1e-7, equal_nan=True)):
            return f"differs: {name}"
        close = False
    return "bit-identical" if close else "allclose"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", default="HEAD", help="git ref whose kernels/ is the 'before' side")
    p.add_argument("--settings", default="pooled-focus,sections-far,blocks-far",
                   help=f"bench.kernels settings (comma list; ratios are to the first): {', '.join(SETTINGS)}")
    p.add_argument("--qs", type=int, default=1000, help="queries Q")
    p.add_argument("--ls", type=int, default=256, help="row width L")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (median); one untimed warm-up round")
    p.add_argument("--check-seeds", type=int, default=2, help="batches (seeds 0..n-1) whose outputs are compared")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import qasc.kernels.pipeline as new

    names = args.settings.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        old = load_ref(args.ref, Path(tmp))
        same = {name: [] for name in names}
        for seed in range(args.check_seeds):
            b = synthetic_batch(args.qs, args.ls, seed)
            for name in names:
                same[name].append(compare(call(old, b, SETTINGS[name]), call(new, b, SETTINGS[name])))
        b = synthetic_batch(args.qs, args.ls, 0)
        times = {(clock, side, name): [] for clock in ("wall", "cpu") for side in ("before", "after") for name in names}
        for r in range(args.repeats + 1):  # round 0 warms up
            for name in names:
                for side, mod in (("before", old), ("after", new)):
                    t0, c0 = time.perf_counter(), time.process_time()
                    call(mod, b, SETTINGS[name])
                    if r:
                        times[("wall", side, name)].append(time.perf_counter() - t0)
                        times[("cpu", side, name)].append(time.process_time() - c0)
    us = {k: 1e6 * median(v) / args.qs for k, v in times.items()}
    rows = []
    for name in names:
        row = {"setting": name}
        for clock in ("wall", "cpu"):
            before, after = us[(clock, "before", name)], us[(clock, "after", name)]
            row.update({f"{clock} before us/q": before, f"{clock} after us/q": after,
                        f"{clock} speed-up": before / after,
                        f"{clock} before / {names[0]}": before / us[(clock, "before", names[0])],
                        f"{clock} after / {names[0]}": after / us[(clock, "after", names[0])]})
        rows.append({**row, "outputs": ", ".join(sorted(set(same[name])))})
    info = machine_info("cpu")
    print(f"\nQ={args.qs} L={args.ls}, before = kernels/ at {args.ref}, torch threads {torch.get_num_threads()}, "
          f"median of {args.repeats} interleaved rounds; load avg {info['load_avg']}")
    print_table(rows, list(rows[0]))
    record = {"bench": "kernels_ab", "ref": args.ref, "Q": args.qs, "L": args.ls, "repeats": args.repeats,
              "machine": info, "rows": rows}
    emit_json(record)
    return record


if __name__ == "__main__":
    main()
