"""Package structure: dependencies point one way (kernels <- engine <- jobs <- bench), no import cycles
between modules, and the light entry points (`import kernels`, `qasc --help`, `import engine.errors`) load
no model, no Ray and no evaluation extras."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

LAYERS = ("kernels", "engine", "jobs", "bench")  # each may import only the ones before it
HEAVY = ("transformers", "ray", "faiss", "matplotlib", "langchain_text_splitters", "tiktoken")


def _modules() -> dict[str, ast.Module]:
    out = {}
    for package in LAYERS:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = ast.parse(path.read_text(encoding="utf-8"))
    return out


def _imports(tree: ast.Module, known: set[str]) -> set[str]:
    """Project modules a module imports, anywhere in it (lazy imports inside functions included)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known)
    return {m for m in found if m in known}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(tree, set(modules)) for name, tree in modules.items()}


def test_dependencies_point_one_way(graph):
    wrong = []
    for name, deps in graph.items():
        layer = LAYERS.index(name.split(".")[0])
        wrong += [f"{name} -> {d}" for d in deps if LAYERS.index(d.split(".")[0]) > layer]
    assert not wrong, wrong


def test_no_import_cycles(graph):
    """Module-level imports between project modules form no cycle (a package's __init__ re-exporting its
    own modules is not an edge back from them)."""
    edges = {n: {d for d in deps if not n.startswith(d + ".")} for n, deps in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


@pytest.mark.parametrize("code, banned", [
    ("import kernels", HEAVY),
    ("import engine.errors", HEAVY + ("torch",)),
    ("from jobs.cli import build_parser; build_parser().format_help()", HEAVY),
])
def test_light_imports(code, banned):
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(m for m in {list(banned)!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_no_module_level_patching_of_the_engine():
    """Tests and the evaluation hand collaborators in; nothing swaps engine functions at run time."""
    offenders = []
    for path in [*(REPO / "tests").rglob("*.py"), *(REPO / "jobs").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "setattr" and node.args:
                target = node.args[0]
                text = ast.unparse(target)
                if text.strip("'\"").split(".")[0] == "engine" or text in ("store_mod", "faiss_index", "chunker_mod"):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders


def test_a_name_of_hugging_faces_kernels_package_gets_a_clear_error(monkeypatch):
    """transformers >= 5.25 imports Hugging Face's PyPI package `kernels`, whose import name is this project's; where
    it is installed, transformers gets ours and asks it for names it lacks: the error says why and what to do."""
    import importlib.metadata as metadata

    from qasc import kernels

    real = metadata.version

    def without_hub(name: str) -> str:
        if name == "kernels":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", without_hub)
    with pytest.raises(AttributeError, match="has no attribute 'CUDAProperties'"):
        kernels.CUDAProperties  # noqa: B018 (no such distribution: a plain AttributeError)
    monkeypatch.setattr(metadata, "version", lambda name: "0.19.1" if name == "kernels" else real(name))
    with pytest.raises(ImportError, match=r"Hugging Face's PyPI package `kernels` 0.19.1 .* transformers < 5.25"):
        from qasc.kernels import CUDAProperties  # noqa: F401
    assert not hasattr(kernels, "__wrapped__")  # private and dunder names stay plain AttributeErrors
