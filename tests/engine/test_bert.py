"""engine.bert: the plain-torch BERT gives transformers' vectors bit for bit, and anything it does not model is
loaded by transformers as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import qasc.engine.embedder as embedder_module
from qasc.engine.bert import load_native_bert, native_config
from qasc.engine.embedder import Embedder, resolve_model_path
from tests.conftest import DEMO_CORPUS

pytestmark = pytest.mark.slow


def through_transformers(monkeypatch, **kwargs) -> Embedder:
    """An Embedder that loads its model with transformers (the native loader declines)."""
    with monkeypatch.context() as m:
        m.setattr(embedder_module, "load_native_bert", lambda *a: None)
        return Embedder(**kwargs)


def corpus_texts() -> list[str]:
    """The demo corpus's sentences, its headings' lines, and edge cases: empty, one character, over max_length."""
    from qasc.engine.splitter import split_sentences

    texts = []
    for path in sorted(DEMO_CORPUS.glob("*.md")):
        doc = path.read_text()
        s = split_sentences(doc, path.stem)
        texts += [doc[a:b] for a, b in zip(s.char_start.tolist(), s.char_end.tolist(), strict=True)]
    return texts + ["", "x", "word " * 400, "Why does the crust darken?", "ÅNGSTRÖM — naïve café 東京"]


@pytest.mark.parametrize("model", ["default", "tiny"])
def test_native_bert_equals_transformers_bit_for_bit(monkeypatch, tiny_model, model):
    """Same token ids, token counts and vectors (float32 bit-equal) as transformers' BertModel, over batches
    padded to their longest member, unpadded batches, and a batch of one."""
    name = None if model == "default" else tiny_model
    native = Embedder(name, device="cpu")
    assert native._native_tokenizer is not None  # the folder was recognised
    reference = through_transformers(monkeypatch, model=name, device="cpu")
    assert reference._native_tokenizer is None
    texts = corpus_texts()
    assert native.tokenize(texts) == reference.tokenize(texts)
    assert np.array_equal(native.count_tokens(texts), reference.count_tokens(texts))
    assert native.dim == reference.dim and native.fingerprint == reference.fingerprint
    for batch in (texts, texts[:1], ["Same length one.", "Same length two."]):
        a, b = native.encode(batch), reference.encode(batch)
        assert a.dtype == b.dtype == np.float32 and np.array_equal(a, b)


def test_native_tokenizer_truncates_and_counts_like_transformers(monkeypatch):
    native = Embedder(device="cpu", max_length=16)
    reference = through_transformers(monkeypatch, device="cpu", max_length=16)
    long = ["one two three " * 30, "short"]
    ids = native.tokenize(long)
    assert ids == reference.tokenize(long) and len(ids[0]) == 16
    counts = native.count_tokens(long)
    assert counts[0] > 16 and np.array_equal(counts, reference.count_tokens(long))
    assert native.tokenizer.pad_token_id == native.pad_token_id  # transformers' tokenizer, loaded on demand


def copy_model(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("change", [
    {"position_embedding_type": "relative_key"},
    {"hidden_act": "gelu_new"},
    {"model_type": "roberta"},
    {"_attn_implementation": "eager"},
    {"chunk_size_feed_forward": 8},
    {"is_decoder": True},
])
def test_configs_it_does_not_model_go_to_transformers(tmp_path, tiny_model, change):
    folder = copy_model(tiny_model, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    assert native_config(folder) is not None
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    assert native_config(folder) is None and load_native_bert(str(folder), "cpu", None) is None


def test_missing_files_go_to_transformers(tmp_path, tiny_model):
    no_tokenizer_json = copy_model(tiny_model, tmp_path / "a")
    (no_tokenizer_json / "tokenizer.json").unlink()
    assert load_native_bert(str(no_tokenizer_json), "cpu", None) is None
    emb = Embedder(str(no_tokenizer_json), device="cpu")  # vocab.txt: transformers builds its tokenizer
    assert emb._native_tokenizer is None and emb.encode(["A sentence."]).shape == (1, emb.dim)
    no_weights = copy_model(tiny_model, tmp_path / "b")
    (no_weights / "model.safetensors").unlink()
    assert load_native_bert(str(no_weights), "cpu", None) is None
    with pytest.raises(ValueError, match="cannot load embedding model"):
        Embedder(str(no_weights), device="cpu")
    assert load_native_bert(str(tmp_path / "missing"), "cpu", None) is None
    assert load_native_bert(resolve_model_path(None), "cpu", None) is not None
