"""The beater looks the watcher's name up once, not on every beat (hpctrain/process/heartbeat.py):
thousands of ranks beating once a second must not ask the site's resolver thousands of times."""

from __future__ import annotations

import socket

import pytest

from hpctrain.process import heartbeat
from hpctrain.run.heartbeats import Beat


def test_one_lookup_for_many_beats_and_again_only_after_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as watcher:
        watcher.bind(("127.0.0.1", 0))
        watcher.settimeout(5)
        port = watcher.getsockname()[1]
        lookups: list[str] = []
        real_getaddrinfo = socket.getaddrinfo

        def counted(host: str, *args: object, **kwargs: object) -> list:
            lookups.append(host)
            if len(lookups) == 1:
                raise socket.gaierror("the resolver is away for a moment")
            return real_getaddrinfo(host, *args, **kwargs)  # type: ignore[arg-type]

        beats = 6
        alive = iter([True] * beats + [False])
        parent = 4242
        monkeypatch.setattr(socket, "getaddrinfo", counted)
        monkeypatch.setattr(heartbeat.signal, "signal", lambda *_: None)  # the test process keeps its own
        monkeypatch.setattr(heartbeat.os, "getppid", lambda: parent if next(alive) else 1)
        monkeypatch.setattr(heartbeat.time, "sleep", lambda _s: None)
        ticks = iter(range(1000))
        heartbeat.beat(f"localhost:{port}", 3, "node7", "0", parent, clock=lambda: float(next(ticks)))

        got = [Beat.decode(watcher.recvfrom(4096)[0]) for _ in range(beats + 1)]
    # The lookup before the first beat failed; the one at the first beat held for every beat after
    # it and for the bye.
    assert lookups == ["localhost", "localhost"]
    assert [b.seq for b in got if b is not None and not b.bye] == list(range(beats))
    assert got[-1] is not None and got[-1].bye
