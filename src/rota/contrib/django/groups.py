"""Groups from a Django model (docs/django.md, "Groups"): the view rota reads as its
groups relation (columns ``group_id``, ``owner_id``, ``plan``, ``active``), made by
``rota_migrate`` over the model's table, so a project's tenants model gives its tasks
the fair claim, plans and quotas without SQL of its own."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from psycopg import sql

from ...db import identifier
from .backend import RotaBackend


def view_sql(b: RotaBackend) -> sql.Composed | None:
    """``CREATE OR REPLACE VIEW`` of the backend's groups relation over its model's
    table, or ``None`` without ``OPTIONS['GROUPS']``.

    Raises:
        ImproperlyConfigured: an unknown model or field, or a bad view name.
    """
    g = b.config.groups
    view = b.config.groups_view
    if g is None or view is None:
        return None
    try:
        model = apps.get_model(str(g["MODEL"]))
    except (LookupError, ValueError) as exc:
        raise ImproperlyConfigured(f"rota: OPTIONS['GROUPS']['MODEL']: {exc}") from None

    def column(key: str) -> sql.Composable | None:
        name = g.get(key)
        if name is None:
            return None
        try:
            return sql.Identifier(model._meta.get_field(name).column)
        except FieldDoesNotExist:
            raise ImproperlyConfigured(
                f"rota: OPTIONS['GROUPS'][{key!r}]: {model.__name__} has no field "
                f"{name!r}") from None

    def text_or_null(key: str) -> sql.Composable:
        c = column(key)
        return sql.SQL("NULL::text") if c is None else sql.SQL("{}::text").format(c)

    gid = column("GROUP_ID")
    active = column("ACTIVE")
    try:
        view_ident = identifier(view, "groups view", qualified=True)
    except ValueError as exc:
        raise ImproperlyConfigured(f"rota: OPTIONS['GROUPS']['VIEW']: {exc}") from None
    return sql.SQL(
        "CREATE OR REPLACE VIEW {view} AS SELECT {gid}::text AS group_id, "
        "{owner} AS owner_id, {plan} AS plan, {active} AS active FROM {table}").format(
        view=view_ident, gid=gid, owner=text_or_null("OWNER_ID"),
        plan=text_or_null("PLAN"),
        active=sql.SQL("true") if active is None else sql.SQL("{}::boolean").format(active),
        table=sql.Identifier(model._meta.db_table))


def create_view(b: RotaBackend) -> str | None:
    """Create (or replace) the groups view on the backend's database; returns its name,
    or ``None`` when the backend has no ``GROUPS``."""
    statement = view_sql(b)
    if statement is None:
        return None
    conn: Any = b.connection()
    with conn.transaction():
        conn.execute(statement)
    return b.config.groups_view
