"""The `_target_` description cache (hpctrain.config.signatures): what a later command reads from it
gives the checks exactly what the import gave, and anything that could change the answer (the
file edited, another copy found first, a preflight hook) imports the target again."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clitools import cli_env

from hpctrain.config import signatures
from hpctrain.run.paths import CODE_MANIFEST
from hpctrain.submit.code_snapshot import _top_source, module_source

# What a fresh command does: describe one target, say whether it imported it and what it saw.
PROBE = """
import json, sys
from hpctrain.config import signatures
d = signatures.describe(sys.argv[1])
params = [[p.name, int(p.kind), p.default is not p.empty] for p in d.signature.parameters.values()]
top = sys.argv[1].split(".")[0]
print(json.dumps({"imports": signatures.imports, "params": params, "preflight": d.preflight,
                  "loaded": top in sys.modules}))
"""


def describe_in_a_new_process(target: str, path: list[Path], cache: Path | str) -> dict[str, Any]:
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    env["HPCTRAIN_TARGET_CACHE"] = str(cache)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, target], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def write_module(folder: Path, text: str, name: str = "mymodel") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(text)


def test_a_later_command_reads_the_cache_until_the_file_changes(tmp_path: Path) -> None:
    code, cache = tmp_path / "code", tmp_path / "cache"
    write_module(code, "class Net:\n    def __init__(self, width, depth=2):\n        pass\n")
    first = describe_in_a_new_process("mymodel.Net", [code], cache)
    second = describe_in_a_new_process("mymodel.Net", [code], cache)
    assert first["imports"] == 1 and first["loaded"]
    assert second["imports"] == 0 and not second["loaded"]  # not even imported
    assert second["params"] == first["params"] == [["width", 1, False], ["depth", 1, True]]
    write_module(code, "class Net:\n    def __init__(self, width, depth=2, heads=1):\n        pass\n")
    edited = describe_in_a_new_process("mymodel.Net", [code], cache)
    assert edited["imports"] == 1 and edited["params"][-1] == ["heads", 1, True]


LAZY_PACKAGE = """
import pathlib, sys

# As Hugging Face's lazy `transformers` module: once imported, its own __spec__ names its
# folder as a Path object.
__spec__.submodule_search_locations = [pathlib.Path(__file__).parent]


class Net:
    def __init__(self, config, width=1):
        pass
"""


def test_a_package_whose_spec_holds_a_path_is_cached(tmp_path: Path) -> None:
    # Before: "Object of type PosixPath is not JSON serializable", every such target refused.
    code, cache = tmp_path / "code", tmp_path / "cache"
    write_module(code / "lazypkg", LAZY_PACKAGE, name="__init__")
    first = describe_in_a_new_process("lazypkg.Net", [code], cache)
    second = describe_in_a_new_process("lazypkg.Net", [code], cache)
    assert first["imports"] == 1 and second["imports"] == 0
    assert second["params"] == [["config", 1, False], ["width", 1, True]]


def test_a_base_class_edited_is_seen(tmp_path: Path) -> None:
    code, cache = tmp_path / "code", tmp_path / "cache"
    write_module(code, "class Base:\n    def __init__(self, a):\n        pass\n", name="base")
    write_module(code, "from base import Base\n\nclass Net(Base):\n    pass\n")
    assert describe_in_a_new_process("mymodel.Net", [code], cache)["params"] == [["a", 1, False]]
    write_module(code, "class Base:\n    def __init__(self, a, bb):\n        pass\n", name="base")
    again = describe_in_a_new_process("mymodel.Net", [code], cache)
    assert again["imports"] == 1 and again["params"] == [["a", 1, False], ["bb", 1, False]]


def test_another_copy_found_first_is_imported(tmp_path: Path) -> None:
    old, new, cache = tmp_path / "old", tmp_path / "new", tmp_path / "cache"
    write_module(old, "def net(a):\n    pass\n")
    write_module(new, "def net(b):\n    pass\n")
    describe_in_a_new_process("mymodel.net", [old], cache)
    shadowed = describe_in_a_new_process("mymodel.net", [new, old], cache)
    assert shadowed["imports"] == 1 and shadowed["params"] == [["b", 1, False]]


@pytest.mark.parametrize("cache", ["off", "with a preflight hook"])
def test_imported_every_time(tmp_path: Path, cache: str) -> None:
    code = tmp_path / "code"
    hook = cache != "off"
    write_module(code, "def data(path):\n    pass\n" + ("data.preflight = lambda path: None\n" if hook else ""))
    folder = "off" if cache == "off" else tmp_path / "cache"
    for _ in range(2):
        seen = describe_in_a_new_process("mymodel.data", [code], folder)
        assert seen["imports"] == 1 and seen["preflight"] == hook


def test_a_jobs_code_snapshot_does_not_evict_the_checkouts_entry(tmp_path: Path) -> None:
    """A job imports its run dir's code snapshot and checks its config there. Before, it wrote the
    snapshot's copy into the cache; the user's next hpctrain-submit from the checkout found that
    entry stale and imported torch again (a second and more of every submit after any job ran)."""
    checkout, cache = tmp_path / "checkout", tmp_path / "cache"
    snapshot = tmp_path / "run" / "code"
    source = "class Net:\n    def __init__(self, width):\n        pass\n"
    write_module(checkout, source)
    write_module(snapshot, source)
    (snapshot / CODE_MANIFEST).write_text("{}\n")
    assert describe_in_a_new_process("mymodel.Net", [checkout], cache)["imports"] == 1
    for _ in range(2):  # the job's every life: read, found stale for its copy, never written
        job = describe_in_a_new_process("mymodel.Net", [snapshot], cache)
        assert job["imports"] == 1 and job["params"] == [["width", 1, False]]
    assert describe_in_a_new_process("mymodel.Net", [checkout], cache)["imports"] == 0


def _positional_only(a, b=1, /, c=2):  # type: ignore[no-untyped-def]
    pass


def _everything(a, *args, b, c=3, **kwargs):  # type: ignore[no-untyped-def]
    pass


def _keywords_only(*, x, y=None):  # type: ignore[no-untyped-def]
    pass


# (positional arguments, keyword arguments) to bind, the way targets.check binds a node's keys.
CALLS: list[tuple[int, dict[str, Any]]] = [
    (0, {}),
    (1, {}),
    (2, {}),
    (0, {"a": 1}),
    (1, {"a": 1}),
    (0, {"b": 2}),
    (0, {"x": 1}),
    (0, {"x": 1, "y": 2, "z": 3}),
    (3, {"c": 1}),
    (1, {"b": 1, "c": 2, "d": 4}),
]


def _bind(signature: inspect.Signature, positional: int, keywords: dict[str, Any]) -> str:
    try:
        signature.bind(*([None] * positional), **keywords)
    except TypeError as error:
        return str(error)
    return "ok"


@pytest.mark.parametrize("function", [_positional_only, _everything, _keywords_only])
def test_a_cached_signature_binds_as_the_real_one(tmp_path: Path, monkeypatch, function) -> None:
    """Every call the checks could make succeeds or fails with the same words either way."""
    monkeypatch.setenv("HPCTRAIN_TARGET_CACHE", str(tmp_path))
    target = f"{__name__}.{function.__name__}"
    entry = signatures._entry(target, function, signatures._describe(function))
    assert entry is not None
    cached = signatures._from_entry(json.loads(json.dumps(entry)))  # through the JSON file
    assert cached is not None and cached.signature is not None
    real = inspect.signature(function)
    for positional, keywords in CALLS:
        assert _bind(cached.signature, positional, keywords) == _bind(real, positional, keywords)


def test_the_code_snapshot_finds_a_modules_files_without_importing_it(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "single.py").write_text("")
    for half in ("a", "b"):
        (tmp_path / half / "spread").mkdir(parents=True)
    (tmp_path / "a" / "alone").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    for name in ("pkg", "single", "spread", "alone"):
        found = _top_source(name)
        assert name not in sys.modules
        module = __import__(name)
        monkeypatch.delitem(sys.modules, name)
        assert found == module_source(module), name
    assert _top_source("spread") is None  # a namespace package over two folders
    with pytest.raises(ImportError):
        _top_source("no_such_module_here")
