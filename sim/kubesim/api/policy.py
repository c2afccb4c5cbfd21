"""ValidatingAdmissionPolicy, as the API server's admission plugin runs it.

A bound policy checks the writes its ``matchConstraints`` and the binding's
``matchResources`` select, whose ``matchConditions`` hold, against its CEL
``validations``; a failure is denied, warned or audited as the binding says,
in upstream's wording and codes. After kubernetes/kubernetes
``staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating`` and
``…/policy/matching``. Not modelled: ``authorizer``, ``status.typeChecking``,
``matchPolicy: Equivalent`` (a rule matches the request's own version).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celpy.adapter import json_to_cel
from celpy.celtypes import BoolType, MapType, StringType

from sim.kubesim import errors
from sim.kubesim.api.context import Context, Resource
from sim.kubesim.builtin import Strategy
from sim.kubesim.errors import Cause
from sim.kubesim.schema import cel_compile_error, cel_program
from sim.kubesim.selectors import match_selector_object
from sim.kubesim.store import Store

__all__ = ["STRATEGIES", "PolicyAdmission"]

Obj = dict[str, Any]

GROUP = "admissionregistration.k8s.io"
POLICIES = "validatingadmissionpolicies.admissionregistration.k8s.io"
BINDINGS = "validatingadmissionpolicybindings.admissionregistration.k8s.io"
#: Never subject to a policy (``rules.IsExemptAdmissionConfigurationResource``).
_EXEMPT = frozenset(
    {
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
        "mutatingadmissionpolicies",
        "mutatingadmissionpolicybindings",
        "validatingwebhookconfigurations",
        "mutatingwebhookconfigurations",
    }
)
_CODES = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}
_ACTIONS = ("Deny", "Warn", "Audit")


@dataclass(frozen=True, slots=True)
class Request:
    """What one write asks, as a policy's matchers and ``request`` see it."""

    operation: str
    resource: Resource
    subresource: str
    namespace: str
    name: str
    obj: Obj | None
    old: Obj | None
    ctx: Context

    def labels(self) -> Iterator[Mapping[str, str]]:
        for item in (self.obj, self.old):
            if item is not None:
                yield (item.get("metadata") or {}).get("labels") or {}

    def cel(self) -> Obj:
        rtype = self.resource.rtype
        version = self.resource.version.name
        kind = {"group": rtype.group, "version": version, "kind": rtype.kind}
        gvr = {"group": rtype.group, "version": version, "resource": rtype.plural}
        user = {"username": self.ctx.user, "groups": list(self.ctx.groups)}
        return {
            "kind": kind,
            "resource": gvr,
            "subResource": self.subresource,
            "requestKind": kind,
            "requestResource": gvr,
            "requestSubResource": self.subresource,
            "name": self.name,
            "namespace": self.namespace,
            "operation": self.operation,
            "userInfo": user,
            "dryRun": self.ctx.dry_run,
        }


def _listed(values: Sequence[str] | None, value: str) -> bool:
    if not values:
        return False
    return "*" in values or value in values


def _resource_listed(resources: Sequence[str], plural: str, subresource: str) -> bool:
    for entry in resources:
        name, _, sub = entry.partition("/")
        if entry == "*/*":
            return True
        if name in ("*", plural) and (sub == subresource or (sub == "*" and subresource)):
            return True
    return False


def _rule_matches(rule: Mapping[str, Any], req: Request) -> bool:
    rtype = req.resource.rtype
    scope = rule.get("scope") or "*"
    if scope not in ("*", "Namespaced" if rtype.namespaced else "Cluster"):
        return False
    names = rule.get("resourceNames") or ()
    return (
        _listed(rule.get("operations"), req.operation)
        and _listed(rule.get("apiGroups"), rtype.group)
        and _listed(rule.get("apiVersions"), req.resource.version.name)
        and _resource_listed(rule.get("resources") or (), rtype.plural, req.subresource)
        and (not names or req.name in names)
    )


class PolicyAdmission:
    """The validating admission policies of one cluster, applied to its writes."""

    def __init__(self, store: Store, find: Callable[[str, str], Resource]) -> None:
        self.store = store
        #: ``(apiVersion, kind) -> Resource``: what a policy's ``paramKind`` names.
        self._find = find

    def admit(
        self,
        operation: str,
        resource: Resource,
        subresource: str,
        obj: Obj | None,
        old: Obj | None,
        ctx: Context,
    ) -> None:
        bindings = self.store.collections[BINDINGS].objects
        if not bindings or (resource.rtype.plural in _EXEMPT and resource.group == GROUP):
            return
        meta = (obj or old or {}).get("metadata") or {}
        req = Request(
            operation,
            resource,
            subresource,
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
            obj,
            old,
            ctx,
        )
        policies = self.store.collections[POLICIES].objects
        for binding in sorted(bindings.values(), key=lambda b: b["metadata"]["name"]):
            spec = binding.get("spec") or {}
            policy = policies.get(("", str(spec.get("policyName") or "")))
            if policy is not None:
                self._apply(policy, binding, req)

    # -- matching --------------------------------------------------------------------------

    def _selects(self, match: Mapping[str, Any] | None, req: Request) -> bool:
        if match is None:
            return True
        rules = match.get("resourceRules")
        if rules is not None and not any(_rule_matches(r, req) for r in rules):
            return False
        if any(_rule_matches(r, req) for r in match.get("excludeResourceRules") or ()):
            return False
        objects = match.get("objectSelector") or {}
        if objects and not any(match_selector_object(objects, labels) for labels in req.labels()):
            return False
        spaces = match.get("namespaceSelector") or {}
        return not spaces or match_selector_object(spaces, self._namespace_labels(req))

    def _namespace_labels(self, req: Request) -> Mapping[str, str]:
        if req.resource.rtype.key == "namespaces":
            return next(req.labels(), {})
        if not req.resource.rtype.namespaced:
            return {}
        found = self._namespace(req)
        return ((found or {}).get("metadata") or {}).get("labels") or {}

    def _namespace(self, req: Request) -> Obj | None:
        if not req.namespace or not req.resource.rtype.namespaced:
            return None
        return self.store.collections["namespaces"].objects.get(("", req.namespace))

    # -- evaluation ------------------------------------------------------------------------

    def _apply(self, policy: Obj, binding: Obj, req: Request) -> None:
        spec = policy.get("spec") or {}
        bound = binding.get("spec") or {}
        if not self._selects(spec.get("matchConstraints"), req):
            return
        if not self._selects(bound.get("matchResources"), req):
            return
        fail = (spec.get("failurePolicy") or "Fail") == "Fail"
        params = self._params(spec, bound, req)
        if params is None:
            return
        for param in params:
            failure = self._first_failure(spec, req, param, fail)
            if failure is not None:
                self._act(policy, binding, req, *failure)
                return

    def _params(self, spec: Obj, bound: Obj, req: Request) -> list[Obj | None] | None:
        """The params to evaluate with (``[None]`` without ``paramKind``); ``None``
        when none are found and the binding allows that."""
        kind = spec.get("paramKind")
        ref = bound.get("paramRef")
        if not kind or not ref:
            return [None]
        resource = self._find(kind.get("apiVersion", ""), kind.get("kind", ""))
        namespace = ref.get("namespace") or (req.namespace if resource.rtype.namespaced else "")
        if ref.get("name"):
            found = self.store.get(resource.rtype, namespace, ref["name"])
            items = [] if found is None else [found]
        else:
            selector = ref.get("selector") or {}
            items = [
                o
                for o in self.store.collections[resource.rtype.key].objects.values()
                if o["metadata"].get("namespace", "") == namespace
                and match_selector_object(selector, o["metadata"].get("labels") or {})
            ]
        if items:
            return list(items)
        if (ref.get("parameterNotFoundAction") or "Deny") == "Allow":
            return None
        self._deny(
            spec.get("name", ""),
            "",
            req,
            "no params found for policy binding with `Deny` parameterNotFoundAction",
            "Invalid",
        )
        return None

    def _first_failure(
        self, spec: Obj, req: Request, param: Obj | None, fail: bool
    ) -> tuple[str, str] | None:
        """``(message, reason)`` of the first validation that fails, if any."""
        activation: Obj = {
            "object": json_to_cel(req.obj),
            "oldObject": json_to_cel(req.old),
            "request": json_to_cel(req.cel()),
            "params": json_to_cel(param),
            "namespaceObject": json_to_cel(self._namespace(req)),
        }
        variables = MapType()
        activation["variables"] = variables
        for variable in spec.get("variables") or ():
            value, error = _run(variable["expression"], activation)
            if error is not None:
                return (error, "Invalid") if fail else None
            variables[StringType(variable["name"])] = value
        for condition in spec.get("matchConditions") or ():
            held, error = _verdict(condition["expression"], activation)
            if error is not None:
                return (error, "Invalid") if fail else None
            if not held:
                return None
        for validation in spec.get("validations") or ():
            held, error = _verdict(validation["expression"], activation)
            if error is not None:
                if fail:
                    return error, "Invalid"
                continue
            if not held:
                return _message(validation, activation), validation.get("reason") or "Invalid"
        return None

    def _act(self, policy: Obj, binding: Obj, req: Request, message: str, reason: str) -> None:
        actions = (binding.get("spec") or {}).get("validationActions") or ()
        policy_name, binding_name = policy["metadata"]["name"], binding["metadata"]["name"]
        if "Warn" in actions:
            req.ctx.warnings.append(
                f"Validation failed for ValidatingAdmissionPolicy '{policy_name}' "
                f"with binding '{binding_name}': {message}"
            )
        if "Deny" in actions:
            self._deny(policy_name, binding_name, req, message, reason)

    @staticmethod
    def _deny(policy: str, binding: str, req: Request, message: str, reason: str) -> None:
        """Upstream's refusal: ``admission.NewForbidden``'s wording, the policy's
        reason and its code, the message again as the one cause."""
        said = f"ValidatingAdmissionPolicy '{policy}'"
        said += f" with binding '{binding}' denied request: " if binding else " denied request: "
        said += message
        error = errors.forbidden(req.resource.plural, req.resource.group, req.name, said)
        error.reason, error.code = reason, _CODES.get(reason, 422)
        error.details.setdefault("causes", []).append({"message": said})
        raise error


def _run(expression: str, activation: Obj) -> tuple[Any, str | None]:
    try:
        value = cel_program(expression).evaluate(activation)
    except Exception as error:
        return None, f"expression '{expression}' resulted in error: {error}"
    if isinstance(value, Exception):
        return None, f"expression '{expression}' resulted in error: {value}"
    return value, None


def _verdict(expression: str, activation: Obj) -> tuple[bool, str | None]:
    """A condition's or validation's truth; an error when it is no bool."""
    value, error = _run(expression, activation)
    if error is not None:
        return False, error
    if not isinstance(value, (bool, BoolType)):
        return False, f"expression '{expression}' resulted in error: no such overload"
    return bool(value), None


def _message(validation: Mapping[str, Any], activation: Obj) -> str:
    if validation.get("messageExpression"):
        value, error = _run(validation["messageExpression"], activation)
        if error is None and isinstance(value, str) and value.strip():
            return str(value)
    return str(validation.get("message") or f"failed expression: {validation['expression']}")


# -- validation of the two kinds, as their registry strategies do -------------------------


def _compiles(expression: Any, field: str) -> list[Cause]:
    if not isinstance(expression, str) or not expression.strip():
        return [Cause("FieldValueRequired", "Required value: expression is not specified", field)]
    problem = cel_compile_error(expression)
    if problem is None:
        return []
    return [
        Cause(
            "FieldValueInvalid",
            f"Invalid value: {expression!r}: compilation failed: {problem}",
            field,
        )
    ]


def validate_policy(obj: Obj) -> list[Cause]:
    spec = obj.get("spec") or {}
    causes: list[Cause] = []
    constraints = spec.get("matchConstraints")
    if not constraints or not constraints.get("resourceRules"):
        causes.append(
            Cause(
                "FieldValueRequired",
                "Required value",
                "spec.matchConstraints.resourceRules",
            )
        )
    if not spec.get("validations") and not spec.get("auditAnnotations"):
        causes.append(
            Cause(
                "FieldValueRequired",
                "Required value: validations or auditAnnotations must contain at least one item",
                "spec.validations",
            )
        )
    if spec.get("failurePolicy", "Fail") not in ("Fail", "Ignore"):
        causes.append(
            Cause(
                "FieldValueNotSupported",
                f'Unsupported value: "{spec["failurePolicy"]}": supported values: "Fail", "Ignore"',
                "spec.failurePolicy",
            )
        )
    for part in ("validations", "matchConditions", "variables"):
        for i, item in enumerate(spec.get(part) or ()):
            causes += _compiles(item.get("expression"), f"spec.{part}[{i}].expression")
    for i, item in enumerate(spec.get("validations") or ()):
        reason = item.get("reason")
        if reason is not None and reason not in _CODES:
            causes.append(
                Cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{reason}": supported values: "Forbidden", "Invalid", '
                    '"RequestEntityTooLarge", "Unauthorized"',
                    f"spec.validations[{i}].reason",
                )
            )
    return causes


def validate_binding(obj: Obj) -> list[Cause]:
    spec = obj.get("spec") or {}
    causes: list[Cause] = []
    if not spec.get("policyName"):
        causes.append(Cause("FieldValueRequired", "Required value", "spec.policyName"))
    actions = spec.get("validationActions") or []
    if not actions:
        causes.append(
            Cause(
                "FieldValueRequired",
                "Required value: at least one validation action is required",
                "spec.validationActions",
            )
        )
    for i, action in enumerate(actions):
        if action not in _ACTIONS:
            causes.append(
                Cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{action}": supported values: "Audit", "Deny", "Warn"',
                    f"spec.validationActions[{i}]",
                )
            )
    if len(set(actions)) != len(actions):
        causes.append(Cause("FieldValueDuplicate", "Duplicate value", "spec.validationActions"))
    if "Deny" in actions and "Warn" in actions:
        causes.append(
            Cause(
                "FieldValueInvalid",
                "Invalid value: must not contain both Deny and Warn "
                "(repeating the same validation failure information in the API response "
                "and headers serves no purpose)",
                "spec.validationActions",
            )
        )
    return causes


class AdmissionPolicyStrategy(Strategy):
    """``validatingadmissionpolicy/strategy.go``: its defaults, its validation."""

    def default(self, obj: Obj) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("failurePolicy", "Fail")
        _default_match(spec.get("matchConstraints"))

    def validate(self, obj: Obj, old: Obj | None) -> list[Cause]:
        return validate_policy(obj)


class AdmissionPolicyBindingStrategy(Strategy):
    """``validatingadmissionpolicybinding/strategy.go``."""

    def default(self, obj: Obj) -> None:
        _default_match((obj.get("spec") or {}).get("matchResources"))

    def validate(self, obj: Obj, old: Obj | None) -> list[Cause]:
        return validate_binding(obj)


def _default_match(match: Obj | None) -> None:
    """``SetDefaults_MatchResources``: Equivalent, empty selectors, every scope."""
    if not isinstance(match, dict):
        return
    match.setdefault("matchPolicy", "Equivalent")
    match.setdefault("namespaceSelector", {})
    match.setdefault("objectSelector", {})
    for part in ("resourceRules", "excludeResourceRules"):
        for rule in match.get(part) or ():
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")


STRATEGIES: dict[str, Callable[[], Strategy]] = {
    POLICIES: AdmissionPolicyStrategy,
    BINDINGS: AdmissionPolicyBindingStrategy,
}
