"""The chaos soak's site that blocks UDP between its nodes (scripts/chaos.py --udp-blocked).

The dev cluster's nodes all live on this machine's loopback, so dropping every UDP datagram on
`lo` is what a firewall between real nodes does to hpctrain: the ranks' heartbeats never reach
the batch script's watcher, and the keeper's pings never reach it either. Slurm itself speaks
TCP and munge a UNIX socket: neither is touched. The drop is `tc` on lo (IPv4 and IPv6), set
before the job is submitted and removed at the soak's end; it needs root.
Nothing else on the machine can use UDP on the loopback meanwhile: run it alone, never beside
the test suite.
"""

from __future__ import annotations

import socket
import subprocess

DEVICE = "lo"
# Kernels without tc's `drop` action (act_gact) are common in VMs and containers: each UDP
# datagram is instead classified to a leaf class whose queue holds at most 1 byte (bfifo), where
# it is dropped on arrival; everything else goes to a default class at 100 Gbit/s (unshaped).
_COMMANDS = [
    ["tc", "qdisc", "add", "dev", DEVICE, "root", "handle", "1:", "htb", "default", "10"],
    ["tc", "class", "add", "dev", DEVICE, "parent", "1:", "classid", "1:10", "htb", "rate", "100gbit"],
    ["tc", "class", "add", "dev", DEVICE, "parent", "1:", "classid", "1:20", "htb"]
    + ["rate", "8bit", "ceil", "8bit", "burst", "1b", "cburst", "1b"],
    ["tc", "qdisc", "add", "dev", DEVICE, "parent", "1:20", "handle", "20:", "bfifo", "limit", "1"],
    ["tc", "filter", "add", "dev", DEVICE, "parent", "1:", "protocol", "ip", "prio", "1", "u32"]
    + ["match", "ip", "protocol", "17", "0xff", "flowid", "1:20"],
    ["tc", "filter", "add", "dev", DEVICE, "parent", "1:", "protocol", "ipv6", "prio", "2", "u32"]
    + ["match", "ip6", "protocol", "17", "0xff", "flowid", "1:20"],
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
    for number, command in enumerate(_COMMANDS):
        done = _tc(command)
        if done.returncode != 0:
            if number:  # the root qdisc is ours: removing it removes the rest
                unblock()
            raise UdpBlockError(
                f"`{' '.join(command)}` failed (root? a root qdisc on {DEVICE} already?): {done.stderr.strip()}"
            )
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
