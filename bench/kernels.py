"""The batched QASC kernels (kernels.pipeline.run_qasc) vs their loop twins (ops=kernels.reference).

Random ragged batches: sims (Q, L) smooth noise, each row valid on a random prefix of L/2..L, several regions
per row (runs of 8..L/4 positions), paragraphs of ~3 sentences, sections of ~15, n_tokens 5..40, a heading-context
boost per section (about +-0.1: pooled runs take it once, whole blocks need it > 0), and for the
pooled extents each row's neighbour dots (Q, L, W) of random unit sentence vectors of width D (`--dims`,
default 384 = MiniLM): the kernels never see the vectors, so their time and memory do not depend on D
(the "est. peak MiB" column shows it for `--dims 16,384`).
The reference is slow: it is timed on the first `--ref-rows` rows and scaled linearly per query (the table says
so, column "ref rows"); it works row by row, so its time is linear in Q by construction.

    python -m bench.kernels
    python -m bench.kernels --quick
    python -m bench.kernels --device cuda --qs 1000,10000,100000 --ls 256,4096 --no-ref
    python -m bench.kernels --qs 1000 --ls 4096 --settings default --dims 16,384 --no-ref   # memory vs D
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.common import emit_json, machine_info, median, print_table, time_repeats
from bench.memory import peak_rss_growth
from qasc.kernels.params import QascParams

# every field spelled out, so that the fixed settings do not move when QascParams' defaults do
BASE = QascParams(percentile=95.0, min_seeds=1, max_extent=1, clip_to_paragraph=False, block_extents="none",
                  length_bonus=0.0, max_tokens=512, merge_picks=False, top_k=1, score_margin=None, focus_gap=None,
                  far_margin=None, budget_tokens=None)
DOTS_WIDTH = 3  # every setting below scores runs of at most 3 sentences
SETTINGS = {
    "default": QascParams(),  # whatever the current defaults are
    "pooled-focus": BASE.replace(percentile=75.0, max_extent=3, clip_to_paragraph=True, top_k=10,
                                 score_margin=0.1, focus_gap=6),
    "blocks-far": BASE.replace(percentile=75.0, max_extent=3, clip_to_paragraph=True, top_k=10,
                               score_margin=0.1, focus_gap=6, far_margin=0.02, block_extents="both",
                               length_bonus=0.02),
    # the shipped default (issue 13) spelled out: whole sections only; blocks-far adds whole paragraphs
    "sections-far": BASE.replace(percentile=75.0, max_extent=3, clip_to_paragraph=True, top_k=10,
                                 score_margin=0.1, focus_gap=6, far_margin=0.02, block_extents="section",
                                 length_bonus=0.02),
    "p95-sentences-top1": BASE,
    # the `context` preset's extents: single sentences around at least 16 seeds, touching ones merged, picks beyond
    # the score margin (the window extents these replaced: bench/RESULTS.md, "Fewer, grouped knobs")
    "context": BASE.replace(min_seeds=16, merge_picks=True, top_k=10, score_margin=0.1),
    "budget-runs": BASE.replace(percentile=85.0, max_extent=2, clip_to_paragraph=True, budget_tokens=512,
                                top_k=None),
}


def synthetic_batch(q: int, length: int, seed: int = 0, device: str | torch.device = "cpu",
                    dim: int = 384) -> dict[str, torch.Tensor]:
    """A random ragged batch (Q, L): sims float32, valid bool, region/paragraph/section ids and n_tokens int64,
    dots (Q, L, DOTS_WIDTH) float32: neighbour dots of random unit vectors of width `dim`, made a row at a time."""
    from qasc.kernels.extents import block_stats, neighbour_dots

    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(q, length + 8, generator=g)
    kernel = torch.ones(1, 1, 9) / 9.0  # moving average: neighbouring sentences are alike
    smooth = torch.nn.functional.conv1d(noise[:, None, :], kernel).squeeze(1)[:, :length]
    sims = (0.25 + 0.5 * smooth + 0.05 * torch.randn(q, length, generator=g)).clamp(-1, 1)
    n_valid = torch.randint(max(length // 2, 1), length + 1, (q, 1), generator=g) if length else torch.zeros(q, 1)
    idx = torch.arange(length).expand(q, length)
    valid = idx < n_valid
    mean_region = max(8, length // 8)
    new_region = torch.rand(q, length, generator=g) < 1.0 / mean_region
    new_paragraph = new_region | (torch.rand(q, length, generator=g) < 1 / 3)
    new_section = new_region | (torch.rand(q, length, generator=g) < 1 / 15)
    ids = {name: torch.where(valid, flags.long().cumsum(1), torch.full((q, length), -1, dtype=torch.long))
           for name, flags in (("region", new_region), ("paragraph", new_paragraph), ("section", new_section))}
    tokens = torch.randint(5, 41, (q, length), generator=g)
    dots = torch.zeros((q, length, DOTS_WIDTH))
    blocks = {f"{kind}_{part}": torch.zeros((q, length), dtype=dtype) for kind in ("paragraph", "section")
              for part, dtype in (("sizes", torch.long), ("norms", torch.float32))}
    for i in range(q):  # one row's (L, dim) vectors at a time: the batch never holds (Q, L, dim)
        row = torch.nn.functional.normalize(torch.randn(length, dim, generator=g), dim=-1)
        dots[i] = neighbour_dots(row, DOTS_WIDTH)
        for kind in ("paragraph", "section"):  # each row taken as one document
            blocks[f"{kind}_sizes"][i], blocks[f"{kind}_norms"][i] = block_stats(row, ids[kind][i])
    # the heading context's boost: one value per section (its heading path's match), about +-0.1
    per_section = 0.1 * torch.randn(q, length + 1, generator=g)
    boost = torch.where(valid, per_section.gather(1, ids["section"].clamp(min=0)), torch.zeros_like(sims))
    out = {"sims": torch.where(valid, sims, torch.zeros_like(sims)), "valid": valid, **ids, "n_tokens": tokens,
           "dots": dots, **blocks, "boost": boost}
    return {k: v.to(device) for k, v in out.items()}


def run(batch: dict[str, torch.Tensor], params: QascParams, ops=None, rows: int | None = None):
    from qasc.kernels.pipeline import run_qasc

    b = batch if rows is None else {k: v[:rows] for k, v in batch.items()}
    return run_qasc(b["sims"], b["valid"], b["region"], b["paragraph"], b["section"], b["n_tokens"], params, ops=ops,
                    dots=b["dots"], blocks={k: (b[f"{k}_sizes"], b[f"{k}_norms"]) for k in ("paragraph", "section")},
                    boost=b["boost"])


def estimate_peak(batch, params, device) -> int:
    """Bytes the fast path needs for one row (CUDA: max_memory_allocated; CPU: RSS high-water growth)."""
    one = {k: v[:1] for k, v in batch.items()}
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        run(one, params)
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    return peak_rss_growth(lambda: run(one, params))


def check_equal(batch, params, rows: int) -> bool:
    """The fast and the reference pipeline pick the same chunks on the first `rows` rows."""
    from qasc.kernels import reference

    fast, slow = run(batch, params, rows=rows), run(batch, params, ops=reference, rows=rows)
    return bool(torch.equal(fast.start.cpu(), slow.start) and torch.equal(fast.end.cpu(), slow.end)
                and torch.equal(fast.chosen.cpu(), slow.chosen))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--qs", default="1,100,1000", help="numbers of queries Q (comma list)")
    p.add_argument("--ls", default="256,4096", help="row widths L (comma list)")
    p.add_argument("--dims", default="384", help="sentence vector widths D behind the neighbour dots (comma list)")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"QascParams settings: {', '.join(SETTINGS)}")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto (the reference always runs on CPU)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats of the fast path (median)")
    p.add_argument("--ref-rows", type=int, default=8, help="rows the reference is timed on (then scaled per query)")
    p.add_argument("--ref-repeats", type=int, default=1, help="timed repeats of the reference (median)")
    p.add_argument("--no-ref", action="store_true", help="fast path only (large Q/L on a GPU)")
    p.add_argument("--mem-budget-gb", type=float, default=6.0,
                   help="skip a (Q, L, setting) whose peak memory, probed on one row and scaled by Q, exceeds this")
    p.add_argument("--budget-s", type=float, default=0.0, help="start no new (L, Q) size once this many seconds have "
                   "passed (0: no limit; the first size always runs); the sizes left are listed as skipped")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny run: Q in {1, 16}, L = 64, 2 settings, 1 repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.qs, args.ls, args.repeats, args.ref_rows = "1,16", "64", 1, 2
        args.settings = "default,context"
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from qasc.engine.embedder import resolve_device
    from qasc.kernels import reference

    device = resolve_device(args.device)
    rows = []
    t_start = time.perf_counter()
    for length, q, dim in ((n, q, d) for n in _ints(args.ls) for q in _ints(args.qs) for d in _ints(args.dims)):
        names = args.settings.split(",")
        if args.budget_s and rows and time.perf_counter() - t_start > args.budget_s:  # the first size always runs
            for name in names:
                rows.append({"Q": q, "L": length, "D": dim, "setting": name, "fast ms": float("nan"),
                             "note": f"skipped: time budget {args.budget_s:g} s spent"})
            print(f"Q={q} L={length} D={dim}: skipped (time budget {args.budget_s:g} s spent)", flush=True)
            continue
        # peak memory probed on one row first: the full batch is only made when some setting fits
        probe = {k: v.to(device) for k, v in synthetic_batch(1, length, args.seed, dim=dim).items()}
        ests = {name: estimate_peak(probe, SETTINGS[name], device) * q for name in names}
        fits = [name for name in names if ests[name] <= args.mem_budget_gb * 2**30]
        batch = synthetic_batch(q, length, args.seed, dim=dim) if fits else None
        on_dev = {k: v.to(device) for k, v in batch.items()} if fits else None
        for name in names:
            params = SETTINGS[name]
            est = ests[name]
            if name not in fits:
                row = {"Q": q, "L": length, "D": dim, "setting": name, "fast ms": float("nan"),
                       "note": f"skipped: ~{est / 2**30:.0f} GiB est. peak"}
                rows.append(row)
                print(row, flush=True)
                continue
            fast = median(time_repeats(lambda p=params, b=on_dev: run(b, p), args.repeats, warmup=1, device=device))
            row = {"Q": q, "L": length, "D": dim, "setting": name, "fast ms": 1e3 * fast,
                   "fast us/query": 1e6 * fast / q, "queries/s": q / fast, "est. peak MiB": est / 2**20}
            if not args.no_ref:
                n_ref = min(q, args.ref_rows)
                slow = median(time_repeats(lambda p=params, n=n_ref, b=batch: run(b, p, ops=reference, rows=n),
                                           args.ref_repeats, warmup=0))
                ref_full = slow * q / n_ref
                row.update({"ref rows": f"{n_ref}/{q}", "ref ms (scaled)": 1e3 * ref_full,
                            "speed-up": ref_full / fast, "equal": check_equal(on_dev, params, min(n_ref, 4))})
            rows.append(row)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)
        del batch, on_dev
        if args.budget_s:  # a partial record after each size: a run stopped by its timeout still leaves one
            emit_json(_record(args, device, rows, partial=True))
    info = machine_info(device)
    print(f"\ndevice {device}, torch threads {torch.get_num_threads()}, fast path median of {args.repeats}; "
          "reference timed on 'ref rows' rows and scaled "
          f"linearly to Q; load avg {info['load_avg']}")
    cols = ["Q", "L", "D", "setting", "fast ms", "fast us/query", "queries/s", "est. peak MiB"]
    if not args.no_ref:
        cols += ["ref rows", "ref ms (scaled)", "speed-up", "equal"]
    if any("note" in r for r in rows):
        cols.append("note")
    print_table(rows, cols)
    record = _record(args, device, rows, info=info)
    emit_json(record)
    return record


def _record(args, device, rows: list[dict], partial: bool = False, info: dict | None = None) -> dict:
    at_1000 = [r["speed-up"] for r in rows if r["Q"] == 1000 and "speed-up" in r]
    skipped = [f"Q={r['Q']} L={r['L']} {r['setting']}" for r in rows if "note" in r]
    record = {"bench": "kernels", "device": str(device), "repeats": args.repeats, "ref_rows": args.ref_rows,
              "min_speedup_q1000": min(at_1000) if at_1000 else None, "skipped": skipped,
              "machine": info or machine_info(device), "rows": rows}
    return {**record, "partial": True} if partial else record


if __name__ == "__main__":
    main()
