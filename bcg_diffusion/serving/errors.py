"""The errors a request gets: :class:`RequestError`, an HTTP status with an OpenAI-style error body, and the two
that several modules raise (a ``model`` the server does not serve, a body above the limit). Imports nothing of the
server, so the request planner, the model catalog and the routes all raise the same errors."""

from __future__ import annotations

from typing import Any

__all__ = ["RequestError", "body_too_large", "model_not_found"]


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with an OpenAI-style error body."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def model_not_found(name: str, served: list[str]) -> RequestError:
    """The 404 (OpenAI code ``model_not_found``) of a request whose ``model`` this server does not serve."""
    shown = name if len(name) <= 80 else name[:77] + "..."
    return RequestError(f"the model {shown!r} does not exist on this server; it serves {', '.join(map(repr, served))} "
                        "(GET /v1/models lists them; leave model out for the base model)",
                        status=404, param="model", code="model_not_found")


def body_too_large(limit: int) -> RequestError:
    return RequestError(f"the request body is larger than {limit} bytes; a request is a small JSON object (prompts "
                        "of at most a few thousand characters)", status=413)
