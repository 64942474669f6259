"""bench/gpu_check.sh's summary: per step rc, seconds, note and its JSON record; the headline numbers vs targets.

    python -m bench.gpu_summary WORK OUT     # WORK: steps.tsv, <step>.json, env.txt, missing.txt (standard library)

Writes OUT/summary.json and OUT/summary.txt; called after every step, so a run stopped at any point leaves both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TARGETS = {"embed_sps": 150_000, "query_qps_1m": 50_000}  # issue 14, on the GPU machine


def _kernel_peaks(rec: dict) -> dict:
    """setting -> {Q, L, queries/s} of its largest timed Q (then L)."""
    out: dict = {}
    for r in rec.get("rows", []):
        qps = r.get("queries/s")
        if qps is None:
            continue
        best = out.get(r["setting"])
        if best is None or (r["Q"], r["L"]) > (best["Q"], best["L"]):
            out[r["setting"]] = {"Q": r["Q"], "L": r["L"], "queries_per_s": qps}
    return out


def summarize(work: Path) -> dict:
    steps = {}
    tsv = work / "steps.tsv"
    for line in tsv.read_text().splitlines() if tsv.is_file() else []:
        name, rc, seconds, note = (line.split("\t") + ["", "", ""])[:4]
        rec_path = work / f"{name}.json"
        record = None
        if rec_path.is_file() and rec_path.stat().st_size:
            try:
                record = json.loads(rec_path.read_text())
            except json.JSONDecodeError as exc:
                record = {"unreadable": str(exc)}
        steps[name] = {"rc": None if rc == "-" else int(rc), "seconds": None if seconds == "-" else int(seconds),
                       "note": note or None, "json_keys": sorted(record) if isinstance(record, dict) else None,
                       "record": record}
    rec = lambda name: (steps.get(name) or {}).get("record") or {}  # noqa: E731
    device = next((r["device"] for r in (s["record"] for s in steps.values()) if isinstance(r, dict) and "device" in r),
                  None)
    head = {
        "device": device,
        "embed_sps_default": rec("embed").get("ours_default_sps"),
        "embed_sps_best": rec("embed").get("ours_best_sps"),
        "embed_dtype": rec("embed").get("dtype"),
        "embed_vs_st": rec("embed").get("speedup_default_vs_st"),
        "embed_roofline": rec("embed").get("roofline_default"),
        "embed_host_ceiling_sps": (rec("embed").get("host") or {}).get("host_ceiling_sps"),
        "embed_fp16_sps": rec("embed_fp16").get("ours_default_sps"),
        "rerank_pairs_per_s": rec("rerank").get("engine_pairs_per_s"),
        "rerank_vs_st": rec("rerank").get("ratio"),
        "kernels_largest_q": _kernel_peaks(rec("kernels")),
        "kernels_skipped": rec("kernels").get("skipped"),
        "query_1m_source": rec("query_synthetic").get("source"),
        "query_1m_batch_qps": rec("query_synthetic").get("batch_qps"),
        "query_1m_kernels_qps": rec("query_synthetic").get("kernels_batch_qps"),
        "subset_sentences": rec("subset").get("sentences"),
        "subset_query_qps": rec("subset").get("query_batch_qps"),
        "cpu_equals_device": rec("subset").get("outputs_equal"),
        "cpu_path_same_chunks_share": (rec("subset").get("equal_cpu_path") or {}).get("same_chunks_share"),
    }
    on_gpu = bool(device and device.startswith("cuda"))
    best_embed = max([x for x in (head["embed_sps_best"], head["embed_fp16_sps"]) if x is not None], default=None)
    qps = head["query_1m_batch_qps"] or head["query_1m_kernels_qps"]
    head["targets"] = {
        "embed_sps>=150k": (best_embed >= TARGETS["embed_sps"]) if on_gpu and best_embed is not None else None,
        "query_qps_1m>=50k": (qps >= TARGETS["query_qps_1m"]) if on_gpu and qps is not None else None,
        "note": None if on_gpu else "not a GPU run: targets not judged",
    }
    missing = [m for m in (work / "missing.txt").read_text().splitlines() if m] if (work / "missing.txt").is_file() \
        else []
    env = (work / "env.txt").read_text() if (work / "env.txt").is_file() else ""
    return {"steps": steps, "headline": head, "missing": missing, "env": env.splitlines()}


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    work, out = Path(argv[0]), Path(argv[1])
    summary = summarize(work)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    lines = [f"{name}: rc={s['rc']} {s['seconds']}s" + (f" ({s['note']})" if s["note"] else "")
             + (f" json keys: {','.join(s['json_keys'])}" if s["json_keys"] else " no JSON line")
             for name, s in summary["steps"].items()]
    lines.append("headline: " + json.dumps(summary["headline"], default=str))
    lines.append("missing: " + (", ".join(summary["missing"]) or "nothing"))
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    return summary


if __name__ == "__main__":
    main()
