"""kube-scheduler's extender wire protocol, as the scheduler speaks it.

Source: kubernetes/kube-scheduler `extender/v1/types.go` (read at commit e87dbddd,
July 2026; also k8s.io/kubernetes staging/src/k8s.io/kube-scheduler/extender/v1).
The JSON keys are the Go field names (no json tags there):

- ExtenderArgs {Pod *v1.Pod, Nodes *v1.NodeList, NodeNames *[]string}: with
  nodeCacheCapable the scheduler fills NodeNames and sends Nodes as null.
- ExtenderFilterResult {Nodes, NodeNames, FailedNodes map[string]string,
  FailedAndUnresolvableNodes map[string]string, Error string}: a reply with neither
  Nodes nor NodeNames keeps no node at all, so every reply here carries one of them.
- HostPriorityList [{Host string, Score int64}] with scores in
  [MinExtenderPriority 0, MaxExtenderPriority 10].
- ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node} -> ExtenderBindingResult {Error}.

Bodies are decoded with orjson and checked by pydantic; anything else is a
`ProtocolError` (the server answers 400 naming what is wrong).
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

M = TypeVar("M", bound=BaseModel)


class ProtocolError(ValueError):
    """A request body that is not the extender protocol; the message says where."""


class _Lenient(BaseModel):
    """Kubernetes objects carry many fields we do not read: ignore them."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class ObjectMeta(_Lenient):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    annotations: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)


class PodSpec(_Lenient):
    schedulerName: str = ""
    nodeName: str = ""


class Pod(_Lenient):
    metadata: ObjectMeta
    spec: PodSpec = PodSpec()


class NodeList(_Lenient):
    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_Lenient):
    Pod: Pod
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None

    def node_names(self) -> list[str]:
        if self.NodeNames is not None:
            return self.NodeNames
        assert self.Nodes is not None
        return [_node_name(item) for item in self.Nodes.items]


class ExtenderBindingArgs(_Lenient):
    PodName: str = Field(min_length=1)
    PodNamespace: str = ""
    PodUID: str = Field(min_length=1)
    Node: str = Field(min_length=1)


def _node_name(item: dict[str, Any]) -> str:
    meta = item.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise ProtocolError("Nodes.items[]: a node without metadata.name")
    return name


def _parse(body: bytes, model: type[M]) -> M:
    """The body as `model`; ProtocolError naming the first thing wrong."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ProtocolError(f"body is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"body is not a JSON object ({model.__name__})")
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        path = ".".join(str(p) for p in first["loc"]) or "body"
        raise ProtocolError(f"not {model.__name__}: {path}: {first['msg']}") from None


def parse_args(body: bytes, max_nodes: int) -> ExtenderArgs:
    """A filter or prioritize request naming at most `max_nodes` nodes."""
    args = _parse(body, ExtenderArgs)
    if args.NodeNames is None and args.Nodes is None:
        raise ProtocolError("not ExtenderArgs: neither NodeNames nor Nodes is set")
    count = len(args.node_names())  # every node has a name
    if count > max_nodes:
        raise ProtocolError(f"{count} nodes, more than the {max_nodes} allowed (max_nodes)")
    return args


def parse_binding(body: bytes) -> ExtenderBindingArgs:
    return _parse(body, ExtenderBindingArgs)


def filter_result(
    args: ExtenderArgs,
    kept: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> bytes:
    """ExtenderFilterResult in the form the request came in: NodeNames for a
    node-cache-capable scheduler, else the kept Nodes objects. Never without either."""
    result: dict[str, Any] = {
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }
    if args.NodeNames is not None:
        result["NodeNames"] = kept
        result["Nodes"] = None
    else:
        assert args.Nodes is not None
        keep = set(kept)
        items = [i for i in args.Nodes.items if _node_name(i) in keep]
        result["Nodes"] = {"metadata": {}, "items": items}
        result["NodeNames"] = None
    return orjson.dumps(result)


def priorities(scores: list[tuple[str, int]]) -> bytes:
    return orjson.dumps([{"Host": host, "Score": value} for host, value in scores])


def binding_result(error: str = "") -> bytes:
    return orjson.dumps({"Error": error})
