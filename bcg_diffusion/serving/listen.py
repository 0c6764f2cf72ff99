"""Running the application with uvicorn on a socket bound first, so ``--port 0`` can report its port.

uvicorn (the ``serve`` extra) is imported by :func:`serve` only, so that the server's options, the listening
line and the sockets are there without it."""

from __future__ import annotations

import socket
from typing import Callable

__all__ = ["LISTENING_PREFIX", "bind_socket", "serve", "url_of"]

#: The line the server prints once it accepts connections: ``listening on http://HOST:PORT``.
LISTENING_PREFIX = "listening on "
GRACEFUL_SHUTDOWN_S = 5


def bind_socket(host: str, port: int, listen: bool = True) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port=0``: a free port chosen by the system), listening if
    ``listen``. Unlistened, it holds the port and refuses connections; uvicorn starts listening on it."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    if listen:
        sock.listen(128)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(app, sock: socket.socket, on_listening: Callable[[str], None], log_level: str = "warning") -> None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM; ``on_listening(url)`` once it accepts connections."""
    import uvicorn

    class _AnnouncingServer(uvicorn.Server):
        """A uvicorn server that calls ``on_listening()`` once it has started accepting connections."""

        def __init__(self, config: uvicorn.Config, on_listening: Callable[[], None]):
            super().__init__(config)
            self._on_listening = on_listening

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                self._on_listening()

    config = uvicorn.Config(app, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    server = _AnnouncingServer(config, lambda: on_listening(url_of(sock)))
    server.run(sockets=[sock])
