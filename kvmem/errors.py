"""The exceptions kvmem raises, each carrying the HTTP status and error code it answers with.

    KvmemError
    ├── BadRequest                400 bad_request
    │   ├── UpstreamRejected      400/413/422 upstream_rejected (the upstream's status)
    │   └── NotOfFormat           400 not_of_format (kvmem import --from: not the format named)
    ├── Unauthorized              401 unauthorized
    ├── Forbidden                 403 forbidden
    │   ├── MemoryDisabled        403 memory_disabled
    │   ├── PersonalizeDisabled   403 personalize_disabled
    │   ├── ReviewNotPerUser      403 review_not_per_user
    │   ├── HostNotAllowed        403 host_not_allowed (a Host not in server.allowed_hosts)
    │   └── OriginNotAllowed      403 origin_not_allowed (a write from another site)
    ├── NotFound                  404 not_found
    │   └── ModelNotFound         404 model_not_found
    ├── MethodNotAllowed          405 method_not_allowed
    ├── RequestTimeout            408 request_timeout
    ├── MemoryFull                409 memory_full
    ├── UserErased                409 user_erased (a write begun before the user's erasure)
    ├── BodyTooLarge              413 body_too_large
    ├── ClientGone                499 client_gone (the client left; nobody reads the answer)
    ├── InvalidMemory             422 (base of the write-rule errors below)
    │   ├── InvalidKey            422 invalid_key
    │   ├── KeyNotAllowed         422 key_not_allowed
    │   ├── EmptyValue            422 empty_value
    │   └── ValueTooLong          422 value_too_long
    ├── UpstreamRateLimited       429 rate_limited (Retry-After passed through)
    ├── TooManyRuns               429 too_many_runs (agent runs in flight; Retry-After)
    ├── HeadersTooLarge           431 headers_too_large (answered by the HTTP protocol)
    ├── UpstreamError             502 upstream_error
    ├── StoreUnavailable          503 store_unavailable
    └── UpstreamTimeout           504 upstream_timeout

    ConfigError                   (not an HTTP error: bad memory.yaml, exit code 2)
    SuiteError                    (not an HTTP error: a bad `kvmem eval` suite file, exit code 2)

Under `/v1/` the same body also carries OpenAI's `type` and `param` (`openai_error_body`), so
that OpenAI's SDKs raise the right exception class; under `/api/` it is Ollama's
`{"error": "message"}`. `error_body(path, exc)` is the one place that chooses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


class KvmemError(Exception):
    """Root of every error kvmem reports to a client; renders as the one error body."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers the error response carries: a 413 ends the connection, since the
        body it refused (perhaps not sent yet, after `Expect: 100-continue`) is never read."""
        return {"Connection": "close"} if self.status == 413 else {}

    def body(self) -> dict[str, Any]:
        """The error body: `{"error": {"code", "message", ...details}}`."""
        return {"error": {"code": self.code, "message": self.message, **self.details}}

    def openai_body(self) -> dict[str, Any]:
        """The body with OpenAI's `type` and `param` fields added (under `/v1/`)."""
        body = self.body()
        body["error"].setdefault("type", openai_error_type(self))
        body["error"].setdefault("param", None)
        return body


class BadRequest(KvmemError):
    """The request is malformed: bad JSON, wrong types, a missing or invalid user id."""

    status, code = 400, "bad_request"


class UpstreamRejected(BadRequest):
    """The model upstream refused the request as the client's fault (400, 413 or 422), e.g.
    "maximum context length exceeded"; it answers with the upstream's status."""

    code = "upstream_rejected"

    def __init__(
        self, message: str, status: int = 400, upstream: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.upstream = upstream

    def openai_body(self) -> dict[str, Any]:
        """The upstream's own OpenAI error object when it sent one, else kvmem's."""
        body = super().openai_body()
        body["error"].update(self.upstream or {})
        return body


class NotOfFormat(BadRequest):
    """A file given to `kvmem import --from` is not of the format named (nothing is written)."""

    code = "not_of_format"


class Unauthorized(KvmemError):
    """No credentials, or credentials that match no key."""

    status, code = 401, "unauthorized"


class Forbidden(KvmemError):
    """The credentials are valid but may not do this."""

    status, code = 403, "forbidden"


class MemoryDisabled(Forbidden):
    """`memory.disabled` is true."""

    code = "memory_disabled"


class PersonalizeDisabled(Forbidden):
    """`memory.personalize` is false, so users cannot change their opt-out switch."""

    code = "personalize_disabled"


class ReviewNotPerUser(Forbidden):
    """A user tried to set their own review switch, but `memory.review` is not `per_user`."""

    code = "review_not_per_user"


class HostNotAllowed(Forbidden):
    """The request's `Host` is not one of `server.allowed_hosts` (a DNS-rebound name, say)."""

    code = "host_not_allowed"


class OriginNotAllowed(Forbidden):
    """A write sent by a page of another site: a foreign `Origin` or a cross-site
    `Sec-Fetch-Site`."""

    code = "origin_not_allowed"


class NotFound(KvmemError):
    """The thing does not exist for this user (another user's things included)."""

    status, code = 404, "not_found"


class ModelNotFound(NotFound):
    """The requested model id is not one kvmem serves."""

    code = "model_not_found"


class MethodNotAllowed(KvmemError):
    """The route exists but not with this method."""

    status, code = 405, "method_not_allowed"


class RequestTimeout(KvmemError):
    """The request body did not arrive within `server.body_timeout_seconds`."""

    status, code = 408, "request_timeout"

    @property
    def headers(self) -> dict[str, str]:
        # The rest of the body may still be on its way: end the connection, not wait for it.
        return {"Connection": "close"}


class MemoryFull(KvmemError):
    """The write would take the user's total tokens above `tokenLimit`."""

    status, code = 409, "memory_full"


class UserErased(KvmemError):
    """A write of work that began before its user was erased (an agent run in flight when
    `DELETE /me` answered): refused, so that nothing of the user comes back."""

    status, code = 409, "user_erased"


class BodyTooLarge(KvmemError):
    """The request body is larger than `server.max_body_bytes`."""

    status, code = 413, "body_too_large"


class ClientGone(KvmemError):
    """The client disconnected before its request was read whole: counted as 499 (nginx's
    "client closed request"), logged at INFO; no answer reaches anyone."""

    status, code = 499, "client_gone"


class InvalidMemory(KvmemError):
    """A key or value breaks one of the write rules (raised only as one of the subclasses)."""

    status, code = 422, "invalid_memory"


class InvalidKey(InvalidMemory):
    """The key is not `^[a-z][a-z0-9_]{0,127}$`, or is `nothing`."""

    code = "invalid_key"


class KeyNotAllowed(InvalidMemory):
    """The key is well formed but not one of `memory.validKeys`."""

    code = "key_not_allowed"


class EmptyValue(InvalidMemory):
    """The value is empty after stripping whitespace."""

    code = "empty_value"


class ValueTooLong(InvalidMemory):
    """The value is longer than `memory.charLimit` characters."""

    code = "value_too_long"


class UpstreamRateLimited(KvmemError):
    """The model upstream answered 429; its `Retry-After` is passed on."""

    status, code = 429, "rate_limited"

    def __init__(self, message: str, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": self.retry_after} if self.retry_after else {}


class TooManyRuns(KvmemError):
    """`POST /memory/agent` while the user's runs in flight reached
    `memory.agent.max_runs_per_user` (or the process's, `max_concurrent_runs`)."""

    status, code = 429, "too_many_runs"

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class HeadersTooLarge(KvmemError):
    """The request line and headers are larger than `server.max_header_bytes`."""

    status, code = 431, "headers_too_large"


class UpstreamError(KvmemError):
    """The model upstream failed or answered with an error."""

    status, code = 502, "upstream_error"


class StoreUnavailable(KvmemError):
    """The database cannot be reached, read or written."""

    status, code = 503, "store_unavailable"


class UpstreamTimeout(KvmemError):
    """The model upstream did not answer within `chat.timeout`."""

    status, code = 504, "upstream_timeout"


# OpenAI's error `type` for each status; a status not listed (5xx) is an `api_error`.
OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
}


def openai_error_type(exc: KvmemError) -> str:
    """OpenAI's error `type` for `exc`."""
    return OPENAI_ERROR_TYPES.get(exc.status, "api_error")


def openai_error_body(exc: KvmemError) -> dict[str, Any]:
    """kvmem's error body with OpenAI's `type` and `param` fields added."""
    return exc.openai_body()


def error_body(path: str, exc: KvmemError) -> dict[str, Any]:
    """The body of `exc` answered for a request to `path`: the one place that chooses an
    error body's shape, for the app's error responses, the HTTP protocol's refusals and a
    stream's last piece alike.

    Ollama's `{"error": "message"}` under `/api/` (Ollama's clients read a string), OpenAI's
    fields added under `/v1/` (`openai_error_body`), kvmem's own `body()` everywhere else.
    """
    if path.startswith("/api/"):
        return {"error": exc.message}
    if path.startswith("/v1/"):
        return exc.openai_body()
    return exc.body()


class ConfigError(Exception):
    """memory.yaml cannot be read or is invalid; the message names the file and the field."""


class SuiteError(Exception):
    """A `kvmem eval` suite cannot be read, is invalid, or cannot be set up; the message
    names the file, the line and scenario, and the field."""


# How many of a body's problems an error message names before it says "and N more".
MAX_PROBLEMS = 5


def describe_problems(exc: ValidationError, whole: str) -> str:
    """What is wrong, field by field (the first few): the one wording of pydantic's errors,
    for request bodies, imported documents, tool arguments (agent and MCP) and JSON-mode
    answers; `whole` names the value itself (a problem with no field)."""
    errors = exc.errors(include_url=False)
    problems = "; ".join(
        f"{'.'.join(str(p) for p in error['loc'])[:100] or whole}: {error['msg']}"
        for error in errors[:MAX_PROBLEMS]
    )
    if len(errors) > MAX_PROBLEMS:
        problems += f"; and {len(errors) - MAX_PROBLEMS} more"
    return problems
