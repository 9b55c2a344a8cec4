"""The package's shape, measured from its own imports and definitions: `python scripts/package_shape.py`.

What it prints (and tests/test_package_shape.py holds to the numbers of docs/development.md):
  - the modules left directly under hpctrain/ (at most 6);
  - which folder imports which, and any cycle between folders (none allowed);
  - imports a folder may not make (its `__init__` says what it may import: ALLOWED below);
  - whether slurm/ reaches torch through any import, however indirect (it must not);
  - modules over 400 lines and classes over 250;
  - Slurm's command names written in a module other than hpctrain/slurm/client.py.

Every import counts, the ones inside functions too (a lazy import is still an arrow between
concerns), except those under `if TYPE_CHECKING:` (they never run).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "hpctrain"
MAX_LOOSE_MODULES = 6
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 250
SLURM_COMMANDS = ("sbatch", "scontrol", "squeue", "sacct", "sinfo", "scancel", "sacctmgr", "sstat", "sprio")
CLIENT = "hpctrain/slurm/client.py"
# What each folder may import (besides itself, the standard library and third-party packages).
# The loose modules (errors, logs, faults, worker) are leaves every folder may use.
LEAVES = {"errors", "logs", "faults"}
ALLOWED: dict[str, set[str]] = {
    "slurm": set(),
    "run": {"slurm"},
    "config": {"run", "slurm"},
    "dist": {"run", "slurm", "config"},
    "data": {"run", "config", "dist"},
    "models": {"config"},
    "metrics": {"run", "config"},
    "checkpoint": {"run", "slurm", "config", "dist"},
    # A trial's rank 0 asks the study whether to prune (tune never imports trainer or process).
    "trainer": {"run", "config", "dist", "data", "models", "metrics", "checkpoint", "tune"},
    "process": {"run", "slurm", "config", "dist", "data", "models", "metrics", "checkpoint", "trainer"},
    "submit": {"run", "slurm", "config"},
    "recovery": {"run", "slurm", "config", "submit"},
    "status": {"run", "slurm", "config", "recovery", "submit"},
    "sweep": {"run", "slurm", "config", "submit", "status"},
    "tune": {"run", "slurm", "config", "submit", "status"},
    "cli": {
        "run", "slurm", "config", "dist", "data", "models", "metrics", "checkpoint", "trainer", "process",
        "submit", "recovery", "status", "sweep", "tune",
    },
    "worker": {"process"},
}  # fmt: skip


@dataclass
class Module:
    name: str  # hpctrain.slurm.client
    path: Path
    lines: int
    imports: set[str] = field(default_factory=set)  # hpctrain modules and top-level third-party names
    classes: dict[str, int] = field(default_factory=dict)
    slurm_words: list[tuple[int, str]] = field(default_factory=list)

    @property
    def folder(self) -> str:
        """`slurm` for hpctrain.slurm.client; the module's own name for a loose module."""
        return self.name.split(".")[1] if self.name.count(".") >= 1 else "__init__"


def read_package(root: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        relative = path.relative_to(root)
        if path.is_symlink() or any(part in {"conf", "sbatch_templates"} for part in relative.parts[1:-1]):
            continue
        parts = list(relative.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        text = path.read_text()
        module = Module(name, relative, len(text.splitlines()))
        _read(module, ast.parse(text), is_package=path.name == "__init__.py")
        modules[name] = module
    return modules


def _read(module: Module, tree: ast.Module, *, is_package: bool) -> None:
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    base = module.name.split(".") if is_package else module.name.split(".")[:-1]
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            module.imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                source = ".".join(base[: len(base) - node.level + 1] + ([source] if source else []))
            module.imports.add(source)
            module.imports.update(f"{source}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ClassDef):
            module.classes[node.name] = (node.end_lineno or node.lineno) - node.lineno + 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = node.value.strip()
            if word in SLURM_COMMANDS:
                module.slurm_words.append((node.lineno, word))


def internal_imports(module: Module, modules: dict[str, Module]) -> set[str]:
    """The hpctrain modules `module` imports (`from a.b import c` names a.b, or a.b.c if a module)."""
    return {name for name in module.imports if name in modules and name != module.name}


def folder_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for module in modules.values():
        for target in internal_imports(module, modules):
            source_folder, target_folder = module.folder, modules[target].folder
            if target_folder not in (source_folder, "__init__"):
                graph[source_folder].add(target_folder)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one folder (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(graph) | {t for targets in graph.values() for t in targets}):
        if node not in index:
            visit(node)
    return found


def reaches_torch(start: str, modules: dict[str, Module]) -> list[str] | None:
    """The chain of imports from `start` to torch, or None when there is none."""
    seen = {start}
    queue: list[list[str]] = [[start]]
    while queue:
        chain = queue.pop(0)
        module = modules[chain[-1]]
        if any(name == "torch" or name.startswith("torch.") for name in module.imports):
            return [*chain, "torch"]
        for target in sorted(internal_imports(module, modules)):
            if target not in seen:
                seen.add(target)
                queue.append([*chain, target])
    return None


def measure(root: Path) -> dict[str, object]:
    modules = read_package(root)
    graph = folder_graph(modules)
    loose = sorted(m.path.name for m in modules.values() if m.name.count(".") == 1 and m.path.name != "__init__.py")
    loose_with_init = sorted(m.path.name for m in modules.values() if m.path.parent == Path(PACKAGE))
    forbidden = sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if target not in LEAVES and target not in ALLOWED.get(source, set())
    )
    slurm_torch = {
        name: chain for name, m in modules.items() if m.folder == "slurm" and (chain := reaches_torch(name, modules))
    }
    return {
        "loose_modules": loose_with_init,
        "loose_module_count": len(loose),
        "folder_cycles": cycles(graph),
        "forbidden_imports": forbidden,
        "slurm_reaches_torch": {name: " -> ".join(chain) for name, chain in sorted(slurm_torch.items())},
        "modules_over_limit": {
            str(m.path): m.lines for m in sorted(modules.values(), key=lambda m: -m.lines) if m.lines > MAX_MODULE_LINES
        },
        "classes_over_limit": {
            f"{m.path}:{cls}": size
            for m in modules.values()
            for cls, size in sorted(m.classes.items())
            if size > MAX_CLASS_LINES
        },
        "slurm_commands_outside_client": {
            str(m.path): sorted({word for _, word in m.slurm_words})
            for m in modules.values()
            if m.slurm_words and str(m.path) != CLIENT
        },
        "largest_module": max((m.lines, str(m.path)) for m in modules.values()),
        "largest_class": max((size, f"{m.path}:{cls}") for m in modules.values() for cls, size in m.classes.items()),
        "folders": {folder: sorted(targets) for folder, targets in sorted(graph.items())},
    }


def problems(shape: dict[str, object]) -> list[str]:
    said = []
    if int(shape["loose_module_count"]) > MAX_LOOSE_MODULES:  # type: ignore[call-overload]
        said.append(f"{shape['loose_module_count']} loose modules under hpctrain/ (at most {MAX_LOOSE_MODULES})")
    for key in (
        "folder_cycles",
        "forbidden_imports",
        "slurm_reaches_torch",
        "modules_over_limit",
        "classes_over_limit",
        "slurm_commands_outside_client",
    ):
        if shape[key]:
            said.append(f"{key}: {shape[key]}")
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--json", action="store_true", help="the whole measure as JSON")
    args = parser.parse_args(argv)
    shape = measure(args.root)
    if args.json:
        print(json.dumps(shape, indent=1))
    else:
        print(f"loose modules: {shape['loose_module_count']} ({', '.join(shape['loose_modules'])})")  # type: ignore[arg-type]
        for folder, targets in shape["folders"].items():  # type: ignore[attr-defined]
            print(f"  {folder:>10} -> {', '.join(targets)}")
        print(f"largest module: {shape['largest_module']}; largest class: {shape['largest_class']}")
    said = problems(shape)
    for line in said:
        print(f"shape: {line}", file=sys.stderr)
    return 1 if said else 0


if __name__ == "__main__":
    sys.exit(main())
