"""Stand-ins for Slurm's commands that answer a script of replies, one per call, and log every
call: for the plumbing of hpctrain.slurm.client and its callers (exit codes, silences, retries).
Their words come from the dev cluster (tests/fixtures/slurm)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"

# Each call takes the next numbered reply of its command (`scontrol.requeue`: of `scontrol
# requeue ...` only, when such replies exist), the last one once they run out.
SCRIPT = """#!/bin/sh
echo "{name} $*" >> "$FAKE_SLURM/calls.log"
key={name}
if [ -n "$1" ] && [ -d "$FAKE_SLURM/{name}.$1" ]; then key="{name}.$1"; fi
n=$(/bin/cat "$FAKE_SLURM/$key/n" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$FAKE_SLURM/$key/n"
d="$FAKE_SLURM/$key/$n"; [ -d "$d" ] || d="$FAKE_SLURM/$key/last"
if [ -f "$d/sleep" ]; then /bin/sleep "$(/bin/cat "$d/sleep")"; fi
if [ -f "$d/out" ]; then /bin/cat "$d/out"; fi
if [ -f "$d/err" ]; then /bin/cat "$d/err" >&2; fi
exit "$(/bin/cat "$d/rc" 2>/dev/null || echo 0)"
"""


@dataclass(frozen=True)
class Said:
    out: str = ""
    err: str = ""
    rc: int = 0
    sleep_s: float = 0.0


def captured(name: str) -> Said:
    """What a Slurm command printed on the dev cluster while slurmctld did not answer."""
    folder = FIXTURES / "no_answer"
    return Said(err=(folder / f"{name}.err").read_text(), rc=int((folder / f"{name}.rc").read_text()))


class FakeSlurm:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.bin = folder / "bin"
        self.bin.mkdir(parents=True)

    def says(self, key: str, *replies: Said) -> FakeSlurm:
        """`key` is a command (`squeue`) or a command and its first word (`scontrol.requeue`)."""
        name = key.split(".")[0]
        script = self.bin / name
        if not script.exists():
            script.write_text(SCRIPT.format(name=name))
            script.chmod(0o755)
        for index, said in [*enumerate(replies, start=1), ("last", replies[-1])]:
            folder = self.folder / key / str(index)
            folder.mkdir(parents=True)
            (folder / "out").write_text(said.out)
            (folder / "err").write_text(said.err)
            (folder / "rc").write_text(str(said.rc))
            if said.sleep_s:
                (folder / "sleep").write_text(str(said.sleep_s))
        return self

    def calls(self, name: str | None = None) -> list[list[str]]:
        log = self.folder / "calls.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line.split() for line in lines if name is None or line.split()[0] == name]


def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """Only the fake commands on PATH, no job around: the real Slurm cannot answer."""
    fake = FakeSlurm(tmp_path / "fake-slurm")
    monkeypatch.setenv("PATH", str(fake.bin))
    monkeypatch.setenv("FAKE_SLURM", str(fake.folder))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    return fake
