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


def run_in_child(command: list[str], payload: dict, prefix: str, failed: str,
                 lost: Callable[[int], str]) -> dict:
    """Runs `command + [spec]` (the spec: payload and the result file's path) -> the child's result, which holds
    "entry". The child's error is raised here: QascError / ResumableError as themselves, any other as QascError
    "{failed}: type: message"; a child that left no result (killed, out of memory) -> ResumableError(lost(its
    exit status))."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        spec, result = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps({**payload, "result": str(result)}))
        proc = subprocess.run([*command, str(spec)], env=_child_env(), stdin=subprocess.DEVNULL, check=False)
        out = json.loads(result.read_text()) if result.exists() else None
    if out is None or "entry" not in out and "error" not in out:
        raise ResumableError(lost(proc.returncode))
    if "error" in out:
        err = out["error"]
        raise ERRORS.get(err["type"], QascError)(err["message"] if err["type"] in ERRORS else
                                                 f"{failed}: {err['type']}: {err['message']}")
    return out


def child_main(argv: list[str], work: Callable[[dict], dict]) -> int:
    """A child's body: [SPEC] -> work(spec)'s result, or {"error": {"type", "message"}}, in the spec's result
    file. Exit status 0 either way (the result file says which)."""
    spec = json.loads(Path(argv[0]).read_text())
    try:
        out = work(spec)
    except Exception as exc:  # reported to the driver, which raises it there
        out = {"error": {"type": type(exc).__name__, "message": str(exc)}}
    Path(spec["result"]).write_text(json.dumps(out))
    return 0


def build_in_child(root: str, shards: list[dict], old: dict | None, kind: str, dim: int, index_file: str,
                   log: Callable[[str], None], command: list[str] | None = None) -> tuple[dict, float | None]:
    """`build_index_file(root, shards, old, kind, dim, index_file)` in a child process -> (the manifest entry, the
    child's peak RSS in GiB or None). command: what starts the child, given the spec path after it (default CHILD:
    this interpreter)."""
    log("qasc ingest: building the index in a child process (the driver holds no index)")
    out = run_in_child(command or CHILD, {"root": str(root), "shards": shards, "old": old, "kind": kind,
                                          "dim": int(dim), "index_file": index_file}, "qasc-index-",
                       "building the index failed",
                       lambda rc: f"the index build process "
                                  f"{f'was killed by signal {-rc}' if rc < 0 else f'exited with {rc}'} before it "
                                  f"finished (out of memory?); the shards are committed: run the same ingest again "
                                  f"to resume at the index")
    return out["entry"], out.get("peak_rss_gb")


def main(argv: list[str]) -> int:
    """The child: [SPEC] -> the index written, {"entry", "peak_rss_gb"} or {"error": {"type", "message"}} in
    the spec's result file. Exit status 0 either way (the result file says which)."""
    from qasc.engine.store.index_build import build_index_file
    from qasc.engine.store.progress import log_stderr

    def work(spec: dict) -> dict:
        entry = build_index_file(Path(spec["root"]), spec["shards"], spec["old"], spec["kind"], spec["dim"],
                                 spec["index_file"], log_stderr)
        return {"entry": entry, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)}

    return child_main(argv, work)
