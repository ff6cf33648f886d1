"""Groups of real ranks over the ring backend on loopback: their host file, and running
one process per rank together."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Mapping, Sequence
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


def run_ranks(command: Sequence[str], environments: Sequence[Mapping[str, str]], timeout: float):
    """Run `command` once per environment, all at once; assert each exits with 0 within
    `timeout` seconds (its output in the message), killing any left running."""
    processes = []
    try:
        for environ in environments:
            processes.append(
                subprocess.Popen(
                    command,
                    env=dict(environ),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        for process in processes:
            log, _ = process.communicate(timeout=timeout)
            assert process.returncode == 0, log
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
