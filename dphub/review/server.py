"""Serving the review page on loopback: token, Host check, nothing logged, one file written.

Why each guard: the page holds note text. It binds to 127.0.0.1 only (no other machine reaches
it); a Host header that is not loopback is refused (a DNS-rebinding page in the reviewer's browser
reaches 127.0.0.1 under its own host name); every request needs the random token printed at
start, compared in constant time (:func:`secrets.compare_digest`), so another local user or a
page guessing the port gets nothing; responses carry ``Cache-Control: no-store``, no referrer and
a Content-Security-Policy that allows no request but the page's own save. uvicorn's access log
is off (request lines carry the token), and the save handler turns every error into a PHI-free
message: the only file the server writes is the corrections file
(:func:`dphub.review.corrections.save_corrections`).

Issue 54: a page whose corrections cannot be written (:func:`dphub.review.corrections.unwritable`)
says so at its top and takes no correction, so no review is lost at the save. What the page sends is checked (:func:`dphub.review.units.check_payload`) and its
UTF-16 offsets converted to code points before anything else; a save must name the revision of
the corrections file its page was loaded with, so a second tab's stale save gets 409 instead of
silently replacing the first one's corrections.
"""

from __future__ import annotations

import json
import secrets
import socket
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dphub.errors import DphubError
from dphub.review.corrections import (
    StaleRevision,
    corrections_revision,
    labelled_notes,
    load_corrections,
    remove_stale_temps,
    save_corrections,
    unwritable,
)
from dphub.review.page import render_page
from dphub.review.run import Review
from dphub.review.safe_words import record_safe_words
from dphub.review.units import corrections_from_page
from dphub.safe_vocab import load as load_safe_vocab

LOOPBACK_HOSTS = frozenset(("127.0.0.1", "localhost", "[::1]", "::1"))
#: the largest corrections request read (offsets and labels, never text)
MAX_BODY = 16 << 20
TOKEN_HEADER = "x-dphub-token"


def new_token() -> str:
    """A fresh random token (256 bits) for the page's URL."""
    return secrets.token_urlsafe(32)


def _host(value: str) -> str:
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:port
        return value.split("]", 1)[0] + "]"
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class _Guard:
    """Refuses a non-loopback Host (421) and a missing or wrong token (403) before any route,
    and puts :data:`_HEADERS` on every response (Starlette's own 404, 405 and 500 too)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token.encode()

    async def __call__(self, scope: Scope, receive: Receive, scope_send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, scope_send)
            return

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k.lower().encode(), v.encode()) for k, v in _HEADERS.items()
                         if k.lower().encode() not in have]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await scope_send(message)

        req = Request(scope)
        if _host(req.headers.get("host", "")) not in LOOPBACK_HOSTS:
            await _text(421, "this page answers on loopback only")(scope, receive, send)
            return
        given = req.query_params.get("token") or req.headers.get(TOKEN_HEADER) or ""
        if not secrets.compare_digest(given.encode(), self.token):
            await _text(403, "a valid token is needed (the URL printed by `dphub review`)")(
                scope, receive, send)
            return
        await self.app(scope, receive, send)


def _text(status: int, msg: str) -> Response:
    return Response(msg + "\n", status_code=status, media_type="text/plain",
                    headers=_HEADERS)


_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY"}


def make_app(review: Review, corrections_path: Path, token: str,
             safe_words: Path | None = None) -> ASGIApp:
    """The Starlette app: ``GET /`` the page, ``POST /corrections`` saves the labelled notes
    (and, with ``safe_words``, records the rejected words there:
    :func:`dphub.review.safe_words.record_safe_words`)."""
    texts = {n.key: n.text for n in review.notes}
    vocab = load_safe_vocab() if safe_words is not None else None
    remove_stale_temps(corrections_path)  # a save killed mid-write left note text in a temp

    async def page(request: Request) -> Response:
        nonce = secrets.token_urlsafe(16)
        revision = corrections_revision(corrections_path)  # before reading: a save in between
        try:                                                # is then refused, never lost
            earlier = load_corrections(review, corrections_path)
        except DphubError as e:
            return _text(409, f"error: {e.message}")
        why = unwritable(corrections_path)  # said at the top of the page, before any work
        html = render_page(review, save_url="/corrections", token=token, corrections=earlier,
                           nonce=nonce, revision=revision,
                           readonly=None if why is None else
                           f"corrections cannot be saved to {corrections_path} ({why}); "
                           "restart `dphub review` with --corrections FILE where you can write")
        csp = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
               "connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; "
               "frame-ancestors 'none'")
        return HTMLResponse(html, headers={**_HEADERS, "Content-Security-Policy": csp})

    async def save(request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"error": "send application/json"}, 415, headers=_HEADERS)
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return JSONResponse({"error": "corrections too large"}, 413, headers=_HEADERS)
        why = unwritable(corrections_path)
        if why is not None:
            return JSONResponse({"error": f"corrections cannot be saved ({why})"}, 409,
                                headers=_HEADERS)
        try:
            payload = json.loads(body)
            # the page's offsets are UTF-16 units: checked and converted here, at the boundary
            corrections = corrections_from_page(payload, texts)
            n = save_corrections(review, corrections, corrections_path,
                                 revision=payload["revision"])
        except (ValueError, RecursionError):
            return JSONResponse({"error": "not valid JSON"}, 400, headers=_HEADERS)
        except StaleRevision as e:  # another tab or reviewer saved since this page was loaded
            return JSONResponse({"error": e.message}, 409, headers=_HEADERS)
        except DphubError as e:  # messages name keys and offsets, never text
            return JSONResponse({"error": e.message}, 400, headers=_HEADERS)
        except Exception as e:  # noqa: BLE001 - a bug: its message (and uvicorn's traceback
            # of it) could quote note text; the page gets the type, nothing is logged
            return JSONResponse({"error": f"internal error ({type(e).__name__}); the "
                                 "corrections file is as it was or fully replaced, never half "
                                 "written"}, 500, headers=_HEADERS)
        site: dict[str, Any] | None = None
        if safe_words is not None:  # the corrections are saved: a failure here is told apart
            try:
                got = record_safe_words(review, labelled_notes(review, corrections), safe_words,
                                        vocab=vocab)
                site = {"counted": got.counted, "waiting": got.waiting}
            except DphubError as e:  # names the file, never a word
                site = {"error": e.message}
            except Exception as e:  # noqa: BLE001 - a bug: never its message (note text)
                site = {"error": f"internal error ({type(e).__name__}); the safe words file "
                                 "is as it was or fully replaced"}
        return JSONResponse({"notes": n, "path": str(corrections_path),
                             "revision": corrections_revision(corrections_path),
                             "safe_words": site},
                            headers=_HEADERS)

    app = Starlette(routes=[Route("/", page, methods=["GET"]),
                            Route("/corrections", save, methods=["POST"])])
    return _Guard(app, token)


def bind_loopback(port: int = 0) -> socket.socket:
    """A listening socket on 127.0.0.1 (``port`` 0: one the system chooses)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        sock.close()
        raise DphubError(f"cannot listen on 127.0.0.1:{port} ({e.strerror})") from None
    sock.listen(16)
    return sock


def serve(app: ASGIApp, sock: socket.socket) -> None:
    """Run uvicorn on ``sock`` until interrupted; no access log, warnings only."""
    import uvicorn  # the optional `review` extra; imported only to serve

    config = uvicorn.Config(app, access_log=False, log_level="warning", lifespan="off",
                            server_header=False, date_header=False)
    uvicorn.Server(config).run(sockets=[sock])


def url(sock: socket.socket, token: str) -> str:
    """The page's address with its token."""
    return f"http://127.0.0.1:{sock.getsockname()[1]}/?token={token}"
