"""Command handlers and queries for the API's objects.

A write locks the object's read-model row (``FOR UPDATE``), checks the
caller's ``resourceVersion``, validates, and in one transaction appends the
event that carries the new state and applies it to the read model (inline
projection). Objects it refers to are locked ``FOR SHARE`` so that a
concurrent delete of a referenced object waits and then sees the new
dependent; a delete locks ``FOR UPDATE`` and refuses while anything depends
on the object.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from pydantic import BaseModel, ValidationError
from sqlalchemy import Connection, Engine, select, tuple_
from sqlalchemy.engine import Row

from service.app.auth import Principal, Role, require
from service.app.crypto import SecretBox
from service.app.errors import (
    AlreadyExists,
    BeingDeleted,
    Forbidden,
    InUse,
    Invalid,
    NotFound,
    StaleVersion,
    UnknownReference,
)
from service.app.floor import relaxations
from service.app.kinds import COLLECTION_ENDED, FLOOR_RELAXERS, KINDS, QUOTA_WRITERS, Kind
from service.app.kube_schemas import custom_problems
from service.app.references import dependents, references
from service.app.schemas import API_VERSION, KUEUE_API_VERSION, ObjectMeta, SecurityPolicy, dump
from service.app.selectors import FieldSelector, LabelSelector
from service.app.uow import SqlUnitOfWork
from service.app.visibility import object_for
from service.app.workloads import validation_problems
from service.eventstore.port import ConcurrencyConflict, EventMetadata, NewEvent
from service.ledger import entries as ledger
from service.ledger.chain import NewLedgerEntry
from service.projections.resources import resource_row, upsert_resources
from service.projections.schema import resources

Obj = dict[str, Any]
MAX_LIMIT = 1000


@dataclass(frozen=True)
class Actor:
    principal: Principal
    request_id: str | None = None

    def metadata(self) -> EventMetadata:
        return EventMetadata(
            actor=self.principal.name, occurred_at=datetime.now(UTC), request_id=self.request_id
        )


@dataclass(frozen=True)
class Page:
    items: list[Obj]
    continue_token: str | None
    resource_version: str


def stream_name(kind: str, namespace: str, name: str) -> str:
    return f"{kind.lower()}-{namespace}/{name}" if namespace else f"{kind.lower()}-{name}"


def to_object(kind: Kind, row: Row[Any] | Mapping[str, Any]) -> Obj:
    r = row._mapping if isinstance(row, Row) else row
    metadata: Obj = {
        "name": r["name"],
        "uid": str(r["uid"]),
        "resourceVersion": str(r["resource_version"]),
        "generation": r["generation"],
        "creationTimestamp": _rfc3339(r["created_at"]),
    }
    if kind.namespaced:
        metadata["namespace"] = r["namespace"]
    if r["labels"]:
        metadata["labels"] = r["labels"]
    if r["annotations"]:
        metadata["annotations"] = r["annotations"]
    obj: Obj = {"apiVersion": API_VERSION, "kind": kind.kind, "metadata": metadata}
    if kind.flat:
        obj.update(r["spec"])
    else:
        obj["spec"] = r["spec"]
        obj["status"] = r["status"]
    return obj


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_object(kind: Kind, body: Any, namespace: str | None) -> tuple[ObjectMeta, BaseModel]:
    """Metadata and spec of a client's object; Invalid naming every field at fault."""
    if not isinstance(body, Mapping):
        raise Invalid("the body must be a JSON or YAML object", [("", "expected an object")])
    problems: list[tuple[str, str]] = []
    api_version = body.get("apiVersion", API_VERSION)
    upstream = kind.crd or KUEUE_API_VERSION
    if api_version not in (API_VERSION, upstream):
        problems.append(("apiVersion", f"must be {API_VERSION} (or {upstream})"))
    if body.get("kind", kind.kind) != kind.kind:
        problems.append(("kind", f"must be {kind.kind} on this path"))
    allowed_top = {"apiVersion", "kind", "metadata", "status"} | (
        set(kind.spec.model_fields) if kind.flat else {"spec"}
    )
    problems += [(str(key), "unknown field") for key in body if key not in allowed_top]
    if not kind.flat and "spec" not in body:
        problems.append(("spec", "Field required"))
    meta: ObjectMeta | None = None
    spec: BaseModel | None = None
    try:
        meta = ObjectMeta.model_validate(body.get("metadata"))
    except ValidationError as error:
        problems += [
            (f"metadata.{p}" if p else "metadata", m) for p, m in validation_problems(error)
        ]
    raw_spec = (
        {k: body[k] for k in kind.spec.model_fields if k in body}
        if kind.flat
        else body.get("spec", {})
    )
    try:
        spec = kind.spec.model_validate(raw_spec)
    except ValidationError as error:
        prefix = "" if kind.flat else "spec"
        problems += [
            (".".join(x for x in (prefix, p) if x), m) for p, m in validation_problems(error)
        ]
    if kind.crd is not None and isinstance(raw_spec, Mapping):
        crd_object = {"apiVersion": kind.crd, "kind": kind.kind, "spec": raw_spec}
        problems += custom_problems(crd_object)
    if meta is not None and kind.namespaced and meta.namespace not in (None, namespace):
        problems.append(("metadata.namespace", f"does not match the path's namespace {namespace}"))
    if meta is not None and not kind.namespaced and meta.namespace:
        problems.append(("metadata.namespace", f"{kind.kind} is cluster-scoped"))
    if problems or meta is None or spec is None:
        raise Invalid(f"{kind.kind} is invalid", problems)
    return meta, spec


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return patch
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def encode_continue(namespace: str, name: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([namespace, name]).encode()).decode()


def decode_continue(token: str) -> tuple[str, str]:
    try:
        namespace, name = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(namespace), str(name)
    except (binascii.Error, ValueError, TypeError) as error:
        raise Invalid("bad continue token", [("continue", "not a token from this API")]) from error


References = Callable[[Connection, str, BaseModel, Obj | None], list[tuple[str, str]]]


class ResourceService:
    def __init__(
        self, engine: Engine, unit_of_work: Callable[[], SqlUnitOfWork], secrets: SecretBox
    ) -> None:
        self._engine = engine
        self._uow = unit_of_work
        self._secrets = secrets

    # -- queries -------------------------------------------------------------------------

    def get(self, principal: Principal, plural: str, namespace: str, name: str) -> Obj:
        kind = KINDS[plural]
        require(principal, kind.read, namespace if kind.namespaced else None)
        with self._engine.connect() as conn:
            row = self._row(conn, kind, namespace, name)
        if row is None or row.deleted:
            raise NotFound(f'{kind.plural} "{name}" not found')
        return object_for(to_object(kind, row), principal)

    def list(
        self,
        principal: Principal,
        plural: str,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> Page:
        kind = KINDS[plural]
        if kind.namespaced and namespace is None:
            require(principal, kind.read - {Role.SUBMITTER})
        else:
            require(principal, kind.read, namespace if kind.namespaced else None)
        labels = LabelSelector.parse(label_selector or "")
        fields = FieldSelector.parse(field_selector or "", kind.kind)
        size = min(limit or MAX_LIMIT, MAX_LIMIT)
        query = select(resources).where(
            resources.c.kind == kind.kind, resources.c.deleted.is_(False)
        )
        if namespace is not None:
            query = query.where(resources.c.namespace == namespace)
        if continue_token:
            after = decode_continue(continue_token)
            query = query.where(tuple_(resources.c.namespace, resources.c.name) > after)
        query = labels.where(query, resources.c.labels)
        query = fields.where(query)
        query = query.order_by(resources.c.namespace, resources.c.name).limit(size + 1)
        with self._engine.connect() as conn:
            rows = conn.execute(query).all()
            head = conn.exec_driver_sql("SELECT position FROM event_head WHERE id = 1").scalar()
        more = len(rows) > size
        rows = rows[:size]
        token = encode_continue(rows[-1].namespace, rows[-1].name) if more and rows else None
        objects = [object_for(to_object(kind, r), principal) for r in rows]
        return Page(objects, token, str(head or 0))

    def secret(self, plural: str, name: str) -> dict[str, Any] | None:
        """A cluster's decrypted credentials, for the workers only (never the API)."""
        with self._engine.connect() as conn:
            row = self._row(conn, KINDS[plural], "", name)
        if row is None or row.secret is None:
            return None
        decoded: dict[str, Any] = json.loads(self._secrets.open(row.secret))
        return decoded

    # -- commands ------------------------------------------------------------------------

    def create(self, actor: Actor, plural: str, namespace: str, body: Any) -> Obj:
        kind = KINDS[plural]
        require(actor.principal, kind.write, namespace if kind.namespaced else None)
        meta, spec = parse_object(kind, body, namespace)
        ns = namespace if kind.namespaced else ""
        with self._uow() as uow:
            conn = uow.connection
            current = self._row(conn, kind, ns, meta.name, lock="UPDATE")
            if current is not None and not current.deleted:
                raise AlreadyExists(f'{kind.plural} "{meta.name}" already exists')
            if current is not None and kind.kind == "Cluster":
                _refuse_while_collecting(current)
            self._check_references(conn, kind, ns, meta.name, spec, None)
            data = self._state(kind, ns, meta, spec, None, generation=1)
            obj = self._write(uow, actor, kind, data, current, "ResourceChanged")
        return obj

    def replace(
        self, actor: Actor, plural: str, namespace: str, name: str, body: Any, if_match: str | None
    ) -> Obj:
        kind = KINDS[plural]
        require(actor.principal, kind.write, namespace if kind.namespaced else None)
        meta, spec = parse_object(kind, body, namespace)
        if meta.name != name:
            raise Invalid("name mismatch", [("metadata.name", f"must be {name} on this path")])
        return self._update(actor, kind, namespace, meta, spec, if_match or meta.resourceVersion)

    def patch(
        self, actor: Actor, plural: str, namespace: str, name: str, patch: Any, if_match: str | None
    ) -> Obj:
        kind = KINDS[plural]
        require(actor.principal, kind.write, namespace if kind.namespaced else None)
        if not isinstance(patch, Mapping):
            raise Invalid("a merge patch must be an object", [("", "expected an object")])
        current = self.get(actor.principal, plural, namespace, name)
        current.pop("status", None)
        merged = merge_patch(current, patch)
        meta, spec = parse_object(kind, merged, namespace)
        if meta.name != name:
            raise Invalid("name mismatch", [("metadata.name", "cannot be changed")])
        wanted = if_match or (patch.get("metadata") or {}).get("resourceVersion")
        return self._update(actor, kind, namespace, meta, spec, wanted)

    def delete(
        self, actor: Actor, plural: str, namespace: str, name: str, if_match: str | None
    ) -> Obj:
        kind = KINDS[plural]
        require(actor.principal, kind.write, namespace if kind.namespaced else None)
        ns = namespace if kind.namespaced else ""
        with self._uow() as uow:
            conn = uow.connection
            current = self._row(conn, kind, ns, name, lock="UPDATE")
            if current is None or current.deleted:
                raise NotFound(f'{kind.plural} "{name}" not found')
            check_version(if_match, current)
            users = dependents(conn, kind, ns, name)
            if users:
                raise InUse(
                    f"{kind.kind} {name} is still used by {', '.join(users[:10])}"
                    + (f" and {len(users) - 10} more" if len(users) > 10 else ""),
                    [("metadata.name", f"used by {u}") for u in users[:10]],
                )
            data = _row_state(current)
            data["deleted"] = True
            obj = self._write(uow, actor, kind, data, current, "ResourceDeleted")
        return obj

    def _update(
        self,
        actor: Actor,
        kind: Kind,
        namespace: str,
        meta: ObjectMeta,
        spec: BaseModel,
        wanted_version: str | None,
    ) -> Obj:
        ns = namespace if kind.namespaced else ""
        with self._uow() as uow:
            conn = uow.connection
            current = self._row(conn, kind, ns, meta.name, lock="UPDATE")
            if current is None or current.deleted:
                raise NotFound(f'{kind.plural} "{meta.name}" not found')
            check_version(wanted_version, current)
            self._check_references(conn, kind, ns, meta.name, spec, current)
            generation = current.generation + (dump(spec) != dict(current.spec))
            data = self._state(kind, ns, meta, spec, current, generation=generation)
            obj = self._write(uow, actor, kind, data, current, "ResourceChanged")
        return obj

    def _state(
        self,
        kind: Kind,
        namespace: str,
        meta: ObjectMeta,
        spec: BaseModel,
        current: Row[Any] | None,
        generation: int,
    ) -> Obj:
        spec_json = dump(spec)
        secret = current.secret if current is not None else None
        if kind.kind == "Cluster":
            credentials = spec_json.pop("credentials", None)
            if credentials is not None:
                secret = self._secrets.seal(json.dumps(credentials).encode())
            elif secret is None:
                raise Invalid(
                    "a cluster needs credentials",
                    [("spec.credentials", "required when creating a cluster")],
                )
        return {
            "kind": kind.kind,
            "namespace": namespace,
            "name": meta.name,
            "uid": str(current.uid)
            if current is not None and not current.deleted
            else str(uuid4()),
            "generation": generation,
            "labels": meta.labels,
            "annotations": meta.annotations,
            "spec": spec_json,
            "status": dict(current.status) if current is not None and not current.deleted else {},
            "secret": base64.b64encode(secret).decode() if secret else None,
            "created_at": (
                current.created_at
                if current is not None and not current.deleted
                else datetime.now(UTC)
            ).isoformat(),
        }

    def _write(
        self,
        uow: SqlUnitOfWork,
        actor: Actor,
        kind: Kind,
        data: Obj,
        current: Row[Any] | None,
        event_type: str,
    ) -> Obj:
        version = current.resource_version if current is not None else 0
        meta = actor.metadata()
        stream = stream_name(kind.kind, data["namespace"], data["name"])
        uow.events.append(stream, version, [NewEvent(uuid4(), event_type, data, meta)])
        row = resource_row(data, version + 1, meta.occurred_at)
        upsert_resources(uow.connection, [row])
        before = dict(current.spec) if current is not None and not current.deleted else None
        after = None if data.get("deleted") else dict(data["spec"])
        entries = [config_entry(actor, kind, data, before, after, meta.occurred_at)]
        if kind.kind == "ClusterQueue":
            entries += floor_entries(actor, data["name"], before, after, meta.occurred_at)
        # Last before COMMIT: the ledger's tip lock is held until then.
        uow.record(entries)
        try:
            uow.commit()
        except ConcurrencyConflict as error:
            # Only a create can get here (updates hold the row lock): another
            # request created the same name between our read and our commit.
            raise AlreadyExists(f'{kind.plural} "{data["name"]}" already exists') from error
        return to_object(kind, row)

    def _row(
        self, conn: Connection, kind: Kind, namespace: str, name: str, lock: str | None = None
    ) -> Row[Any] | None:
        query = select(resources).where(
            resources.c.kind == kind.kind,
            resources.c.namespace == namespace,
            resources.c.name == name,
        )
        if lock == "UPDATE":
            query = query.with_for_update()
        return conn.execute(query).first()

    def _check_references(
        self,
        conn: Connection,
        kind: Kind,
        namespace: str,
        name: str,
        spec: BaseModel,
        current: Row[Any] | None,
    ) -> None:
        problems = references(conn, kind, namespace, name, dump(spec), current)
        if problems:
            raise UnknownReference(
                f"{kind.kind} {name} refers to objects that do not exist or cannot be used",
                problems,
            )


def config_entry(
    actor: Actor, kind: Kind, data: Obj, before: Obj | None, after: Obj | None, at: datetime
) -> NewLedgerEntry:
    """The ledger's record of an admin's change, before and after."""
    common = {
        "actor": actor.principal.name,
        "namespace": data["namespace"] or None,
        "name": data["name"],
        "before": before,
        "after": after,
    }
    body: ledger.Body
    if kind.kind in ("ClusterQueue", "Cohort"):
        body = ledger.QuotaChanged.model_validate({"object_kind": kind.kind, **common})
    else:
        body = ledger.ConfigChanged.model_validate({"object_kind": kind.kind, **common})
    return ledger.new_entry(body, uuid4(), at)


def _policy(spec: Mapping[str, Any] | None) -> SecurityPolicy:
    return SecurityPolicy.model_validate((spec or {}).get("securityPolicy", {}))


def floor_entries(
    actor: Actor, name: str, before: Obj | None, after: Obj | None, at: datetime
) -> list[NewLedgerEntry]:
    """Who may change a ClusterQueue's security floor, and the ledger entry
    of a relaxation: queue admins write queues but cannot weaken the floor;
    security admins weaken it but change nothing else."""
    principal = actor.principal
    if not principal.has(QUOTA_WRITERS):
        unchanged = {k: v for k, v in (before or {}).items() if k != "securityPolicy"} == {
            k: v for k, v in (after or {}).items() if k != "securityPolicy"
        }
        if before is None or after is None or not unchanged:
            raise Forbidden(
                f"{principal.name} may change only spec.securityPolicy of an existing ClusterQueue"
            )
    relaxed = [] if after is None else relaxations(_policy(before), _policy(after))
    if not relaxed:
        return []
    if not principal.has(FLOOR_RELAXERS):
        raise Forbidden(
            f"{principal.name} may not relax ClusterQueue {name}'s security floor "
            f"({'; '.join(relaxed)}): that takes the security-admin role",
            [("spec.securityPolicy", f"relaxes {r}") for r in relaxed],
        )
    body = ledger.SecurityRelaxed(actor=principal.name, cluster_queue=name, relaxed=relaxed)
    return [ledger.new_entry(body, uuid4(), at)]


def check_version(wanted: str | None, current: Row[Any]) -> None:
    if wanted is None:
        return
    wanted = wanted.strip('"').removeprefix("W/").strip('"')
    if wanted != str(current.resource_version):
        raise StaleVersion(
            f"the object has been modified: resourceVersion {wanted} is stale, "
            f"current is {current.resource_version}; read it again and retry",
            [("metadata.resourceVersion", "stale")],
        )


def _row_state(row: Row[Any]) -> Obj:
    return {
        "kind": row.kind,
        "namespace": row.namespace,
        "name": row.name,
        "uid": str(row.uid),
        "generation": row.generation,
        "labels": dict(row.labels),
        "annotations": dict(row.annotations),
        "spec": dict(row.spec),
        "status": dict(row.status),
        "secret": base64.b64encode(row.secret).decode() if row.secret else None,
        "created_at": row.created_at.isoformat(),
    }


def _refuse_while_collecting(deleted: Row[Any]) -> None:
    """A deleted Cluster's name is taken until the fleet loop has swept what
    its registration wrote on the member (workers/collect.py): a new
    registration would leave that sweep with nothing to work from."""
    collection = deleted.status.get("collection") or {}
    if collection.get("state") in COLLECTION_ENDED:
        return
    attempts = int(collection.get("attempts") or 0)
    progress = (
        f"attempt {attempts}, next at {collection.get('nextAttemptAt')}"
        + (f", last error: {collection['lastError']}" if collection.get("lastError") else "")
        if attempts
        else "not yet attempted"
    )
    raise BeingDeleted(
        f'clusters "{deleted.name}" is being deleted: what it wrote on the member is still '
        f"being removed ({progress}); create it again once its status.collection.state "
        "is Collected or Failed",
        [("metadata.name", f"Cluster {deleted.name} is being deleted")],
    )


__all__ = ["Actor", "Page", "ResourceService", "check_version", "stream_name", "to_object"]
