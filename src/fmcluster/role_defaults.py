"""Each role's defaults/main.yml, generated from its meta/argument_specs.yml.

A role variable is written once, in the spec: its type, its `default` and its `description` (ansible-doc's reader,
and ansible's check of the play's values). The defaults file ansible reads is rendered from it, every default
preceded by its description as the comment the operator reads. A default that is a template is tagged `!unsafe` in
the spec: ansible renders a spec before it validates the play's values against it, and a template naming a variable
the play has not set would fail the role there; the defaults file holds it as the plain template ansible renders
when the variable is read. tests/test_role_variables.py keeps the committed
files equal to what the specs generate.

    python -m fmcluster.role_defaults           # rewrite every role's defaults/main.yml
    python -m fmcluster.role_defaults --check   # name the roles whose file is not what its spec generates
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import yaml

from fmcluster.exits import ExitCode
from fmcluster.paths import source_root

ROLES = source_root() / "roles"
HEADER = ("# Generated from meta/argument_specs.yml by `python -m fmcluster.role_defaults`: edit the spec and run it "
          "again.")
#: yamllint's line-length (.yamllint.yml); comments and long values wrap earlier, where the hand-written ones did.
LINE_MAX = 160
WRAP = 118
#: A list of scalars this short is written on one line, `[a, b]`.
FLOW_MAX = 100


_UNREADABLE = object()


class Unsafe(str):
    """A spec value tagged `!unsafe`: a template ansible must not render when it validates the play's values."""


class SpecLoader(yaml.SafeLoader):
    """YAML as ansible reads a meta/argument_specs.yml, `!unsafe` included."""


def _unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> Unsafe:
    assert isinstance(node, yaml.ScalarNode), "!unsafe tags a string"
    return Unsafe(loader.construct_scalar(node))


SpecLoader.add_constructor("!unsafe", _unsafe)


def load_spec(path: Path) -> Any:
    """A role's meta/argument_specs.yml as ansible reads it (`!unsafe` strings as Unsafe)."""
    return yaml.load(path.read_text(), Loader=SpecLoader)  # noqa: S506 - SafeLoader plus one string tag


def _is_template(text: str) -> bool:
    return "{{" in text or "{%" in text


def _untagged_templates(value: Any) -> List[str]:
    """Template strings in `value` that are not tagged `!unsafe`."""
    if isinstance(value, str):
        return [value] if _is_template(value) and not isinstance(value, Unsafe) else []
    if isinstance(value, Mapping):
        return [t for k, v in value.items() for t in _untagged_templates(k) + _untagged_templates(v)]
    if isinstance(value, list):
        return [t for v in value for t in _untagged_templates(v)]
    return []


def _plain(value: Any) -> Any:
    """`value` with its `!unsafe` strings as the plain strings defaults/main.yml holds (templates ansible renders)."""
    if isinstance(value, Unsafe):
        return str(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _loads(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return _UNREADABLE


def _reads_back(lines: Sequence[str], value: Any) -> bool:
    return bool(_loads("\n".join(["k:", *lines]) + "\n") == {"k": value})


def _inline(value: Any) -> Optional[str]:
    """`value` on one line as YAML reads it back (plain where that is unambiguous, else double-quoted), or None."""
    if isinstance(value, str):
        # numbers, times and addresses stay quoted even where YAML 1.1 would read them as strings, templates too
        plain_ok = (value and value == value.strip() and "\n" not in value and "{{" not in value
                    and not re.match(r"[\d.:+-]", value))
        if plain_ok and _loads(f"k: {value}") == {"k": value}:
            return value
        return json.dumps(value, ensure_ascii=False)
    if value is None or isinstance(value, (bool, int, float)):
        return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
    if value == [] or value == {}:
        return "[]" if isinstance(value, list) else "{}"
    # one-word items only: a list of sentences (a description) reads better one item a line
    if isinstance(value, list) and all(isinstance(v, (int, float, bool)) or (isinstance(v, str) and " " not in v)
                                       for v in value):
        items = [_inline(v) for v in value]
        text = "[" + ", ".join(i for i in items if i is not None) + "]"
        return text if _loads(f"k: {text}") == {"k": value} else None
    return None


def _string_block(value: str, indent: int) -> Optional[List[str]]:
    """A long or multi-line string as a folded (`>-`) or literal (`|-`) block, when YAML reads it back exactly."""
    pad = " " * indent
    if "\n" in value:
        candidate = ["|-", *(pad + line if line else "" for line in value.split("\n"))]
    else:
        folded = textwrap.wrap(value, WRAP - indent, break_long_words=False, break_on_hyphens=False)
        candidate = [">-", *(pad + line for line in folded)]
    body = [candidate[0]] + [f"  {line}" for line in candidate[1:]]
    return candidate if _reads_back(body, value) and all(len(line) <= LINE_MAX for line in candidate) else None


def entry(key: Any, value: Any, indent: int) -> List[str]:
    """`key: value` at `indent`, as lines of block YAML that read back as `value`."""
    pad = " " * indent
    head = f"{pad}{_inline(key)}:"
    one_line = _inline(value)
    if one_line is not None:
        width = len(head) + 1 + len(one_line)
        if isinstance(value, list):
            fits = width <= FLOW_MAX
        elif isinstance(value, str):
            fits = width <= LINE_MAX and "\n" not in value
        else:
            fits = True
        if fits:
            return [f"{head} {one_line}"]
    if isinstance(value, str):
        block = _string_block(value, indent + 2)
        if block is None:  # spaces at an end, or runs of them: only quotes keep those (yamllint will say if too long)
            return [f"{head} {json.dumps(value, ensure_ascii=False)}"]
        return [f"{head} {block[0]}", *block[1:]]
    if isinstance(value, Mapping):
        return [head, *(line for k, v in value.items() for line in entry(k, v, indent + 2))]
    return [head, *(line for item in value for line in _item(item, indent + 2))]


def _item(value: Any, indent: int) -> List[str]:
    """One list item `- value` at `indent`."""
    pad = " " * indent
    if isinstance(value, Mapping) and value:
        lines = [line for k, v in value.items() for line in entry(k, v, indent + 2)]
        return [f"{pad}- {lines[0].lstrip()}", *lines[1:]]
    lines = entry("k", value, indent)
    return [f"{pad}- {lines[0].split(':', 1)[1].lstrip()}".rstrip(), *lines[1:]]


def comment(description: Any) -> List[str]:
    """A description (one string or a list of paragraphs) as comment lines, each paragraph starting a line; a
    paragraph's own line breaks (an aligned table) are kept."""
    paragraphs = [description] if isinstance(description, str) else list(description or [])
    return [f"# {line}".rstrip() for text in paragraphs for source_line in str(text).split("\n")
            for line in textwrap.wrap(source_line, WRAP - 2, break_long_words=False, break_on_hyphens=False) or [""]]


def options(spec: Mapping[str, Any]) -> Dict[str, Any]:
    """The main entry point's options of one meta/argument_specs.yml document."""
    return dict(spec["argument_specs"]["main"].get("options") or {})


def render(role: str, spec: Mapping[str, Any]) -> Optional[str]:
    """defaults/main.yml for `role` from its argument spec; None when no option has a default."""
    main = spec["argument_specs"]["main"]
    for name, option in options(spec).items():
        # ansible renders the whole spec before it checks the play's values: a template naming a variable the play
        # has not set (yet: a registered result, another role's setting) would fail the role at its first task.
        untagged = _untagged_templates(option.get("default"))
        if untagged:
            raise ValueError(f"roles/{role}/meta/argument_specs.yml: {name}'s default {untagged[0]!r} is a template; "
                             "tag it `!unsafe` so ansible keeps it as text in the spec (defaults/main.yml renders it)")
    defaults = {name: _plain(option["default"]) for name, option in options(spec).items() if "default" in option}
    if not defaults:
        return None
    lines = ["---", HEADER, *comment(f"{role}: {main.get('short_description', '')}")]
    if main.get("description"):
        lines += ["#", *comment(main["description"])]
    for name, value in defaults.items():
        lines += ["", *comment(options(spec)[name].get("description")), *entry(name, value, 0)]
    text = "\n".join(lines) + "\n"
    if _loads(text) != defaults:
        raise ValueError(f"roles/{role}/defaults/main.yml would not read back as its spec's defaults")
    return text


def generated(roles: Path = ROLES) -> Dict[Path, str]:
    """Each generated defaults file by path, for the roles whose spec has defaults."""
    files = {}
    for spec_path in sorted(roles.glob("*/meta/argument_specs.yml")):
        role = spec_path.parent.parent
        text = render(role.name, load_spec(spec_path))
        if text is not None:
            files[role / "defaults" / "main.yml"] = text
    return files


def stale(roles: Path = ROLES) -> List[Path]:
    """Defaults files that are not what their spec generates."""
    return [path for path, text in generated(roles).items() if not path.is_file() or path.read_text() != text]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fmcluster.role_defaults", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; fail naming each stale file")
    args = parser.parse_args(argv)
    if args.check:
        behind = stale()
        for path in behind:
            print(f"{path}: not what meta/argument_specs.yml generates; run: python -m fmcluster.role_defaults")
        return ExitCode.FAILED if behind else ExitCode.OK
    for path, text in generated().items():
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
            print(path)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
