"""The demo answers its own questions: each demo question's first chunk lies in the section that holds its answer
(checked by character offsets)."""

from __future__ import annotations

import pytest

from qasc.engine.query import Engine
from qasc.jobs.demo_cmd import DEMO_QUESTIONS

pytestmark = pytest.mark.slow

# per demo question: (document, the heading that opens the section holding the answer, a phrase of the answer)
ANSWERS = [
    ("sourdough", "## The bake", "250 degrees Celsius"),
    ("lighthouses", "## The Fresnel lens", "Augustin-Jean Fresnel"),
    ("solar_power", "## Sizing a system", "peak sun hours"),
    ("lighthouses", "## Automation", "automated in 1998"),
]
# Known miss (bench/RESULTS.md, "One scoring model"): the sourdough question matches the title "Baking sourdough
# bread" (c 0.61) better than "Baking sourdough bread > The bake" (0.57); in a 3-document store the heading spread
# is large (0.65), so the title's introduction outranks the answer. A section's match floored at its title's fixes
# the demo but costs medquad -3.5 and qasper -2.4 F1 held out: not taken. strict: the day it passes, this fails.
KNOWN_MISS = {0: "the title's introduction outranks the answer section (bench/RESULTS.md, 'One scoring model')"}


def section_span(text: str, heading: str) -> tuple[int, int]:
    """The characters of the section that `heading` opens: from the heading to the next heading (or the end)."""
    start = text.index(heading)
    nxt = text.find("\n#", start + len(heading))
    return start, len(text) if nxt < 0 else nxt


@pytest.fixture(scope="module")
def demo_answers(demo_store):
    engine = Engine.open(str(demo_store), device="cpu")
    return {d.doc_id: d.text for d in engine.store.docs}, engine.query(DEMO_QUESTIONS)


@pytest.mark.parametrize("i", [pytest.param(i, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISS[i]))
                               if i in KNOWN_MISS else i for i in range(len(DEMO_QUESTIONS))])
def test_the_first_chunk_is_in_the_answer_section(demo_answers, i):
    texts, results = demo_answers
    doc, heading, phrase = ANSWERS[i]
    lo, hi = section_span(texts[doc], heading)
    assert phrase in texts[doc][lo:hi]  # the section named here does hold the answer
    assert results[i], DEMO_QUESTIONS[i]
    first = results[i][0]
    assert first.doc_id == doc and lo <= first.char_start < first.char_end <= hi, (DEMO_QUESTIONS[i], first)


def test_qasc_demo_runs_on_the_installed_corpus(tmp_path):
    """`make demo` (`qasc demo`) as a user runs it, outside the checkout (no repo root on sys.path: the corpus is found
    through the installed package, qasc.engine's data), every demo question answered with its first chunk printed."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "qasc.jobs.cli", "demo", "--store", str(tmp_path / "store"),
                           "--top-k", "1", "--device", "cpu"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "demo store: 3 documents" in proc.stdout
    assert all(f"[{i}] {q}" in proc.stdout for i, q in enumerate(DEMO_QUESTIONS))
    assert proc.stdout.count("#1 score") == len(DEMO_QUESTIONS)
