"""LDAP distinguished names (RFC 4514) and search filters (RFC 4515) as the tenant spec gives them, parsed, not
pattern-matched: `directory:` values land in sssd.conf, where SSSD reads a search base as
`base?scope?filter[?base?scope?filter...]` (sssd-ldap(5), ldap_search_base). So a `?` in a base DN, or in the
group filter the sssd_client role appends after `?subtree?`, would add a scope, a filter or a whole other search
base; a filter must be exactly one balanced filter, whatever its nesting.

Both functions return None for a valid value, else why it is not (one sentence, naming where).
"""

from __future__ import annotations

import re

#: RFC 4512 1.4: descr (keystring) or numericoid.
_ATTRIBUTE = re.compile(r"[A-Za-z][A-Za-z0-9-]*|(?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))+")
#: RFC 4514 2.4: characters a value must escape (the spec accepts no escapes, so they are refused), and `?`,
#: SSSD's search-base separator.
_DN_SPECIAL = '"+,;<>\\\x00?'
#: RFC 4515 3: characters of an assertion value that must be written as \XX.
_FILTER_SPECIAL = "()*\\\x00"
MAX_FILTER_DEPTH = 32


def dn_problem(text: str) -> str | None:
    """Why `text` is not a plain DN (`attr=value,attr=value`, no escapes, no multi-valued RDN), or None."""
    if not text:
        return "is empty"
    if "?" in text:
        return (f"has '?' at character {text.index('?') + 1}: SSSD reads what follows as a scope, a filter or another "
                "search base")
    for n, rdn in enumerate(text.split(","), 1):
        attribute, equals, value = rdn.partition("=")
        if not equals:
            return f"RDN {n} ({rdn!r}) has no '='"
        if not _ATTRIBUTE.fullmatch(attribute):
            return f"RDN {n} names no attribute type ({attribute!r})"
        if not value:
            return f"RDN {n} ({rdn!r}) has an empty value"
        if value != value.strip(" "):
            return f"RDN {n} ({rdn!r}) has a value with a leading or trailing space"
        if value.startswith("#"):
            return f"RDN {n} ({rdn!r}) has a value in #hex form"
        bad = next((c for c in value if c in _DN_SPECIAL or c == "="), None)
        if bad is not None:
            return f"RDN {n} ({rdn!r}) holds {bad!r}, which a DN value cannot hold unescaped"
    return None


class _Bad(ValueError):
    def __init__(self, at: int, why: str) -> None:
        super().__init__(f"{why} at character {at + 1}")


def filter_problem(text: str) -> str | None:
    """Why `text` is not exactly one RFC 4515 filter (with no raw `?`), or None."""
    if "?" in text:
        return (f"has '?' at character {text.index('?') + 1}: SSSD reads what follows as another search base or "
                "scope (write a literal ? as \\3f)")
    if not text:
        return "is empty"
    try:
        end = _filter(text, 0, 0)
    except _Bad as err:
        return str(err)
    if end != len(text):
        return f"has text after the first filter, at character {end + 1} (give one filter; combine them with (&...) or (|...))"
    return None


def _filter(text: str, at: int, depth: int) -> int:
    """Parse `( filtercomp )` at `at`; the index after it."""
    if depth > MAX_FILTER_DEPTH:
        raise _Bad(at, f"nests deeper than {MAX_FILTER_DEPTH} filters")
    if at >= len(text) or text[at] != "(":
        raise _Bad(at, "expected '(' to start a filter")
    at += 1
    if at >= len(text):
        raise _Bad(at, "ends inside a filter")
    if text[at] in "&|":
        at += 1
        count = 0
        while at < len(text) and text[at] == "(":
            at = _filter(text, at, depth + 1)
            count += 1
        if count == 0:
            raise _Bad(at, f"'{text[at - 1]}' needs at least one filter after it")
    elif text[at] == "!":
        at = _filter(text, at + 1, depth + 1)
    else:
        at = _item(text, at)
    if at >= len(text) or text[at] != ")":
        raise _Bad(at, "expected ')' to close the filter")
    return at + 1


def _item(text: str, at: int) -> int:
    """attr (= | ~= | >= | <=) value, attr=*, substrings, or an extensible match; the index of its closing ')'."""
    start = at
    while at < len(text) and (text[at].isascii() and (text[at].isalnum() or text[at] in "-.;:")):
        if text[at] == ":" and text[at:at + 2] == ":=":
            break
        at += 1
    attribute = text[start:at]
    if at >= len(text):
        raise _Bad(at, "ends inside a filter")
    if text[at:at + 2] == ":=":  # extensible: [attr][:dn][:rule]:=value
        if not attribute:
            raise _Bad(start, "an extensible match needs an attribute type or a matching rule")
        return _value(text, at + 2, stars=False)
    if not attribute:
        raise _Bad(start, "expected an attribute type")
    name = attribute.split(";", 1)[0]
    if not _ATTRIBUTE.fullmatch(name) or ":" in attribute:
        raise _Bad(start, f"{attribute!r} is not an attribute type")
    if text[at:at + 2] in ("~=", ">=", "<="):
        return _value(text, at + 2, stars=False)
    if text[at] != "=":
        raise _Bad(at, "expected '=', '~=', '>=' or '<=' after the attribute type")
    return _value(text, at + 1, stars=True)


def _value(text: str, at: int, stars: bool) -> int:
    """An assertion value (with `*` wildcards where `stars`), escapes as \\XX; the index of the ')' after it."""
    while at < len(text) and text[at] != ")":
        char = text[at]
        if char == "\\":
            if not re.fullmatch(r"[0-9A-Fa-f]{2}", text[at + 1:at + 3]):
                raise _Bad(at, "has a '\\' that is not followed by two hex digits")
            at += 3
            continue
        if char == "*" and not stars:
            raise _Bad(at, "has '*' in a value that takes no wildcard (write \\2a)")
        if char in "(\x00":
            raise _Bad(at, f"has {char!r} inside a value (write \\{ord(char):02x})")
        at += 1
    return at
