"""Sweep's guest contract for Python handlers built with componentize-py (WASI 0.2 components).

The contract (docs/guests.md): the payload is a JSON object on stdin, the result one JSON value
on stdout, logs go to stderr, and the exit code decides the outcome: 0 succeeded, 100 failed for
good (retrying cannot help), anything else failed and may be retried. The last line of stderr is
the failure's message.

    import sweep_guest

    def handle(payload):
        return {"greeting": "hello " + payload["name"]}

    Run = sweep_guest.command(handle)   # the `wasi:cli/run` export componentize-py looks for

`handle` takes the payload (a dict) and returns the result. Raising `Permanent` exits 100;
`Retry`, or any other exception, exits 1 (retried); each with its message as the last line of
stderr.

Also here: `env(name)`, a task's environment variable (its secrets arrive that way), and
`request(...)`, an outbound HTTP request through `wasi:http/outgoing-handler`, blocking (no
asyncio needed), which Sweep sends only where the tenant's egress list allows.

Why not `os.environ` and `sys.exit`: componentize-py runs the module's top level once at
build time and snapshots the interpreter, so `os.environ` holds the build's (empty)
environment, not the task's; and `sys.exit(100)` reaches the host as a bare failure (exit 1)
through the preview 1 adapter. `wasi:cli/environment` and `wasi:cli/exit.exit-with-code` are
read and called at run time.
"""

import json
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import environment, exit as wasi_exit, outgoing_handler, streams
from wit_world.imports import wasi_http_types as http

PERMANENT = 100
"""Exit code of a failure that must not be retried."""
RETRYABLE = 1
"""Exit code of a failure worth retrying."""


class Permanent(Exception):
    """A failure retrying cannot fix (bad payload, a 4xx answer): the task exits 100."""


class Retry(Exception):
    """A failure worth retrying (a 5xx, a timeout): the task exits 1, its message last on
    stderr. Any other unexpected exception does the same, its type named in the message."""


class HttpError(Exception):
    """A request that failed before a response arrived, or whose body could not be read.

    `code` names the `wasi:http` error-code case (`HttpRequestDenied` for a host off the
    tenant's egress list, `DestinationIpProhibited`, `ConnectionRefused`, ...).
    """

    def __init__(self, code: str, detail: str = ""):
        self.code = code
        super().__init__(f"{code}: {detail}" if detail else code)


def env(name: str) -> Optional[str]:
    """The task's environment variable `name` (a secret the module names, or `SWEEP_*`)."""
    for key, value in environment.get_environment():
        if key == name:
            return value
    return None


def payload() -> Dict[str, Any]:
    """The payload: stdin read to the end, a JSON object (anything else is `Permanent`)."""
    text = sys.stdin.buffer.read()
    try:
        value = json.loads(text)
    except ValueError as e:
        raise Permanent(f"the payload is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise Permanent("the payload is not a JSON object")
    return value


def finish(result: Any) -> None:
    """Writes `result` as the task's JSON result."""
    sys.stdout.write(json.dumps(result, separators=(",", ":")))
    sys.stdout.write("\n")
    sys.stdout.flush()


def fail(message: str, code: int) -> None:
    """Ends the task with exit `code` and `message` as the last line of stderr. Never returns."""
    sys.stdout.flush()
    sys.stderr.write(" ".join(str(message).splitlines()) + "\n")
    sys.stderr.flush()
    # Buffers are not flushed by exit-with-code: the instance just stops.
    wasi_exit.exit_with_code(code)


def command(handle: Callable[[Dict[str, Any]], Any]) -> type:
    """The `wasi:cli/run` export that runs `handle` under the guest contract."""

    class Run(exports.Run):
        def run(self) -> None:
            try:
                result = handle(payload())
            except Permanent as e:
                fail(str(e) or "permanent failure", PERMANENT)
            except Retry as e:
                fail(str(e) or "failed; retry", RETRYABLE)
            except Exception as e:  # noqa: BLE001 - every other failure is retried
                fail(f"{type(e).__name__}: {e}", RETRYABLE)
            else:
                finish(result)

    return Run


# --- outbound HTTP --------------------------------------------------------------------------

_METHODS = {
    "GET": http.Method_Get,
    "HEAD": http.Method_Head,
    "POST": http.Method_Post,
    "PUT": http.Method_Put,
    "DELETE": http.Method_Delete,
    "OPTIONS": http.Method_Options,
    "PATCH": http.Method_Patch,
}

# `blocking-write-and-flush` takes at most 4096 bytes per call.
_WRITE_CHUNK = 4096
_READ_CHUNK = 64 * 1024


@dataclass
class Response:
    """A response: its status, headers (lowercase names, in order) and whole body."""

    status: int
    headers: List[Tuple[str, str]]
    body: bytes

    def header(self, name: str) -> Optional[str]:
        """The first header called `name` (any case)."""
        name = name.lower()
        return next((v for n, v in self.headers if n == name), None)

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


def _error_name(code: Any) -> str:
    # The generated classes are `ErrorCode_<Case>`: the case is what callers match on.
    name = type(code).__name__
    return name.split("_", 1)[1] if name.startswith("ErrorCode_") else name


def _error_detail(code: Any) -> str:
    value = getattr(code, "value", None)
    return "" if value is None else str(value)


def _stream_error(e: Err) -> Optional[HttpError]:
    """None when `e` says the stream ended; the failure otherwise."""
    if isinstance(e.value, streams.StreamError_Closed):
        return None
    error = e.value.value
    code = http.http_error_code(error)
    if code is not None:
        return HttpError(_error_name(code), _error_detail(code))
    return HttpError("StreamError", error.to_debug_string())


def request(
    method: str,
    url: str,
    headers: Optional[Dict[str, str]] = None,
    body: Optional[bytes] = None,
) -> Response:
    """Sends one request and reads the whole response. Raises `HttpError` if no response
    arrived or its body could not be read; any status is a `Response`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {url!r}")
    try:
        method_case = _METHODS[method.upper()]()
    except KeyError:
        method_case = http.Method_Other(method)
    entries = [(name.lower(), value.encode()) for name, value in (headers or {}).items()]
    if body and not any(name == "content-length" for name, _ in entries):
        # Known up front: sent as a length, not chunked, which every server reads.
        entries.append(("content-length", str(len(body)).encode()))
    fields = http.Fields.from_list(entries)
    outgoing = http.OutgoingRequest(fields)
    outgoing.set_method(method_case)
    outgoing.set_scheme(http.Scheme_Https() if parts.scheme == "https" else http.Scheme_Http())
    outgoing.set_authority(parts.netloc)
    outgoing.set_path_with_query(parts.path + ("?" + parts.query if parts.query else "") or "/")

    outgoing_body = outgoing.body()
    try:
        future = outgoing_handler.handle(outgoing, None)
    except Err as e:
        # Refused before anything was sent (the egress list, the request limit).
        outgoing_body.__exit__(None, None, None)
        raise HttpError(_error_name(e.value), _error_detail(e.value)) from None
    # A refused request shows first as a body that cannot be written (the host closed it):
    # the response's error says why, so it is reported before a write failure.
    write_failure = None
    if body:
        # The stream is a child of the body: it must be gone before the body is finished.
        with outgoing_body.write() as stream:
            for start in range(0, len(body), _WRITE_CHUNK):
                try:
                    stream.blocking_write_and_flush(body[start : start + _WRITE_CHUNK])
                except Err as e:
                    write_failure = _stream_error(e) or HttpError(
                        "HttpRequestBodySize", "the body was cut short"
                    )
                    break
    if write_failure is None:
        http.OutgoingBody.finish(outgoing_body, None)
    else:
        outgoing_body.__exit__(None, None, None)

    with future:
        with future.subscribe() as ready:
            ready.block()
        answer = future.get()
    # Ready, so `some`; the outer result is `ok` on the first get.
    result = answer.value
    if isinstance(result, Err):
        raise HttpError(_error_name(result.value), _error_detail(result.value))
    if write_failure is not None:
        result.value.__exit__(None, None, None)
        raise write_failure
    with result.value as response:
        status = response.status()
        with response.headers() as fields:
            header_list = [(n.lower(), v.decode("latin-1")) for n, v in fields.entries()]
        incoming = response.consume()
        chunks = []
        with incoming.stream() as stream:
            while True:
                try:
                    chunks.append(stream.blocking_read(_READ_CHUNK))
                except Err as e:
                    failure = _stream_error(e)
                    if failure is not None:
                        raise failure from None
                    break
        with http.IncomingBody.finish(incoming):
            pass  # no trailers wanted: dropping the future is enough
    return Response(status, header_list, b"".join(chunks))
