"""rota's dashboard inside a Django project, behind Django's staff login
(docs/django.md, "Dashboard")::

    urlpatterns = [..., path("rota/", include("rota.contrib.django.urls"))]

Each request is checked by Django (``staff_member_required``: a logged-in, active staff
user, else the admin's login page), then answered by the dashboard's ASGI app in
process, mounted at the prefix, so its links follow it. The dashboard's own credential
is a secret of this process that the view adds itself; its Retry and Cancel forms keep
their own CSRF token and same-origin check (Django's CSRF middleware is not asked: the
forms do not carry Django's token)."""

from __future__ import annotations

import secrets
from typing import Any

import httpx
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from ...web import dashboard_app
from .worker import backend, make_queue

#: The dashboard's credential inside this process (never leaves it).
_SECRET = secrets.token_urlsafe(32)
#: Request headers not passed on (the view sets the credential; hop-by-hop ones).
_DROPPED = frozenset({"authorization", "cookie", "content-length", "host", "connection"})


@csrf_exempt
@staff_member_required
async def dashboard(request: HttpRequest, path: str = "") -> HttpResponse:
    """Answer one dashboard request for a staff user (see the module)."""
    prefix = request.path[:len(request.path) - len(path)].rstrip("/")
    async with make_queue(backend()) as queue:
        app = dashboard_app(queue, secret=_SECRET)
        transport = httpx.ASGITransport(app=app, root_path=prefix)
        headers: dict[str, Any] = {k: v for k, v in request.headers.items()
                                   if k.lower() not in _DROPPED}
        headers["Authorization"] = f"Bearer {_SECRET}"
        async with httpx.AsyncClient(
                transport=transport, base_url=f"{request.scheme}://{request.get_host()}"
                ) as client:
            reply = await client.request(request.method or "GET", request.get_full_path(),
                                         headers=headers, content=request.body)
    response = HttpResponse(reply.content, status=reply.status_code)
    for key, value in reply.headers.items():
        if key.lower() not in ("content-length", "content-encoding", "transfer-encoding"):
            response[key] = value
    return response
