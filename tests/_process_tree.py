"""The processes a command started, followed while it runs, for the tests that require that none outlives it.

A process whose parent dies is no longer anyone's child (it goes to init), so the tree is read again and again
while the command runs (:class:`ProcessTree`), and what it ever held is checked once the command is gone. The
listening sockets of the tree are read from the same list (psutil, as ``/proc/net/tcp`` of each process).
"""

from __future__ import annotations

import ipaddress
import threading
import time

import psutil

POLL_S = 0.1


class ProcessTree:
    """Every process below ``pid`` (``pid`` included) seen while :meth:`stop` was not called, polled in a thread."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.seen: dict[int, psutil.Process] = {pid: self.root}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, name=f"tree-{pid}", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.is_set():
            try:
                for child in self.root.children(recursive=True):
                    self.seen.setdefault(child.pid, child)
            except psutil.Error:  # the root is gone: nothing new can appear below it
                return
            time.sleep(POLL_S)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(5)

    def alive(self) -> list[str]:
        """``pid name`` of each process seen that still runs (zombies do not count)."""
        out = []
        for process in list(self.seen.values()):
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{process.pid} {process.name()}")
            except psutil.Error:
                continue
        return out

    def wait_all_gone(self, timeout_s: float) -> list[str]:
        """The processes still alive after up to ``timeout_s`` (empty: none outlived the command)."""
        deadline = time.monotonic() + timeout_s
        alive = self.alive()
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = self.alive()
        return alive

    def listening(self) -> list[tuple[str, str, int]]:
        """``(process, address, port)`` of every listening TCP socket of the processes alive now."""
        out = []
        for process in list(self.seen.values()):
            try:
                for conn in process.net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN:
                        out.append((f"{process.pid} {process.name()}", conn.laddr.ip, conn.laddr.port))
            except psutil.Error:
                continue
        return out

    def kill_all(self) -> None:
        """Clean-up after a failed test: SIGKILL to whatever the tree left."""
        for process in list(self.seen.values()):
            try:
                process.kill()
            except psutil.Error:
                continue


def is_loopback(address: str) -> bool:
    """``127.x``, ``::1`` and IPv4-mapped ``::ffff:127.x``."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
