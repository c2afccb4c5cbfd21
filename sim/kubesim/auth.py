"""Bearer-token authentication and an RBAC-like allow-list, plus an audit of what was used.

Each token maps to a :class:`User` whose ``rules`` are RBAC ``PolicyRule``
dictionaries (``apiGroups``, ``resources`` — ``jobs``, ``jobs/status``, ``*`` —,
``verbs``, optional ``resourceNames``) with one extension, ``namespaces``, that
stands for binding a Role in those namespaces instead of a ClusterRole. So a
test can grant a reconciler exactly the rules of our deploy manifests and see
it fail with the same 403 a real cluster would give; the audit log tells which
verbs and resources it actually used, and which it was refused. Discovery
(``/api``, ``/apis``, ``/version``, ``/openapi``) is open to every
authenticated user, like the ``system:discovery`` role.

The audit holds one record per authorization decision, refusals included
(``allowed``), each with the code its request was answered. A server-side
apply that creates its object is decided twice, as ``patch`` and as
``create`` with the object's name, as the real server does (apiserver
``endpoints/handlers/patch.go``: ``createAuthorizerAttributes``). A user's
rules may be changed while the server runs (:meth:`Authorizer.set_rules`);
a request is authorized when it starts, so an open watch goes on, as it
does on a real cluster (and is audited when it ends).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AuditRecord",
    "Authorizer",
    "User",
    "forbidden_reason",
    "grants",
    "groups_of",
    "rule_allows",
]


AUTHENTICATED = "system:authenticated"


def groups_of(name: str) -> tuple[str, ...]:
    """The groups the token authenticator gives ``name``: a ServiceAccount's
    ``system:serviceaccounts`` and ``system:serviceaccounts:<namespace>``."""
    parts = name.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return ("system:serviceaccounts", f"system:serviceaccounts:{parts[2]}", AUTHENTICATED)
    return (AUTHENTICATED,)


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
    #: What the request was answered (an apply refused ``create`` answers 403
    #: to its ``patch``, which was allowed).
    code: int
    #: The decision: whether the rules allowed ``verb`` here.
    allowed: bool = True

    @property
    def denied(self) -> bool:
        return not self.allowed

    def allowed_by(self, rule: Mapping[str, Any]) -> bool:
        """Whether ``rule`` grants what this record asked for."""
        return rule_allows(
            rule,
            self.verb,
            self.group,
            self.resource,
            self.subresource,
            self.namespace,
            self.name,
        )


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

    def set_rules(self, name: str, rules: Iterable[Mapping[str, Any]] | None) -> int:
        """Give every token of user ``name`` these rules from now on (``None``:
        everything), as editing a bound Role does; how many tokens changed."""
        frozen = None if rules is None else tuple(dict(r) for r in rules)
        changed = 0
        for token, user in list(self.users.items()):
            if user.name == name:
                self.users[token] = dataclasses.replace(user, rules=frozen)
                changed += 1
        return changed

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

    def records(self, user: str | None = None) -> list[AuditRecord]:
        """The audit, or ``user``'s part of it."""
        return [r for r in self.audit if user is None or r.user == user]

    def denied(self, user: str | None = None) -> list[AuditRecord]:
        """The decisions that refused ``user`` (403)."""
        return [r for r in self.records(user) if r.denied]

    def used_rules(self, user: str | None = None) -> list[dict[str, Any]]:
        """The (group, resource, verbs) a user actually exercised (refusals
        left out), as RBAC-shaped rules."""
        used: dict[tuple[str, str], set[str]] = {}
        for entry in self.records(user):
            if entry.denied:
                continue
            combined = (
                f"{entry.resource}/{entry.subresource}" if entry.subresource else entry.resource
            )
            used.setdefault((entry.group, combined), set()).add(entry.verb)
        return [
            {"apiGroups": [group], "resources": [resource], "verbs": sorted(verbs)}
            for (group, resource), verbs in sorted(used.items())
        ]

    def rules_of(self, name: str) -> tuple[Mapping[str, Any], ...] | None:
        """User ``name``'s rules (of its first token; ``None``: everything)."""
        for user in self.users.values():
            if user.name == name:
                return user.rules
        raise KeyError(name)

    def unused_rules(self, name: str) -> list[dict[str, Any]]:
        """Every single grant of user ``name``'s rules — one API group, one
        resource, one verb, with the rule's resource names and namespaces —
        that no request of its allowed: what its role holds and never needed."""
        used = [r for r in self.records(name) if not r.denied]
        return [
            grant
            for grant in grants(self.rules_of(name) or ())
            if not any(record.allowed_by(grant) for record in used)
        ]


def grants(rules: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rules`` split into single grants (one group, resource and verb each)."""
    return [
        {**rule, "apiGroups": [group], "resources": [resource], "verbs": [verb]}
        for rule in rules
        for group in rule.get("apiGroups") or ()
        for resource in rule.get("resources") or ()
        for verb in rule.get("verbs") or ()
    ]
