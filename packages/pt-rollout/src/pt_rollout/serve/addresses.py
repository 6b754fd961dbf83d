"""This node's addresses, as a trainer on another node must name them."""

from __future__ import annotations

import socket


def interface_addresses() -> list[str]:
    """This node's IPv4 addresses other than loopback, one per interface that has one
    (Linux's SIOCGIFADDR)."""
    import fcntl
    import struct

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            address = socket.inet_ntoa(packed[20:24])
            if not address.startswith("127.") and address not in found:
                found.append(address)
    return found


def how_trainers_name(port: int) -> str:
    """What a trainer on another node puts in ``rollout.servers`` for a process listening
    on every address of this node at ``port``: this node's host name where it resolves to
    an address other than loopback, else its addresses (a name that resolves to 127.0.1.1,
    as on many Debian nodes, would send the trainer to its own loopback)."""
    name = socket.gethostname()
    try:
        resolved = sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)})
    except OSError:
        resolved = []
    if resolved and not any(str(a).startswith("127.") for a in resolved):
        return f"a trainer's rollout.servers: [{name}:{port}]"
    addresses = interface_addresses()
    why = (
        f"this node's name {name} resolves to {', '.join(map(str, resolved))} here"
        if resolved
        else f"this node's name {name} does not resolve here"
    )
    if not addresses:
        return f"{why}, and it has no other IPv4 address: a trainer must be on this node"
    entries = ", ".join(f"{a}:{port}" for a in addresses)
    return f"a trainer's rollout.servers: [{addresses[0]}:{port}] ({why}; its addresses: {entries})"
