"""Pages generated from the code at build time, so that they cannot drift from it.

Two pages come from here:

- ``reference/cli.md``, from the typer app ``hetopt.cli.app``;
- ``reference/instance-schema.md``, from ``hetopt.spec.schema.json_schema()``.

mkdocs runs this file as a hook (``hooks:`` in ``mkdocs.yml``). The functions
``cli_reference`` and ``schema_reference`` return Markdown; ``tests/test_docs.py``
calls them without building the site.
"""

from __future__ import annotations

import json
import re
from typing import Any

CLI_PAGE = "reference/cli.md"
SCHEMA_PAGE = "reference/instance-schema.md"


# ---------------------------------------------------------------------------
# CLI reference
# ---------------------------------------------------------------------------


DESIGN_NOTE = re.compile(r"\s*\(DESIGN \d+(\.\d+)*\)")
"""Internal design-note references in help texts, which point outside the repository."""


def _clean(text: str | None) -> str:
    """Collapse a docstring or help text to one paragraph, without design-note references."""
    return DESIGN_NOTE.sub("", " ".join((text or "").split()))


def _context(command: Any, name: str, parent: Any = None) -> Any:
    """A click context for `command` (typer may vendor its own click: use the command's class)."""
    return command.context_class(command, info_name=name, parent=parent)


def _declaration(param: Any, ctx: Any) -> str:
    """How the parameter is written on the command line, e.g. ``--time-limit <float>``."""
    record = None
    getter = getattr(param, "get_help_record", None)
    if getter is not None:
        try:
            record = getter(ctx)
        except (TypeError, AttributeError):
            record = None
    if record:
        return record[0]
    if getattr(param, "param_type_name", "") == "argument":
        return (param.metavar or param.name or "").upper()
    return ", ".join([*param.opts, *param.secondary_opts])


def _default(param: Any) -> str | None:
    """The default as text, or None where there is none worth showing."""
    if getattr(param, "is_flag", False) or getattr(param, "required", False):
        return None
    value = getattr(param, "default", None)
    if value is None or callable(value) or value == () or value == []:
        return None
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def _range(param: Any) -> str | None:
    """The accepted range of a numeric option, e.g. ``1 ≤ x ≤ 100000``."""
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    if low is None and high is None:
        return None
    if low is not None and high is not None:
        return f"{low} ≤ x ≤ {high}"
    return f"x ≥ {low}" if low is not None else f"x ≤ {high}"


def _param_line(param: Any, ctx: Any) -> str:
    """One bullet: the declaration, then the facts, then the help text."""
    facts = []
    if getattr(param, "required", False):
        facts.append("required")
    if getattr(param, "multiple", False) or getattr(param, "nargs", 1) == -1:
        facts.append("repeatable")
    default = _default(param)
    if default is not None:
        facts.append(f"default `{default}`")
    bounds = _range(param)
    if bounds is not None:
        facts.append(bounds)
    head = f"- `{_declaration(param, ctx)}`"
    if facts:
        head += " (" + "; ".join(facts) + ")"
    help_text = _clean(getattr(param, "help", None))
    return f"{head}. {help_text}" if help_text else head + "."


def _command_section(name: str, command: Any, parent_ctx: Any) -> list[str]:
    ctx = _context(command, name, parent_ctx)
    usage = " ".join(["hetopt", name, *command.collect_usage_pieces(ctx)])
    arguments = [p for p in command.params if getattr(p, "param_type_name", "") == "argument"]
    options = [p for p in command.params if getattr(p, "param_type_name", "") == "option"]
    options.append(_HelpOption())
    lines = [f"## `hetopt {name}`", "", _clean(command.help), "", "```text", usage, "```", ""]
    if arguments:
        lines += ["**Arguments**", ""]
        lines += [_param_line(p, ctx) for p in arguments]
        lines.append("")
    lines += ["**Options**", ""]
    lines += [_param_line(p, ctx) for p in options]
    lines.append("")
    return lines


class _HelpOption:
    """The ``--help`` every command has (click adds it outside ``params``)."""

    param_type_name = "option"
    opts = ("--help",)
    secondary_opts = ()
    is_flag = True
    required = False
    multiple = False
    nargs = 1
    help = "Show the command's help and exit."

    def get_help_record(self, ctx: Any) -> tuple[str, str]:
        return ("--help", self.help)


def cli_commands() -> dict[str, Any]:
    """The app's commands by name, in the order `hetopt --help` lists them."""
    import typer

    from hetopt.cli import app

    group = typer.main.get_command(app)
    ctx = _context(group, "hetopt")
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}


def cli_reference() -> str:
    """The CLI reference page: every command, its arguments and options, with help and defaults."""
    import typer

    from hetopt.cli import app

    group = typer.main.get_command(app)
    root = _context(group, "hetopt")
    names = group.list_commands(root)
    lines = [
        "# CLI reference",
        "",
        "<!-- Generated from the typer app `hetopt.cli.app` by docs/hooks/generate.py. -->",
        "",
        "This page is generated from the command-line app when the site is built.",
        "It lists every command with its arguments and options.",
        "The [JSON output](../cli-output.md) page lists what `--json` prints.",
        "",
        _clean(group.help),
        "",
        "```text",
        "hetopt [GLOBAL OPTIONS] COMMAND [ARGS]...",
        "```",
        "",
        "**Global options** (before the command)",
        "",
    ]
    lines += [_param_line(p, root) for p in group.params]
    lines += ["", "| command | what it does |", "| --- | --- |"]
    for name in names:
        command = group.get_command(root, name)
        summary = re.split(r"\. |; ", _clean(command.help))[0].rstrip(".")
        lines.append(f"| [`{name}`](#hetopt-{name}) | {summary}. |")
    lines.append("")
    for name in names:
        lines += _command_section(name, group.get_command(root, name), root)
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Instance schema reference
# ---------------------------------------------------------------------------


def _anchor(path: str) -> str:
    """A stable heading id for a key path: ``cluster.nodes[]`` → ``cluster-nodes``."""
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def _def_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _section_paths(schema: dict) -> dict[str, str]:
    """Each definition's key path in an instance file, found breadth-first from the top."""
    defs = schema.get("$defs", {})
    paths: dict[str, str] = {}
    queue: list[tuple[str, dict]] = [("", schema)]
    while queue:
        prefix, node = queue.pop(0)
        for key, prop in node.get("properties", {}).items():
            path = f"{prefix}.{key}" if prefix else key
            for ref, suffix in _refs(prop):
                name = _def_name(ref)
                if name in paths:
                    continue
                kind = defs[name].get("properties", {}).get("kind", {}).get("const")
                where = path + suffix + (f" ({kind})" if kind else "")
                paths[name] = where
                queue.append((path + suffix, defs[name]))
    return paths


def _refs(prop: dict) -> list[tuple[str, str]]:
    """The definitions a property points to, each with the path suffix that reaches it."""
    found: list[tuple[str, str]] = []
    if "$ref" in prop:
        found.append((prop["$ref"], ""))
    for variant in prop.get("anyOf", []) + prop.get("oneOf", []):
        found += _refs(variant)
    if "items" in prop:
        found += [(ref, "[]" + suffix) for ref, suffix in _refs(prop["items"])]
    for value in prop.get("patternProperties", {}).values():
        found += [(ref, ".<name>" + suffix) for ref, suffix in _refs(value)]
    return found


def _bounds(prop: dict) -> str:
    parts = []
    if "exclusiveMinimum" in prop:
        parts.append(f"> {prop['exclusiveMinimum']}")
    if "minimum" in prop:
        parts.append(f"≥ {prop['minimum']}")
    if "exclusiveMaximum" in prop:
        parts.append(f"< {prop['exclusiveMaximum']}")
    if "maximum" in prop:
        parts.append(f"≤ {prop['maximum']}")
    return ", ".join(parts)


def _type(prop: dict, paths: dict[str, str]) -> str:
    """A short human reading of a property's JSON Schema type."""
    if "$ref" in prop:
        name = _def_name(prop["$ref"])
        path = paths.get(name, name)
        return f"[`{path}`](#{_anchor(path)})"
    variants = prop.get("anyOf") or prop.get("oneOf")
    if variants:
        kept = [v for v in variants if v.get("type") != "null"]
        return " or ".join(_type(v, paths) for v in kept)
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return "one of " + ", ".join(f"`{v}`" for v in prop["enum"])
    kind = prop.get("type")
    if kind == "array":
        size = ""
        if prop.get("minItems") is not None and prop.get("minItems") == prop.get("maxItems"):
            size = f"{prop['minItems']} "
        elif prop.get("minItems"):
            size = f"{prop['minItems']} or more "
        return f"list of {size}" + _type(prop.get("items", {}), paths)
    if kind == "object" and "patternProperties" in prop:
        values = " or ".join(_type(v, paths) for v in prop["patternProperties"].values())
        return f"map from a name to {values}"
    names = {
        "string": "string",
        "number": "number",
        "integer": "integer",
        "boolean": "boolean",
        "object": "object",
    }
    text = names.get(kind, str(kind or "any"))
    if kind == "string" and "pattern" in prop:
        text = "name"
    bounds = _bounds(prop)
    return f"{text} {bounds}" if bounds else text


def _property_line(key: str, prop: dict, required: bool, paths: dict[str, str]) -> str:
    facts = [_type(prop, paths)]
    if required:
        facts.append("required")
    elif "default" in prop and prop["default"] is not None:
        facts.append(f"default `{json.dumps(prop['default'])}`")
    else:
        facts.append("optional")
    text = f"- **`{key}`** ({'; '.join(facts)})"
    description = _clean(prop.get("description"))
    return f"{text}. {description}" if description else text + "."


def _object_lines(node: dict, paths: dict[str, str]) -> list[str]:
    required = set(node.get("required", []))
    properties = node.get("properties", {})
    return [_property_line(k, v, k in required, paths) for k, v in properties.items()]


def schema_properties() -> list[str]:
    """The top-level keys of an instance file."""
    from hetopt.spec.schema import json_schema

    return list(json_schema().get("properties", {}))


def schema_reference() -> str:
    """The instance-format reference page, one section per key of the JSON Schema."""
    from hetopt.spec.schema import json_schema

    schema = json_schema()
    paths = _section_paths(schema)
    lines = [
        "# Instance schema",
        "",
        "<!-- Generated from hetopt.spec.schema.json_schema() by docs/hooks/generate.py. -->",
        "",
        "This page is generated from the instance schema when the site is built.",
        "`hetopt schema` prints the same schema as JSON.",
        "The [instance format](../instance-format.md) page explains it with examples.",
        "",
        f"*{_clean(schema.get('description'))}*",
        "",
        "Unknown keys are errors in every section.",
        "A *name* is 1 to 64 letters, digits, `_`, `.` or `-`.",
        'Integers are strict: `8.5` or `"8"` is not a count.',
        "",
        "## Top level {#top-level}",
        "",
        *_object_lines(schema, paths),
        "",
    ]
    defs = schema.get("$defs", {})
    for name, path in sorted(paths.items(), key=lambda item: _order(item[1], schema)):
        node = defs[name]
        lines += [f"## `{path}` {{#{_anchor(path)}}}", ""]
        description = _clean(node.get("description"))
        if description:
            lines += [description, ""]
        lines += _object_lines(node, paths)
        lines.append("")
    return "\n".join(lines)


def _order(path: str, schema: dict) -> tuple[int, str]:
    """Sections in the order of the top-level keys, then by path."""
    top = list(schema.get("properties", {}))
    head = re.split(r"[.\[ ]", path, maxsplit=1)[0]
    return (top.index(head) if head in top else len(top), path)


# ---------------------------------------------------------------------------
# mkdocs hook
# ---------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site (mkdocs ≥ 1.6)."""
    from mkdocs.structure.files import File

    for uri, make in ((CLI_PAGE, cli_reference), (SCHEMA_PAGE, schema_reference)):
        files.append(File.generated(config, uri, content=make()))
    return files
