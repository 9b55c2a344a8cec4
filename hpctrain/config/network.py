"""slurm.network: how a site's nodes reach each other, for sites whose fast network is not the
one their host names resolve to.

    slurm:
      network:
        socket_ifname: ib0            # NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME
        master_addr_suffix: i         # MASTER_ADDR = rank 0's node name + "i" (node1 -> node1i)
        master_addr_ifname: ""        # or: MASTER_ADDR = rank 0's IPv4 address on this interface

Values reach the job script and the environment of every task, so each is checked by key: only
the characters of interface and host names get through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpctrain.config.checks import require

# Linux interface names: at most 15 characters (IFNAMSIZ 16 with the NUL), no '/' or space.
_IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
# What may follow a node name and still be a host name (DNS labels, dots between them).
_SUFFIX = re.compile(r"^[A-Za-z0-9.-]*$")


@dataclass
class NetworkConfig:
    # Interfaces NCCL and gloo open their sockets on, comma-separated ("ib0" or "ib0,ib1");
    # exported as NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME. Empty leaves both to choose.
    socket_ifname: str = ""
    # Appended to rank 0's Slurm node name to make MASTER_ADDR ("i": node1 -> node1i), for sites
    # that name nodes on their fast network that way. Empty: the node name itself.
    master_addr_suffix: str = ""
    # Or: MASTER_ADDR is rank 0's IPv4 address on this interface ("ib0"). Empty: not used.
    master_addr_ifname: str = ""

    def __post_init__(self) -> None:
        key = "slurm.network.socket_ifname"
        for name in self.socket_ifname.split(",") if self.socket_ifname else ():
            require(
                bool(_IFNAME.match(name)),
                key,
                f"{name!r} is not an interface name (letters, digits, _ . : -, at most 15); "
                "list exact names with commas (NCCL's ^ and = forms: export NCCL_SOCKET_IFNAME in slurm.setup)",
            )
        require(
            bool(_SUFFIX.match(self.master_addr_suffix)),
            "slurm.network.master_addr_suffix",
            f"{self.master_addr_suffix!r} may hold only letters, digits, '.' and '-' (it ends a host name)",
        )
        require(
            self.master_addr_ifname == "" or bool(_IFNAME.match(self.master_addr_ifname)),
            "slurm.network.master_addr_ifname",
            f"{self.master_addr_ifname!r} is not an interface name (letters, digits, _ . : -, at most 15)",
        )
        require(
            not (self.master_addr_suffix and self.master_addr_ifname),
            "slurm.network.master_addr_suffix",
            "set master_addr_suffix or master_addr_ifname, not both",
        )

    def socket_env(self) -> dict[str, str]:
        """The variables every task gets: gloo takes the same comma-separated names as NCCL."""
        if not self.socket_ifname:
            return {}
        return {"NCCL_SOCKET_IFNAME": self.socket_ifname, "GLOO_SOCKET_IFNAME": self.socket_ifname}
