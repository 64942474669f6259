"""The query path's gather and heading kernels against the forms they replaced, in the same run.

- dots: `kernels.gather.gathered_dots` (blocked elementwise products) vs a bmm of (1, D) x (D, 1) pairs over
  blocks of 2^22 elements (its form before 2026-12-06), over a float16 table of --rows rows;
- paths: `kernels.context.best_paths` over --paths heading paths: float32 (exact), the bf16 shortlist, the int8
  shortlist (`int8_heading_table`), with the share of the exact 8 best paths each finds;
- top: `kernels.context.shortlist_top` vs torch.topk on the int8 shortlist's int32 scores.
Random unit vectors; medians of --repeats runs. bench/RESULTS.md has the numbers at 1M rows and 50k paths.

    python -m bench.query_parts --quick
    python -m bench.query_parts            # 1M rows, 50k paths, 1,024 queries
"""

from __future__ import annotations

import argparse

from bench.common import emit_json, machine_info, median, print_table, time_repeats


def bmm_dots(table, query, index, valid, block_elements: int = 1 << 22):
    """The peer: gathered_dots as it was, a bmm of (1, D) x (D, 1) per valid entry, 2^22-element blocks."""
    import torch

    out = torch.zeros(index.shape, dtype=torch.float32)
    who, col = valid.nonzero(as_tuple=True)
    step = max(1, block_elements // table.shape[1])
    for lo in range(0, who.numel(), step):
        a, b = who[lo : lo + step], col[lo : lo + step]
        rows = table.index_select(0, index[a, b]).float()
        out[a, b] = torch.bmm(rows[:, None, :], query.index_select(0, a)[:, :, None]).view(-1)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of the float16 table (default 1M)")
    p.add_argument("--paths", type=int, default=50_016, help="heading paths (default 50,016: bench.scale's 1M store)")
    p.add_argument("--queries", type=int, default=1024, help="queries (default 1,024: one kernel block)")
    p.add_argument("--entries", type=int, default=300, help="gathered rows per query for the dots (default 300)")
    p.add_argument("--dim", type=int, default=384, help="vector width (default 384)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per form (median; default 5)")
    p.add_argument("--quick", action="store_true", help="20k rows, 5k paths, 64 queries, 2 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.paths, args.queries, args.repeats = 20_000, 5_000, 64, 2
    for name in ("rows", "paths", "queries", "entries", "dim", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    return args


def main(argv=None) -> dict:
    import torch

    from qasc.engine.query import CONTEXT_PATHS
    from qasc.kernels.context import best_paths, int8_heading_table, shortlist_top
    from qasc.kernels.gather import gathered_dots
    from qasc.kernels.quantize import int8_products, quantize_rows

    args = parse_args(argv)
    g = torch.Generator().manual_seed(0)
    unit = lambda n: torch.nn.functional.normalize(torch.randn(n, args.dim, generator=g), dim=1)  # noqa: E731
    table, query, heads = unit(args.rows).half(), unit(args.queries), unit(args.paths)
    index = torch.randint(0, args.rows, (args.queries, args.entries), generator=g)
    valid = torch.rand(index.shape, generator=g) < 0.9
    rows = []

    def row(part, form, fn, **extra):
        t = median(time_repeats(fn, args.repeats))
        rows.append({"part": part, "form": form, "ms": t * 1e3, **extra})
        return t

    ours = gathered_dots(table, query, index, valid)
    assert torch.allclose(ours, bmm_dots(table, query, index, valid), atol=1e-5)
    t_ours = row("dots", "gathered_dots (elementwise, 2^19 blocks)", lambda: gathered_dots(table, query, index, valid))
    t_bmm = row("dots", "bmm of (1, D) x (D, 1), 2^22 blocks (before)", lambda: bmm_dots(table, query, index, valid))

    j = CONTEXT_PATHS
    exact = best_paths(query, heads, j)[1]
    low8, scale = int8_heading_table(heads)
    forms = {"float32 (exact)": (None, None), "bf16 shortlist": (heads.bfloat16(), None),
             "int8 shortlist": (low8, scale)}
    paths_ms = {}
    for name, (low, sc) in forms.items():
        got = best_paths(query, heads, j, low, low_scale=sc)[1]
        found = sum(len(set(a) & set(b)) for a, b in zip(got.tolist(), exact.tolist(), strict=True)) / exact.numel()
        paths_ms[name] = row("paths", name, lambda low=low, sc=sc: best_paths(query, heads, j, low, low_scale=sc),
                             exact_share=found)

    block = min(128, args.queries)
    scores = int8_products(quantize_rows(query[:block] * (scale / 127))[0], low8)
    wide = min(4 * j, args.paths)
    t_top = row("top", f"shortlist_top ({block} x {args.paths}, top {wide})", lambda: shortlist_top(scores, wide))
    t_topk = row("top", "torch.topk (peer)", lambda: scores.topk(wide, dim=1))

    print_table(rows, title=f"query parts: {args.rows:,} rows, {args.paths:,} paths, {args.queries} queries, "
                            f"{args.entries} entries each, dim {args.dim}")
    record = {"bench": "query_parts", "rows": rows, "dots_speedup_vs_bmm": t_bmm / t_ours,
              "int8_paths_speedup_vs_bf16": paths_ms["bf16 shortlist"] / paths_ms["int8 shortlist"],
              "shortlist_top_speedup_vs_topk": t_topk / t_top, "args": vars(args), "host": machine_info()}
    emit_json(record)
    return record


if __name__ == "__main__":
    main()
