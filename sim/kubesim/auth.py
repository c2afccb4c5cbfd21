"""Bearer-token authentication and an RBAC-like allow-list, plus an audit of what was used.

Each token maps to a :class:`User` whose ``rules`` are RBAC ``PolicyRule``
dictionaries (``apiGroups``, ``resources`` — ``jobs``, ``jobs/status``, ``*`` —,
``verbs``, optional ``resourceNames``) with one extension, ``namespaces``, that
stands for binding a Role in those namespaces instead of a ClusterRole. So a
test can grant a reconciler exactly the rules of our deploy manifests and see
it fail with the same 403 a real cluster would give; the audit log tells which
verbs and resources it actually used. Discovery (``/api``, ``/apis``,
``/version``, ``/openapi``) is open to every authenticated user, like the
``system:discovery`` role.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AuditRecord", "Authorizer", "User", "forbidden_reason"]


@dataclass(frozen=True, slots=True)
class User:
    name: str
    groups: tuple[str, ...] = ("system:authenticated",)
    #: ``None`` allows everything (cluster-admin); else the allow-list.
    rules: tuple[Mapping[str, Any], ...] | None = None
    #: May use the ``/_admin`` fault-injection endpoints.
    admin: bool = False


@dataclass(frozen=True, slots=True)
class AuditRecord:
    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int


def _matches(values: Iterable[str], wanted: str) -> bool:
    values = tuple(values)
    return "*" in values or wanted in values


def _resource_matches(rule_resources: Iterable[str], resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for allowed in rule_resources:
        if allowed in ("*", combined):
            return True
        if subresource and allowed == f"*/{subresource}":
            return True
    return False


def rule_allows(
    rule: Mapping[str, Any],
    verb: str,
    group: str,
    resource: str,
    subresource: str,
    namespace: str,
    name: str,
) -> bool:
    if not _matches(rule.get("verbs") or (), verb):
        return False
    if not _matches(rule.get("apiGroups") or (), group):
        return False
    if not _resource_matches(rule.get("resources") or (), resource, subresource):
        return False
    names = rule.get("resourceNames")
    if names and name not in names:
        return False
    namespaces = rule.get("namespaces")
    return not namespaces or namespace in namespaces


def forbidden_reason(
    user: User, verb: str, group: str, resource: str, subresource: str, namespace: str
) -> str:
    combined = f"{resource}/{subresource}" if subresource else resource
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    return f'User "{user.name}" cannot {verb} resource "{combined}" in API group "{group}" {scope}'


@dataclass(slots=True)
class Authorizer:
    """Tokens, their users, and the audit log of resource requests."""

    users: dict[str, User] = field(default_factory=dict)
    audit: list[AuditRecord] = field(default_factory=list)
    audit_limit: int = 100_000

    def add(self, user: User, token: str | None = None) -> str:
        token = token or secrets.token_urlsafe(24)
        self.users[token] = user
        return token

    def authenticate(self, header: str | None) -> User | None:
        if not header or not header.lower().startswith("bearer "):
            return None
        return self.users.get(header[7:].strip())

    def allows(
        self,
        user: User,
        verb: str,
        group: str,
        resource: str,
        subresource: str,
        namespace: str,
        name: str,
    ) -> bool:
        if user.rules is None:
            return True
        return any(
            rule_allows(rule, verb, group, resource, subresource, namespace, name)
            for rule in user.rules
        )

    def record(self, entry: AuditRecord) -> None:
        if len(self.audit) >= self.audit_limit:
            del self.audit[: self.audit_limit // 10]
        self.audit.append(entry)

    def used_rules(self, user: str | None = None) -> list[dict[str, Any]]:
        """The (group, resource, verbs) a user actually exercised, as RBAC-shaped rules."""
        used: dict[tuple[str, str], set[str]] = {}
        for entry in self.audit:
            if user is not None and entry.user != user:
                continue
            combined = (
                f"{entry.resource}/{entry.subresource}" if entry.subresource else entry.resource
            )
            used.setdefault((entry.group, combined), set()).add(entry.verb)
        return [
            {"apiGroups": [group], "resources": [resource], "verbs": sorted(verbs)}
            for (group, resource), verbs in sorted(used.items())
        ]
