"""A Kubernetes API server fake, for the faults a real one cannot be made to give on demand
(`fail_next` injects an error status, `delay` hangs every answer); every request (verb,
path) and the status it got are recorded, for RBAC checks.

It speaks the REST paths of the official client, core and grouped, namespaced or not, with
the semantics gpuscaler depends on: resourceVersion bumped by every write, a stale one 409;
AlreadyExists and NotFound as `Status` objects; JSON merge and strategic merge PATCH (else
415); label and field selectors on lists; `pods/NAME/eviction` refused (429) by a
PodDisruptionBudget with no disruption allowed; `pods/NAME/binding`.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

Json = dict[str, Any]
Key = tuple[str, str, str | None, str]  # (group/version, plural, namespace, name)

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Maps merge; lists of objects keyed by `name` or `type` merge by that key; other
    lists are replaced; `null` deletes."""
    if isinstance(patch, dict):
        out = dict(target) if isinstance(target, dict) else {}
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = strategic_merge_patch(out.get(k), v)
        return out
    if (
        isinstance(patch, list)
        and isinstance(target, list)
        and patch
        and all(isinstance(p, dict) for p in patch)
    ):
        key = next((k for k in ("name", "type") if all(k in p for p in patch)), None)
        if key is not None:
            merged = [dict(t) for t in target]
            for p in patch:
                i = next((i for i, t in enumerate(merged) if t.get(key) == p[key]), None)
                if i is None:
                    merged.append(copy.deepcopy(p))
                else:
                    merged[i] = strategic_merge_patch(merged[i], p)
            return merged
    return copy.deepcopy(patch)


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in re.split(r",(?![^()]*\))", selector))):
        if m := re.match(r"^(\S+)\s+(in|notin)\s+\((.*)\)$", term):
            values = {v.strip() for v in m.group(3).split(",")}
            has = labels.get(m.group(1)) in values
            if has != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _fields_match(selector: str, obj: Json) -> bool:
    """Field selector equalities (`a.b=v`, `a.b==v`, `a.b!=v`), as the API server applies
    them to the fields it supports (pods: spec.nodeName, metadata.name, status.phase)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        path, value = re.split(r"!=|==|=", term, maxsplit=1)
        actual: Any = obj
        for part in path.split("."):
            actual = actual.get(part) if isinstance(actual, dict) else None
        if (str(actual if actual is not None else "") == value) == negate:
            return False
    return True


def status(code: int, reason: str, message: str) -> Json:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class FakeCluster:
    objects: dict[Key, Json] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    """(verb, path) of every request, for RBAC checks."""
    codes: list[int] = field(default_factory=list)
    """The status code answered to each request, in the same order."""
    faults: list[tuple[str, re.Pattern[str], int, int]] = field(default_factory=list)
    version: int = 1000
    lock: threading.Lock = field(default_factory=threading.Lock)
    delay: float = 0.0
    """Seconds every request waits before it is answered: a server that hangs."""

    def _bump(self, obj: Json) -> Json:
        self.version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        return obj

    def add(self, gv: str, plural: str, obj: Json) -> Json:
        """Seed an object (as if created earlier)."""
        meta = _stamped(obj.setdefault("metadata", {}))
        with self.lock:
            self.objects[(gv, plural, meta.get("namespace"), meta["name"])] = self._bump(
                copy.deepcopy(obj)
            )
        return obj

    def get(self, gv: str, plural: str, namespace: str | None, name: str) -> Json | None:
        return copy.deepcopy(self.objects.get((gv, plural, namespace, name)))

    def fail_next(self, verb: str, path_pattern: str, code: int, after: int = 0) -> None:
        """The next `verb` request whose path matches gets `code` (after letting `after`
        such requests through)."""
        self.faults.append((verb, re.compile(path_pattern), code, after))

    def answered(self, verb: str, path_pattern: str, code: int) -> int:
        """How many `verb` requests matching the path were answered with `code`."""
        pattern = re.compile(path_pattern)
        return sum(
            1
            for (v, p), c in zip(self.requests, self.codes, strict=True)
            if v == verb and pattern.search(p) and c == code
        )

    # ------------------------------------------------------------------ handling

    def handle(
        self, verb: str, path: str, query: dict[str, list[str]], ctype: str, body: Any
    ) -> tuple[int, Json]:
        with self.lock:
            self.requests.append((verb, path))
            code, answer = self._answer(verb, path, query, ctype, body)
            self.codes.append(code)
            return code, answer

    def _answer(
        self, verb: str, path: str, query: dict[str, list[str]], ctype: str, body: Any
    ) -> tuple[int, Json]:
        for i, (v, pattern, code, after) in enumerate(self.faults):
            if v == verb and pattern.search(path):
                if after > 0:
                    self.faults[i] = (v, pattern, code, after - 1)
                    break
                del self.faults[i]
                return code, status(
                    code, "InternalError" if code >= 500 else "Injected", "injected fault"
                )
        m = _PATH.match(path)
        if not m:
            return 404, status(404, "NotFound", f"no route {path}")
        gv = "v1" if m.group("core") else f"{m.group('group')}/{m.group('version')}"
        ns, plural, name, sub = m.group("ns", "plural", "name", "sub")
        key: Key = (gv, plural, ns, name or "")
        if sub == "eviction" and verb == "POST":
            return self._evict(ns, name or "", (body or {}).get("deleteOptions"))
        if sub == "binding" and verb == "POST":
            return self._bind(ns, name or "", body)
        if sub is not None and sub != "status":
            return 404, status(404, "NotFound", f"no subresource {sub}")
        if name is None:
            if verb == "GET":
                return 200, self._list(gv, plural, ns, query)
            if verb == "POST":
                return self._create(gv, plural, ns, body)
            return 405, status(405, "MethodNotAllowed", verb)
        current = self.objects.get(key)
        if current is None:
            return 404, status(404, "NotFound", f'{plural} "{name}" not found')
        if verb == "GET":
            return 200, copy.deepcopy(current)
        if verb == "DELETE":
            refused = _precondition_failed(current, body)
            if refused is not None:
                return refused
            del self.objects[key]
            return 200, status(200, "", "deleted") | {"status": "Success"}
        if verb == "PUT":
            sent = (body.get("metadata") or {}).get("resourceVersion")
            if sent is not None and sent != current["metadata"]["resourceVersion"]:
                return 409, status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; please apply your changes to the latest version and try again',
                )
            new = copy.deepcopy(body)
            new["metadata"] = {**current["metadata"], **new.get("metadata", {})}
            self.objects[key] = self._bump(new)
            return 200, copy.deepcopy(new)
        if verb == "PATCH":
            if ctype.startswith("application/merge-patch+json"):
                new = merge_patch(current, body)
            elif ctype.startswith("application/strategic-merge-patch+json"):
                new = strategic_merge_patch(current, body)
            else:
                return 415, status(415, "UnsupportedMediaType", f"unsupported patch type {ctype}")
            sent = ((body or {}).get("metadata") or {}).get("resourceVersion")
            if sent is not None and sent != current["metadata"]["resourceVersion"]:
                return 409, status(409, "Conflict", "the object has been modified")
            self.objects[key] = self._bump(new)
            return 200, copy.deepcopy(new)
        return 405, status(405, "MethodNotAllowed", verb)

    def _list(self, gv: str, plural: str, ns: str | None, query: dict[str, list[str]]) -> Json:
        selector = (query.get("labelSelector") or [""])[0]
        fields = (query.get("fieldSelector") or [""])[0]
        items = [
            copy.deepcopy(o)
            for (g, p, n, _), o in sorted(self.objects.items(), key=lambda kv: kv[0][3])
            if g == gv
            and p == plural
            and (ns is None or n == ns)
            and _selector_matches(selector, (o.get("metadata") or {}).get("labels") or {})
            and _fields_match(fields, o)
        ]
        kind = (items[0].get("kind", "") + "List") if items else "List"
        return {
            "kind": kind,
            "apiVersion": gv,
            "metadata": {"resourceVersion": str(self.version)},
            "items": items,
        }

    def _create(self, gv: str, plural: str, ns: str | None, body: Json) -> tuple[int, Json]:
        meta = body.setdefault("metadata", {})
        if "name" not in meta and "generateName" in meta:
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if ns is not None:
            meta["namespace"] = ns
        key: Key = (gv, plural, ns, meta.get("name", ""))
        if key in self.objects:
            return 409, status(
                409, "AlreadyExists", f'{plural} "{meta.get("name")}" already exists'
            )
        _stamped(meta)
        self.objects[key] = self._bump(copy.deepcopy(body))
        return 201, copy.deepcopy(self.objects[key])

    def _bind(self, ns: str | None, name: str, body: Json) -> tuple[int, Json]:
        """pods/NAME/binding: sets spec.nodeName once; a bound pod or another UID is 409,
        as the real registry does (pkg/registry/core/pod/storage assignPod)."""
        pod = self.objects.get(("v1", "pods", ns, name))
        if pod is None:
            return 404, status(404, "NotFound", f'pods "{name}" not found')
        uid = (body.get("metadata") or {}).get("uid")
        if uid and uid != pod["metadata"].get("uid"):
            return 409, status(409, "Conflict", "Precondition failed: UID")
        if pod.get("spec", {}).get("nodeName"):
            return 409, status(409, "Conflict", f"pod {name} is already assigned")
        pod.setdefault("spec", {})["nodeName"] = body["target"]["name"]
        self._bump(pod)
        return 201, status(201, "Created", "bound") | {"status": "Success"}

    def _evict(self, ns: str | None, name: str, options: Json | None) -> tuple[int, Json]:
        key: Key = ("v1", "pods", ns, name)
        pod = self.objects.get(key)
        if pod is None:
            return 404, status(404, "NotFound", f'pods "{name}" not found')
        refused = _precondition_failed(pod, options)
        if refused is not None:
            return refused
        labels = pod["metadata"].get("labels") or {}
        for (g, p, n, _), pdb in self.objects.items():
            if g == "policy/v1" and p == "poddisruptionbudgets" and n == ns:
                match = (pdb.get("spec", {}).get("selector") or {}).get("matchLabels") or {}
                allowed = (pdb.get("status") or {}).get("disruptionsAllowed", 0)
                if all(labels.get(k) == v for k, v in match.items()) and allowed <= 0:
                    return 429, status(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                    )
        del self.objects[key]
        return 201, status(201, "", "evicted") | {"status": "Success"}


def _stamped(meta: Json) -> Json:
    """`meta` with the uid and creationTimestamp the server sets on create."""
    meta.setdefault("uid", str(uuid.uuid4()))
    meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return meta


def _precondition_failed(obj: Json, options: Json | None) -> tuple[int, Json] | None:
    """DeleteOptions.preconditions.uid, as the API server checks it (409 Conflict)."""
    uid = ((options or {}).get("preconditions") or {}).get("uid")
    if uid is None or uid == obj["metadata"].get("uid"):
        return None
    message = (
        f"Precondition failed: UID in precondition: {uid}, "
        f"UID in object meta: {obj['metadata'].get('uid')}"
    )
    return 409, status(409, "Conflict", message)


@contextmanager
def fake_apiserver(cluster: FakeCluster | None = None) -> Iterator[tuple[str, FakeCluster]]:
    cluster = cluster or FakeCluster()

    class Handler(BaseHTTPRequestHandler):
        def _do(self) -> None:
            url = urlparse(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                self._send(400, status(400, "BadRequest", "body is not JSON"))
                return
            assert cluster is not None
            if cluster.delay:
                time.sleep(cluster.delay)
            code, out = cluster.handle(
                self.command,
                url.path,
                parse_qs(url.query),
                self.headers.get("Content-Type", ""),
                body,
            )
            self._send(code, out)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _do

        def _send(self, code: int, body: Json) -> None:
            reply(self, code, json.dumps(body).encode(), {"Content-Type": "application/json"})

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield url, cluster


def reply(handler: BaseHTTPRequestHandler, code: int, body: bytes, headers: dict[str, str]) -> None:
    """Send `body` with status `code`, `headers` and its Content-Length."""
    handler.send_response(code)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free 127.0.0.1 port in a thread; yields its URL, stops after."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def kubeconfig_for(url: str, path: Path) -> Path:
    """A kubeconfig at `path` pointing a client at `url` (the fake, or a closed port)."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
                "current-context": "fake",
            }
        )
    )
    return path
