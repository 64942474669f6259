"""The budget profile (now the `context` preset chosen without --preset): `qasc query --budget-tokens N` on the
shipped chunking setting answers with the development suite's budget setting; any of its knobs given, a store frozen
with another setting, or --no-budget-profile (deprecated: --preset answers) keep the setting as it is."""

from __future__ import annotations

import argparse
import json

import pytest

from qasc.engine.config import BUDGET_PROFILE, BUDGET_PROFILE_RETRIEVAL, RetrievalConfig, budget_setting
from qasc.jobs.eval import qasc as Q
from qasc.jobs.eval.suite import is_budget_profile
from qasc.jobs.params_cli import add_qasc_arguments, setting_from_args
from qasc.kernels.params import QascParams

SHIPPED, SHIPPED_RETRIEVAL = QascParams(), RetrievalConfig()


def test_the_profile_replaces_its_knobs_only_with_a_budget():
    params, retrieval, applied = budget_setting(SHIPPED, SHIPPED_RETRIEVAL)
    assert (params, retrieval, applied) == (SHIPPED, SHIPPED_RETRIEVAL, False)
    budget = SHIPPED.replace(budget_tokens=400, top_k=5, fill_diversity=0.0)
    params, retrieval, applied = budget_setting(budget, SHIPPED_RETRIEVAL)
    assert applied
    assert {k: getattr(params, k) for k in BUDGET_PROFILE} == BUDGET_PROFILE
    assert {k: getattr(retrieval, k) for k in BUDGET_PROFILE_RETRIEVAL} == BUDGET_PROFILE_RETRIEVAL
    # every other knob keeps its value: the selection, the similarities, the fill
    others = [f for f in SHIPPED.to_dict() if f not in BUDGET_PROFILE]
    assert {k: getattr(params, k) for k in others} == {k: getattr(budget, k) for k in others}
    assert params.budget_tokens == 400 and params.top_k == 5 and params.fill_diversity == 0.0


@pytest.mark.parametrize("given", [{"percentile"}, {"depth"}, {"extent", "top_k"}])
def test_a_profile_knob_given_keeps_the_setting(given):
    budget = SHIPPED.replace(budget_tokens=400)
    assert budget_setting(budget, SHIPPED_RETRIEVAL, frozenset(given)) == (budget, SHIPPED_RETRIEVAL, False)
    # knobs outside the profile do not turn it off
    assert budget_setting(budget, SHIPPED_RETRIEVAL, frozenset({"top_k", "budget_tokens"}))[2]


@pytest.mark.parametrize("stored", [{"percentile": 80.0}, {"max_extent": 3}, {"depth": 8, "neighbourhood": 4}])
def test_a_store_frozen_with_another_setting_keeps_it(stored):
    retrieval = RetrievalConfig(**{k: v for k, v in stored.items() if k in BUDGET_PROFILE_RETRIEVAL})
    params = SHIPPED.replace(budget_tokens=400, **{k: v for k, v in stored.items() if k in BUDGET_PROFILE})
    assert budget_setting(params, retrieval) == (params, retrieval, False)


def test_the_profile_is_a_setting_of_the_suites_grid():
    """The suite can choose it (and reports whether it did: jobs.eval.suite.is_budget_profile)."""
    matches = [s.key() for s in Q.qasc_grid() if is_budget_profile(s)]
    assert matches == ["p95 m0 min=16 lex=0.8 depth16 nb8"]
    assert not any(is_budget_profile(s) for s in Q.qasc_grid(quick=True))


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_qasc_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("argv, applied", [
    (["--budget-tokens", "300"], True),
    (["--budget-tokens", "300", "--top-k", "3", "--fill-diversity", "0"], True),
    (["--budget-tokens", "300", "--no-budget-profile"], False),
    (["--budget-tokens", "300", "--budget-profile"], True),  # the default, named (deprecated)
    (["--budget-tokens", "300", "--percentile", "90"], False),  # given, even at the shipped value
    (["--budget-tokens", "300", "--neighbourhood", "2"], False),
    ([], False),
    (["--budget-tokens", "none"], False),
])
def test_flags_decide_the_profile(argv, applied):
    params, retrieval, preset = setting_from_args(_parse(argv), SHIPPED, SHIPPED_RETRIEVAL)
    assert (preset == "context") is applied
    assert (params.percentile == 95.0 and retrieval.depth == 16) is applied


def _rows(path):
    return [(r["query_id"], r["doc_id"], r["char_start"], r["char_end"]) for r in map(json.loads, open(path))]


@pytest.mark.slow
def test_cli_budget_answers_with_the_profile(demo_store, tmp_path, capsys):
    from qasc.jobs.cli import main
    from tests.engine.test_query import QUESTIONS

    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps({"id": f"q{i}", "question": q}) + "\n" for i, q in enumerate(QUESTIONS)))
    base = ["query", "--store", str(demo_store), "--queries", str(queries), "--budget-tokens", "120"]
    flags = [x for k, v in {**BUDGET_PROFILE, **BUDGET_PROFILE_RETRIEVAL}.items()
             for x in ((f"--{k.replace('_', '-')}", str(v)) if not isinstance(v, bool)
                       else (f"--{'' if v else 'no-'}{k.replace('_', '-')}",))]
    runs = {}
    for name, extra in {"profile": [], "explicit": ["--no-budget-profile", *flags],
                        "shipped": ["--no-budget-profile"]}.items():
        out = tmp_path / f"{name}.jsonl"
        assert main(base + ["--out", str(out), *extra]) == 0
        runs[name] = (_rows(out), capsys.readouterr().err)
    assert runs["profile"][0] == runs["explicit"][0]  # the profile is exactly its flags
    assert "qasc query: preset context (budget 120 tokens; --preset answers for precise spans)" in runs["profile"][1]
    assert "qasc query: preset answers with --percentile 95.0" in runs["explicit"][1]
    assert "qasc query: preset answers (budget 120 tokens;" in runs["shipped"][1]
    assert runs["profile"][0] != runs["shipped"][0]  # and not the F1 setting's chunks
