"""kernels.reference is complete: every public function of every kernels/ module has a same-named twin in
kernels/reference/<the same module>.py, with the kernel's parameter names, re-exported by the package, and no twin
reuses the kernels' own code (a bug there would hide in both).

The modules and their functions are discovered (pkgutil, inspect), not listed: a new kernel without a twin fails
here with its name.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

from qasc import kernels
from qasc.kernels import reference

# qualified name -> why the function has no twin (helpers that are not kernels)
EXEMPT = {
    "qasc.kernels.pipeline.run_qasc": "the kernels' composition itself: the tests run it with ops=kernels.reference",
}
# qualified name -> parameters the twin takes after the kernel's (none so far)
EXTRA_PARAMETERS: dict[str, tuple[str, ...]] = {}
# kernels modules a twin may import from, and what: types of the outputs, not operations
ALLOWED_IMPORTS = {"qasc.kernels.candidates": {"CandidateRows"}}
REFERENCE_DIR = Path(reference.__file__).parent


def kernel_modules() -> list[ModuleType]:
    """Every module of the kernels package but the reference itself."""
    return [importlib.import_module(f"qasc.kernels.{m.name}") for m in pkgutil.iter_modules(kernels.__path__)
            if m.name != "reference"]


def public_functions(module: ModuleType) -> dict[str, object]:
    """The functions a module defines (not imports) whose names do not start with an underscore."""
    return {name: f for name, f in vars(module).items()
            if inspect.isfunction(f) and not name.startswith("_") and f.__module__ == module.__name__}


def twin_of(module: ModuleType, name: str) -> object | None:
    short = module.__name__.rsplit(".", 1)[1]
    if not (REFERENCE_DIR / f"{short}.py").exists():
        return None
    return getattr(importlib.import_module(f"qasc.kernels.reference.{short}"), name, None)


def test_discovery_finds_the_kernel_modules() -> None:
    names = {m.__name__ for m in kernel_modules()}
    assert {"qasc.kernels.seeding", "qasc.kernels.extents", "qasc.kernels.quantize", "qasc.kernels.runs"} <= names
    assert sum(len(public_functions(m)) for m in kernel_modules()) >= 35  # 40 after the window and scan kernels went


def test_every_public_kernel_has_a_twin() -> None:
    missing = [f"{m.__name__}.{name}" for m in kernel_modules() for name in public_functions(m)
               if f"{m.__name__}.{name}" not in EXEMPT and twin_of(m, name) is None]
    assert not missing, f"public kernels without a twin in kernels/reference/<module>.py: {missing}"


def test_exemptions_are_current() -> None:
    """Every exemption names a public kernel function that has no twin (a stale entry would hide nothing)."""
    stale = []
    for qualified in EXEMPT:
        module_name, name = qualified.rsplit(".", 1)
        module = importlib.import_module(module_name)
        if name not in public_functions(module) or twin_of(module, name) is not None:
            stale.append(qualified)
    assert not stale, f"EXEMPT entries that are not public kernels without a twin: {stale}"


def test_twins_take_the_kernels_parameters() -> None:
    """The twin's parameters are the kernel's, same names in the same order, plus only the declared extras."""
    wrong = []
    for m in kernel_modules():
        for name, kernel in public_functions(m).items():
            twin = twin_of(m, name)
            if twin is None:
                continue
            want = list(inspect.signature(kernel).parameters)
            got = list(inspect.signature(twin).parameters)
            extra = list(EXTRA_PARAMETERS.get(f"{m.__name__}.{name}", ()))
            if got != want + extra:
                wrong.append(f"{m.__name__}.{name}: kernel {want}, twin {got}")
    assert not wrong, wrong


def test_twins_state_their_contract() -> None:
    """Every twin has a docstring that says what it computes, not only whose twin it is."""
    bad = []
    for m in kernel_modules():
        for name in public_functions(m):
            twin = twin_of(m, name)
            doc = inspect.getdoc(twin) if twin is not None else "-"
            if not doc or doc.lower().startswith("twin of"):
                bad.append(f"{m.__name__}.{name}")
    assert not bad, f"twins without a contract docstring: {bad}"


def test_the_package_re_exports_every_twin() -> None:
    """`kernels.reference.<name>` is the twin of kernels/<module>.py's <name> (run_qasc(ops=kernels.reference))."""
    wrong = []
    for m in kernel_modules():
        for name in public_functions(m):
            twin = twin_of(m, name)
            if twin is not None and (getattr(kernels.reference, name, None) is not twin
                                     or name not in kernels.reference.__all__):
                wrong.append(f"{m.__name__}.{name}")
    assert not wrong, f"twins not re-exported by kernels.reference: {wrong}"


def test_twins_import_no_kernel_code() -> None:
    """kernels/reference/*.py imports nothing from the kernels' modules but the allowed output types."""
    wrong = []
    for path in sorted(REFERENCE_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [(node.module, {a.name for a in node.names})]
            elif isinstance(node, ast.Import):
                modules = [(a.name, {"*"}) for a in node.names]
            else:
                continue
            for module, names in modules:
                if module == "qasc.kernels" or (module.startswith("qasc.kernels.")
                                                and not module.startswith("qasc.kernels.reference")):
                    if not names <= ALLOWED_IMPORTS.get(module, set()):
                        wrong.append(f"{path.name}:{node.lineno} {module} {sorted(names)}")
    assert not wrong, f"twins importing the kernels' own code: {wrong}"
