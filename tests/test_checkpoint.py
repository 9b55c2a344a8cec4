"""Checkpoint files, snapshots, RNG state and the background writer: pure logic on real files.

Everything here runs in this process on tiny states; the end-to-end proofs (a real signal to a
real training run, then a bit-identical resume) are in test_signals.py.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hpctrain import faults
from hpctrain.checkpoint import NoUsableCheckpoint, PlainCheckpointer, rng, store, transient
from hpctrain.checkpoint.snapshot import Snapshotter
from hpctrain.checkpoint.writer import BackgroundWriter
from hpctrain.dist.context import DistContext
from hpctrain.run.causes import CheckpointReason
from hpctrain.run.events import Checkpoint

STORE_LOG = "hpctrain.checkpoint.store"


def make_state(seed: int) -> dict[str, Any]:
    """A small training-state-shaped tree: tensors, nested dicts, lists, RNG tuples, scalars."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {
            "fc.weight": torch.randn(4, 3, generator=generator),
            "fc.bias": torch.randn(4, generator=generator),
            "steps": torch.tensor(seed, dtype=torch.int64),
        },
        "optimizer": {
            "state": {0: {"exp_avg": torch.randn(4, 3, generator=generator), "step": torch.tensor(float(seed))}},
            "param_groups": [{"lr": 1e-3 * (seed + 1), "betas": (0.9, 0.999), "params": [0, 1]}],
        },
        "scheduler": None,
        "train": {"step": seed, "epoch": seed // 22, "batch_in_epoch": seed % 22},
        "rng": [rng.capture()],
        "world_size": 1,
        "fingerprint": f"fp-{seed}",
    }


def assert_same_tree(actual: Any, expected: Any, where: str = "state") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: {type(actual)} is not a tensor"
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        assert torch.equal(actual, expected), f"{where}: values differ"
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), f"{where}: keys differ"
        for key in expected:
            assert_same_tree(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), f"{where}: {type(actual)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same_tree(a, e, f"{where}/{i}")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def write(folder: Path, step: int, reason: str = "periodic") -> dict[str, Any]:
    state = make_state(step)
    store.write(folder, step, state, {"reason": reason})
    return state


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---- store: write / load_newest ------------------------------------------------------------


def test_write_then_load_newest_round_trips_the_state(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    state = write(folder, 120, reason="preempt")

    found = store.load_newest(folder)

    assert found is not None
    entry, loaded = found
    assert entry.step == 120
    assert entry.data.name == "step_00000120.pt" and entry.meta.name == "step_00000120.json"
    assert_same_tree(loaded, state)
    # The Python RNG state comes back as the very tuple random.setstate takes.
    assert loaded["rng"][0]["python"] == state["rng"][0]["python"]
    assert file_names(folder) == ["step_00000120.json", "step_00000120.pt"]

    meta = json.loads(entry.meta.read_text())
    assert meta["step"] == 120 and meta["reason"] == "preempt"
    assert meta["size"] == entry.data.stat().st_size
    assert meta["sha256"] == sha256(entry.data)
    assert store.verify(entry)["sha256"] == meta["sha256"]


def test_newest_of_several_wins(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    for step in (5, 100, 20):  # written out of order: the step in the name decides
        write(folder, step)
    found = store.load_newest(folder)
    assert found is not None and found[0].step == 100
    assert found[1]["train"]["step"] == 100
    assert [e.step for e in store.entries(folder)] == [100, 20, 5]


class _Unpicklable:
    def __reduce__(self) -> Any:
        raise pickle.PicklingError("this object cannot be saved")


def _save_half_then_fail(obj: Any, file: Any, *args: Any, **kwargs: Any) -> None:
    file.write(b"PK\x03\x04" + b"\0" * 4096)  # the start of a checkpoint...
    raise OSError(28, "No space left on device")  # ...then the disk is full


@pytest.mark.parametrize("failure", ["disk-full-mid-file", "unpicklable-state", "failure-writing-json"])
def test_a_failed_write_leaves_no_temporary_file_and_the_previous_checkpoint_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    folder = tmp_path / "checkpoints"
    previous = write(folder, 10)
    before = {name: sha256(folder / name) for name in file_names(folder)}

    state = make_state(20)
    if failure == "disk-full-mid-file":
        monkeypatch.setattr(store.torch, "save", _save_half_then_fail)
        expected: type[BaseException] = OSError
    elif failure == "unpicklable-state":
        state["extra"] = {"hook": _Unpicklable()}
        expected = Exception
    else:

        def no_json(*args: Any, **kwargs: Any) -> str:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(store.json, "dumps", no_json)
        expected = OSError
    with pytest.raises(expected):
        store.write(folder, 20, state, {"reason": CheckpointReason.PERIODIC})
    monkeypatch.undo()

    assert not list(folder.glob("*.tmp")), file_names(folder)
    assert not (folder / "step_00000020.json").exists(), "a failed checkpoint must not look complete"
    assert not (folder / "step_00000020.pt").exists(), "nor leave a data file that blocks the disk"
    # The earlier checkpoint's files are byte for byte what they were, and it is the one loaded.
    assert {name: sha256(folder / name) for name in before} == before
    assert [e.step for e in store.entries(folder)] == [10]
    found = store.load_newest(folder)
    assert found is not None and found[0].step == 10
    assert_same_tree(found[1], previous)


def _truncate(entry: store.Entry) -> None:
    data = entry.data.read_bytes()
    entry.data.write_bytes(data[: len(data) // 2])


def _flip_a_byte(entry: store.Entry) -> None:
    data = bytearray(entry.data.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.data.write_bytes(bytes(data))


def _remove_data(entry: store.Entry) -> None:
    entry.data.unlink()


def _garbage_meta(entry: store.Entry) -> None:
    entry.meta.write_text("{ this is not json")


@pytest.mark.parametrize(
    "damage", [_truncate, _flip_a_byte, _remove_data, _garbage_meta], ids=["torn", "corrupt", "missing-pt", "bad-json"]
)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Any
) -> None:
    folder = tmp_path / "checkpoints"
    older = write(folder, 22)
    write(folder, 44)
    damage(store.paths_for(folder, 44))

    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        found = store.load_newest(folder)

    assert found is not None
    assert found[0].step == 22
    assert_same_tree(found[1], older)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == STORE_LOG]
    assert warnings, caplog.text
    assert any("step_00000044" in r.getMessage() for r in warnings), caplog.text
    assert not any("step_00000022" in r.getMessage() for r in warnings), "the good checkpoint was not warned about"


def test_verify_names_what_is_wrong(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    write(folder, 7)
    entry = store.paths_for(folder, 7)
    _truncate(entry)
    with pytest.raises(ValueError, match=r"step_00000007\.pt: .*torn"):
        store.verify(entry)
    write(folder, 8)
    entry = store.paths_for(folder, 8)
    _flip_a_byte(entry)
    with pytest.raises(ValueError, match=r"step_00000008\.pt: checksum mismatch"):
        store.verify(entry)


def test_when_every_checkpoint_is_bad_load_refuses_to_start_over(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    write(folder, 10)
    write(folder, 20)
    _flip_a_byte(store.paths_for(folder, 10))
    _truncate(store.paths_for(folder, 20))

    with pytest.raises(NoUsableCheckpoint) as raised:
        store.load_newest(folder)

    message = str(raised.value)
    assert "Refusing to start over" in message
    assert "step_00000010.pt" in message and "step_00000020.pt" in message


CUT_WRITE = """
import sys, torch
from hpctrain.checkpoint import store
folder, steps = sys.argv[1], [int(s) for s in sys.argv[2:]]
for step in steps:
    torch.manual_seed(step)
    store.write(__import__("pathlib").Path(folder), step, {"w": torch.randn(64)}, {"reason": "periodic"})
"""


def _write_then_cut(folder: Path, *steps: int) -> subprocess.CompletedProcess[str]:
    """Write `steps` in a process SIGKILLed between the last one's two renames (a fault point)."""
    env = {**os.environ, faults.ENV: f"checkpoint.between_renames=kill@{len(steps)}"}
    command = [sys.executable, "-c", CUT_WRITE, str(folder), *map(str, steps)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("older", [(), (10,)], ids=["alone", "after-another"])
def test_a_write_killed_between_its_two_renames_is_resumed_from(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, older: tuple[int, ...]
) -> None:
    """Its .pt is whole (renamed after fsync), its .json never landed: the run resumes from it,
    whether or not an older checkpoint exists (alone, it used to fail the run as a user error)."""
    folder = tmp_path / "checkpoints"
    cut = _write_then_cut(folder, *older, 20)
    assert cut.returncode == -signal.SIGKILL, cut.stderr
    assert (folder / "step_00000020.pt").is_file() and not (folder / "step_00000020.json").exists()
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        found = store.load_newest(folder)
    assert found is not None and found[0].step == 20
    torch.manual_seed(20)
    assert torch.equal(found[1]["w"], torch.randn(64))
    assert "step_00000020.pt has no step_00000020.json" in caplog.text


def test_a_lone_data_file_that_does_not_load_blocks_a_silent_fresh_start(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "step_00000003.pt").write_bytes(b"not a checkpoint")
    assert store.entries(folder) == []
    with pytest.raises(NoUsableCheckpoint, match="Refusing to start over"):
        store.load_newest(folder)


def test_prune_removes_unpublished_data_older_than_what_it_keeps(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    assert _write_then_cut(folder, 10, 20).returncode == -signal.SIGKILL  # 20 left without its .json
    for step in (30, 40, 50):
        write(folder, step)
    store.prune(folder, keep=2)
    assert sorted(p.name for p in folder.iterdir()) == [
        "step_00000040.json",
        "step_00000040.pt",
        "step_00000050.json",
        "step_00000050.pt",
    ]


def test_an_empty_or_missing_folder_means_a_fresh_run(tmp_path: Path) -> None:
    assert store.load_newest(tmp_path / "does-not-exist") is None
    empty = tmp_path / "checkpoints"
    empty.mkdir()
    assert store.load_newest(empty) is None
    assert store.entries(empty) == []


# ---- store: prune ----------------------------------------------------------------------------


def test_prune_keeps_the_newest_n(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    for step in (10, 20, 30, 40, 50):
        write(folder, step)
    (folder / "step_00000060.pt.tmp").write_bytes(b"half a checkpoint")

    store.prune(folder, keep=2)

    assert file_names(folder) == ["step_00000040.json", "step_00000040.pt", "step_00000050.json", "step_00000050.pt"]
    found = store.load_newest(folder)
    assert found is not None and found[0].step == 50


def test_a_torn_checkpoint_is_not_counted_among_those_prune_keeps(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    for step in (10, 20, 30, 40):
        write(folder, step)
    torn = folder / "step_00000040.pt"
    torn.write_bytes(torn.read_bytes()[:100])  # cut short, its .json whole: a torn write

    store.prune(folder, keep=2)

    # Two whole ones kept (30 and 20), not the torn 40 and 30 alone; the torn one is deleted (no
    # load could use it).
    assert [e.step for e in store.entries(folder)] == [30, 20]
    assert sorted(p.name for p in folder.iterdir())[0] == "step_00000020.json" and not torn.exists()
    found = store.load_newest(folder)
    assert found is not None and found[0].step == 30


def test_a_data_file_without_its_json_is_not_counted_by_prune_but_is_loaded(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    for step in (10, 20, 30):
        write(folder, step)
    torch.save(make_state(40), folder / "step_00000040.pt")  # newer, but its .json never landed

    assert [e.step for e in store.entries(folder)] == [30, 20, 10]
    store.prune(folder, keep=2)

    # The stray .pt neither counted as one of the two kept nor pushed a complete one out, and
    # prune left it (newer than the kept ones: it may be a write under way).
    assert [e.step for e in store.entries(folder)] == [30, 20]
    assert (folder / "step_00000030.pt").exists() and (folder / "step_00000020.pt").exists()
    assert not (folder / "step_00000010.pt").exists() and not (folder / "step_00000010.json").exists()
    assert (folder / "step_00000040.pt").exists()
    # At a start nothing is under way: it is whole (renamed after fsync), and the newest.
    found = store.load_newest(folder)
    assert found is not None and found[0].step == 40


# ---- snapshots -----------------------------------------------------------------------------


@dataclass
class Meta:
    names: list[str]


def test_snapshots_reuse_their_buffers_for_the_same_shapes() -> None:
    source = {"model": {"w": torch.randn(8, 4), "b": torch.zeros(4)}, "moments": [torch.ones(3), torch.ones(2, 2)]}
    snapshotter = Snapshotter()

    first = snapshotter.take(source)
    first_tensors = [first["model"]["w"], first["model"]["b"], *first["moments"]]
    pointers = [t.data_ptr() for t in first_tensors]
    with torch.no_grad():
        source["model"]["w"].add_(1.0)
    second = snapshotter.take(source)
    second_tensors = [second["model"]["w"], second["model"]["b"], *second["moments"]]

    for a, b in zip(first_tensors, second_tensors):
        assert a is b
    assert [t.data_ptr() for t in second_tensors] == pointers
    assert torch.equal(second["model"]["w"], source["model"]["w"])  # the buffer holds the new values

    # Another shape at the same place gets a buffer of its own.
    source["model"]["b"] = torch.zeros(5)
    third = snapshotter.take(source)
    assert third["model"]["b"].shape == (5,)
    assert third["model"]["w"] is first["model"]["w"]


def test_a_snapshot_is_a_copy_of_the_values() -> None:
    weight = torch.randn(6, 6, requires_grad=True)
    meta = Meta(names=["a", "b"])
    source = {"model": {"w": weight}, "meta": meta, "groups": [{"lr": 0.1, "betas": (0.9, 0.99)}], "n": 3}
    expected = weight.detach().clone()

    snap = Snapshotter().take(source)

    assert snap["model"]["w"].data_ptr() != weight.data_ptr()
    assert not snap["model"]["w"].requires_grad
    with torch.no_grad():
        weight.mul_(0).add_(7)  # training goes on and changes the live tensor
    source["groups"][0]["lr"] = 99.0
    meta.names.append("c")
    assert torch.equal(snap["model"]["w"], expected)
    assert snap["groups"] == [{"lr": 0.1, "betas": (0.9, 0.99)}]
    assert isinstance(snap["groups"][0]["betas"], tuple)
    # Plain values are deep copies, not references into the live state.
    assert snap["meta"] is not meta and snap["meta"].names == ["a", "b"]
    assert snap["n"] == 3


def test_tied_tensors_are_copied_once_and_stay_tied_in_the_file(tmp_path: Path) -> None:
    # A GPT's state_dict lists its tied embedding/head weight under two names.
    shared = torch.randn(50, 8)
    source = {"model": {"embed.weight": shared, "head.weight": shared, "bias": torch.zeros(8)}}
    snapshotter = Snapshotter()

    snap = snapshotter.take(source)

    assert snap["model"]["embed.weight"] is snap["model"]["head.weight"]
    assert snap["model"]["embed.weight"].data_ptr() != shared.data_ptr()
    assert torch.equal(snap["model"]["head.weight"], shared)
    # Views of one storage that differ (offset, shape) are different tensors and copied apart.
    views = snapshotter.take({"a": shared[:10], "b": shared[10:20]})
    assert torch.equal(views["a"], shared[:10]) and torch.equal(views["b"], shared[10:20])

    entry = store.write(tmp_path, 1, snap, {"reason": CheckpointReason.PERIODIC})
    once = store.write(tmp_path, 2, {"model": {"embed.weight": shared.clone(), "bias": torch.zeros(8)}}, {})
    assert entry.data.stat().st_size < once.data.stat().st_size + 1024, "the tied weight was written twice"
    loaded = torch.load(entry.data, weights_only=True)
    assert loaded["model"]["embed.weight"].data_ptr() == loaded["model"]["head.weight"].data_ptr()


def test_the_background_writer_runs_at_low_cpu_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stat = Path(f"/proc/self/task/{threading.get_native_id()}/stat")
    if not stat.exists():
        pytest.skip("needs Linux /proc to read a thread's nice value")
    niceness: list[int] = []
    real_write = store.write

    def observing_write(*args: Any, **kwargs: Any) -> store.Entry:
        # Field 19 of /proc/<pid>/task/<tid>/stat is the nice value (after the "(comm)" field).
        fields = Path(f"/proc/self/task/{threading.get_native_id()}/stat").read_text().rsplit(")", 1)[1].split()
        niceness.append(int(fields[16]))
        return real_write(*args, **kwargs)

    monkeypatch.setattr(store, "write", observing_write)
    writer = BackgroundWriter(tmp_path, keep=2, on_written=lambda record: None)
    writer.start(1, make_state(1), {"reason": CheckpointReason.PERIODIC}, background=True)
    writer.wait()
    writer.start(2, make_state(2), {"reason": CheckpointReason.FINAL}, background=False)

    assert niceness[0] == 19, "the background write must yield the CPU to training"
    main_nice = int(stat.read_text().rsplit(")", 1)[1].split()[16])
    assert niceness[1] == main_nice, "a foreground (forced) write keeps the training thread's priority"


# ---- RNG -----------------------------------------------------------------------------------


def _draw() -> tuple[torch.Tensor, float, np.ndarray]:
    return torch.rand(5), random.random(), np.random.rand(3)


def _assert_same_draws(a: tuple[torch.Tensor, float, np.ndarray], b: tuple[torch.Tensor, float, np.ndarray]) -> None:
    assert torch.equal(a[0], b[0])
    assert a[1] == b[1]
    assert np.array_equal(a[2], b[2])


def test_rng_capture_then_restore_replays_the_same_numbers() -> None:
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    _draw()
    state = rng.capture()
    expected = _draw()
    for _ in range(3):
        _draw()
    random.gauss(0, 1)  # leaves a cached gauss value behind

    rng.restore(state)

    _assert_same_draws(_draw(), expected)


def test_rng_state_survives_a_checkpoint_file(tmp_path: Path) -> None:
    torch.manual_seed(11)
    random.seed(12)
    np.random.seed(13)
    np.random.standard_normal()  # numpy caches the second gaussian: part of the state too
    state = rng.capture()
    expected = _draw()
    expected_gauss = np.random.standard_normal()
    store.write(tmp_path, 1, {"rng": state}, {"reason": CheckpointReason.PERIODIC})
    _draw()

    found = store.load_newest(tmp_path)  # weights_only=True, as a resume loads it
    assert found is not None
    rng.restore(found[1]["rng"])

    _assert_same_draws(_draw(), expected)
    assert np.random.standard_normal() == expected_gauss


# ---- the background writer ----------------------------------------------------------------


def test_background_writes_never_overlap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spans: list[tuple[int, float, float]] = []
    first_may_finish = threading.Event()
    real_write = store.write

    def slow_write(folder: Path, step: int, state: dict[str, Any], info: dict[str, Any], *rest: Any) -> store.Entry:
        started = time.perf_counter()
        if step == 1:
            first_may_finish.wait(30)
        time.sleep(0.1)  # long enough for a second write to start inside this one, were it allowed
        entry = real_write(folder, step, state, info, *rest)
        spans.append((step, started, time.perf_counter()))
        return entry

    monkeypatch.setattr(store, "write", slow_write)
    written: list[Checkpoint] = []
    writer = BackgroundWriter(tmp_path, keep=5, on_written=written.append)

    writer.start(1, make_state(1), {"reason": CheckpointReason.PERIODIC}, background=True)
    # start() came back while the write is still held up: training does not wait for it.
    assert spans == [] and not store.paths_for(tmp_path, 1).meta.exists()
    first_may_finish.set()
    writer.start(2, make_state(2), {"reason": CheckpointReason.PERIODIC}, background=True)
    writer.start(3, make_state(3), {"reason": CheckpointReason.FINAL}, background=False)
    writer.wait()

    assert [s[0] for s in spans] == [1, 2, 3]
    for (_, _, end), (_, next_start, _) in zip(spans, spans[1:]):
        assert end <= next_start, f"two writes overlapped: {spans}"
    assert [(r.step, r.reason) for r in written] == [
        (1, CheckpointReason.PERIODIC),
        (2, CheckpointReason.PERIODIC),
        (3, CheckpointReason.FINAL),
    ]
    assert all(r.write_s is not None and r.write_s >= 0.1 for r in written)
    assert [e.step for e in store.entries(tmp_path)] == [3, 2, 1]


def test_background_writes_prune_to_keep(tmp_path: Path) -> None:
    writer = BackgroundWriter(tmp_path, keep=2, on_written=lambda record: None)
    for step in (1, 2, 3, 4):
        writer.start(step, make_state(step), {"reason": CheckpointReason.PERIODIC}, background=True)
    writer.wait()
    assert [e.step for e in store.entries(tmp_path)] == [4, 3]


def test_an_error_in_the_background_write_is_raised_by_the_next_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def failing_write(folder: Path, step: int, state: dict[str, Any], info: dict[str, Any], *rest: Any) -> store.Entry:
        release.wait(5)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "write", failing_write)
    written: list[Checkpoint] = []
    writer = BackgroundWriter(tmp_path, keep=2, on_written=written.append)

    writer.start(
        5, make_state(5), {"reason": CheckpointReason.PERIODIC}, background=True
    )  # returns: the error comes later
    release.set()
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    writer.wait()  # reported once, then cleared
    assert written == []


# ---- the PlainCheckpointer (one process) ------------------------------------------------------


def _checkpointer(folder: Path, fingerprint: str = "fp-A", records: list | None = None) -> PlainCheckpointer:
    on_written = records.append if records is not None else (lambda record: None)
    return PlainCheckpointer(
        folder, DistContext.single(cuda_devices=0), keep=2, fingerprint=fingerprint, on_written=on_written
    )


def test_checkpointer_background_save_then_wait_then_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "checkpoints"
    records: list[Checkpoint] = []
    checkpointer = _checkpointer(folder, records=records)
    weight = torch.randn(16, 16)
    expected = weight.clone()
    state = {"model": {"w": weight}, "train": {"step": 30, "epoch": 1, "batch_in_epoch": 8}}

    may_write = threading.Event()
    real_write = store.write

    def held_write(*args: Any, **kwargs: Any) -> store.Entry:
        may_write.wait(30)  # a slow disk: the write takes as long as the test wants
        return real_write(*args, **kwargs)

    monkeypatch.setattr(store, "write", held_write)
    torch.manual_seed(5)
    random.seed(5)
    blocked = checkpointer.save(30, state, CheckpointReason.PERIODIC, background=True)
    # save() is back while the write has not even started: training goes on at once.
    assert not store.paths_for(folder, 30).data.exists() and records == []
    assert blocked >= 0
    expected_draw = torch.rand(2), random.random()
    weight.add_(1.0)  # training changes the live tensor while the write is under way
    may_write.set()
    checkpointer.wait()

    assert [e.step for e in store.entries(folder)] == [30]
    assert len(records) == 1
    assert records[0].step == 30 and records[0].reason is CheckpointReason.PERIODIC
    assert records[0].blocking_s is not None and records[0].blocking_s >= 0
    assert records[0].write_s is not None and records[0].write_s >= 0

    monkeypatch.undo()
    loaded = _checkpointer(folder).load()
    assert loaded is not None
    assert torch.equal(loaded["model"]["w"], expected), "the checkpoint must hold the values at save time"
    assert loaded["train"] == {"step": 30, "epoch": 1, "batch_in_epoch": 8}
    assert loaded["world_size"] == 1 and loaded["fingerprint"] == "fp-A"
    # "rng" is this rank's own dict (not the list of every rank's), ready for rng.restore.
    assert isinstance(loaded["rng"], dict) and {"torch", "python", "numpy"} <= loaded["rng"].keys()
    rng.restore(loaded["rng"])
    draw = torch.rand(2), random.random()
    assert torch.equal(draw[0], expected_draw[0]) and draw[1] == expected_draw[1]


def test_checkpointer_forced_save_is_on_disk_when_it_returns(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    records: list[Checkpoint] = []
    checkpointer = _checkpointer(folder, records=records)
    checkpointer.save(7, {"model": {"w": torch.ones(3)}}, CheckpointReason.PREEMPT, background=False)
    assert store.paths_for(folder, 7).meta.exists()
    assert [(r.step, r.reason) for r in records] == [(7, CheckpointReason.PREEMPT)]


def test_checkpointer_load_of_an_empty_run_is_none(tmp_path: Path) -> None:
    assert _checkpointer(tmp_path / "checkpoints").load() is None


def test_checkpointer_refuses_a_checkpoint_of_another_model(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    writer = _checkpointer(folder, fingerprint="fp-A")
    writer.save(12, {"model": {"w": torch.ones(2)}}, CheckpointReason.PERIODIC, background=False)

    with pytest.raises(ValueError, match="different model"):
        _checkpointer(folder, fingerprint="fp-B").load()


def test_checkpointer_load_reports_unusable_checkpoints(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    checkpointer = _checkpointer(folder)
    checkpointer.save(3, {"model": {"w": torch.ones(2)}}, CheckpointReason.PERIODIC, background=False)
    _flip_a_byte(store.paths_for(folder, 3))
    with pytest.raises(NoUsableCheckpoint, match="Refusing to start over"):
        checkpointer.load()


# ---- store: a filesystem that fails for a moment ------------------------------------------------


def _two_checkpoints(tmp_path: Path) -> Path:
    folder = tmp_path / "checkpoints"
    for step in (10, 20):
        write(folder, step)
    return folder


def _flaky(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[float]:
    """sha256_of fails `failures` times with EIO (an NFS server rebooting, a Lustre OST failing
    over), then reads; the retry delays are recorded instead of slept."""
    slept: list[float] = []
    real = store.sha256_of
    left = [failures]

    def flaky_sha256(path: Path) -> str:
        if left[0] > 0:
            left[0] -= 1
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real(path)

    monkeypatch.setattr(store, "sha256_of", flaky_sha256)
    monkeypatch.setattr(transient.time, "sleep", slept.append)
    return slept


def test_a_read_that_fails_for_a_moment_is_tried_again_and_the_newest_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _two_checkpoints(tmp_path)
    slept = _flaky(monkeypatch, failures=2)
    found = store.load_newest(folder)
    # Not the older checkpoint: the newest, after two tries again.
    assert found is not None and found[0].step == 20
    assert slept == list(transient.RETRY_DELAYS_S[:2])


def test_a_filesystem_that_keeps_failing_is_an_error_of_its_own_not_an_unusable_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _two_checkpoints(tmp_path)
    slept = _flaky(monkeypatch, failures=100)
    with pytest.raises(OSError) as raised:
        store.load_newest(folder)
    assert raised.value.errno == errno.EIO and not isinstance(raised.value, store.NoUsableCheckpoint)
    assert slept == list(transient.RETRY_DELAYS_S)  # tried for 15.5 s, then the error
    assert [e.step for e in store.entries(folder)] == [20, 10]  # nothing dropped or renamed
