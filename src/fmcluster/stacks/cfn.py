"""CloudFormation templates as Python data: intrinsic functions, tags and the YAML dump.

Why data and not text: a tenant value must never be able to change a template's structure. The
templates (fmcluster.stacks.templates.*) are built as dicts and lists, tenant values enter them only
as leaf strings, and `dump` writes YAML with PyYAML's emitter, which quotes and escapes every scalar
itself. There is no text template a value could break out of.

The one place CloudFormation parses strings again is `Fn::Sub` (`${...}` interpolation). `Sub` is
therefore only for strings fmcluster writes itself; text that carries a tenant value is built with
`text()`, which emits `Fn::Join` (whose parts CloudFormation never interpolates) and refuses a
`Sub` template that is not fmcluster's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

# ${Name} or ${Resource.Attribute} or ${AWS::Pseudo} in an fmcluster-owned Sub template.
_SUB_VARIABLE = re.compile(r"\$\{([A-Za-z0-9:.]+)\}")
_SUB_ANY = re.compile(r"\$\{")


#: CloudFormation's ceiling for a CreationPolicy's ResourceSignal Timeout (and a rolling update's PauseTime).
MAX_SIGNAL_TIMEOUT_S = 12 * 3600.0
_DURATION = re.compile(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?")


def signal_timeout_s(text: str) -> float:
    """A ResourceSignal Timeout (ISO 8601 duration, "PT#H#M#S") in seconds; ValueError when CloudFormation would
    refuse it (another form, nothing in it, or over 12 hours)."""
    found = _DURATION.fullmatch(text.strip())
    if not found or not any(found.groups()):
        raise ValueError(f"Timeout {text!r} is not an ISO 8601 duration of the form PT#H#M#S")
    hours, minutes, seconds = (int(part or 0) for part in found.groups())
    total = hours * 3600.0 + minutes * 60.0 + seconds
    if total > MAX_SIGNAL_TIMEOUT_S:
        raise ValueError(f"Timeout {text} exceeds the maximum of 12 hours (PT12H)")
    return total


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class GetAtt:
    resource: str
    attribute: str


@dataclass(frozen=True)
class Sub:
    """`!Sub` of a template fmcluster wrote: only ${Name} references, never a tenant value."""

    template: str

    def __post_init__(self) -> None:
        stray = _SUB_ANY.findall(_SUB_VARIABLE.sub("", self.template))
        if stray:
            raise ValueError(f"Sub template has a '${{' that is not a plain reference: {self.template!r}")


@dataclass(frozen=True)
class Fn:
    """Any other intrinsic function, e.g. Fn("Join", ["", [...]]) or Fn("If", [cond, a, b])."""

    name: str  # Join, If, Equals, Not, Base64, ...
    value: Any


def join(parts: list[Any], delimiter: str = "") -> Fn:
    return Fn("Join", [delimiter, parts])


def base64(value: Any) -> Fn:
    return Fn("Base64", value)


def user_data(parts: list[Any]) -> Fn:
    """EC2 user data from literal text and references: one Fn::Base64 of one Fn::Join, adjacent texts merged."""
    merged: list[Any] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    return base64(join(merged))


def if_(condition: str, then: Any, otherwise: Any) -> Fn:
    return Fn("If", [condition, then, otherwise])


NO_VALUE = Ref("AWS::NoValue")


class _Literal(str):
    """A tenant value inside text(): kept verbatim as its own Fn::Join part."""


def text(template: str, **values: Any) -> Any:
    """`template` (written by fmcluster) with `{name}` placeholders filled from `values`, and
    `${Name}` / `${Resource.Attribute}` references that CloudFormation resolves.

    A str value is tenant data: it becomes its own literal Fn::Join part, so `${`, quotes or
    newlines in it stay data. An intrinsic value (Ref, GetAtt, ...) is inserted as is. The result is
    a plain string when nothing needs resolving, a Sub when only references appear, and a Join as
    soon as a tenant value is involved."""
    parts: list[Any] = []
    pos = 0
    for match in re.finditer(r"\{([a-z_]+)\}", template):
        parts += _references(template[pos:match.start()])
        value = values[match.group(1)]
        parts.append(_Literal(value) if isinstance(value, str) else value)
        pos = match.end()
    parts += _references(template[pos:])
    merged: list[Any] = []
    for part in parts:
        if type(part) is str and merged and type(merged[-1]) is str:
            merged[-1] += part
        elif part != "" or isinstance(part, _Literal):
            merged.append(part)
    if not any(isinstance(p, _Literal) for p in merged) and all(isinstance(p, (str, Ref, GetAtt)) for p in merged):
        if all(type(p) is str for p in merged):
            return "".join(merged)
        return Sub("".join(p if isinstance(p, str) else _as_sub(p) for p in merged))
    # Runs of fmcluster's own text and references become one Sub each; tenant values stay separate,
    # literal Join parts between them.
    flat: list[Any] = []
    run: list[Any] = []

    def close_run() -> None:
        if run:
            flat.append(Sub("".join(p if isinstance(p, str) else _as_sub(p) for p in run))
                        if any(not isinstance(p, str) for p in run) else "".join(run))
            run.clear()

    for part in merged:
        if isinstance(part, _Literal):
            close_run()
            # Kept even when empty: a tenant value always gives the same shape (a Join), whatever it holds.
            flat.append(str(part))
        elif isinstance(part, (str, Ref, GetAtt)):
            run.append(part)
        else:
            close_run()
            flat.append(part)
    close_run()
    return join(flat)


def _references(fragment: str) -> list[Any]:
    """An fmcluster-written fragment with ${Name} references split into literal text and Refs."""
    out: list[Any] = []
    pos = 0
    for match in _SUB_VARIABLE.finditer(fragment):
        out.append(fragment[pos:match.start()])
        name = match.group(1)
        out.append(GetAtt(*name.split(".", 1)) if "." in name else Ref(name))
        pos = match.end()
    out.append(fragment[pos:])
    if _SUB_ANY.search("".join(p for p in out if isinstance(p, str))):
        raise ValueError(f"template fragment has a '${{' that is not a plain reference: {fragment!r}")
    return out


def _as_sub(value: Ref | GetAtt) -> str:
    return "${" + (value.name if isinstance(value, Ref) else f"{value.resource}.{value.attribute}") + "}"


def tags(values: dict[str, str], propagate: bool | None = None) -> list[dict[str, Any]]:
    """CloudFormation Tags list; `propagate` adds PropagateAtLaunch (auto scaling groups)."""
    out: list[dict[str, Any]] = []
    for key, value in values.items():
        tag: dict[str, Any] = {"Key": key, "Value": value}
        if propagate is not None:
            tag["PropagateAtLaunch"] = propagate
        out.append(tag)
    return out


# --- YAML dump -------------------------------------------------------------------------------------

class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Block style, key order kept, no anchors/aliases (a shared list must not become *id001);
    libyaml's emitter when PyYAML has it."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: Any, value: str) -> Any:
    # Multi-line text (user data) reads best as a literal block; PyYAML's emitter falls back to a
    # quoted scalar by itself whenever a block could not hold the value exactly.
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


def _ref(dumper: Any, value: Ref) -> Any:
    return dumper.represent_scalar("!Ref", value.name)


def _getatt(dumper: Any, value: GetAtt) -> Any:
    return dumper.represent_scalar("!GetAtt", f"{value.resource}.{value.attribute}")


def _sub(dumper: Any, value: Sub) -> Any:
    return dumper.represent_scalar("!Sub", value.template)


def _fn(dumper: Any, value: Fn) -> Any:
    tag = f"!{value.name}"
    if isinstance(value.value, list):
        return dumper.represent_sequence(tag, value.value)
    if isinstance(value.value, dict):
        return dumper.represent_mapping(tag, value.value)
    if isinstance(value.value, (Ref, GetAtt, Sub, Fn)):
        # A tagged node cannot carry a second tag: use the long form for the nested function.
        return dumper.represent_mapping("tag:yaml.org,2002:map", {f"Fn::{value.name}": value.value})
    return dumper.represent_scalar(tag, str(value.value))


_Dumper.add_representer(str, _str)
_Dumper.add_representer(Ref, _ref)
_Dumper.add_representer(GetAtt, _getatt)
_Dumper.add_representer(Sub, _sub)
_Dumper.add_representer(Fn, _fn)


def dump(template: dict[str, Any]) -> str:
    """The template as CloudFormation YAML (short-form intrinsics, every scalar quoted as needed)."""
    return yaml.dump(template, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100,
                     allow_unicode=False)
