"""A small evaluator of the IAM policies fmcluster renders: Allow statements, wildcards, policy variables.

It answers one question — does this identity policy allow this request? — the way IAM's policy evaluation
logic does for the parts fmcluster's policies use, and refuses (raises) on anything it does not model, so a
policy that grows a Deny, a NotAction or an unknown condition operator cannot pass silently:

- a request is allowed when one Allow statement matches its action, its resource and all its conditions;
- `*` in an action or resource matches any run of characters (`/` included), `?` exactly one;
- `${key}` in a resource or condition value is replaced by the request's value of that context key
  (`${*}`, `${?}`, `${$}` stand for the literal characters); a statement whose variable has no value in the
  request matches nothing (IAM User Guide, "Policy variables with no value");
- StringEquals, StringLike, ArnEquals and ArnLike: a key with any of the listed values matches; a key absent
  from the request does not.

The rendered CloudFormation is resolved first (`resolve`): Ref, Fn::GetAtt, Fn::Sub (including `${!x}` as the
literal `${x}`) and Fn::Join, from the values a test gives for the stack's parameters and resources.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_SUB = re.compile(r"\$\{(!?)([^}]*)\}")
_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_LITERALS = {"*": "*", "?": "?", "$": "$"}
OPERATORS = ("StringEquals", "StringLike", "ArnEquals", "ArnLike")


class Unmodelled(ValueError):
    """The policy uses something this evaluator does not model: fail closed."""


def resolve(value: Any, names: Mapping[str, str]) -> Any:
    """A rendered template value with its intrinsic functions replaced by what CloudFormation would make of them."""
    if isinstance(value, list):
        return [resolve(v, names) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Ref"}:
        return names[value["Ref"]]
    if set(value) == {"Fn::GetAtt"}:
        attribute = value["Fn::GetAtt"]
        return names[".".join(attribute) if isinstance(attribute, list) else attribute]
    if set(value) == {"Fn::Sub"}:
        def one(match: re.Match[str]) -> str:
            return "${" + match.group(2) + "}" if match.group(1) else names[match.group(2)]
        return _SUB.sub(one, str(value["Fn::Sub"]))
    if set(value) == {"Fn::Join"}:
        delimiter, parts = value["Fn::Join"]
        return str(delimiter).join(str(resolve(p, names)) for p in parts)
    return {k: resolve(v, names) for k, v in value.items()}


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _glob(pattern: str, text: str, case: bool = True) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, 0 if case else re.IGNORECASE) is not None


def substitute(pattern: str, context: Mapping[str, str]) -> str | None:
    """`pattern` with its policy variables replaced from the request context; None when one has no value.
    Replaced values are matched literally: a `*` in a value is no wildcard."""
    missing = False
    out: list[str] = []
    pos = 0
    for match in _VARIABLE.finditer(pattern):
        out.append(pattern[pos:match.start()])
        key = match.group(1)
        if key in _LITERALS:
            out.append("\0" + _LITERALS[key])  # a literal character, not a wildcard
        elif key in context:
            out.append("".join("\0" + c if c in "*?" else c for c in context[key]))
        else:
            missing = True
        pos = match.end()
    out.append(pattern[pos:])
    return None if missing else "".join(out)


def _match(pattern: str, text: str, context: Mapping[str, str], wildcards: bool = True) -> bool:
    expanded = substitute(pattern, context)
    if expanded is None:
        return False
    regex = []
    i = 0
    while i < len(expanded):
        c = expanded[i]
        if c == "\0":
            regex.append(re.escape(expanded[i + 1]))
            i += 2
            continue
        regex.append(".*" if wildcards and c == "*" else "." if wildcards and c == "?" else re.escape(c))
        i += 1
    return re.fullmatch("".join(regex), text) is not None


@dataclass
class Request:
    action: str
    resource: str
    context: dict[str, str] = field(default_factory=dict)


def _statement_allows(statement: Mapping[str, Any], request: Request) -> bool:
    for element in ("NotAction", "NotResource", "NotPrincipal"):
        if element in statement:
            raise Unmodelled(f"{element} in {statement.get('Sid', statement)}")
    if statement.get("Effect") != "Allow":
        raise Unmodelled(f"Effect {statement.get('Effect')!r} in {statement.get('Sid', statement)}")
    if not any(_glob(str(a), request.action, case=False) for a in _listed(statement["Action"])):
        return False
    if not any(_match(str(r), request.resource, request.context) for r in _listed(statement["Resource"])):
        return False
    for operator, tests in statement.get("Condition", {}).items():
        if operator not in OPERATORS:
            raise Unmodelled(f"condition operator {operator} in {statement.get('Sid', statement)}")
        for key, wanted in tests.items():
            if key not in request.context:
                return False
            like = operator.endswith("Like")
            if not any(_match(str(w), request.context[key], request.context, wildcards=like) for w in _listed(wanted)):
                return False
    return True


def allows(policies: Sequence[Mapping[str, Any]], request: Request) -> bool:
    """Whether any statement of the (resolved) policy documents allows the request."""
    return any(_statement_allows(st, request) for doc in policies for st in _listed(doc["Statement"]))


#: The condition operators a bucket policy's Deny uses here: the negated forms match when no listed value matches
#: (IAM User Guide, "Condition operators": a key absent from the request matches a negated operator).
DENY_OPERATORS = (*OPERATORS, "StringNotEquals", "StringNotLike", "Bool")


def denies(statement: Mapping[str, Any], request: Request) -> bool:
    """Whether one resolved Deny statement (of a resource policy, Principal "*") applies to the request."""
    if statement.get("Effect") != "Deny" or statement.get("Principal") != "*":
        raise Unmodelled(f"not a Deny for every principal: {statement.get('Sid', statement)}")
    for element in ("NotAction", "NotResource", "NotPrincipal"):
        if element in statement:
            raise Unmodelled(f"{element} in {statement.get('Sid', statement)}")
    if not any(_glob(str(a), request.action, case=False) for a in _listed(statement["Action"])):
        return False
    if not any(_match(str(r), request.resource, request.context) for r in _listed(statement["Resource"])):
        return False
    for operator, tests in statement.get("Condition", {}).items():
        if operator not in DENY_OPERATORS:
            raise Unmodelled(f"condition operator {operator} in {statement.get('Sid', statement)}")
        for key, wanted in tests.items():
            value = request.context.get(key)
            if operator == "Bool":
                if value is None or value.lower() != str(wanted).lower():
                    return False
                continue
            like = operator.endswith("Like")
            hit = value is not None and any(_match(str(w), value, request.context, wildcards=like)
                                            for w in _listed(wanted))
            if hit == ("Not" in operator):
                return False
    return True
