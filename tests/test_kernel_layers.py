"""kernel/ is layered (docs/architecture.md): a module imports only its own layer and the
layers below it, never one above, whether the import is at the top, inside a function or under
``TYPE_CHECKING``; only the CLI imports the package face ``kernel`` itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# lowest first: the folders of kernel/ and their layer
LAYERS = {"model": 0, "io": 1, "pool": 2, "bulk": 3, "facade": 4, "sweep": 5, "replay": 6,
          "calibration": 7, "registry_fit": 7, "report": 8, "cli": 9}
FACE = LAYERS["cli"]  # kernel/__init__.py: the public names, for users and the CLI alone


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """Every ``kernel`` module ``source`` imports, with its line (relative imports resolved;
    ``from kernel.x import y`` names ``kernel.x.y`` so a submodule import is seen)."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return [(name, line) for name, line in found
            if name == "kernel" or name.startswith("kernel.")]


def layer_of(name: str) -> int:
    """The layer of an imported name: its folder's, or the face's for ``kernel.<public name>``."""
    parts = name.split(".")
    if len(parts) == 1 or parts[1] not in LAYERS:
        return FACE
    return LAYERS[parts[1]]


def kernel_files() -> list[Path]:
    return sorted((ROOT / "kernel").rglob("*.py"))


def test_every_module_sits_in_a_layer() -> None:
    stray = [str(p.relative_to(ROOT)) for p in kernel_files()
             if p.parent != ROOT / "kernel" and p.relative_to(ROOT / "kernel").parts[0]
             not in LAYERS]
    flat = [p.name for p in (ROOT / "kernel").glob("*.py") if p.name != "__init__.py"]
    assert not stray and not flat, f"modules outside every layer folder: {stray + flat}"


def test_no_import_goes_up_a_layer() -> None:
    upward = []
    for path in kernel_files():
        if path.parent == ROOT / "kernel":
            continue  # the face: it re-exports every layer
        module = module_name(path)
        own = LAYERS[module.split(".")[1]]
        for name, line in imported_modules(path.read_text(), module, path.name == "__init__.py"):
            if layer_of(name) > own:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not upward, "imports that go up a layer (docs/architecture.md):\n" + "\n".join(upward)


def test_the_finder_sees_deferred_and_type_only_imports() -> None:
    src = ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from ..facade.kernel import Kernel\n"
           "def f():\n    from kernel import report\n    import " + "kernel.cli.main\n"
           "from .. import pool\nfrom .laws import x\n")
    got = sorted(imported_modules(src, "kernel.model.step", is_package=False),
                 key=lambda g: g[1])
    assert got == [("kernel.facade.kernel.Kernel", 4), ("kernel.report", 6),
                   ("kernel.cli.main", 7), ("kernel.pool", 8), ("kernel.model.laws.x", 9)]
    assert [layer_of(n) for n, _ in got] == [4, 8, 9, 2, 0]
    assert layer_of("kernel.Kernel") == FACE and layer_of("kernel") == FACE


def test_architecture_names_every_module_and_its_layer() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [str(p.relative_to(ROOT)) for p in kernel_files()
               if p.name != "__init__.py" and str(p.relative_to(ROOT / "kernel")) not in text]
    assert not missing, f"docs/architecture.md does not name: {missing}"
    rows = re.findall(r"^\| (\d+) [^|]*\| `kernel/(\w+)/`", text, re.M)
    assert {folder: int(n) for n, folder in rows} == LAYERS


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_each_layer_folder_says_what_it_is(folder: str) -> None:
    init = ROOT / "kernel" / folder / "__init__.py"
    assert ast.get_docstring(ast.parse(init.read_text())), f"{init} has no docstring"


def deferred_imports(source: str) -> list[tuple[int, str]]:
    """The imports inside function bodies, each with its source line(s)."""
    lines = source.splitlines()
    found = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    found.append((node.lineno,
                                  " ".join(lines[node.lineno - 1:node.end_lineno])))
    return sorted(set(found))


def test_deferred_imports_say_why() -> None:
    """Below the CLI an import inside a function is for a heavy or optional dependency (or
    one module of a pair that reads the other), and its line says so; the CLI loads each
    command's library modules only when the command runs, so ``--help`` stays fast."""
    silent = [f"{path.relative_to(ROOT)}:{line}: {text.strip()}"
              for path in kernel_files() if path.relative_to(ROOT).parts[1] != "cli"
              for line, text in deferred_imports(path.read_text()) if "#" not in text]
    assert not silent, "deferred imports without a stated reason:\n" + "\n".join(silent)
    assert deferred_imports("def f():\n    import os\n") == [(2, "    import os")]
