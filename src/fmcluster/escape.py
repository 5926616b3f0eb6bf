"""How a message echoes input: every character a terminal or a reader would not see as itself is escaped.

Input reaches messages as refused values, unknown or duplicate keys, host names and file names. Raw, a newline
would forge a line of its own (`fix: curl … | sh`), an escape sequence would rewrite the terminal, a
right-to-left override would make the text read differently than it is. Every validator message goes through
`escaped` (a quoted value) or `neutral` (a whole line, as Problem.render writes it).
"""

from __future__ import annotations

import re

#: Characters Python calls printable that show as nothing: the combining grapheme joiner, the Hangul fillers, the
#: Khmer inherent vowels, the Mongolian free variation selectors and the variation selectors (Unicode's
#: Default_Ignorable_Code_Point characters outside the Cf category). Everything else invisible (C0/C1 controls and
#: ESC, bidirectional embeddings, overrides and isolates, zero-width spaces and joiners, the BOM, line and paragraph
#: separators, every space but U+0020) is not printable to str.isprintable already.
INVISIBLE = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\uffa0\ufe00-\ufe0f"
                       "\U000e0100-\U000e01ef]")


def _shown(c: str) -> str:
    if c.isprintable() and not INVISIBLE.match(c):
        return c
    return c.encode("unicode_escape", "backslashreplace").decode("ascii")


def neutral(text: str) -> str:
    """`text` with every character a reader would not see as itself escaped (as \\x1b, \\u202e...): controls
    (newline, ESC, NEL and every other C0/C1), format characters (bidirectional embeddings, overrides and isolates,
    zero-width spaces and joiners), line and paragraph separators, spaces other than U+0020, surrogates, unassigned
    code points and the other default-ignorable characters (INVISIBLE). The one escape every echo of input uses."""
    if text.isprintable() and not INVISIBLE.search(text):
        return text
    return "".join(_shown(c) for c in text)


def neutral_lines(text: str) -> str:
    """A multi-line message made of our own lines with input in them: each line neutral, joined by newlines again
    (only "\\n" separates lines: a carriage return or U+2028 inside a line is escaped like any other)."""
    return "\n".join(neutral(line) for line in text.split("\n"))


def escaped(value: object, limit: int = 60) -> str:
    """A value as a message may show it: quoted (repr), escaped (see neutral), shortened to about `limit`."""
    text = neutral(repr(value))
    return text if len(text) <= limit else text[: limit - 5] + "…" + text[-4:]
