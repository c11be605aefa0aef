"""A schema's objects as PostgreSQL's catalogs describe them, for comparing two schemas
built different ways (a fresh install against replayed migrations).

Every definition is read back through pg_catalog (format_type, pg_get_expr,
pg_get_indexdef, pg_get_constraintdef, pg_get_functiondef, pg_get_triggerdef), so two
schemas compare equal exactly when the database holds the same objects, whatever the SQL
text that made them; the schema's own name is replaced by ``SCHEMA``.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import psycopg

#: Each kind of object: a query over the schema named by %(schema)s returning
#: (key, definition) rows.
QUERIES: dict[str, str] = {
    "relation": """
        SELECT c.relname,
               c.relkind::text || ' ' || c.relpersistence::text || ' '
               || coalesce(array_to_string(c.reloptions, ','), '')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f', 'c')
    """,
    "column": """
        SELECT c.relname || '.' || a.attname,
               'position ' || row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum)
               || ' ' || format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
               || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
               || CASE a.attidentity WHEN 'a' THEN ' identity always'
                                     WHEN 'd' THEN ' identity by default' ELSE '' END
               || CASE WHEN a.attgenerated <> '' THEN ' generated' ELSE '' END
               || coalesce(' collate ' || nullif(co.collname, 'default'), '')
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation co ON co.oid = a.attcollation
        WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c')
          AND a.attnum > 0 AND NOT a.attisdropped
    """,
    "sequence": """
        SELECT s.sequencename,
               s.data_type || ' start ' || s.start_value || ' increment ' || s.increment_by
               || ' min ' || s.min_value || ' max ' || s.max_value || ' cache '
               || s.cache_size || CASE WHEN s.cycle THEN ' cycle' ELSE '' END
        FROM pg_sequences s WHERE s.schemaname = %(schema)s
    """,
    "index": """
        SELECT i.relname, pg_get_indexdef(x.indexrelid)
        FROM pg_index x
        JOIN pg_class i ON i.oid = x.indexrelid
        JOIN pg_namespace n ON n.oid = i.relnamespace
        WHERE n.nspname = %(schema)s
    """,
    "constraint": """
        SELECT coalesce(r.relname, t.typname) || '.' || c.conname,
               pg_get_constraintdef(c.oid)
               || CASE WHEN c.condeferrable THEN ' deferrable' ELSE '' END
        FROM pg_constraint c
        JOIN pg_namespace n ON n.oid = c.connamespace
        LEFT JOIN pg_class r ON r.oid = c.conrelid
        LEFT JOIN pg_type t ON t.oid = c.contypid
        WHERE n.nspname = %(schema)s
    """,
    "function": """
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
               pg_get_functiondef(p.oid)
               -- who may call it: a SECURITY DEFINER entry point revokes PUBLIC's EXECUTE
               || E'\n-- acl ' || coalesce(p.proacl::text, 'default')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(schema)s
    """,
    "trigger": """
        SELECT c.relname || '.' || t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND NOT t.tgisinternal
    """,
}

Catalog = dict[str, dict[str, str]]


def normalize(text: str, schema: str) -> str:
    """``text`` with the schema's name, quoted or not, replaced by ``SCHEMA``."""
    text = text.replace(f'"{schema}"', "SCHEMA")
    return re.sub(rf"(?<![\w$]){re.escape(schema)}(?![\w$])", "SCHEMA", text)


def snapshot(conn: psycopg.Connection[Any], schema: str) -> Catalog:
    """Every object of ``schema``: ``{kind: {name: definition}}``."""
    out: Catalog = {}
    for kind, query in QUERIES.items():
        rows = conn.execute(query, {"schema": schema}).fetchall()
        out[kind] = {normalize(k, schema): normalize(v, schema) for k, v in rows}
    return out


def differences(a: Catalog, b: Catalog, a_name: str = "a", b_name: str = "b") -> list[str]:
    """What differs between two snapshots, one entry per object (empty when equal); a
    definition that differs comes with a unified diff."""
    out = []
    for kind in QUERIES:
        left, right = a.get(kind, {}), b.get(kind, {})
        for name in sorted(left.keys() | right.keys()):
            if name not in right:
                out.append(f"{kind} {name}: only in {a_name}")
            elif name not in left:
                out.append(f"{kind} {name}: only in {b_name}")
            elif left[name] != right[name]:
                diff = difflib.unified_diff(
                    left[name].splitlines(), right[name].splitlines(),
                    a_name, b_name, lineterm="", n=1)
                out.append(f"{kind} {name} differs:\n" + "\n".join(diff))
    return out
