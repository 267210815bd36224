"""What the server answers: a body and its media type, built once, sent as is.

Conventions:
- A future resolves to a `Reply`; `retrieve_future` sends it unchanged. Results are JSON
  (`json_reply`, from a pydantic `tinker.types` model or a plain dict) except
  `forward_backward`'s and `asample`'s, which are protobuf (`proto_reply`).
- A failed future is JSON `{"error": ..., "category": "user" | "server"}` (the SDK raises
  `tinker.RequestFailedError` with both). `failure_reply` decides the category from the
  exception: the errors a caller's input causes (`ValueError`, `TypeError`, `LookupError`,
  `NotImplementedError`, `FileExistsError`, `FileNotFoundError` and rlpure's own) are `user`;
  anything else is a bug on this side, `server`, and its message is replaced by a one-line
  summary (the traceback goes to the server's log, never into a response).
- An error that is not a future's (a malformed request) is an HTTP 4xx with a JSON body
  `{"detail": message}` (`error_body`): the SDK maps the status to its exception type and puts
  the body in the message. A 4xx is never empty (the SDK treats an empty 400 as a dropped
  connection and retries).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import msgspec
import pydantic

from shell.errors import RlpureError

__all__ = [
    "JSON",
    "PROTOBUF",
    "BadRequest",
    "Reply",
    "error_body",
    "failure_reply",
    "json_reply",
    "proto_reply",
    "user_error",
]

_logger = logging.getLogger("rlpure.serve")

JSON = "application/json"
PROTOBUF = "application/x-protobuf"

_USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    LookupError,
    NotImplementedError,
    FileExistsError,
    FileNotFoundError,
    RlpureError,
)


class BadRequest(RlpureError, ValueError):
    """A request the server refuses before running it: HTTP `status` (400 by default) with
    `{"detail": message}`; the message names the field."""

    def __init__(self, detail: str, status: int = 400) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status


class Reply(msgspec.Struct, frozen=True):
    """A response body ready to send."""

    body: bytes
    media_type: str = JSON
    status: int = 200


def json_reply(value: pydantic.BaseModel | dict[str, Any], status: int = 200) -> Reply:
    """`value` as JSON (a pydantic model dumped in JSON mode, `None` fields omitted)."""
    if isinstance(value, pydantic.BaseModel):
        data = value.model_dump(mode="json", exclude_none=True)
    else:
        data = value
    return Reply(json.dumps(data).encode(), JSON, status)


def proto_reply(body: bytes) -> Reply:
    """A serialized protobuf result."""
    return Reply(body, PROTOBUF)


def user_error(err: BaseException) -> bool:
    """Whether `err` was caused by the request (category `user`) rather than by the server."""
    return isinstance(err, _USER_ERRORS)


def failure_reply(
    err: BaseException, what: str, scrub: Callable[[str], str] = lambda text: text
) -> Reply:
    """The failed-future body for `err` raised while running `what` (see module doc);
    `scrub` rewrites a user error's message (the server names checkpoints by tinker path)."""
    if user_error(err):
        message = scrub(f"{what}: {err}" if str(err) else f"{what}: {type(err).__name__}")
        return json_reply({"error": message, "category": "user"})
    _logger.error("%s failed", what, exc_info=err)
    return json_reply(
        {
            "error": f"{what}: internal error ({type(err).__name__}); see the server's log",
            "category": "server",
        }
    )


def error_body(message: str) -> bytes:
    """The JSON body of a 4xx/5xx response: `{"detail": message}`."""
    return json.dumps({"detail": message}).encode()
