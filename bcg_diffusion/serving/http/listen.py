"""Running the application with uvicorn on a socket bound first, so ``--port 0`` can report its port.

uvicorn (the ``serve`` extra) is imported by :func:`serve` only, so that the server's options, the listening
line and the sockets are there without it. A request uvicorn's HTTP parser refuses before the application
sees it (a ``Content-Length`` that is not a number, a malformed request line or header) is answered with a 400
in the OpenAI error format too (:func:`json_400_protocol`), not uvicorn's plain text."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import sys
from typing import Callable

from bcg_diffusion.toolkit.options import Failure

__all__ = ["API_KEY_VARIABLE", "BAD_HTTP_MESSAGE", "LISTENING_PREFIX", "bind_socket", "is_loopback", "json_400_protocol", "reserve_port",
           "serve", "url_of", "warn_if_open"]

#: The environment variable that holds the API key when --api-key is not given (vLLM's VLLM_API_KEY, here).
API_KEY_VARIABLE = "BCG_API_KEY"
#: The message of the 400 for a request the HTTP parser refuses.
BAD_HTTP_MESSAGE = ("the HTTP request could not be parsed: a malformed request line or header, such as a "
                    "Content-Length that is not a whole number of bytes; send a valid HTTP/1.1 request")


def _json_400_bytes() -> bytes:
    body = json.dumps({"error": {"message": BAD_HTTP_MESSAGE, "type": "invalid_request_error", "param": None,
                                 "code": None}}, separators=(",", ":")).encode("ascii")
    head = (b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode("ascii") + b"\r\nconnection: close\r\n\r\n")
    return head + body


def json_400_protocol(base: type) -> type:
    """A subclass of uvicorn's HTTP protocol class ``base`` whose parser-level 400 is the OpenAI error JSON (the
    connection is closed after it, as uvicorn does)."""

    class Json400Protocol(base):
        def send_400_response(self, msg: str) -> None:
            self.transport.write(_json_400_bytes())
            self.transport.close()

    Json400Protocol.__name__ = f"Json400{base.__name__}"
    return Json400Protocol


def _http_protocol() -> type:
    """uvicorn's choice for ``http="auto"`` (httptools where installed, else h11), with the JSON 400."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return json_400_protocol(base)

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


def is_loopback(host: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return host == "localhost"


def warn_if_open(host: str, api_key: str | None) -> None:
    """On stderr, the warning of a server reachable from other machines (``host`` not loopback) without an API key."""
    if not is_loopback(host) and api_key is None:
        print(f"warning: --host {host}: the server is reachable from other machines and requires no API key; "
              f"give it one with --api-key or {API_KEY_VARIABLE}", file=sys.stderr)


def reserve_port(host: str, port: int, command: str) -> socket.socket:
    """Bind (not listen) now, so a port in use fails before the build (``Failure``, exit code 2, its line starting
    with ``command``); connections are refused until listening."""
    try:
        return bind_socket(host, port, listen=False)
    except OSError as exc:
        raise Failure(2, f"{command}: error: cannot bind {host}:{port}: {exc}") from exc


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

    config = uvicorn.Config(app, log_level=log_level, access_log=False, http=_http_protocol(),
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    server = _AnnouncingServer(config, lambda: on_listening(url_of(sock)))
    server.run(sockets=[sock])
