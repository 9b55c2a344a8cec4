"""The chaos soak's site that blocks UDP between its nodes (scripts/chaos.py --udp-blocked).

The dev cluster's nodes all live on this machine's loopback, so dropping every UDP datagram on
`lo` is what a firewall between real nodes does to hpctrain: the ranks' heartbeats never reach
the batch script's watcher, and the keeper's pings never reach it either. Slurm itself speaks
TCP and munge a UNIX socket: neither is touched. The drop is a `tc` filter on lo's egress (both
IPv4 and IPv6), added before the job is submitted and removed at the soak's end; it needs root.
Nothing else on the machine can use UDP on the loopback meanwhile: run it alone, never beside
the test suite.
"""

from __future__ import annotations

import socket
import subprocess

DEVICE = "lo"
_ADD_QDISC = ["tc", "qdisc", "add", "dev", DEVICE, "root", "handle", "1:", "prio"]
_FILTERS = [
    ["tc", "filter", "add", "dev", DEVICE, "parent", "1:", "protocol", "ip", "prio", "1", "u32"]
    + ["match", "ip", "protocol", "17", "0xff", "action", "drop"],
    ["tc", "filter", "add", "dev", DEVICE, "parent", "1:", "protocol", "ipv6", "prio", "2", "u32"]
    + ["match", "ip6", "protocol", "17", "0xff", "action", "drop"],
]
_REMOVE = ["tc", "qdisc", "del", "dev", DEVICE, "root", "handle", "1:"]


class UdpBlockError(RuntimeError):
    pass


def _tc(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30)
    except FileNotFoundError as error:
        raise UdpBlockError("`tc` (iproute2) is not installed: --udp-blocked needs it") from error


def block() -> None:
    """Every UDP datagram on the loopback dropped from now on; raises UdpBlockError (saying why)
    when that cannot be done, leaving nothing half set."""
    added = _tc(_ADD_QDISC)
    if added.returncode != 0:
        raise UdpBlockError(f"`{' '.join(_ADD_QDISC)}` failed (root? a qdisc already there?): {added.stderr.strip()}")
    for command in _FILTERS:
        done = _tc(command)
        if done.returncode != 0:
            unblock()
            raise UdpBlockError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    if delivered():
        unblock()
        raise UdpBlockError("a UDP datagram to this machine still arrived with the filter in place")


def unblock() -> None:
    _tc(_REMOVE)


def delivered(timeout_s: float = 0.5) -> bool:
    """Whether a UDP datagram sent to 127.0.0.1 arrives (the check that the block holds)."""
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender,
    ):
        receiver.bind(("127.0.0.1", 0))
        receiver.settimeout(timeout_s)
        sender.sendto(b"are you there", receiver.getsockname())
        try:
            return receiver.recv(64) == b"are you there"
        except TimeoutError:
            return False
