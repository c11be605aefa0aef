"""The YouTube Data API v3 as the example pipeline uses it, in three pieces:

- :mod:`~rota_demo.youtube.client`: :class:`YouTubeClient`, the three calls the pipeline
  makes, each returning its items and the quota units it cost, with the API's errors
  mapped to :class:`QuotaExceeded`, :class:`YouTubeTimeout` and :class:`YouTubeError`;
- :mod:`~rota_demo.youtube.stand_in`: :func:`stand_in_app`, a local server with the real
  API's response shapes and quota rules, able to inject timeouts and errors;
- :mod:`~rota_demo.youtube.fixtures`: the stand-in's deterministic pool of fake channels;

and :mod:`~rota_demo.youtube.api`, the rules both sides share (units per call, the daily
quota, the Pacific quota day). Serve the stand-in with
:func:`rota_demo.loopback.serve_in_thread`.
"""

from .api import (
    DAILY_UNITS,
    DEFAULT_BASE_URL,
    PACIFIC,
    STAND_IN_PREFIX,
    UNIT_COST,
    next_reset,
    quota_day,
)
from .client import (
    ApiResult,
    Channel,
    ChannelHit,
    Comment,
    QuotaExceeded,
    YouTubeClient,
    YouTubeError,
    YouTubeTimeout,
)
from .stand_in import StandIn, stand_in_app

__all__ = [
    "DAILY_UNITS",
    "DEFAULT_BASE_URL",
    "PACIFIC",
    "STAND_IN_PREFIX",
    "UNIT_COST",
    "ApiResult",
    "Channel",
    "ChannelHit",
    "Comment",
    "QuotaExceeded",
    "StandIn",
    "YouTubeClient",
    "YouTubeError",
    "YouTubeTimeout",
    "next_reset",
    "quota_day",
    "stand_in_app",
]
