"""A ring group on this machine: ranks 1..N-1 as child processes, this process rank 0.

Each rank gets a free loopback port; the ring backend's host file (`MLX_HOSTFILE`) lists
one `["127.0.0.1:PORT"]` per rank in rank order, the format `mlx.launch --backend ring`
writes. Children run the same command with `MLX_RANK` set, so they join the group as the
other ranks. On Linux a child is killed when its parent dies (`PR_SET_PDEATHSIG`); a child
that exits before `stop` is reported through `on_exit`.

Joining a ring group blocks inside MLX without releasing Python's lock, so nothing in rank
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

LOOPBACK = "127.0.0.1"
READY_FD_VARIABLE = "MLXCEL_RANK_READY_FD"
_PR_SET_PDEATHSIG = 1


def free_loopback_ports(count: int) -> list[int]:
    """`count` distinct TCP ports nothing listens on now on 127.0.0.1."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]


def write_ring_hostfile(ports: Sequence[int], directory: Path) -> Path:
    """The ring backend's host file for one rank per port on 127.0.0.1, rank order."""
    path = directory / "hostfile.json"
    path.write_text(json.dumps([[f"{LOOPBACK}:{port}"] for port in ports]), encoding="utf-8")
    return path


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

    Attributes:
        environment: `MLX_RANK` and `MLX_HOSTFILE` for this process, rank 0, to join with.

    Raises:
        ValueError: `size` < 2.
        OSError: a child cannot be started.
    """

    def __init__(
        self,
        command: Sequence[str],
        size: int,
        *,
        environ: Mapping[str, str],
        on_exit: Callable[[int, int], None],
    ) -> None:
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        self._directory = tempfile.TemporaryDirectory(prefix="mlxcel-ranks-")
        hostfile = write_ring_hostfile(free_loopback_ports(size), Path(self._directory.name))
        self.environment = {"MLX_RANK": "0", "MLX_HOSTFILE": str(hostfile)}
        self._on_exit = on_exit
        self._stopping = threading.Event()
        self._processes: list[subprocess.Popen] = []
        self._ready, ready_writer = os.pipe()
        group = {"MLX_HOSTFILE": str(hostfile), READY_FD_VARIABLE: str(ready_writer)}
        try:
            for rank in range(1, size):
                self._processes.append(
                    subprocess.Popen(
                        list(command),
                        env={**environ, **group, "MLX_RANK": str(rank)},
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
