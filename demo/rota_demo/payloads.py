"""Job payloads of the example's frozen dataclasses (:class:`~rota_demo.brief.Brief`,
:class:`~rota_demo.youtube.client.Channel`, ...): one JSON-serializable dict each way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, asdict
from typing import Any, ClassVar, Self


class Payload:
    """Base of a dataclass that travels in job payloads."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def to_payload(self) -> dict[str, Any]:
        """A JSON-serializable dict (for job payloads); inverse of :meth:`from_payload`."""
        return asdict(self)

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Self:
        """Rebuild from :meth:`to_payload` output (unknown keys ignored)."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})
