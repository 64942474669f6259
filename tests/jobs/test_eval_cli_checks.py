"""`qasc eval` refuses bad arguments before any work: one line, exit 2, nothing written or overwritten."""

from __future__ import annotations

import json

import pytest

from qasc.jobs.cli import main
from tests.jobs.test_eval_harness import write_dataset


@pytest.fixture()
def sets(tmp_path):
    return write_dataset(tmp_path / "a" / "same"), write_dataset(tmp_path / "b" / "same")


def _run(capsys, *argv: str) -> str:
    assert main(["eval", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_bad_arguments_are_refused_up_front(tmp_path, sets, capsys):
    a, b = map(str, sets)
    out = str(tmp_path / "out")
    assert "distinct folder names" in _run(capsys, "--data", f"{a},{b}", "--out", out)
    assert "is not a Chroma-format data set" in _run(capsys, "--data", f"{a},{tmp_path / 'nope'}", "--out", out)
    assert "--data names no folder" in _run(capsys, "--data", ",", "--out", out)
    assert "--methods names no method" in _run(capsys, "--data", a, "--methods", "", "--out", out)
    assert "unknown method 'bogus'" in _run(capsys, "--data", a, "--methods", "sentences,bogus", "--out", out)
    assert "--bootstrap must be >= 1" in _run(capsys, "--data", a, "--bootstrap", "0", "--out", out)
    assert not (tmp_path / "out").exists()


def test_out_folder_of_someone_else_is_not_overwritten(tmp_path, sets, capsys):
    a = str(sets[0])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("MINE")
    (mine / "results.json").write_text("{}")
    assert "that `qasc eval` did not write" in _run(capsys, "--data", a, "--out", str(mine))
    assert (mine / "report.md").read_text() == "MINE"
    (tmp_path / "afile").write_text("x")
    assert "exists and is a file" in _run(capsys, "--data", a, "--out", str(tmp_path / "afile"))


def test_a_previous_eval_folder_may_be_reused(tmp_path):
    from qasc.jobs.eval_cmd import check_out_dir

    prev = tmp_path / "prev"
    prev.mkdir()
    (prev / "report.md").write_text("# QASC evaluation")
    (prev / "results.json").write_text(json.dumps({"config": {}, "environment": {}, "timings": {}}))
    check_out_dir(str(prev))  # no error
    check_out_dir(str(tmp_path / "new"))
