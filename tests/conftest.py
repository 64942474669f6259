"""Shared fixtures: the model once per session, Ray once per session, small stores built once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from qasc.jobs.env import set_env_defaults

set_env_defaults()
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests use the bundled model only
os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")

# CI replays the same property-test examples on every run (a red CI then means a changed behaviour, not an unlucky
# draw); sessions without CI=true search new examples each run
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")

REPO = Path(__file__).resolve().parents[1]
DEMO_CORPUS = REPO / "engine" / "data" / "demo"
CHROMA = Path(os.environ.get("QASC_CHROMA_DIR", REPO.parent / "shared" / "data" / "chroma_general"))

# the modules whose tests use Ray (the session's instance, or one they start themselves)
RAY_MODULES = {"test_ingest_ray.py", "test_ray_data.py", "test_ray_job_submit.py"}


def pytest_collection_modifyitems(config, items):
    """Ray tests run in two pytest-xdist groups (`make test` runs `-n 2 --dist loadgroup`): `ray`, the tests on
    this process's Ray instance (the `ray_session` fixture, started once), and `own-ray`, the tests marked
    `own_ray` that start an instance of their own in a subprocess (`qasc ingest --ray`, the README's Ray Data
    example, `ray start --head`). xdist hands the two largest groups to the two workers first, so the long Ray
    work runs side by side from the start (at most two Ray instances at once) instead of in one worker's queue."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("own_ray") is not None:
            item.add_marker(pytest.mark.xdist_group("own-ray"))
        elif "ray_session" in getattr(item, "fixturenames", ()) or item.path.name in RAY_MODULES:
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(scope="session")
def embedder():
    from qasc.engine.embedder import Embedder

    return Embedder(device="cpu")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance (num_cpus=2), started once for the whole test session."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory) -> Path:
    """The built-in demo corpus ingested locally (no Ray)."""
    from qasc.engine.store import ingest

    path = tmp_path_factory.mktemp("demo") / "store"
    ingest([str(DEMO_CORPUS)], str(path))
    return path


@pytest.fixture(scope="session")
def chroma_store(tmp_path_factory, tiny_model) -> Path:
    """chroma_general (1.4 MB, five documents) ingested locally with the tiny model: its real sentences, headings
    and token counts in seconds (the real model takes minutes on 2 cores; it runs on chroma_general in
    tests/jobs/test_eval_slow.py); skipped without ../shared."""
    if not (CHROMA / "corpora").is_dir():
        pytest.skip(f"chroma_general not found at {CHROMA}")
    from qasc.engine.config import EmbedderConfig, EngineConfig
    from qasc.engine.store import ingest

    path = tmp_path_factory.mktemp("chroma") / "store"
    ingest([str(CHROMA / "corpora")], str(path), EngineConfig(embedder=EmbedderConfig(model=tiny_model)))
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A random 1-layer, 32-wide BERT with the real MiniLM tokenizer: the same sentences and token counts as
    the default model, embedded in a fraction of the time (ingest, resume and bad-input tests)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from qasc.engine.embedder import resolve_model_path

    path = tmp_path_factory.mktemp("tiny_model")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(None))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory) -> str:
    """A random 2-layer, 32-wide BertForSequenceClassification (one label) with the real MiniLM tokenizer: a
    cross-encoder in a folder, as a user brings one (the rerank stage's tests; none ships offline)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from qasc.engine.embedder import resolve_model_path

    path = tmp_path_factory.mktemp("tiny_cross_encoder")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(None))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
