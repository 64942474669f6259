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

LAYERS = ("qasc.kernels", "qasc.engine", "qasc.jobs", "bench")  # each may import only the ones before it
INSTALLED = ("engine", "jobs", "kernels")  # folders installed as qasc.<folder> (pyproject.toml)
HEAVY = ("transformers", "ray", "faiss", "matplotlib", "langchain_text_splitters", "tiktoken")


def _modules() -> dict[str, ast.Module]:
    out = {}
    for package in LAYERS:
        folder = package.removeprefix("qasc.")
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            name = f"qasc.{name}" if folder in INSTALLED else name
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


def _layer(module: str) -> int:
    return next(i for i, package in enumerate(LAYERS) if module == package or module.startswith(package + "."))


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(tree, set(modules)) for name, tree in modules.items()}


def test_dependencies_point_one_way(graph):
    wrong = []
    for name, deps in graph.items():
        layer = _layer(name)
        wrong += [f"{name} -> {d}" for d in deps if _layer(d) > layer]
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
    ("import qasc.kernels.seeding", HEAVY),
    ("import qasc.engine.errors", HEAVY + ("torch",)),
    ("from qasc.jobs.cli import build_parser; build_parser().format_help()", HEAVY),
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
                parts = text.strip("'\"").removeprefix("qasc.").split(".")
                if parts[0] == "engine" or text in ("store_mod", "faiss_index", "chunker_mod"):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders


def test_installed_packages_are_the_tree():
    """pyproject.toml installs every package folder under engine/, jobs/ and kernels/ (and each folder of data under
    them) as qasc.<path>, and nothing else: a new subpackage that is not listed would be missing from a wheel (an
    editable install hides that)."""
    import tomllib

    setup = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    files = [p for folder in INSTALLED for p in (REPO / folder).rglob("*") if p.is_file()
             and "__pycache__" not in p.parts and (p.suffix == ".py" or "data" in p.relative_to(REPO).parts)]
    folders = {f"qasc.{'.'.join(p.parent.relative_to(REPO).parts)}" for p in files}
    assert sorted(setup["packages"]) == sorted(folders)
    assert setup["package-dir"] == {f"qasc.{folder}": folder for folder in INSTALLED}


def test_no_top_level_import_name_is_taken():
    """The project installs only the `qasc` import name, and its kernels/ folder (the repo root on sys.path: pytest,
    `python -m bench...`) is a namespace portion, which an installed regular package of the same name always wins
    over: Hugging Face's `kernels` (imported by transformers >= 5.25) stays importable beside a checkout."""
    assert not (REPO / "kernels" / "__init__.py").exists()
    probe = ("import importlib.util, json; s = importlib.util.find_spec('kernels'); "
             "print(json.dumps([s.origin, list(s.submodule_search_locations or [])]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    origin, locations = json.loads(out.stdout)
    if origin is None:  # no distribution named `kernels` here: the folder is found, as a namespace, and nothing else
        assert locations == [str(REPO / "kernels")]
    else:  # Hugging Face's package is installed (in site-packages, perhaps a venv inside the checkout): it wins
        assert not origin.startswith(str(REPO / "kernels")), origin
