"""rota's web apps: the cron endpoint (:mod:`rota.web.cron`), the dashboard
(:mod:`rota.web.dashboard`) and Prometheus metrics (:mod:`rota.web.metrics`).

The dashboard is imported on first use: Jinja2 and prometheus_client would otherwise
add about 150 ms to the start of every process that imports rota (a worker, a cron run).
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .cron import *  # noqa: F403 (what rota.web.cron exports, named in its __all__)
from .cron import __all__ as _cron_all

if TYPE_CHECKING:
    from .dashboard import dashboard_app


def lazy_dashboard(module: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` (PEP 562) of ``module`` (``rota``, ``rota.web``): its
    ``dashboard_app``, imported on first use."""

    def module_getattr(name: str) -> Any:
        if name == "dashboard_app":
            from .dashboard import dashboard_app

            return dashboard_app
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return module_getattr


__getattr__ = lazy_dashboard(__name__)


__all__ = [*_cron_all, "dashboard_app"]
