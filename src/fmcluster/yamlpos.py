"""YAML loading that remembers where each key was written, so errors can name the line.

A tenant spec is written by people in many organizations, so the loader treats the file as hostile: it
refuses what no spec needs (more than MAX_BYTES, bytes that are not UTF-8, non-printable characters,
keys that are not plain strings, nesting deeper than MAX_DEPTH, an alias that contains itself) and stops
expanding aliases after MAX_NODES nodes, so an "alias bomb" costs milliseconds, not memory. Every refusal
is a YamlSyntaxError with the line, never a traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fmcluster.escape import escaped

KeyPath = tuple[str | int, ...]

#: A tenant spec is a few kilobytes; the biggest sensible one (16 queues, 20 receivers, 1000 users with a key each)
#: stays under 200 KiB.
MAX_BYTES = 256 * 1024
#: The schema nests six levels; anything much deeper is not a spec.
MAX_DEPTH = 32
#: Values in the document, before and after alias expansion: a spec has a few hundred, and about 13 more per user
#: (the schema allows 1000 users: ~14000), an alias bomb billions. Counted while composing too, so a large flat file
#: stops early instead of being read whole.
MAX_NODES = 20_000
#: Digits in a number: the largest a spec holds (a capacity in GiB) has six; a longer one is a typo or an attack
#: (Python refuses to read integers of more than 4300 digits, and big ones cost time to convert).
MAX_DIGITS = 15
#: Numbers are decimal: YAML 1.1 also reads 010 as 8, 0x10 as 16, 0b10 as 2, 1:30 as 90 and 1_6 as 16, which no
#: person writing a node count means.
DECIMAL_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
#: Characters YAML 1.1 treats as line breaks but editors, grep and diff do not: a key after one is invisible to
#: the tools a reviewer uses, yet read by the loader.
HIDDEN_LINE_BREAKS = {"\u2028": "LINE SEPARATOR", "\u2029": "PARAGRAPH SEPARATOR", "\x85": "NEXT LINE (NEL)"}


GENERIC_FIX = "fix the YAML at that line (indentation, a missing ':' or an unclosed quote)"


class YamlSyntaxError(Exception):
    def __init__(self, path: Path, line: int | None, detail: str, fix: str = GENERIC_FIX,
                 key_path: KeyPath = ()) -> None:
        super().__init__(f"{path}:{line}: {detail}" if line else f"{path}: {detail}")
        self.path = path
        self.line = line
        self.detail = detail
        self.fix = fix
        self.key_path = key_path


@dataclass
class LoadedYaml:
    path: Path
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, key_path: KeyPath) -> int | None:
        """Line of the deepest existing ancestor of key_path (1-based)."""
        probe = tuple(key_path)
        while probe:
            if probe in self.lines:
                return self.lines[probe]
            probe = probe[:-1]
        return self.lines.get((), None)


class _Refused(Exception):
    """Raised inside the loader; load() turns it into a YamlSyntaxError naming the file."""

    def __init__(self, line: int | None, detail: str, fix: str, key_path: KeyPath = ()) -> None:
        super().__init__(detail)
        self.line = line
        self.detail = detail
        self.fix = fix
        self.key_path = key_path


_SEQ, _MAP = "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_KINDS = {"int": "number", "float": "number", "bool": "true/false value", "NoneType": "null",
          "date": "date", "datetime": "date", "bytes": "binary value"}


def _line(node_or_event: Any) -> int:
    return int(node_or_event.start_mark.line) + 1


class _Loader(yaml.SafeLoader):
    """SafeLoader whose composer refuses deep nesting before Python's recursion limit is near."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._composed = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._composed += 1
        try:
            if self._composed > MAX_NODES:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise _Refused(_line(event), f"the document holds more than {MAX_NODES} values",
                               "a tenant spec has a few hundred, about 13 more per user: remove what is not the spec")
            if self._depth > MAX_DEPTH:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise _Refused(_line(event), f"the document nests deeper than {MAX_DEPTH} levels",
                               "a tenant spec nests about six levels: remove the extra brackets or indentation")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Builder:
    """Node graph → Python data, recording each key path's line and bounding alias expansion."""

    def __init__(self, loader: _Loader) -> None:
        self.loader = loader
        self.lines: dict[KeyPath, int] = {}
        self.nodes = 0
        self.open: set[int] = set()  # ids of the collection nodes on the current path (a cycle = recursive alias)

    def build(self, node: yaml.Node, here: KeyPath) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _Refused(_line(node), f"aliases expand to more than {MAX_NODES} values (an alias bomb?)",
                           "write the values out; a tenant spec has a few hundred", here[:-1])
        self.lines[here] = _line(node)
        if not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            return self._scalar(node, here)
        if node.tag not in (_SEQ, _MAP):
            raise _Refused(_line(node), f"the tag {_shown(node.tag)} is not supported in a tenant spec",
                           "remove the tag (`!!…` or `!…`) and write plain lists and mappings", here)
        if id(node) in self.open:
            raise _Refused(_line(node), "an alias refers to the collection that contains it (a recursive alias)",
                           "replace the alias (`*name`) inside its own anchor (`&name`) with the values", here[:-1])
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.build(item, (*here, i)) for i, item in enumerate(node.value)]
            return self._mapping(node, here)
        finally:
            self.open.discard(id(node))

    def _scalar(self, node: yaml.Node, here: KeyPath) -> Any:
        """A scalar's value: numbers decimal and bounded, a constructor's failure (`!!int abc`, the date
        2024-02-30) a refusal naming the line, never a traceback."""
        text = str(node.value)
        if node.tag in (_INT, _FLOAT) and len(re.sub(r"[^0-9]", "", text)) > MAX_DIGITS:
            raise _Refused(_line(node), f"the number {_shown(text)} has more than {MAX_DIGITS} digits",
                           f"no spec number needs more than {MAX_DIGITS} digits: check for a typo", here)
        # Text YAML itself reads as a number (`!!int abc` is not: its constructor fails below, with the line).
        implicit = self.loader.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
        if node.tag == _INT and implicit == _INT and not DECIMAL_INT.fullmatch(text):
            raise _Refused(_line(node), f"{_shown(text)} is not a decimal number: YAML 1.1 reads it as "
                           f"{_number_form(text)}", "write the number in plain decimal digits (e.g. 8, 16, 90), "
                           "or quote it if you meant text", here)
        if node.tag == _FLOAT and implicit in (_INT, _FLOAT) and ("_" in text or ":" in text):
            raise _Refused(_line(node), f"{_shown(text)} is not a decimal number: YAML 1.1 reads it as "
                           f"{_number_form(text)}", "write it in plain decimal form (e.g. 1.5), or quote it if you "
                           "meant text", here)
        try:
            return self.loader.construct_object(node, deep=True)
        except Exception as err:  # noqa: BLE001 - PyYAML's constructors raise ValueError, KeyError (`!!bool maybe`),
            # IndexError (`!!int ''`), AttributeError (`!!timestamp nope`)...: each is this value's refusal
            tag = node.tag.removeprefix("tag:yaml.org,2002:")
            raise _Refused(_line(node), f"{_shown(text)} cannot be read as {_shown(tag)}: {_shown(str(err), 80)}",
                           "write a plain value (quote text; write dates as YYYY-MM-DD that exist), without a "
                           "`!!` tag", here) from None

    def _mapping(self, node: yaml.MappingNode, here: KeyPath) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = _line(key_node)
            if not isinstance(key_node, yaml.ScalarNode):
                raise _Refused(line, "a key is a list or a mapping, not a name",
                               "keys are plain names like `org:`; remove the `?` or brackets", here)
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _Refused(line, "merge keys (`<<: *alias`) are not supported in a tenant spec",
                               "write the keys out", here)
            key = self._scalar(key_node, here)
            if not isinstance(key, str):
                kind = _KINDS.get(type(key).__name__, type(key).__name__)
                raise _Refused(line, f"the key {_shown(str(key_node.value))} is read as a {kind}, not a name",
                               "keys are names like `org:`; quote it if you meant the text", here)
            if key in result:
                raise _Refused(line, f"duplicate key {_shown(key)}", "keep one of them", (*here, key))
            child = (*here, key)
            result[key] = self.build(value_node, child)
            self.lines[child] = line
        return result


def _shown(text: str, limit: int = 60) -> str:
    """Input as a message may echo it (fmcluster.escape.escaped, which fmcluster.validation.show is too)."""
    return escaped(text, limit)


def _number_form(text: str) -> str:
    plain = text.lstrip("+-")
    if ":" in plain:
        return "a base-60 (sexagesimal) number, e.g. 1:30 is 90"
    if "_" in plain:
        return "a number with '_' separators, e.g. 1_6 is 16"
    if plain[:2].lower() == "0x":
        return "a hexadecimal number, e.g. 0x10 is 16"
    if plain[:2].lower() == "0b":
        return "a binary number, e.g. 0b10 is 2"
    if plain[:1] == "0":
        return "an octal number, e.g. 010 is 8"
    return "a number in a form other than decimal"


def _hidden_line_break(path: Path, text: str) -> None:
    for char, name in HIDDEN_LINE_BREAKS.items():
        position = text.find(char)
        if position >= 0:
            raise YamlSyntaxError(path, _where(text, position), f"a raw U+{ord(char):04X} {name} character: YAML "
                                  "reads it as a line break that editors, grep and diff do not show",
                                  "delete it (write the text on ordinary lines; inside a double-quoted value "
                                  "an escape like \\u2028 is read as text and refused there)")


def _decode(path: Path, raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise YamlSyntaxError(path, line, f"byte 0x{raw[err.start]:02x} at column {column} is not UTF-8",
                              "save the file as UTF-8") from None
    return text.removeprefix("\ufeff")


def read_text(path: Path, max_bytes: int = MAX_BYTES) -> str:
    """The file's text, refusing what is not a regular UTF-8 file of at most max_bytes."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(max_bytes + 1)
    except IsADirectoryError:
        raise YamlSyntaxError(path, None, "the spec is a directory, not a file", "put the spec in a file") from None
    except OSError as err:
        raise YamlSyntaxError(path, None, f"the spec cannot be read: {err.strerror or err}",
                              "make it a readable file") from None
    if len(raw) > max_bytes:
        raise YamlSyntaxError(path, None, f"the file is larger than {max_bytes // 1024} KiB",
                              "a tenant spec is a few kilobytes: remove what is not the spec") from None
    return _decode(path, raw)


def _where(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


_BRACKETS = re.compile(r"[\[\]{}]")


def _too_deep_brackets(text: str) -> int | None:
    """Line where more than MAX_DEPTH brackets are open at once, else None. PyYAML's scanner looks ahead up to
    1024 characters for every open flow bracket, so thousands of them cost it a second before the composer's
    own depth check runs; counting them first costs milliseconds. Brackets inside quotes or comments count
    too: no spec has 33 unclosed ones."""
    depth = 0
    for match in _BRACKETS.finditer(text):
        if match.group() in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return _where(text, match.start())
        elif depth:
            depth -= 1
    return None


def load(path: Path) -> LoadedYaml:
    """Load one YAML document with a line number for every key path. Raises YamlSyntaxError."""
    text = read_text(path)
    _hidden_line_break(path, text)
    if (deep := _too_deep_brackets(text)) is not None:
        raise YamlSyntaxError(path, deep, f"more than {MAX_DEPTH} brackets are open at once (the document nests "
                              f"deeper than {MAX_DEPTH} levels)", "a tenant spec nests about six levels: remove the "
                              "extra brackets")
    loader: _Loader | None = None
    try:
        loader = _Loader(text)
        root = loader.get_single_node()
        builder = _Builder(loader)
        data = None if root is None else builder.build(root, ())
        lines = builder.lines
    except _Refused as err:
        raise YamlSyntaxError(path, err.line, err.detail, err.fix, err.key_path) from None
    except yaml.reader.ReaderError as err:
        char = err.character if isinstance(err.character, int) else ord(err.character)
        raise YamlSyntaxError(path, _where(text, err.position), f"character U+{char:04X} is not allowed in YAML",
                              "remove it (control characters have no place in a spec)") from None
    except yaml.MarkedYAMLError as err:
        raise YamlSyntaxError(path, *_describe(err)) from None
    except yaml.YAMLError as err:
        raise YamlSyntaxError(path, None, str(err)[:200]) from None
    except RecursionError:
        raise YamlSyntaxError(path, None, "the document nests too deeply to read",
                              "remove the extra brackets or indentation") from None
    finally:
        if loader is not None:
            loader.dispose()
    return LoadedYaml(path=path, data=data, lines=lines)


def _describe(err: yaml.MarkedYAMLError) -> tuple[int | None, str, str]:
    """(line, detail, fix) of a parser error: where the unclosed thing started when the file ran out first."""
    problem, context = err.problem or "", err.context or ""
    at_end = "end of stream" in problem or "<stream end>" in problem
    if at_end and err.context_mark is not None:
        opened = err.context_mark.line + 1
        if "quoted scalar" in context:
            return opened, f"the quote opened on line {opened} is never closed", "close the quote on that line"
        what = context.removeprefix("while scanning ").removeprefix("while parsing ").removeprefix("a ")
        return opened, f"the {what} started on line {opened} is never closed", "close the bracket on that line"
    mark = err.problem_mark or err.context_mark
    line = mark.line + 1 if mark else None
    if "'\\t'" in problem:
        return line, "a tab character where YAML expects spaces", "indent with spaces, not tabs"
    return line, f"{context} {problem}".strip()[:300], GENERIC_FIX
