"""How a message echoes input: every character a terminal or a reader would not see as itself is escaped.

Input reaches messages as refused values, unknown or duplicate keys, host names and file names. Raw, a newline
would forge a line of its own (`fix: curl … | sh`), an escape sequence would rewrite the terminal, a
right-to-left override would make the text read differently than it is. Every validator message goes through
`escaped` (a quoted value) or `neutral` (a whole line, as Problem.render writes it).
"""

from __future__ import annotations


def neutral(text: str) -> str:
    """`text` with every non-printable character escaped: controls (newline, ESC, NEL), format characters
    (bidirectional overrides, zero-width), line and paragraph separators, surrogates, unassigned code points."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


def escaped(value: object, limit: int = 60) -> str:
    """A value as a message may show it: quoted (repr), escaped (see neutral), shortened to about `limit`."""
    text = neutral(repr(value))
    return text if len(text) <= limit else text[: limit - 5] + "…" + text[-4:]
