"""Errors in the OpenAI shape, and the mapping of engine exceptions to HTTP statuses."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "unavailable_error",
}


class ApiError(Exception):
    """An error answered to the client as `{"error": {...}}` with `status`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "type": ERROR_TYPES.get(status, "server_error")}}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


def _is(exc: BaseException, name: str) -> bool:
    # Match dflash's public exception classes by name: the server never needs the native module to
    # classify, and test doubles can raise look-alikes.
    return any(cls.__name__ == name for cls in type(exc).__mro__)


def engine_error(exc: BaseException) -> ApiError:
    """The API error for an exception raised by the engine."""
    if isinstance(exc, ApiError):
        return exc
    if _is(exc, "ContextOverflowError"):
        n_prompt, n_ctx = getattr(exc, "n_prompt", None), getattr(exc, "n_ctx", None)
        detail = str(exc) or "prompt too long"
        if n_prompt is not None and n_ctx is not None and str(n_prompt) not in detail:
            detail = f"{detail} (prompt has {n_prompt} tokens, context is {n_ctx})"
        return ApiError(400, detail)
    if _is(exc, "InvalidParameterError"):
        return ApiError(400, str(exc) or "invalid parameter")
    return ApiError(500, f"engine error: {type(exc).__name__}: {exc}")
