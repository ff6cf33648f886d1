"""Host files for groups of real ranks over the ring backend on loopback."""

from __future__ import annotations

import json
import socket
from pathlib import Path


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def write_ring_hostfile(path: Path, num_ranks: int) -> Path:
    """The ring backend's host file: per rank, the list of addresses it listens on."""
    path.write_text(json.dumps([[f"127.0.0.1:{port}"] for port in free_ports(num_ranks)]))
    return path
