"""A group on this machine: ranks 1..N-1 as child processes, this process rank 0.

Two backends, configured as `mlx.launch` configures them:

- ring: each rank gets a free loopback port; the host file (`MLX_HOSTFILE`) lists one
  `["127.0.0.1:PORT"]` per rank in rank order.
- nccl (CUDA, one GPU per rank): `MLX_WORLD_SIZE`, and `NCCL_HOST_IP`/`NCCL_PORT` naming
  where rank 0 hands out NCCL's unique id (MLX binds the port on every interface, so it is
  chosen free on all of them).

Children run the same command with `MLX_RANK` set, so they join the group as the other
ranks. Given the machine's GPUs, child rank r sees only GPU r (modulo their number) through
`CUDA_VISIBLE_DEVICES`, so ranks spread over the GPUs; rank 0 keeps the GPUs it sees and
runs on the first. On Linux a child is killed when its parent dies (`PR_SET_PDEATHSIG`); a
child that exits before `stop` is reported through `on_exit`.

Joining a group blocks inside MLX without releasing Python's lock, so nothing in rank
0 could report a child that dies while rank 0 waits there. Each child therefore says it is
about to join by writing one byte to the file descriptor named in `READY_FD_VARIABLE`, and
rank 0 joins only once every child has (`wait_until_ready`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

import mlx.core as mx

LOOPBACK = "127.0.0.1"
READY_FD_VARIABLE = "MLXCEL_RANK_READY_FD"
ANY_ADDRESS = "0.0.0.0"
BACKENDS = ("ring", "nccl")
_PR_SET_PDEATHSIG = 1


def free_ports(count: int, *, address: str = LOOPBACK) -> list[int]:
    """`count` distinct TCP ports nothing listens on now on `address` (loopback by default;
    `ANY_ADDRESS` for ports free on every interface)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((address, 0))
        return [sock.getsockname()[1] for sock in sockets]


def write_ring_hostfile(ports: Sequence[int], directory: Path) -> Path:
    """The ring backend's host file for one rank per port on 127.0.0.1, rank order."""
    path = directory / "hostfile.json"
    path.write_text(json.dumps([[f"{LOOPBACK}:{port}"] for port in ports]), encoding="utf-8")
    return path


def ring_environments(size: int, directory: Path) -> list[dict[str, str]]:
    """Per rank, the variables that make it rank r of a ring group of `size` on loopback;
    the host file is written to `directory`."""
    hostfile = write_ring_hostfile(free_ports(size), directory)
    return [{"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)} for rank in range(size)]


def nccl_environments(size: int, environ: Mapping[str, str]) -> list[dict[str, str]]:
    """Per rank, the variables that make it rank r of an NCCL group of `size` on this
    machine. NCCL's own traffic stays on loopback unless `environ` names an interface."""
    (port,) = free_ports(1, address=ANY_ADDRESS)
    shared = {
        "MLX_WORLD_SIZE": str(size),
        "NCCL_HOST_IP": LOOPBACK,
        "NCCL_PORT": str(port),
        "NCCL_SOCKET_IFNAME": environ.get("NCCL_SOCKET_IFNAME", "lo"),
    }
    return [{**shared, "MLX_RANK": str(rank)} for rank in range(size)]


def visible_cuda_devices(environ: Mapping[str, str]) -> list[str]:
    """The CUDA GPUs this process may use, as `CUDA_VISIBLE_DEVICES` entries (indices or
    UUIDs), in MLX's device order; empty without MLX's CUDA backend."""
    if not mx.cuda.is_available():
        return []
    count = mx.device_count(mx.gpu)
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(index) for index in range(count)]
    return [entry.strip() for entry in listed.split(",") if entry.strip()][:count]


def local_backend(size: int, devices: Sequence[str]) -> str:
    """NCCL when every one of `size` ranks can have a GPU of its own, else ring."""
    return "nccl" if len(devices) >= size else "ring"


def _die_with_parent() -> None:
    # Runs in the child between fork and exec. The signal follows the parent *thread* that
    # forked, so ranks must be started from a thread that lives as long as the command.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class LocalRanks:
    """Ranks 1..size-1 running `command` as children of this process (rank 0).

    Args:
        command: the program and arguments every rank runs.
        size: ranks in the group, this process included (>= 2).
        environ: the children's environment, before the group's variables are added.
        on_exit: called on a watcher thread with (rank, exit code) when a child ends before
            `stop`.
        backend: "ring" or "nccl" (see the module).
        devices: the GPUs to spread the ranks over, as `CUDA_VISIBLE_DEVICES` entries
            (`visible_cuda_devices`); empty leaves the children's devices alone.

    Attributes:
        environment: the group's variables for this process, rank 0, to join with.

    Raises:
        ValueError: `size` < 2, an unknown backend, or "nccl" with fewer devices than
            ranks (NCCL needs a GPU per rank).
        OSError: a child cannot be started.
    """

    def __init__(
        self,
        command: Sequence[str],
        size: int,
        *,
        environ: Mapping[str, str],
        on_exit: Callable[[int, int], None],
        backend: str = "ring",
        devices: Sequence[str] = (),
    ) -> None:
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if backend == "nccl" and len(devices) < size:
            raise ValueError(f"nccl needs a GPU per rank: {size} ranks, {len(devices)} GPUs")
        self._directory = tempfile.TemporaryDirectory(prefix="mlxcel-ranks-")
        if backend == "ring":
            ranks = ring_environments(size, Path(self._directory.name))
        else:
            ranks = nccl_environments(size, environ)
        if devices:
            for rank, variables in enumerate(ranks[1:], start=1):
                variables["CUDA_VISIBLE_DEVICES"] = devices[rank % len(devices)]
        self.environment = ranks[0]
        self._on_exit = on_exit
        self._stopping = threading.Event()
        self._processes: list[subprocess.Popen] = []
        self._ready, ready_writer = os.pipe()
        try:
            for variables in ranks[1:]:
                self._processes.append(
                    subprocess.Popen(
                        list(command),
                        env={**environ, **variables, READY_FD_VARIABLE: str(ready_writer)},
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        pass_fds=(ready_writer,),
                        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                    )
                )
        except OSError:
            self.stop(timeout=0)
            raise
        finally:
            os.close(ready_writer)
        self._watchers = [
            threading.Thread(
                target=self._watch, args=(rank, process), name=f"mlxcel-rank-{rank}", daemon=True
            )
            for rank, process in enumerate(self._processes, start=1)
        ]
        for watcher in self._watchers:
            watcher.start()

    def _watch(self, rank: int, process: subprocess.Popen) -> None:
        code = process.wait()
        if not self._stopping.is_set():
            self._on_exit(rank, code)

    def wait_until_ready(self) -> bool:
        """Wait until every child has signalled it is joining the group (`signal_ready`).

        Returns:
            False when the children ended before all signalled, once `on_exit` has been
            called for each of them.
        """
        missing = len(self._processes)
        while missing:
            signalled = os.read(self._ready, missing)
            if not signalled:  # every child has exited or closed its end
                for watcher in self._watchers:
                    watcher.join()
                return False
            missing -= len(signalled)
        return True

    def stop_watching(self) -> None:
        """From now on a child's exit is expected: `on_exit` is no longer called."""
        self._stopping.set()

    def stop(self, timeout: float) -> dict[int, int]:
        """Stop watching, wait up to `timeout` seconds for the children to end, then kill
        those still running.

        Returns:
            Each child's exit code, by rank (negative: ended by that signal).
        """
        self.stop_watching()
        deadline = time.monotonic() + timeout
        codes = {}
        for rank, process in enumerate(self._processes, start=1):
            try:
                codes[rank] = process.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                process.kill()
                codes[rank] = process.wait()
        os.close(self._ready)
        self._directory.cleanup()
        return codes


def signal_ready(ready_fd: int) -> None:
    """In a child: tell rank 0 this rank is about to join the group (see the module)."""
    os.write(ready_fd, b"r")
    os.close(ready_fd)
