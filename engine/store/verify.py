"""`verify_store`: every integrity check of a committed store, one (check, ok, detail) per line."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np

from qasc.engine.errors import QascError, first_line
from qasc.engine.lexical import term_rule
from qasc.engine.store import index as faiss_index
from qasc.engine.store import lexical as saved_terms
from qasc.engine.store.files import file_digest
from qasc.engine.store.manifest import read_manifest, shard_files
from qasc.engine.store.mapped import mapped_problems, tables_fingerprint
from qasc.engine.store.reader import load_passages, load_shard, merge_headings
from qasc.engine.store.schema import STAGING
from qasc.engine.types import Sentences


def referenced_files(manifest: dict) -> list[str]:
    """Every file a manifest points at: each shard's tables (documents, sentences, headings, passages, term
    counts), and the index."""
    out = [rel for shard in manifest["shards"] for rel in shard_files(shard)]
    if manifest.get("index", {}).get("file"):
        out.append(manifest["index"]["file"])
    return out


def verify_store(path: str | Path, *, sample: int = 2000) -> list[tuple[str, bool, str]]:
    """Every integrity check of a store -> [(check, ok, detail)]; QascError if it is not a complete store.

    Checksums and sizes of every file, Parquet readability and row counts, unique doc ids, offsets inside
    their document, token cap, finite unit-norm embeddings, the term counts saved per shard (format, counts,
    equal to the texts counted again), index size/dim/kind and its vectors against the
    stored embeddings (a sample of rows), and the model's fingerprint/dim where the model is available.
    """
    root = Path(path).expanduser().absolute()
    manifest = read_manifest(root)
    out: list[tuple[str, bool, str]] = []

    def check(name: str, problems: list[str], ok_detail: str) -> None:
        out.append((name, not problems, "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)"
                                                                   if len(problems) > 5 else "") or ok_detail))

    problems = []
    for rel, digest in manifest["checksums"].items():
        if not (root / rel).exists():
            problems.append(f"{rel} missing")
        elif file_digest(root / rel) != digest:
            problems.append(f"{rel} differs from the manifest (sha256/size)")
    for rel in referenced_files(manifest):  # every file the manifest points at is inside the store and summed
        if not (root / rel).resolve().is_relative_to(root.resolve()):
            problems.append(f"{rel} lies outside the store")
        if rel not in manifest["checksums"]:
            problems.append(f"{rel} has no checksum in the manifest")
    check("checksums", problems, f"{len(manifest['checksums'])} files match the manifest")

    docs: list[Sentences] = []
    embs: list[np.ndarray] = []
    head_embs: list[np.ndarray] = []
    heads = []
    problems = []
    n_passages = 0
    per_shard = []  # (entry, its Sentences, its passages' first and count): the term counts' check
    for shard in manifest["shards"]:
        try:
            d, _, _, e, h = load_shard(root, shard, manifest)
            docs.extend(d)
            embs.append(e)
            head_embs.append(h.emb)
            heads.append(h)
            passages = load_passages(root, shard, manifest, 0)
            n_passages += len(passages.first)
            per_shard.append((shard, d, passages.first, passages.count))
        except QascError as exc:
            problems.append(str(exc))
    n_sent = sum(len(d) for d in docs)
    counts = manifest["counts"]
    if not problems and (len(docs) != counts["documents"] or n_sent != counts["sentences"]
                         or len(manifest["shards"]) != counts["shards"]):
        problems.append(f"{len(docs)} documents / {n_sent} sentences, the manifest says "
                        f"{counts['documents']} / {counts['sentences']}")
    row = doc = 0
    for shard in manifest["shards"]:  # shards in order, their global row and document ranges contiguous
        if int(shard.get("row_start", row)) != row or int(shard.get("doc_start", doc)) != doc:
            problems.append(f"shard {shard.get('id')}: row_start/doc_start {shard.get('row_start')}/"
                            f"{shard.get('doc_start')}, expected {row}/{doc}")
        row += int(shard["n_sentences"])
        doc += int(shard["n_documents"])
    check("tables", problems, f"{counts['shards']} shards, {counts['documents']} documents, "
                              f"{counts['sentences']} sentences" + (f", {n_passages} passages" if n_passages else "")
                              + " readable, counts match")
    loaded = not problems

    problems = []
    ids = [d.doc_id for d in docs]
    dup = [k for k, v in collections.Counter(ids).items() if v > 1]
    if dup:
        problems.append(f"duplicate doc_ids {dup[:3]}")
    cap = manifest["splitter"].get("max_sentence_tokens", 10**9)
    for d in docs:
        if len(d) and (d.char_start.min() < 0 or d.char_end.max() > len(d.text) or np.any(d.char_end <= d.char_start)):
            problems.append(f"{d.doc_id}: sentence offsets outside the document")
        elif len(d) and int(d.n_tokens.max()) > cap:
            problems.append(f"{d.doc_id}: a sentence of {int(d.n_tokens.max())} tokens exceeds the cap {cap}")
        elif np.any(np.diff(d.paragraph) < 0) or np.any(np.diff(d.section) < 0):
            problems.append(f"{d.doc_id}: paragraph/section ids go backwards")
    rng = np.random.default_rng(0)
    for d in docs[:: max(1, len(docs) // 50)]:
        for i in rng.choice(len(d), size=min(len(d), 20), replace=False).tolist() if len(d) else []:
            s = d.text[int(d.char_start[i]):int(d.char_end[i])]
            if s != s.strip():
                problems.append(f"{d.doc_id}: sentence {i} has untrimmed offsets")
    if not loaded:
        problems.append("not checked: tables unreadable")
    check("offsets", problems, f"{n_sent} sentence spans inside their documents, token cap {cap} holds")

    dim = int(manifest["dim"])
    emb = np.concatenate(embs) if embs else np.zeros((0, dim), np.float32)
    problems = []
    for what, vecs in (("embeddings", emb), ("heading embeddings", np.concatenate(head_embs or [emb[:0]]))):
        if not len(vecs):
            continue
        if not np.isfinite(vecs).all():
            problems.append(f"{int((~np.isfinite(vecs)).any(1).sum())} {what} hold NaN/inf")
        else:
            norms = np.linalg.norm(vecs.astype(np.float32, copy=False), axis=1)
            tol = 1e-2 if manifest["dtype"] == "float16" else 1e-3
            if np.abs(norms - 1).max() > tol:
                problems.append(f"{int((np.abs(norms - 1) > tol).sum())} {what} are not unit-norm")
    if not loaded:
        problems.append("not checked: tables unreadable")
    n_heads = sum(len(h) for h in head_embs)
    check("embeddings", problems, f"{len(emb)} x {dim} {manifest['dtype']} (+ {n_heads} heading paths), finite, "
                                  f"unit norm")

    mapped = manifest.get("mapped")
    problems = mapped_problems(root, manifest, docs, emb, merge_headings(heads, dim)) if loaded and mapped else []
    if mapped and not loaded:
        problems.append("not checked: tables unreadable")
    current = mapped and mapped.get("tables_fingerprint") == tables_fingerprint()
    check("mapped", problems, "none (written before mapped arrays: opened by reading the shards)" if not mapped else
          f"{mapped['folder']}: vectors, row arrays and heading paths equal the shards'; {len(mapped['tables'])} "
          f"saved tables" + ("" if current else " of other engine code (not used: built at first query)"))

    problems = []
    for shard, d, first, count in per_shard if loaded else []:
        problems += saved_terms.shard_problems(root, shard, d, first, count)
    if not loaded:
        problems.append("not checked: tables unreadable")
    shards = manifest["shards"]
    n_saved = sum(saved_terms.ROWS in s for s in shards)
    other = sum(saved_terms.ROWS in s and s.get("term_rule") != term_rule() for s in shards)
    check("lexical", problems, f"{n_saved - other} of {len(shards)} shards' term counts match their texts"
          + (f"; {len(shards) - n_saved} written before term counts were saved" if n_saved < len(shards) else "")
          + (f"; {other} counted by another term rule (not compared; counted from the texts at open)" if other
             else ""))

    problems = []
    try:
        index = faiss_index.load_index(root, manifest)
        if int(index.ntotal) != int(manifest["index"]["ntotal"]) or int(index.ntotal) != int(counts["sentences"]):
            problems.append(f"the index holds {index.ntotal} vectors; the manifest says {manifest['index']['ntotal']} "
                            f"({counts['sentences']} sentences)")
        if not loaded:
            problems.append("vectors not checked: tables unreadable")
        elif len(emb):
            rows = np.unique(rng.integers(0, len(emb), size=min(sample, len(emb))))
            got = faiss_index.reconstruct(index, rows)
            if not faiss_index.reconstruct_matches(manifest["index"], got, emb[rows]):
                problems.append("index vectors differ from the stored embeddings")
    except QascError as exc:
        problems.append(str(exc))
    check("index", problems, f"{manifest['index']['kind']} index of {manifest['index']['ntotal']} vectors, "
                             f"dim {dim}, matches the embeddings")

    problems, detail = [], ""
    try:
        from qasc.engine.embedder import model_fingerprint, resolve_model_path

        model_path = resolve_model_path(manifest["config"]["embedder"].get("model"))
        if Path(model_path).is_dir():
            fp = model_fingerprint(model_path)
            cfg = json.loads((Path(model_path) / "config.json").read_text())
            hidden = int(cfg.get("hidden_size", cfg.get("dim", -1)))
            if fp != manifest["fingerprint"]:
                problems.append(f"model {manifest['model']!r} here has fingerprint {fp}, the store "
                                f"{manifest['fingerprint']}")
            if hidden != dim:
                problems.append(f"model {manifest['model']!r} has dim {hidden}, the store {dim}")
            detail = f"{manifest['model']} fingerprint {fp}, dim {hidden}"
        else:
            detail = f"model {manifest['model']!r} not available here; fingerprint not checked"
    except (ImportError, OSError, ValueError) as exc:
        detail = f"model {manifest['model']!r} not available here ({first_line(exc)}); not checked"
    check("model", problems, detail)
    if (root / STAGING).exists():
        out.append(("pending", True, "an unfinished ingest is staged (_staging/); the committed store is intact"))
    return out
