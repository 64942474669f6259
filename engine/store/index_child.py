"""A store's index built in a child process, so that the local ingest driver never holds it.

The index is the one part of a local ingest whose memory grows with the input (an ivf index's 8-bit codes are N x
dim bytes, plus 8 bytes of id a row, plus the list assignments while adding). `LocalRunner.build_index` hands
stores of at least INDEX_CHILD_MIN_ROWS rows to `build_in_child`: a fresh interpreter running this module's
`main(SPEC)` runs `engine.store.index_build.build_index_file` (the same call as in process, and as the Ray task of a
cluster ingest) and reports the manifest entry, or the error, in a JSON file beside the spec; its log lines go to
stderr. The driver's memory then stays flat in N; the child's peak RSS (ru_maxrss) comes back with the entry.

A child that dies (killed for memory, a crash) raises ResumableError: the shards are committed, and the same
ingest resumes at the index. A QascError / ResumableError inside the child is raised as itself.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from qasc.engine.errors import QascError
from qasc.engine.store.files import ResumableError

INDEX_CHILD_MIN_ROWS = 100_000  # local ingest: stores this large get their index from a child process
ERRORS = {"QascError": QascError, "ResumableError": ResumableError}
CHILD = [sys.executable, "-c", "import sys; from engine.store.index_child import main; sys.exit(main(sys.argv[1:]))"]


def _child_env() -> dict[str, str]:
    """This environment with the folder holding the `engine` package first on PYTHONPATH (an uninstalled tree)."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def build_in_child(root: str, shards: list[dict], old: dict | None, kind: str, dim: int, index_file: str,
                   log: Callable[[str], None], command: list[str] | None = None) -> tuple[dict, float | None]:
    """`build_index_file(root, shards, old, kind, dim, index_file)` in a child process -> (the manifest entry, the
    child's peak RSS in GiB or None). command: what starts the child, given the spec path after it (default CHILD:
    this interpreter)."""
    log("qasc ingest: building the index in a child process (the driver holds no index)")
    with tempfile.TemporaryDirectory(prefix="qasc-index-") as tmp:
        spec, result = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps({"root": str(root), "shards": shards, "old": old, "kind": kind, "dim": int(dim),
                                    "index_file": index_file, "result": str(result)}))
        proc = subprocess.run([*(command or CHILD), str(spec)], env=_child_env(), stdin=subprocess.DEVNULL, check=False)
        out = json.loads(result.read_text()) if result.exists() else None
    if out is None or "entry" not in out and "error" not in out:
        how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with {proc.returncode}"
        raise ResumableError(f"the index build process {how} before it finished (out of memory?); the shards are "
                             f"committed: run the same ingest again to resume at the index")
    if "error" in out:
        err = out["error"]
        raise ERRORS.get(err["type"], QascError)(err["message"] if err["type"] in ERRORS else
                                                 f"building the index failed: {err['type']}: {err['message']}")
    return out["entry"], out.get("peak_rss_gb")


def main(argv: list[str]) -> int:
    """The child: [SPEC] -> the index written, {"entry", "peak_rss_gb"} or {"error": {"type", "message"}} in
    the spec's result file. Exit status 0 either way (the result file says which)."""
    from qasc.engine.store.index_build import build_index_file
    from qasc.engine.store.progress import log_stderr

    spec = json.loads(Path(argv[0]).read_text())
    try:
        entry = build_index_file(Path(spec["root"]), spec["shards"], spec["old"], spec["kind"], spec["dim"],
                                 spec["index_file"], log_stderr)
        out: dict = {"entry": entry, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)}
    except Exception as exc:  # reported to the driver, which raises it there
        out = {"error": {"type": type(exc).__name__, "message": str(exc)}}
    Path(spec["result"]).write_text(json.dumps(out))
    return 0
