"""Which resources a CloudFormation value reads (Ref, Fn::GetAtt, Fn::Sub's ${Name} and ${Name.Attr}).

Shared by the emulator (an output whose resource it did not create is left out, as the resource is) and the
deploy (which says which outputs went with which resources). Pseudo parameters (AWS::Region...) are not
resources; a parameter's name may come back too, and matches no resource."""

from __future__ import annotations

import re
from typing import Any

_SUB_NAME = re.compile(r"\$\{(?!!)([A-Za-z0-9]+)(?:\.[A-Za-z0-9.]+)?\}")


def referenced(value: Any) -> set[str]:
    if isinstance(value, dict):
        found: set[str] = set()
        for key, inner in value.items():
            if key == "Fn::GetAtt":
                found.add(inner[0] if isinstance(inner, list) else str(inner).split(".", 1)[0])
            elif key == "Ref":
                found.add(str(inner))
            elif key == "Fn::Sub":
                text, names = (inner[0], inner[1]) if isinstance(inner, list) else (inner, {})
                found |= set(_SUB_NAME.findall(str(text))) - set(names) | referenced(names)
            else:
                found |= referenced(inner)
        return found
    if isinstance(value, list):
        return set().union(*(referenced(v) for v in value))
    return set()


__all__ = ["referenced"]
