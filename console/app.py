"""The console's web application (Starlette): pages, their JSON twins under ``/api/``,
health paths, and the headers every answer carries.

Read-only by construction: every route is a GET and the backend calls only lookups.
Everything a message holds is untrusted: templates autoescape, the CSP allows no script
at all and only this origin's stylesheet, and bodies are downloaded as attachments.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rmqstore.common.times import iso_time
from rmqstore.console.auth import FAILURE_REFILL_S, Outcome, PasswordChecks
from rmqstore.console.backend import (
    Backend,
    BadInput,
    ConsoleError,
    body_views,
)
from rmqstore.console.chart import bar_chart, svg

HERE = Path(__file__).parent
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]
# Probes answer without a password: they carry no data.
OPEN_PATHS = ("/healthz", "/readyz")
CHART_WIDTH = 960
CHART_HEIGHT = 220
SPARK_WIDTH = 120
SPARK_HEIGHT = 24
BODY_VIEWS = ("text", "json", "hex")

ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


# The names a loopback console answers to: a page of another site that rebinds its own
# name to 127.0.0.1 (DNS rebinding) reaches the port, but with its own name in Host.
# (An IPv6 address as a Host gives it, in brackets.)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Basic realm="rmqstore console", charset="UTF-8"'}


class Guard:
    """ASGI middleware: the trusted-Host check (Starlette's TrustedHostMiddleware: 400
    for a Host not allowed), Basic authentication when a users file is given (bounded
    Argon2 checks, console.auth), the security headers, and ``Server-Timing: app`` (the
    time to the response's first byte; the benchmark reads it). The probes need neither
    a trusted Host nor a password: they carry no data."""

    def __init__(self, app: ASGIApp, users: dict[str, str] | None, allowed_hosts: Sequence[str] = ("*",)):
        self.app = app
        self.checks = PasswordChecks(users) if users is not None else None
        self.checked: ASGIApp = TrustedHostMiddleware(self._authenticated, allowed_hosts=list(allowed_hosts))

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                took_ms = (time.perf_counter() - started) * 1000
                headers = [h for h in message.get("headers", []) if h[0].lower() not in {k for k, _ in SECURITY_HEADERS}]
                message["headers"] = headers + SECURITY_HEADERS + [(b"server-timing", f"app;dur={took_ms:.3f}".encode())]
            await send(message)

        if scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send_with_headers)
            return
        await self.checked(scope, receive, send_with_headers)

    async def _authenticated(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]) -> None:
        if self.checks is not None:
            header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), "")
            client = scope.get("client")
            outcome, _ = await self.checks.check(header, client[0] if client else "") if header else (Outcome.REFUSED, None)
            if outcome is Outcome.BUSY or outcome is Outcome.LIMITED:
                why = "too many password checks at once" if outcome is Outcome.BUSY else "too many failed logins from this address"
                refused = PlainTextResponse(f"{why}: try again shortly\n", status_code=429,
                                            headers={"Retry-After": str(int(FAILURE_REFILL_S))})  # fmt: skip
                await refused(scope, receive, send)
                return
            if outcome is not Outcome.PROVEN:
                denied = PlainTextResponse("authentication required\n", status_code=401, headers=UNAUTHORIZED_HEADERS)
                await denied(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _params(request: Request) -> dict[str, str]:
    return {name: value for name, value in request.query_params.items()}


def _now_ms() -> int:
    return int(time.time() * 1000)


class Pages:
    def __init__(self, backend: Backend):
        self.backend = backend
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True, default_for_string=True)
        )
        # Times for people, and in links (what a form then shows), as ISO 8601 in UTC.
        self.templates.filters["utc"] = lambda ms: "" if ms is None else iso_time(int(ms))
        self.templates.globals["svg"] = svg

    def render(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(name).render(**context)
        return HTMLResponse(html, status_code=status)

    async def _data(self, build: Callable[[], Any]) -> Any:
        return await run_in_threadpool(build)

    # Each page: its data from the backend, then either JSON or the template; a
    # ConsoleError becomes the same page with the message inline and the error's status.

    async def api(self, request: Request) -> Response:
        builders: dict[str, Callable[[dict[str, str]], Any]] = {
            "topics": lambda p: self.backend.topics(_now_ms()),
            "search": self.backend.search,
            "message": lambda p: self.backend.message(p)[0],
            "rate": lambda p: self.backend.rate(p, _now_ms()),
            "nodes": lambda p: self.backend.nodes(),
            "groups": self.backend.groups,
            "pending": lambda p: self.backend.pending(p, _now_ms()),
        }
        name = request.path_params["name"]
        if name not in builders:
            return JSONResponse({"error": f"no API named {name}"}, status_code=404)
        params = _params(request)
        try:
            return JSONResponse(await self._data(lambda: builders[name](params)))
        except ConsoleError as error:
            return JSONResponse({"error": error.message}, status_code=error.status)

    async def topics(self, request: Request) -> Response:
        try:
            data = await self._data(lambda: self.backend.topics(_now_ms()))
        except ConsoleError as error:
            return self.render("topics.html", error.status, page="topics", error=error.message, data=None)
        sparks = {
            t["name"]: bar_chart(t["recentCounts"], [0] * len(t["recentCounts"]), SPARK_WIDTH, SPARK_HEIGHT) for t in data["topics"]
        }
        return self.render("topics.html", page="topics", data=data, sparks=sparks, error=None)

    async def search(self, request: Request) -> Response:
        params = _params(request)
        result = None
        error = None
        status = 200
        if params.get("mode"):
            try:
                result = await self._data(lambda: self.backend.search(params))
            except ConsoleError as failed:
                error, status = failed.message, failed.status
        return self.render("search.html", status, page="search", params=params, result=result, error=error)

    async def pending(self, request: Request) -> Response:
        params = _params(request)
        try:
            data = await self._data(lambda: self.backend.pending(params, _now_ms()))
        except ConsoleError as error:
            return self.render("pending.html", error.status, page="pending", error=error.message, data=None, params=params)
        return self.render("pending.html", page="pending", data=data, error=None, params=params)

    async def message(self, request: Request) -> Response:
        params = _params(request)
        view = params.get("view", "text") or "text"
        try:
            if view not in BODY_VIEWS:
                raise BadInput(f"view: {view!r} is not one of {', '.join(BODY_VIEWS)}")
            detail, found = await self._data(lambda: self.backend.message(params))
        except ConsoleError as error:
            return self.render("message.html", error.status, page="search", error=error.message, detail=None, params=params)
        return self.render(
            "message.html", page="search", detail=detail, body=body_views(found.body), view=view, error=None, params=params
        )

    async def body(self, request: Request) -> Response:
        params = _params(request)
        try:
            _, found = await self._data(lambda: self.backend.message(params))
        except ConsoleError as error:
            return PlainTextResponse(error.message + "\n", status_code=error.status)
        filename = f"{found.topic}-{found.queue_id}-{found.queue_offset}.bin"
        return Response(
            found.body, media_type="application/octet-stream", headers={"Content-Disposition": f'attachment; filename="{filename}"'}
        )

    async def rate(self, request: Request) -> Response:
        params = _params(request)
        data = None
        charts = None
        error = None
        status = 200
        if params.get("topic"):
            try:
                data = await self._data(lambda: self.backend.rate(params, _now_ms()))
                charts = {
                    "topic": bar_chart(data["counts"], data["starts"], CHART_WIDTH, CHART_HEIGHT),
                    "queues": [bar_chart(q["counts"], data["starts"], CHART_WIDTH, CHART_HEIGHT // 2) for q in data["queues"]],
                }
            except ConsoleError as failed:
                error, status = failed.message, failed.status
        return self.render("rate.html", status, page="rate", params=params, data=data, charts=charts, error=error)

    async def groups(self, request: Request) -> Response:
        params = _params(request)
        try:
            data = await self._data(lambda: self.backend.groups(params))
        except ConsoleError as error:
            return self.render("groups.html", error.status, page="groups", params=params, error=error.message, data=None)
        return self.render("groups.html", page="groups", params=params, data=data, error=None)

    async def nodes(self, request: Request) -> Response:
        try:
            data = await self._data(self.backend.nodes)
        except ConsoleError as error:
            return self.render("nodes.html", error.status, page="nodes", error=error.message, data=None)
        return self.render("nodes.html", page="nodes", data=data, error=None)

    async def ready(self, request: Request) -> Response:
        try:
            await self._data(self.backend.ping)
        except ConsoleError as error:
            return PlainTextResponse(f"query node: {error.message}\n", status_code=503)
        return PlainTextResponse("ready\n")


async def _health(request: Request) -> Response:
    return PlainTextResponse("ok\n")


async def _home(request: Request) -> Response:
    return RedirectResponse("/topics", status_code=303)


def build_app(backend: Backend, users: dict[str, str] | None, allowed_hosts: Sequence[str] = ("*",)) -> ASGIApp:
    """The console. ``allowed_hosts``: the names (Starlette's patterns: ``*.example.com``)
    a request's Host may give; ``*`` for any."""
    pages = Pages(backend)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": "no such page"}, status_code=status)
        return pages.render("error.html", status, page="", error=f"no page at {request.url.path}")

    app = Starlette(
        routes=[
            Route("/", _home),
            Route("/topics", pages.topics),
            Route("/search", pages.search),
            Route("/message", pages.message),
            Route("/message/body", pages.body),
            Route("/rate", pages.rate),
            Route("/groups", pages.groups),
            Route("/pending", pages.pending),
            Route("/nodes", pages.nodes),
            Route("/api/{name}", pages.api),
            Route("/healthz", _health),
            Route("/readyz", pages.ready),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        exception_handlers={404: not_found, 405: not_found},
    )
    return Guard(app, users, allowed_hosts)
