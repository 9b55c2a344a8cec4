"""The address this node is reached at by the others of its job, decided on the node itself:
its IPv4 address on `slurm.network.master_addr_ifname`, else its Slurm node name plus
`slurm.network.master_addr_suffix`, else its node name where that resolves (NodeName may differ
from the host name) or its host name. Rank 0 publishes it for the rendezvous
(hpctrain.dist.rendezvous), the batch script's heartbeat watcher for the beats
(hpctrain.recovery.watch): part of how the processes of one job find each other, so here in the
run protocol, which both may import. Standard library only: the watcher starts without torch.
"""

from __future__ import annotations

import fcntl
import socket
import struct


def rank0_address(node: str, suffix: str = "", ifname: str = "") -> str:
    """The address this node tells the others (rank 0's, the watcher's); `node` is its Slurm name."""
    if ifname:
        return interface_ipv4(ifname)
    if suffix:
        return (node or socket.gethostname()) + suffix
    return node if node and resolves(node) else socket.gethostname()


def interface_ipv4(ifname: str) -> str:
    """This node's IPv4 address on `ifname` (Linux SIOCGIFADDR; the standard library has no
    portable call for it)."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            answer = fcntl.ioctl(probe.fileno(), siocgifaddr, struct.pack("256s", ifname.encode()[:15]))
        except OSError as error:
            raise OSError(
                f"slurm.network.master_addr_ifname: {socket.gethostname()} has no IPv4 address on "
                f"interface {ifname!r} ({error.strerror}); `ip -4 addr` on a node lists them"
            ) from None
    return socket.inet_ntoa(answer[20:24])


def resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except OSError:
        return False
