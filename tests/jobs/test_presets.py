"""Named presets (engine.presets) and `qasc query`'s flags: --preset sets the knobs, flags given override it, the
old budget-profile rule picks a preset when none is named; --help keeps a short main group and docs/query.md's flag
tables list exactly the flags of --help."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from qasc.engine import presets
from qasc.engine.config import RetrievalConfig, budget_setting
from qasc.engine.errors import QascError
from qasc.jobs.params_cli import ADVANCED_TITLE, MAIN_FIELDS, setting_from_args
from qasc.kernels.params import QascParams

SHIPPED, SHIPPED_RETRIEVAL = QascParams(), RetrievalConfig()
QUERY_DOC = Path(__file__).resolve().parents[2] / "docs" / "query.md"  # the "Query flags" tables (README links it)


def test_answers_is_the_shipped_setting_and_context_the_budget_profile():
    assert presets.apply("answers", SHIPPED, SHIPPED_RETRIEVAL) == (SHIPPED, SHIPPED_RETRIEVAL)
    profile, profile_retrieval, applied = budget_setting(SHIPPED.replace(budget_tokens=400), SHIPPED_RETRIEVAL)
    assert applied and presets.apply("context", SHIPPED, SHIPPED_RETRIEVAL) == (profile, profile_retrieval)
    assert presets.DEFAULT_PRESET in presets.PRESETS
    assert all(p.purpose and "\n" not in p.description for p in presets.PRESETS.values())


def test_apply_sets_the_knobs_and_budget_only():
    custom = SHIPPED.replace(top_k=3, percentile=70.0, budget_tokens=50, lexical_weight=0.0)
    params, retrieval = presets.apply("context", custom, RetrievalConfig(depth=4))
    assert (params.top_k, params.lexical_weight, params.budget_tokens) == (3, 0.0, 400)
    assert (params.percentile, retrieval.depth) == (95.0, 16)
    params, retrieval = presets.apply("answers", params, retrieval)
    assert params == SHIPPED.replace(top_k=3, lexical_weight=0.0) and retrieval == SHIPPED_RETRIEVAL


def test_presets_are_read_only_and_unknown_names_refused():
    with pytest.raises(TypeError):
        presets.PRESETS["fast"] = presets.PRESETS["answers"]  # type: ignore[index]
    with pytest.raises(TypeError):
        presets.PRESETS["context"].qasc["percentile"] = 50.0  # type: ignore[index]
    with pytest.raises(ValueError, match="unknown preset 'fast'; the presets are answers, context"):
        presets.apply("fast", SHIPPED, SHIPPED_RETRIEVAL)


@pytest.mark.parametrize("params, retrieval, given, name", [
    (SHIPPED, SHIPPED_RETRIEVAL, set(), "answers"),
    (SHIPPED.replace(budget_tokens=300), SHIPPED_RETRIEVAL, set(), "context"),
    (SHIPPED.replace(budget_tokens=300), SHIPPED_RETRIEVAL, {"percentile"}, "answers"),
    (SHIPPED.replace(budget_tokens=300, percentile=80.0), SHIPPED_RETRIEVAL, {"percentile"}, "answers"),
    (SHIPPED.replace(percentile=80.0), SHIPPED_RETRIEVAL, set(), None),  # a store frozen with other knobs
    (SHIPPED.replace(budget_tokens=300), RetrievalConfig(depth=8, neighbourhood=4), set(), None),
    (*presets.apply("context", SHIPPED, SHIPPED_RETRIEVAL), set(), "context"),  # a store frozen with context
])
def test_choose_names_the_preset_that_answers(params, retrieval, given, name):
    chosen, chosen_retrieval, got = presets.choose(params, retrieval, frozenset(given))
    assert got == name
    assert chosen.budget_tokens == params.budget_tokens
    if name == "context":
        assert presets.matching(chosen, chosen_retrieval) == "context"


def test_describe_says_which_preset_and_what_differs():
    context = presets.apply("context", SHIPPED, SHIPPED_RETRIEVAL)
    assert presets.describe("context", *context) == \
        "preset context (budget 400 tokens; --preset answers for precise spans)"
    assert presets.describe("answers", SHIPPED.replace(percentile=80.0, budget_tokens=30), SHIPPED_RETRIEVAL) == \
        "preset answers with --percentile 80.0 (budget 30 tokens; --preset context for recall within a token budget)"
    assert presets.describe(None, SHIPPED.replace(adaptive=False), RetrievalConfig(depth=4)) == (
        "the store's own setting (differs from preset answers in --no-adaptive --depth 4; no token budget; "
        "--preset answers for precise spans; --preset context for recall within a token budget)")


def _parser() -> argparse.ArgumentParser:
    from qasc.jobs.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["query"]


def _cli_setting(argv, base=SHIPPED, base_retrieval=SHIPPED_RETRIEVAL):
    args = _parser().parse_args(["--store", "s", "--question", "q", *argv])
    return setting_from_args(args, base, base_retrieval)


FROZEN = SHIPPED.replace(percentile=80.0)  # a store frozen with another setting


@pytest.mark.parametrize("argv, base, want", [
    (["--preset", "context"], SHIPPED, ("context", 95.0, 16, 400)),
    (["--preset", "context", "--budget-tokens", "200"], SHIPPED, ("context", 95.0, 16, 200)),
    (["--preset", "context", "--budget-tokens", "none"], SHIPPED, ("context", 95.0, 16, None)),
    (["--preset", "context", "--percentile", "90", "--depth", "4"], SHIPPED, ("context", 90.0, 4, 400)),
    (["--preset", "answers", "--budget-tokens", "300"], SHIPPED, ("answers", 90.0, 8, 300)),
    (["--no-budget-profile", "--budget-tokens", "300"], SHIPPED, ("answers", 90.0, 8, 300)),
    (["--budget-tokens", "300"], SHIPPED, ("context", 95.0, 16, 300)),
    ([], SHIPPED, ("answers", 90.0, 8, None)),
    ([], FROZEN, (None, 80.0, 8, None)),
    (["--budget-tokens", "300"], FROZEN, (None, 80.0, 8, 300)),
    (["--preset", "answers"], FROZEN, ("answers", 90.0, 8, None)),
    (["--preset", "context"], FROZEN, ("context", 95.0, 16, 400)),
])
def test_cli_preset_then_flags(argv, base, want):
    params, retrieval, name = _cli_setting(argv, base)
    assert (name, params.percentile, retrieval.depth, params.budget_tokens) == want
    if name is not None:  # the knobs not given hold the preset's values
        given = {"percentile", "depth"} & {a.lstrip("-") for a in argv}
        assert presets.matching(params, retrieval, frozenset(given)) == name


def test_cli_refuses_a_contradiction_and_a_context_the_store_cannot_take():
    with pytest.raises(QascError, match="--no-budget-profile .* contradicts --preset context"):
        _cli_setting(["--no-budget-profile", "--preset", "context"])
    with pytest.raises(QascError, match="min_seeds"):
        _cli_setting(["--budget-tokens", "300"], SHIPPED.replace(max_seeds=4))
    params, _, name = _cli_setting(["--preset", "context", "--max-seeds", "none"], SHIPPED.replace(max_seeds=4))
    assert (name, params.min_seeds, params.max_seeds) == ("context", 16, None)  # flags fix what the preset needs


def _groups(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    """Group title -> its actions shown by --help (suppressed ones left out)."""
    return {g.title: [a for a in g._group_actions if a.help != argparse.SUPPRESS] for g in parser._action_groups
            if g._group_actions}


def _long_flags(actions) -> set[str]:
    return {s for a in actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def test_help_main_group_is_short_and_every_field_has_a_flag():
    parser = _parser()
    groups = _groups(parser)
    main = groups["options"]
    assert len(main) <= 15, [a.dest for a in main]
    assert set(groups) == {"options", ADVANCED_TITLE}
    assert {"--store", "--queries", "--question", "--out", "--preset", "--top-k", "--budget-tokens",
            "--device"} <= _long_flags(main)
    dests = {a.dest for a in parser._actions}
    assert {f.name for f in (*fields(QascParams), *fields(RetrievalConfig))} <= dests
    assert {a.dest for a in main} & {f.name for f in fields(QascParams)} == set(MAIN_FIELDS)
    # the deprecated flags are accepted, hidden, and the --preset help names the alias
    hidden = [a for a in parser._actions if a.help == argparse.SUPPRESS]
    assert {s for a in hidden for s in a.option_strings} == {"--budget-profile", "--no-budget-profile"}
    preset_help = next(a.help for a in parser._actions if a.dest == "preset")
    assert "--no-budget-profile is a deprecated alias of --preset answers" in preset_help


def _readme_tables() -> list[set[str]]:
    """The flags of each table in docs/query.md's "Query flags" section (rows starting with "| `--")."""
    text = QUERY_DOC.read_text()
    section = text[text.index("### Query flags"):]
    section = section[:section.index("\n## ")] if "\n## " in section else section
    tables: list[set[str]] = []
    previous = ""
    for line in section.splitlines():
        if line.startswith("| `--"):
            if not previous.startswith("| `--"):
                tables.append(set())
            tables[-1] |= set(re.findall(r"`(--[a-z][a-z-]*)", line.split(" | ")[0]))
        previous = line if line.startswith("|") else ""
    return tables


def test_readme_tables_list_exactly_the_flags_of_help():
    groups = _groups(_parser())
    assert _readme_tables() == [_long_flags(groups["options"]), _long_flags(groups[ADVANCED_TITLE])]


@pytest.mark.slow
@pytest.mark.parametrize("argv, line", [
    ([], "qasc query: preset answers (no token budget; --preset context for recall within a token budget)"),
    (["--budget-tokens", "120"], "qasc query: preset context (budget 120 tokens; --preset answers for precise spans)"),
    (["--preset", "context", "--top-k", "2"], "qasc query: preset context (budget 400 tokens; --preset answers"),
])
def test_cli_prints_which_preset_answered(demo_store, tmp_path, capsys, argv, line):
    from qasc.jobs.cli import main

    base = ["query", "--store", str(demo_store)]
    assert main([*base, "--question", "Who invented the Fresnel lens?", *argv]) == 0  # a table
    captured = capsys.readouterr()
    assert line in captured.err and "Fresnel" in captured.out
    out = tmp_path / "r.jsonl"
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"id": "a", "question": "Who invented the Fresnel lens?"}) + "\n")
    assert main([*base, "--queries", str(queries), "--out", str(out), *argv]) == 0  # a file
    assert line in capsys.readouterr().err and out.read_text()
