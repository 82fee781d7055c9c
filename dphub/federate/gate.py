"""The SuperLink's public door: the Fleet API for SuperNodes, the Control API for the operator.

Flower 1.42's SuperLink serves one HTTP API (``--host``/``--port``) for the Fleet API
(SuperNodes), the Control API (``flwr``: register and unregister nodes, list runs, read
their logs, submit runs) and the Runtime API (ServerApp processes). The open-source release
authenticates only SuperNodes (``--enable-supernode-auth``, on the Fleet routes) and, with a
shared secret, the Runtime API's task hand-out (``--superexec-auth-secret-file``); its Control
API has no account authentication (OIDC is Flower's enterprise edition), so whoever reaches
the port is the operator (issue 53).

So ``dphub federate superlink`` keeps Flower's SuperLink on a Unix socket only the server's
user can open (:mod:`dphub.federate.unix_superlink`) and puts this gate on the public address. It terminates TLS with the server's certificate and forwards:

* the Fleet API's routes (:data:`FLEET_ROUTES`, Flower's ``/v1/fleet/...``) to anyone: the
  SuperLink still checks each SuperNode's signed key behind it;
* the Control API's routes only with the operator's token (``Authorization: Bearer``, compared
  in constant time; the header is not forwarded), which ``dphub federate serve --server-dir``
  writes into the operator's ``flwr`` credential store;
* ``/health``;

and answers everything else (the Runtime API, ``/docs``, ``/openapi.json``, unknown routes)
404 without forwarding it. Forwarded paths are rebuilt from the matched route name, never
copied, so no spelling of a path (``..``, ``%2f``, a query) reaches another route.

A hand-written proxy rather than a general reverse proxy (nginx, Caddy): it is ~100 lines on
Starlette, uvicorn and httpx (which Flower already installs), it needs nothing installed on the
server beyond dphub, and the route list is Flower's own, kept next to the code that depends on it.
"""

from __future__ import annotations

import hmac
import re
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

#: Flower 1.42's Fleet API (flwr/superlink/routers/fleet/router.py): what a SuperNode calls
FLEET_ROUTES = frozenset({
    "register-node", "activate-node", "deactivate-node", "unregister-node",
    "send-node-heartbeat", "pull-messages", "push-messages", "get-run", "get-fab",
    "push-object", "pull-object", "confirm-message-received",
})
_CONTROL_NAME = re.compile(r"[a-z][a-z-]{0,63}")
#: a forwarded request's body, at most (Flower's own FAB limit is 10 MB; messages are weights)
MAX_BODY = 64 << 20
_HOP = frozenset({"host", "authorization", "content-length", "connection", "keep-alive",
                  "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "cookie"})
REFUSED_CONTROL = ("the Control API of this SuperLink needs the operator's token: "
                   "run flwr with the FLWR_HOME that `dphub federate serve --server-dir` wrote")


def route_kind(method: str, path: str) -> tuple[str, str] | None:
    """``(kind, upstream path)`` of a request the gate forwards, else None (404)."""
    if method in ("GET", "HEAD") and path == "/health":
        return "health", "/health"
    if method != "POST":
        return None
    prefix, _, name = path.rpartition("/")
    if prefix == "/v1/fleet" and name in FLEET_ROUTES:
        return "fleet", f"/v1/fleet/{name}"
    if prefix == "/v1/control" and _CONTROL_NAME.fullmatch(name):
        return "control", f"/v1/control/{name}"
    return None


def is_operator(request: Request, token: str) -> bool:
    """The request carries exactly one ``Authorization: Bearer <token>`` with the right token."""
    values = request.headers.getlist("authorization")
    if len(values) != 1:
        return False
    scheme, _, given = values[0].partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode())


#: the name the SuperLink's loopback certificate is for (TLS over its Unix socket)
UPSTREAM_URL = "https://127.0.0.1"


def gate_app(upstream: Path, token: str, upstream_ca: bytes) -> Starlette:
    """The gate's ASGI app, forwarding to the SuperLink's Unix socket ``upstream`` over TLS
    checked against the SuperLink's own loopback CA (``upstream_ca``, PEM)."""
    ctx = ssl.create_default_context(cadata=upstream_ca.decode("ascii"))
    state: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["client"] = httpx.AsyncClient(
            base_url=UPSTREAM_URL, timeout=httpx.Timeout(30.0, read=None),
            transport=httpx.AsyncHTTPTransport(uds=str(upstream), verify=ctx))
        try:
            yield
        finally:
            await state["client"].aclose()

    async def forward(request: Request) -> Response:
        matched = route_kind(request.method, request.url.path)
        if matched is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        kind, path = matched
        if kind == "control" and not is_operator(request, token):
            return JSONResponse({"detail": REFUSED_CONTROL}, status_code=403)
        body = b""
        if request.method == "POST":
            chunks: list[bytes] = []
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY:
                    return JSONResponse({"detail": "request too large"}, status_code=413)
                chunks.append(chunk)
            body = b"".join(chunks)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        client = state["client"]
        up = client.build_request(request.method, path, headers=headers, content=body)
        try:
            resp = await client.send(up, stream=True)
        except httpx.HTTPError:
            return JSONResponse({"detail": "the SuperLink is not reachable"}, status_code=502)
        out: dict[str, Any] = {k: v for k, v in resp.headers.items()
                               if k.lower() not in _HOP}
        return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, headers=out,
                                 background=BackgroundTask(resp.aclose))

    methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)],
                     lifespan=lifespan)
