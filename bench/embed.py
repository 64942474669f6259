"""Our Embedder.encode vs SentenceTransformer.encode: same model folder, device, sentences and batch size.

Reports sentences/s, padded-token waste (pad tokens / real tokens), peak memory (CPU: RSS high-water of one
encode() in a fresh process; CUDA: max_memory_allocated), the lowest per-sentence cosine to our default
vectors, and on CUDA the share of the FLOP roofline (all-MiniLM-L6-v2 ~ 21.5 MFLOP per real token; H200 bf16
dense ~ 989 TFLOP/s).
Runs are interleaved round-robin (one repeat of every config, then the next) so load drift hits all alike.

    python -m bench.embed                      # 2000 chroma_general sentences, CPU sweep
    python -m bench.embed --quick
    python -m bench.embed --device cuda --n 200000 --batch-tokens 65536,262144 --max-batch-sizes 1024,4096
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from bench.common import emit_json, machine_info, median, print_table, sync, time_repeats

MFLOP_PER_TOKEN = 21.5e6
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def cuda_peak_memory(fn, device) -> int:
    """Bytes: CUDA max_memory_allocated during fn, above what was allocated before."""
    import torch

    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    return int(torch.cuda.max_memory_allocated(device) - base)


_PEAK_CHILD = r"""
import json, resource, sys
texts = json.load(open(sys.argv[1]))
engine, bt, bs, dtype, model = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6] or None
import torch
if engine == "ours":
    from qasc.engine.embedder import Embedder
    e = Embedder(model, device="cpu", dtype=dtype, batch_tokens=bt, max_batch_size=bs)
    run = lambda x: e.encode(x)
else:
    from sentence_transformers import SentenceTransformer
    from qasc.engine.embedder import resolve_model_path, resolve_dtype
    m = SentenceTransformer(resolve_model_path(model), device="cpu",
                            model_kwargs={"dtype": resolve_dtype(dtype, torch.device("cpu"))})
    run = lambda x: m.encode(x, batch_size=bs, convert_to_numpy=True, normalize_embeddings=True)
run(texts[:64])
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # reset the RSS high-water mark (VmHWM)
before = status("VmRSS")
run(texts)
print(json.dumps(status("VmHWM") - before))
"""


def cpu_peak_memory(texts: list[str], engine: str, batch_tokens: int, batch_size: int, dtype: str,
                    model: str | None = None) -> int:
    """Bytes: RSS high-water (VmHWM, reset through /proc/self/clear_refs) above the RSS before one encode() call,
    in a fresh process with a fixed glibc mmap threshold, so that every large buffer is fresh memory."""
    import json
    import subprocess
    import sys
    import tempfile

    from bench.common import REPO

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(texts, fh)
    try:
        out = subprocess.run([sys.executable, "-c", _PEAK_CHILD, fh.name, engine, str(batch_tokens), str(batch_size),
                              dtype, model or ""], cwd=REPO, capture_output=True, text=True, check=True,
                             env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"})
        return int(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        os.unlink(fh.name)


def ours_padding(emb, texts: list[str]) -> tuple[int, int]:
    """(real, padded) tokens of Embedder.encode's length-sorted, token-budgeted batches."""
    lengths = np.fromiter((len(x) for x in emb.tokenize(texts)), dtype=np.int64, count=len(texts))
    padded = sum(len(b) * int(lengths[b].max()) for b in emb.batches(lengths))
    return int(lengths.sum()), int(padded)


def st_padding(model, texts: list[str], batch_size: int) -> tuple[int, int]:
    """(real, padded) tokens of SentenceTransformer.encode: sorted by -characters, fixed-size batches."""
    tok = model.tokenizer
    ids = tok(texts, truncation=True, max_length=model.max_seq_length, add_special_tokens=True)["input_ids"]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(texts))
    order = np.argsort([-len(t) for t in texts])
    padded = sum(len(b) * int(lengths[b].max()) for b in (order[i : i + batch_size] for i in range(0, len(order),
                                                                                                batch_size)))
    return int(lengths.sum()), int(padded)


def host_breakdown(emb, texts: list[str]) -> dict:
    """Seconds of the host-side work of Embedder.encode (no model): tokenize, length batches, and the per-row
    padding (Embedder.pad, as Embedder.encode calls it), and the sentences/s ceiling they set for any device."""
    import time


    t0 = time.perf_counter()
    ids = emb.tokenize(texts)
    t1 = time.perf_counter()
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    batches = emb.batches(lengths)
    t2 = time.perf_counter()
    for batch in batches:  # Embedder.encode's padding, without the model
        emb.pad(ids, lengths, batch)
    t3 = time.perf_counter()
    return {"tokenize_s": t1 - t0, "batches_s": t2 - t1, "pad_s": t3 - t2,
            "host_ceiling_sps": len(texts) / max(t3 - t0, 1e-9)}


def roofline_share(sentences_per_s: float, tokens_per_sentence: float, device) -> float:
    import torch

    if torch.device(device).type != "cuda":
        return float("nan")
    name = torch.cuda.get_device_name(torch.device(device))
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    return float("nan") if peak is None else sentences_per_s * tokens_per_sentence * MFLOP_PER_TOKEN / peak


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000, help="sentences drawn (fixed seed) from chroma_general; 0 = all")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--tile", type=int, default=0, help="repeat the sentence list up to this many (GPU: enough work)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--model", default=None, help="model folder (default: all-MiniLM-L6-v2 from its package)")
    p.add_argument("--dtype", default="auto", help="auto (fp32 CPU, bf16 CUDA) | float32 | bfloat16 | float16")
    p.add_argument("--batch-tokens", default="1024,2048,4096,8192", help="our token budgets to sweep (comma list)")
    p.add_argument("--max-batch-sizes", default="32,64,128", help="our max batch sizes to sweep (comma list)")
    p.add_argument("--st-batch-sizes", default="32,64,128", help="SentenceTransformer batch sizes (comma list)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per config (median reported)")
    p.add_argument("--also-dtype", default=None, help="also run ours (default batching) and ST (batch 32) in this "
                   "dtype, e.g. bfloat16 (CPUs with avx512_bf16/AMX)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--no-st", action="store_true", help="skip the sentence-transformers peer")
    p.add_argument("--no-memory", action="store_true", help="CPU: skip the per-config peak-memory subprocesses")
    p.add_argument("--host-breakdown", action="store_true", help="also time Embedder.encode's host-side work "
                   "(tokenize, batching, padding loop) with our default batching: the ceiling for any device")
    p.add_argument("--host-only", action="store_true", help="only the host-side breakdown (no model runs)")
    p.add_argument("--quick", action="store_true", help="tiny run: 200 sentences, 1 repeat, 2 configs each")
    p.add_argument("--sentences", nargs="*", default=None, help=argparse.SUPPRESS)  # tests: explicit texts
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.repeats = min(args.n, 200), 1
        args.batch_tokens, args.max_batch_sizes, args.st_batch_sizes = "1024,4096", "32", "32"
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from bench.common import chroma_sentences
    from qasc.engine.embedder import Embedder, resolve_device, resolve_dtype, resolve_model_path

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    texts = args.sentences or chroma_sentences(args.n or None, args.seed)
    if args.tile > len(texts):
        texts = [texts[i % len(texts)] for i in range(args.tile)]
    path = resolve_model_path(args.model)

    configs: list[dict] = []
    base = Embedder(args.model, device=str(device), dtype=args.dtype)
    if args.host_only:
        host = host_breakdown(base, texts)
        info = machine_info(device)
        print(f"host side of Embedder.encode ({len(texts)} sentences, batch_tokens {base.batch_tokens}, max batch "
              f"{base.max_batch_size}, TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM')}, load avg "
              f"{info['load_avg']}): tokenize {host['tokenize_s']:.2f} s, batches {host['batches_s']:.2f} s, padding "
              f"loop {host['pad_s']:.2f} s -> at most {host['host_ceiling_sps']:,.0f} sentences/s on any device")
        record = {"bench": "embed-host", "n": len(texts), "device": str(device), "host": host, "machine": info,
                  "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM")}
        emit_json(record)
        return record
    default_bt, default_mb = base.batch_tokens, base.max_batch_size
    sweep = {(default_bt, default_mb)}
    sweep |= {(bt, mb) for bt in _ints(args.batch_tokens) for mb in _ints(args.max_batch_sizes)}
    for bt, mb in sorted(sweep):
        if bt < base.max_length:
            continue
        emb = base if (bt, mb) == (default_bt, default_mb) else Embedder(
            args.model, device=str(device), dtype=args.dtype, batch_tokens=bt, max_batch_size=mb)
        real, padded = ours_padding(emb, texts)
        configs.append({"engine": "ours", "batch_tokens": bt, "batch_size": mb, "default": (bt, mb) == (
            default_bt, default_mb), "fn": (lambda e=emb: e.encode(texts)), "real": real, "padded": padded,
            "dtype": args.dtype, "warm": (lambda e=emb: e.encode(texts[:64]))})
    st_model = None
    if not args.no_st:
        from sentence_transformers import SentenceTransformer

        st_model = SentenceTransformer(path, device=str(device), model_kwargs={"dtype": dtype})
        for bs in _ints(args.st_batch_sizes):
            real, padded = st_padding(st_model, texts, bs)
            configs.append({"engine": "sentence-transformers", "batch_tokens": "-", "batch_size": bs,
                            "default": bs == 32, "real": real, "padded": padded, "dtype": args.dtype,
                            "fn": (lambda b=bs, m=st_model: m.encode(texts, batch_size=b, convert_to_numpy=True,
                                                                     normalize_embeddings=True)),
                            "warm": (lambda b=bs, m=st_model: m.encode(texts[:64], batch_size=b))})
    if args.also_dtype:
        alt = Embedder(args.model, device=str(device), dtype=args.also_dtype, batch_tokens=default_bt,
                       max_batch_size=default_mb)
        real, padded = ours_padding(alt, texts)
        configs.append({"engine": "ours", "batch_tokens": default_bt, "batch_size": default_mb, "default": False,
                        "real": real, "padded": padded, "dtype": args.also_dtype, "fn": (lambda: alt.encode(texts)),
                        "warm": (lambda: alt.encode(texts[:64]))})
        if not args.no_st:
            from sentence_transformers import SentenceTransformer

            alt_st = SentenceTransformer(path, device=str(device),
                                         model_kwargs={"dtype": resolve_dtype(args.also_dtype, device)})
            real, padded = st_padding(alt_st, texts, 32)
            configs.append({"engine": "sentence-transformers", "batch_tokens": "-", "batch_size": 32,
                            "default": False, "real": real, "padded": padded, "dtype": args.also_dtype,
                            "fn": (lambda: alt_st.encode(texts, batch_size=32, convert_to_numpy=True,
                                                         normalize_embeddings=True)),
                            "warm": (lambda: alt_st.encode(texts[:64], batch_size=32))})

    # agreement of the vectors with ours (default dtype and batching), computed once per config
    ref_vectors = base.encode(texts)

    for c in configs:  # peak memory (also the warm-up), then interleave the timed repeats
        c["times"] = []
        c["warm"]()
        if device.type == "cuda":
            c["peak"] = cuda_peak_memory(lambda c=c: c.__setitem__("out", c["fn"]()), device)
        else:
            c["out"] = c["fn"]()
            c["peak"] = float("nan") if args.no_memory else cpu_peak_memory(
                texts, "ours" if c["engine"] == "ours" else "st", c["batch_tokens"] if c["engine"] == "ours" else 0,
                c["batch_size"], c["dtype"], args.model)
        c["cos"] = float((np.asarray(c.pop("out"), dtype=np.float32) * ref_vectors).sum(1).min())
    for _ in range(args.repeats):
        for c in configs:
            c["times"] += time_repeats(c["fn"], repeats=1, warmup=0, device=device)

    rows = []
    st_ref = next((c for c in configs if c["engine"] != "ours" and c["batch_size"] == 32 and c["dtype"] == args.dtype),
                  None)
    st_ref_sps = len(texts) / median(st_ref["times"]) if st_ref else float("nan")
    for c in configs:
        sps = len(texts) / median(c["times"])
        rows.append({
            "engine": c["engine"] + (" (default)" if c["default"] and c["engine"] == "ours" else ""),
            "dtype": str(resolve_dtype(c["dtype"], device)).replace("torch.", ""),
            "batch_tokens": c["batch_tokens"], "batch_size": c["batch_size"],
            "sent/s": sps, "vs ST bs32": sps / st_ref_sps,
            "pad waste": (c["padded"] - c["real"]) / c["real"],
            "peak MB": c["peak"] / 2**20,
            "roofline": roofline_share(sps, c["real"] / len(texts), device),
            "spread %": 100 * (max(c["times"]) - min(c["times"])) / median(c["times"]),
            "min cos": f"{c['cos']:.5f}",
        })
    cols = ["engine", "dtype", "batch_tokens", "batch_size", "sent/s", "vs ST bs32", "pad waste", "peak MB",
            "min cos", "spread %"]
    if device.type == "cuda":
        cols.insert(6, "roofline")
    info = machine_info(device)
    print(f"\n{len(texts)} sentences, {np.mean([c['real'] for c in configs]) / len(texts):.1f} tokens/sentence, "
          f"device {device}, {args.repeats} repeats (median), torch threads {torch.get_num_threads()}, "
          f"load avg {info['load_avg']}; min cos = lowest cosine to ours (default) per sentence")
    print_table(rows, cols)
    host = None
    if args.host_breakdown:
        host = host_breakdown(base, texts)
        print(f"host side of Embedder.encode ({len(texts)} sentences, TOKENIZERS_PARALLELISM="
              f"{os.environ.get('TOKENIZERS_PARALLELISM')}): tokenize {host['tokenize_s']:.2f} s, batches "
              f"{host['batches_s']:.2f} s, padding loop {host['pad_s']:.2f} s -> at most "
              f"{host['host_ceiling_sps']:,.0f} sentences/s on any device")
    ours = [r for r in rows if r["engine"].startswith("ours") and r["dtype"] == str(dtype).replace("torch.", "")]
    best = max(ours, key=lambda r: r["sent/s"])
    default = next(r for r in ours if "(default)" in r["engine"])
    record = {
        "bench": "embed", "model": path, "n": len(texts), "device": str(device),
        "dtype": str(dtype).replace("torch.", ""), "repeats": args.repeats, "ours_default_sps": default["sent/s"],
        "ours_best_sps": best["sent/s"],
        "ours_best": {"batch_tokens": best["batch_tokens"], "max_batch_size": best["batch_size"]},
        "st_bs32_sps": st_ref_sps, "speedup_default_vs_st": default["vs ST bs32"],
        "speedup_best_vs_st": best["vs ST bs32"],
        "min_cosine_vs_st": min((float(r["min cos"]) for r in rows if r["engine"] == "sentence-transformers"),
                                default=float("nan")),
        "roofline_default": default["roofline"], "host": host, "machine": info,
        "rows": [{k: v for k, v in r.items()} for r in rows],
    }
    emit_json(record)
    return record


if __name__ == "__main__":
    main()
