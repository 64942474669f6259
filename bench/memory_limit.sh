#!/bin/bash
# bench/memory_limit.sh GIB [--evict DIR] -- COMMAND...
#
# Runs COMMAND in a memory cgroup limited to GIB GiB (anonymous memory + the page cache charged to the group: a
# hard limit, the kernel reclaims the group's clean file pages at it and OOM-kills only what cannot fit), then
# prints one JSON line: the limit, COMMAND's exit status, the group's peak usage, how often it hit the limit, and
# whether the OOM killer ran. --evict DIR drops DIR's files from the page cache first (bench.one_question's evict,
# run by $PYTHON, default python: the project's), so that their pages are charged to the group when read. Needs root
# and a cgroup-v1 memory hierarchy at /sys/fs/cgroup/memory or cgroup v2 at /sys/fs/cgroup. Used for the 1M store's
# 2.07 GiB bound (bench/RESULTS.md, "Issue 52 on an idle host"):
#
#   bench/memory_limit.sh 2.072 --evict /tmp/qasc-scale/store-1000000-s0-ivf-float16-table -- \
#       python -m bench.scale --embedder table --no-quality --work /tmp/qasc-scale --reuse-store ...
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: bench/memory_limit.sh GIB [--evict DIR] -- COMMAND..." >&2; exit 2; }
GIB=$1; shift
EVICT=""
if [ "$1" = "--evict" ]; then
  [ -d "${2:-}" ] || { echo "bench/memory_limit.sh: --evict ${2:-}: not a folder" >&2; exit 2; }
  EVICT=$(realpath "$2"); shift 2
fi
[ "$1" = "--" ] || { echo "bench/memory_limit.sh: expected -- before the command" >&2; exit 2; }
shift
BYTES=$(python3 -c "import sys; print(int(float(sys.argv[1]) * 2**30))" "$GIB")
NAME="qasc-limit-$$"
if [ -d /sys/fs/cgroup/memory ]; then  # cgroup v1 (one write per value: a split write would parse as 0)
  CG=/sys/fs/cgroup/memory/$NAME; mkdir "$CG"; echo "$BYTES" > "$CG/memory.limit_in_bytes"
  PEAK=memory.max_usage_in_bytes
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # cgroup v2
  CG=/sys/fs/cgroup/$NAME; mkdir "$CG"; echo "$BYTES" > "$CG/memory.max"
  PEAK=memory.peak
else
  echo "bench/memory_limit.sh: no memory cgroup on this machine" >&2; exit 2
fi
trap 'rmdir "$CG" 2>/dev/null || true' EXIT
if [ -n "$EVICT" ]; then  # bench.one_question's evict, with the project's python (PYTHON, default python)
  (cd "$(dirname "$0")/.." && "${PYTHON:-python}" -c "import sys; from pathlib import Path
from bench.one_question import evict; evict([Path(sys.argv[1])])" "$EVICT")
fi
set +e
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$CG" "$@"
RC=$?
set -e
if [ -f "$CG/memory.failcnt" ]; then HITS=$(cat "$CG/memory.failcnt"); else HITS=$(awk '/^max /{print $2}' "$CG/memory.events"); fi
if [ -f "$CG/memory.oom_control" ]; then OOM=$(awk '/^oom_kill /{print $2}' "$CG/memory.oom_control")
else OOM=$(awk '/^oom_kill /{print $2}' "$CG/memory.events"); fi
python3 -c "import json, sys; print(json.dumps({'memory_limit_gib': float(sys.argv[1]), 'rc': int(sys.argv[2]),
 'group_peak_gib': round(int(sys.argv[3]) / 2**30, 3), 'times_at_limit': int(sys.argv[4]), 'oom_kills': int(sys.argv[5] or 0)}))" \
  "$GIB" "$RC" "$(cat "$CG/$PEAK")" "$HITS" "${OOM:-0}"
exit $RC
