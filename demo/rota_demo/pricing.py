"""The example product's pricing table, rendered from the plans object that ranks its
claim (the same :data:`rota_demo.app.PLANS` its queue is given).

The "search queue" row is stored nowhere: it is each plan's place in the claim's
priority order (the lowest plan is "Standard", the highest "First", each plan between
them is "Ahead of" the plan below it), so the table cannot promise an order the claim
does not keep. The other rows are the plans' limits.
"""

from __future__ import annotations

from rota import Plan, Plans


def queue_label(plans: Plans, plan: Plan) -> str:
    """The customer-facing "search queue" label of ``plan``: its place in ``plans``'
    priority order (Free "Standard", Standard "Ahead of Free", Pro "First")."""
    ordered = list(plans)  # lowest to highest priority: Plans refuses any other order
    rank = ordered.index(plan)
    if rank == 0:
        return "Standard"
    if rank == len(ordered) - 1:
        return "First"
    return f"Ahead of {ordered[rank - 1].name}"


def pricing_rows(plans: Plans) -> list[tuple[str, list[str]]]:
    """Rows of the pricing table, one value per plan (lowest first): ("Search queue",
    labels from the priority order), then one row per limit key."""
    rows: list[tuple[str, list[str]]] = [("Search queue", [queue_label(plans, p) for p in plans])]
    keys: list[str] = []
    for p in plans:
        keys.extend(k for k in p.limits if k not in keys)
    for k in keys:
        label = k.replace("_", " ").capitalize()
        rows.append((label, [str(p.limits.get(k, "—")) for p in plans]))
    return rows
