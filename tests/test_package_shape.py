"""The package's shape, measured from its own imports (scripts/package_shape.py), held to the
numbers of issue 33 and docs/development.md: each number a test of its own, so a failure names the
one that moved. Then the measure itself on a tiny package made here, so it is shown able to fail."""

from __future__ import annotations

import fnmatch
import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("package_shape", REPO / "scripts" / "package_shape.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


package_shape = _load_script()


@pytest.fixture(scope="module")
def shape() -> dict[str, object]:
    return package_shape.measure(REPO)


@pytest.fixture(scope="module")
def modules() -> dict[str, Any]:
    return package_shape.read_package(REPO)


def test_at_most_six_modules_directly_under_the_package(shape: dict[str, object]) -> None:
    assert shape["loose_module_count"] <= package_shape.MAX_LOOSE_MODULES == 6, shape["loose_modules"]


def test_no_import_cycle_between_folders(shape: dict[str, object]) -> None:
    assert shape["folder_cycles"] == []


def test_no_folder_imports_what_its_init_forbids(shape: dict[str, object]) -> None:
    assert shape["forbidden_imports"] == []


def test_slurm_reaches_no_torch(shape: dict[str, object]) -> None:
    assert shape["slurm_reaches_torch"] == {}


def test_recovery_imports_nothing_from_tune(modules: dict[str, Any]) -> None:
    # However indirectly: tuning listens to the run's records (hpctrain.run.listeners) instead.
    recovery = [name for name, m in modules.items() if m.folder == "recovery"]
    assert recovery, "no recovery/ folder measured"
    reached = {name: chain for name in recovery if (chain := _chain_to_folder(name, "tune", modules))}
    assert reached == {}


def test_no_module_over_400_lines(shape: dict[str, object]) -> None:
    assert package_shape.MAX_MODULE_LINES == 400
    assert shape["modules_over_limit"] == {}


def test_no_class_over_250_lines(shape: dict[str, object]) -> None:
    assert package_shape.MAX_CLASS_LINES == 250
    assert shape["classes_over_limit"] == {}


def test_slurm_command_names_only_in_the_client(shape: dict[str, object]) -> None:
    outside = {
        path: words
        for path, words in shape["slurm_commands_outside_client"].items()  # type: ignore[attr-defined]
        if not fnmatch.fnmatch(path, "hpctrain/slurm/client*.py")
    }
    assert outside == {}


def _chain_to_folder(start: str, folder: str, modules: dict[str, Any]) -> list[str] | None:
    """The chain of imports from module `start` to any module of `folder`, or None."""
    seen, queue = {start}, [[start]]
    while queue:
        chain = queue.pop(0)
        for target in sorted(package_shape.internal_imports(modules[chain[-1]], modules)):
            if modules[target].folder == folder:
                return [*chain, target]
            if target not in seen:
                seen.add(target)
                queue.append([*chain, target])
    return None


# ---- the measure itself, on a package made here --------------------------------------------------

TINY = {
    "__init__.py": "",
    "errors.py": "class UserError(Exception):\n    pass\n",
    "one.py": "",
    "two.py": "",
    "slurm/__init__.py": "",
    # Relative imports, both forms; a string naming a Slurm command in the client is allowed.
    "slurm/client.py": "from . import states\nfrom .states import LIVE\nCOMMAND = 'squeue'\n",
    "slurm/states.py": "LIVE = ('RUNNING',)\n",
    # slurm -> run: forbidden, and a cycle with run -> slurm below; a command name outside the client.
    "slurm/env.py": "from ..run.paths import RunDir\nSAID = ' scancel '\n",
    "run/__init__.py": "",
    # torch imported inside a function still counts: slurm.env -> run.paths -> torch.
    "run/paths.py": (
        "from hpctrain.slurm import client\n"
        "class RunDir:\n    pass\n"
        "def load():\n    import torch.distributed\n    return torch.distributed\n"
    ),
    "recovery/__init__.py": "",
    # An import only for type checkers never runs: not an arrow.
    "recovery/control.py": (
        "from typing import TYPE_CHECKING\n"
        "from hpctrain.errors import UserError\n"
        "if TYPE_CHECKING:\n    from hpctrain.tune import report\n"
    ),
    "tune/__init__.py": "",
    "tune/report.py": "def told():\n    from hpctrain.recovery import control\n    return control\n",
    "trainer/__init__.py": "",
    "trainer/trainer.py": "class Trainer:\n" + "    x = 1\n" * 250 + "\n" * 150,
}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    for relative, text in TINY.items():
        path = tmp_path / "hpctrain" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_the_import_reader_resolves_relative_lazy_and_type_only_imports(tiny: Path) -> None:
    found = package_shape.read_package(tiny)
    imported = {name: package_shape.internal_imports(m, found) for name, m in found.items()}
    assert imported["hpctrain.slurm.client"] == {"hpctrain.slurm", "hpctrain.slurm.states"}
    assert imported["hpctrain.slurm.env"] == {"hpctrain.run.paths"}
    assert imported["hpctrain.tune.report"] == {"hpctrain.recovery", "hpctrain.recovery.control"}  # in a function
    assert imported["hpctrain.recovery.control"] == {"hpctrain.errors"}  # not the TYPE_CHECKING one
    assert "torch.distributed" in found["hpctrain.run.paths"].imports
    assert found["hpctrain.trainer.trainer"].classes == {"Trainer": 251}
    assert found["hpctrain.slurm.env"].slurm_words == [(2, "scancel")]


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({}, []),
        ({"a": {"b"}, "b": {"c"}}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}, "e": {"a", "c"}}, [["a", "b"], ["c", "d"]]),
        ({"a": {"a"}}, []),  # a folder importing itself is no cycle between folders
    ],
)
def test_the_cycle_finder(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert sorted(package_shape.cycles(graph)) == expected


def test_the_measure_finds_what_is_wrong_in_a_package(tiny: Path) -> None:
    shape = package_shape.measure(tiny)
    assert shape["loose_module_count"] == 3  # errors, one, two (not __init__)
    # tune -> recovery only: recovery's import of tune is for type checkers.
    assert shape["folder_cycles"] == [["run", "slurm"]]
    assert shape["forbidden_imports"] == ["slurm -> run", "tune -> recovery"]
    assert shape["slurm_reaches_torch"] == {"hpctrain.slurm.env": "hpctrain.slurm.env -> hpctrain.run.paths -> torch"}
    assert shape["modules_over_limit"] == {"hpctrain/trainer/trainer.py": 401}
    assert shape["classes_over_limit"] == {"hpctrain/trainer/trainer.py:Trainer": 251}
    assert shape["slurm_commands_outside_client"] == {"hpctrain/slurm/env.py": ["scancel"]}
    assert package_shape.problems(shape)  # the command would exit 1
