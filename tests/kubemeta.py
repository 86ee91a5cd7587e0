"""Typed reads of the official client's objects, whose fields are all Optional."""

from __future__ import annotations

from typing import Any, Protocol

from kubernetes import client


class HasMetadata(Protocol):
    @property
    def metadata(self) -> client.V1ObjectMeta | None: ...


def meta(obj: HasMetadata) -> client.V1ObjectMeta:
    assert obj.metadata is not None, "object without metadata"
    return obj.metadata


def labels_of(obj: HasMetadata) -> dict[str, str]:
    return dict(meta(obj).labels or {})


def annotations_of(obj: HasMetadata) -> dict[str, str]:
    return dict(meta(obj).annotations or {})


def status_of(obj: Any) -> Any:
    """`obj.status`, asserted present (its type differs per kind)."""
    assert obj.status is not None, "object without status"
    return obj.status
