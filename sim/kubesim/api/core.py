"""One cluster's API verbs over its store: lookup, get and list, create, update,
patch (JSON, merge, strategic and server-side apply) and delete."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from sim.kubesim import errors
from sim.kubesim.api.context import (
    APPLY_PATCH,
    APPLY_PATCH_CBOR,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Admission,
    Context,
    Resource,
    now_rfc3339,
)
from sim.kubesim.api.metadata import (
    META_KNOWN,
    MODIFIED,
    SERVER_METADATA,
    check_delete_preconditions,
    check_identity,
    check_preconditions,
    comparable,
    content,
    generate_suffix,
    merge_update,
)
from sim.kubesim.api.paging import after, decode_continue, encode_continue, matches, state_at
from sim.kubesim.api.policy import STRATEGIES as POLICY_STRATEGIES
from sim.kubesim.api.policy import PolicyAdmission
from sim.kubesim.builtin import STRATEGIES, Strategy, validate_metadata
from sim.kubesim.errors import Cause
from sim.kubesim.fieldmanager import FieldManager, Shape, schema_shape
from sim.kubesim.patch import json_patch, merge_patch, strategic_merge_patch
from sim.kubesim.quantity import QuantityFormatError
from sim.kubesim.resources import ResourceType, Version
from sim.kubesim.schema import SchemaValidator
from sim.kubesim.selectors import FieldSelector, LabelSelector
from sim.kubesim.store import Store, clone

__all__ = ["ApiCore"]

Obj = dict[str, Any]

#: The built-in kinds' strategies, the admission policy kinds' among them.
_STRATEGIES = {**STRATEGIES, **POLICY_STRATEGIES}


class ApiCore:
    """Every verb of every served resource of one cluster."""

    def __init__(
        self,
        types: Iterable[ResourceType],
        store: Store,
        *,
        default_field_validation: str = "Warn",
    ) -> None:
        self.store = store
        self.types = tuple(types)
        self.default_field_validation = default_field_validation
        self.admission: list[Admission] = []
        self.policies = PolicyAdmission(store, self.for_kind)
        self._resources: dict[tuple[str, str, str], Resource] = {}
        self._by_kind: dict[tuple[str, str], Resource] = {}
        for rtype in self.types:
            for version in rtype.versions:
                resource = self._bind(rtype, version)
                self._resources[(rtype.group, version.name, rtype.plural)] = resource
                self._by_kind[(rtype.api_version(version.name), rtype.kind)] = resource

    def _bind(self, rtype: ResourceType, version: Version) -> Resource:
        strategy = _STRATEGIES.get(rtype.key, Strategy)()
        validator = SchemaValidator(version.schema) if version.schema else None
        root = schema_shape(version.schema, "") if version.schema else Shape(kind="struct")
        return Resource(rtype, version, strategy, validator, FieldManager(root, rtype.has_status))

    # -- lookup ----------------------------------------------------------------------------

    def resource(self, group: str, version: str, plural: str) -> Resource:
        try:
            return self._resources[(group, version, plural)]
        except KeyError:
            raise errors.not_served() from None

    def find(self, group: str, version: str, plural: str) -> Resource | None:
        return self._resources.get((group, version, plural))

    def for_kind(self, api_version: str, kind: str) -> Resource:
        try:
            return self._by_kind[(api_version, kind)]
        except KeyError:
            raise errors.bad_request(
                f"no kind {kind!r} is registered for version {api_version!r}"
            ) from None

    def storage(self, rtype: ResourceType) -> Resource:
        return self._resources[(rtype.group, rtype.storage_version, rtype.plural)]

    def present(self, resource: Resource, obj: Obj) -> Obj:
        """``obj`` as served at ``resource``'s version (no conversion: apiVersion only)."""
        if obj.get("apiVersion") == resource.api_version:
            return obj
        return {**obj, "apiVersion": resource.api_version}

    # -- reads -----------------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str, name: str) -> Obj:
        obj = self.store.get(resource.rtype, namespace, name)
        if obj is None:
            raise errors.not_found(resource.plural, resource.group, name)
        return obj

    def list(
        self,
        resource: Resource,
        namespace: str,
        *,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
        limit: int = 0,
        continue_token: str = "",
        resource_version: str = "",
        resource_version_match: str = "",
    ) -> tuple[list[Obj], int, str, int | None]:
        """Matching objects, the list's resourceVersion, a continue token and remaining count."""
        collection = self.store.collection(resource.rtype)
        start = ""
        if continue_token:
            list_rv, start = decode_continue(continue_token)
            state = state_at(collection, list_rv, continued=True)
        elif resource_version_match == "Exact" and resource_version not in ("", "0"):
            list_rv = int(resource_version)
            state = state_at(collection, list_rv, continued=False)
        else:
            list_rv, state = self.store.rv, collection.objects
            if resource_version == "0":
                limit = 0
        keys = sorted(k for k in state if (not namespace or k[0] == namespace) and after(k, start))
        matched = [state[k] for k in keys if matches(state[k], labels, fields)]
        if limit and len(matched) > limit:
            page = matched[:limit]
            last = page[-1]["metadata"]
            token = encode_continue(list_rv, f"{last.get('namespace', '')}/{last['name']}")
            remaining = len(matched) - limit if labels is None or labels.empty else None
            return page, list_rv, token, remaining
        return matched, list_rv, "", None

    # -- writes ----------------------------------------------------------------------------

    def create(
        self, resource: Resource, namespace: str, body: Obj, ctx: Context, *, owned: bool = False
    ) -> Obj:
        """``owned``: ``body`` is the caller's to give away (a request's freshly parsed
        body), stored as it is rather than copied; otherwise it is left untouched."""
        obj = body if owned else clone(body)
        check_identity(resource, obj, namespace)
        metadata = obj.setdefault("metadata", {})
        if metadata.get("resourceVersion"):
            raise errors.bad_request("resourceVersion should not be set on objects to be created")
        if not metadata.get("name"):
            if not metadata.get("generateName"):
                raise errors.invalid(
                    resource.rtype.kind,
                    resource.group,
                    "",
                    [
                        Cause(
                            "FieldValueRequired",
                            "Required value: name or generateName is required",
                            "metadata.name",
                        )
                    ],
                )
            metadata["name"] = metadata["generateName"] + generate_suffix()
        self._require_namespace(resource, namespace)
        if self.store.get(resource.rtype, namespace, metadata["name"]) is not None:
            raise errors.already_exists(resource.plural, resource.group, metadata["name"])
        for key in SERVER_METADATA:
            metadata.pop(key, None)
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = now_rfc3339()
        if resource.strategy.generation:
            metadata["generation"] = 1
        if resource.rtype.has_status and not resource.strategy.status_on_create:
            obj.pop("status", None)
        with _decoding(resource):
            resource.strategy.prepare_create(obj)
        obj = self._admit_and_validate("CREATE", resource, obj, None, ctx)
        if "managedFields" not in metadata or not metadata["managedFields"]:
            metadata.pop("managedFields", None)
            resource.fields.record_update(
                old=None,
                new=obj,
                manager=ctx.manager,
                subresource="",
                api_version=resource.api_version,
                now=metadata["creationTimestamp"],
            )
        return self._commit(resource, obj, ctx)

    def update(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        body: Obj,
        ctx: Context,
        subresource: str = "",
    ) -> Obj:
        old = self.get(resource, namespace, name)
        obj = clone(body)
        check_identity(resource, obj, namespace, name)
        check_preconditions(resource, old, obj, require_rv=not resource.rtype.builtin)
        new = merge_update(resource, old, obj, subresource)
        new = self._admit_and_validate("UPDATE", resource, new, old, ctx, subresource)
        if comparable(new) == comparable(old):
            return old
        resource.fields.record_update(
            old=old,
            new=new,
            manager=ctx.manager,
            subresource=subresource,
            api_version=resource.api_version,
            now=now_rfc3339(),
        )
        return self._finish_update(resource, old, new, ctx)

    def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        content_type: str,
        body: Any,
        ctx: Context,
        *,
        subresource: str = "",
        force: bool = False,
        owned: bool = False,
    ) -> Obj:
        """``owned`` as for :meth:`create` (an apply's configuration is stored as it is)."""
        if content_type in (APPLY_PATCH, APPLY_PATCH_CBOR):
            return self._apply(resource, namespace, name, body, ctx, subresource, force, owned)
        old = self.get(resource, namespace, name)
        current = self.present(resource, old)
        if content_type == MERGE_PATCH:
            patched = merge_patch(current, body)
        elif content_type == JSON_PATCH:
            patched = json_patch(current, body)
        elif content_type == STRATEGIC_PATCH:
            if not resource.rtype.builtin:
                raise errors.unsupported_media_type(
                    content_type, [JSON_PATCH, MERGE_PATCH, APPLY_PATCH]
                )
            patched = strategic_merge_patch(current, body)
        else:
            raise errors.unsupported_media_type(
                content_type, [JSON_PATCH, MERGE_PATCH, APPLY_PATCH, STRATEGIC_PATCH]
            )
        if not isinstance(patched, dict):
            raise errors.bad_request("the patched object is not a JSON object")
        check_identity(resource, patched, namespace, name)
        requested_rv = (patched.get("metadata") or {}).get("resourceVersion")
        if requested_rv and requested_rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict(
                resource.plural,
                resource.group,
                name,
                MODIFIED,
            )
        if subresource == "status" and content_type != JSON_PATCH and _only_status(body):
            # A merge or strategic merge patch of status alone: ``patched`` is a copy of
            # the object that differs in status only, what merge_update would build
            # from a second copy.
            patched["apiVersion"] = resource.api_version
            new = patched
        else:
            new = merge_update(resource, old, patched, subresource)
        new = self._admit_and_validate("UPDATE", resource, new, old, ctx, subresource)
        if comparable(new) == comparable(old):
            return old
        resource.fields.record_update(
            old=old,
            new=new,
            manager=ctx.manager,
            subresource=subresource,
            api_version=resource.api_version,
            now=now_rfc3339(),
        )
        return self._finish_update(resource, old, new, ctx)

    def _apply(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        body: Any,
        ctx: Context,
        subresource: str,
        force: bool,
        owned: bool,
    ) -> Obj:
        if not ctx.manager:
            raise errors.bad_request(
                "PATCH, application/apply-patch+yaml requires fieldManager to be set"
            )
        if not isinstance(body, dict):
            raise errors.bad_request("apply patch must be an object")
        applied = body if owned else clone(body)
        if (
            applied.get("apiVersion") != resource.api_version
            or applied.get("kind") != resource.rtype.kind
        ):
            raise errors.bad_request(
                f"apiVersion and kind of the applied configuration must be {resource.api_version}, "
                f"Kind={resource.rtype.kind}"
            )
        check_identity(resource, applied, namespace, name)
        self._strict_unknown(resource, applied, ctx, apply=True)
        old = self.store.get(resource.rtype, namespace, name)
        if old is not None:
            check_preconditions(resource, old, applied, require_rv=False)
        now = now_rfc3339()
        merged = resource.fields.apply(
            live=self.present(resource, old) if old is not None else None,
            applied=applied,
            manager=ctx.manager,
            subresource=subresource,
            api_version=resource.api_version,
            now=now,
            force=force,
            owned=True,
        )
        if old is None:
            if subresource:
                raise errors.not_found(resource.plural, resource.group, name)
            return self._create_applied(resource, namespace, merged, ctx)
        # merge_update works in place and restores the old managedFields: keep the new ones.
        managed = merged["metadata"].get("managedFields", [])
        new = merge_update(resource, old, merged, subresource)
        new["metadata"]["managedFields"] = managed
        new = self._admit_and_validate("UPDATE", resource, new, old, ctx, subresource)
        if comparable(new) == comparable(old) and new["metadata"].get("managedFields") == old[
            "metadata"
        ].get("managedFields"):
            return old
        return self._finish_update(resource, old, new, ctx)

    def _create_applied(self, resource: Resource, namespace: str, obj: Obj, ctx: Context) -> Obj:
        managed = obj["metadata"].get("managedFields")
        self._require_namespace(resource, namespace)
        metadata = obj["metadata"]
        for key in SERVER_METADATA:
            metadata.pop(key, None)
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = now_rfc3339()
        if resource.strategy.generation:
            metadata["generation"] = 1
        if resource.rtype.has_status and not resource.strategy.status_on_create:
            obj.pop("status", None)
        with _decoding(resource):
            resource.strategy.prepare_create(obj)
        obj = self._admit_and_validate("CREATE", resource, obj, None, ctx)
        if managed:
            obj["metadata"]["managedFields"] = managed
        return self._commit(resource, obj, ctx)

    def delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        ctx: Context,
        *,
        propagation: str = "",
        preconditions: dict[str, Any] | None = None,
    ) -> tuple[Obj, bool]:
        """Delete (or start deleting); returns the object and whether it is gone now."""
        old = self.get(resource, namespace, name)
        check_delete_preconditions(resource, old, preconditions or {})
        # Validating webhooks see a DELETE with the object as it is (Volcano's
        # queue webhook refuses to delete an open Queue).
        for hook in self.admission:
            hook("DELETE", resource, clone(old), old, ctx)
        self.policies.admit("DELETE", resource, "", None, old, ctx)
        policy = propagation or self._default_propagation(resource)
        finalizers = list(old["metadata"].get("finalizers") or ())
        if policy == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if policy == "Orphan" and "orphan" not in finalizers and not ctx.dry_run:
            self._orphan_dependents(old["metadata"]["uid"], namespace)
        if resource.rtype.key == "namespaces":
            return self._delete_namespace(resource, old, clone(old), ctx), False
        if finalizers:
            if old["metadata"].get("deletionTimestamp") and (
                old["metadata"].get("finalizers") == finalizers
            ):
                return old, False
            # Only a deletion that waits for finalizers writes a new state: copied here.
            obj = clone(old)
            metadata = obj["metadata"]
            metadata["finalizers"] = finalizers
            metadata.setdefault("deletionTimestamp", now_rfc3339())
            metadata.setdefault("deletionGracePeriodSeconds", 0)
            if "generation" in metadata:
                metadata["generation"] += 1
            return self._commit(resource, obj, ctx, allow_terminating=True), False
        if ctx.dry_run:
            return old, True
        event = self.store.remove(resource.rtype, old)
        return event.obj, True

    def _delete_namespace(self, resource: Resource, old: Obj, obj: Obj, ctx: Context) -> Obj:
        if old["metadata"].get("deletionTimestamp"):
            return old
        obj["metadata"]["deletionTimestamp"] = now_rfc3339()
        obj["metadata"]["deletionGracePeriodSeconds"] = 0
        obj.setdefault("status", {})["phase"] = "Terminating"
        return self._commit(resource, obj, ctx, allow_terminating=True)

    def _default_propagation(self, resource: Resource) -> str:
        # batch/v1 Jobs orphan their pods unless told otherwise, for backward
        # compatibility (pkg/registry/batch/job/strategy.go DefaultGarbageCollectionPolicy).
        return "Orphan" if resource.rtype.key == "jobs.batch" else "Background"

    def _orphan_dependents(self, owner_uid: str, namespace: str) -> None:
        for rtype in self.types:
            if not rtype.namespaced:
                continue
            resource = self.storage(rtype)
            for dependent in self.store.items(rtype, namespace):
                refs = dependent["metadata"].get("ownerReferences") or ()
                if not any(ref.get("uid") == owner_uid for ref in refs):
                    continue
                updated = clone(dependent)
                kept = [ref for ref in refs if ref.get("uid") != owner_uid]
                if kept:
                    updated["metadata"]["ownerReferences"] = kept
                else:
                    updated["metadata"].pop("ownerReferences", None)
                self.store.write(resource.rtype, updated)

    # -- write helpers ---------------------------------------------------------------------

    def _strict_unknown(
        self, resource: Resource, obj: Obj, ctx: Context, *, apply: bool = False
    ) -> None:
        metadata = obj.get("metadata") or {}
        unknown = [f"metadata.{k}" for k in metadata if k not in META_KNOWN]
        for key in unknown:
            metadata.pop(key.split(".", 1)[1], None)
        if resource.validator is not None:
            unknown += resource.validator.prune(obj)
        if not unknown:
            return
        mode = ctx.field_validation or self.default_field_validation
        if mode == "Strict" or apply:
            if apply:
                raise errors.bad_request(
                    f"failed to create typed patch object ({metadata.get('namespace', '')}/"
                    f"{metadata.get('name', '')}; {resource.api_version}, "
                    f"Kind={resource.rtype.kind}): "
                    f".{unknown[0]}: field not declared in schema"
                )
            fields = ", ".join(f'unknown field "{u}"' for u in unknown)
            raise errors.bad_request(
                f'{resource.rtype.kind} in version "{resource.version.name}" cannot be handled '
                f"as a {resource.rtype.kind}: strict decoding error: {fields}"
            )
        if mode == "Warn":
            ctx.warnings.extend(f'unknown field "{u}"' for u in unknown)

    def _admit_and_validate(
        self,
        operation: str,
        resource: Resource,
        obj: Obj,
        old: Obj | None,
        ctx: Context,
        subresource: str = "",
    ) -> Obj:
        self._strict_unknown(resource, obj, ctx)
        with _decoding(resource):
            resource.strategy.default(obj)
        if resource.validator is not None:
            resource.validator.apply_defaults(obj)
        for hook in self.admission:
            hook(operation, resource, obj, old, ctx)
        causes = validate_metadata(obj, dns_label=resource.strategy.dns_label_names)
        if old is not None and old["metadata"].get("deletionTimestamp"):
            added = set(obj["metadata"].get("finalizers") or ()) - set(
                old["metadata"].get("finalizers") or ()
            )
            if added:
                causes.append(
                    Cause(
                        "FieldValueForbidden",
                        "Forbidden: no new finalizers can be added if the object is being deleted, "
                        f"found new finalizers {sorted(added)}",
                        "metadata.finalizers",
                    )
                )
        if resource.validator is not None:
            causes += resource.validator.validate(obj, old)
        causes += resource.strategy.validate(obj, old)
        if causes:
            raise errors.invalid(
                resource.rtype.kind, resource.group, obj["metadata"].get("name", ""), causes
            )
        # Validating admission comes last, on the object as it would be stored.
        self.policies.admit(operation, resource, subresource, obj, old, ctx)
        if resource.version.deprecation_warning:
            ctx.warnings.append(resource.version.deprecation_warning)
        return obj

    def _require_namespace(self, resource: Resource, namespace: str) -> None:
        if not resource.rtype.namespaced:
            return
        ns = self.store.collections["namespaces"].objects.get(("", namespace))
        if ns is None:
            raise errors.not_found("namespaces", "", namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                resource.plural,
                resource.group,
                "",
                f"unable to create new content in namespace {namespace} "
                "because it is being terminated",
            )

    def _finish_update(self, resource: Resource, old: Obj, new: Obj, ctx: Context) -> Obj:
        metadata = new["metadata"]
        if resource.strategy.generation and content(new) != content(old):
            metadata["generation"] = old["metadata"].get("generation", 1) + 1
        finished = metadata.get("deletionTimestamp") and not metadata.get("finalizers")
        # A namespace also waits for its spec.finalizers (the namespace controller's).
        if finished and (
            resource.rtype.key != "namespaces" or not (new.get("spec") or {}).get("finalizers")
        ):
            if ctx.dry_run:
                return new
            return self.store.remove(resource.rtype, old).obj
        return self._commit(resource, new, ctx, allow_terminating=True)

    def _commit(
        self, resource: Resource, obj: Obj, ctx: Context, *, allow_terminating: bool = False
    ) -> Obj:
        storage = self.storage(resource.rtype)
        obj["apiVersion"] = storage.api_version
        if ctx.dry_run:
            obj["metadata"].setdefault("resourceVersion", "")
            return obj
        self.store.write(resource.rtype, obj)
        return obj


@contextlib.contextmanager
def _decoding(resource: Resource) -> Iterator[None]:
    """A value that is no quantity fails decoding with 400, as it does for real."""
    try:
        yield
    except QuantityFormatError as error:
        kind = resource.rtype.kind
        raise errors.bad_request(
            f'{kind} in version "{resource.version.name}" cannot be handled as a {kind}: {error}'
        ) from None


def _only_status(patch: Any) -> bool:
    """Whether a (strategic) merge patch touches nothing but ``status`` (no directive)."""
    return isinstance(patch, dict) and all(key == "status" for key in patch)


def key_of(obj: Obj) -> tuple[str, str]:
    return obj["metadata"].get("namespace") or "", obj["metadata"]["name"]
