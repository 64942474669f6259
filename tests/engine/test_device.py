"""Every tensor follows the engine's device: query vectors of another dtype/device are moved first, and the
FAISS index goes to a GPU only when the engine's device is cuda (and then to that device's GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qasc.engine.store.index import gpu_for


def _spans(results):
    return [[(c.doc_id, c.char_start, c.char_end, round(c.score, 5)) for c in r] for r in results]


@pytest.fixture(scope="module")
def engine():
    from bench.query import synthetic_engine

    return synthetic_engine(2000, "cpu", "torch", with_model=False)


def test_query_embedded_takes_float64_and_numpy(engine):
    q = torch.nn.functional.normalize(torch.randn(6, 384, generator=torch.Generator().manual_seed(0)), dim=1)
    want = _spans(engine.query_embedded(q))
    assert any(want)
    assert _spans(engine.query_embedded(q.double())) == want
    assert _spans(engine.query_embedded(q.double().numpy())) == want


@pytest.mark.parametrize("kind,device,gpus,want", [
    ("flat", "cpu", 4, None),              # --device cpu never puts the index on a GPU
    ("ivf", torch.device("cpu"), 4, None),
    ("flat", "cuda", 0, None),             # faiss without GPU support (faiss-cpu)
    ("flat", "cuda", 2, 0),
    ("ivf", torch.device("cuda", 1), 2, 1),  # the engine's own GPU, not GPU 0
    ("flat", "cuda:3", 2, None),           # a GPU faiss does not see: stays on CPU
    ("hnsw", "cuda", 2, None),             # faiss has no GPU HNSW
    ("flat", None, 2, None),
])
def test_index_placement(kind, device, gpus, want):
    assert gpu_for(kind, device, gpus) == want


@pytest.mark.slow
def test_store_open_keeps_the_index_on_cpu_by_default(demo_store):
    import faiss

    from qasc.engine.query import Engine
    from qasc.engine.store.reader import Store

    assert isinstance(Store.open(demo_store, load_index=True).index, faiss.Index)
    engine = Engine.open(str(demo_store), device="cpu")
    assert not type(engine.store.index).__name__.startswith("Gpu")
    assert np.isfinite(engine.store.search(np.ones((1, engine.embeddings.shape[1]), np.float32), 2)[0]).all()
