"""Reading instance files (YAML or JSON) into a validated :class:`~hetopt.spec.instance.Instance`.

Three layers of checks, each reporting key paths and, for YAML, line numbers:
1. syntax (malformed YAML/JSON, empty file, duplicate keys, a top level that is not a mapping);
2. the schema (types, ranges, unknown keys) — pydantic;
3. meaning (names that must refer to something, divisibility, probabilities) —
   :mod:`hetopt.spec.checks`.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hetopt.errors import InputError, Problem, did_you_mean, format_path
from hetopt.spec.schema import InstanceFile

Loc = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)


class _StrictLoader(yaml.SafeLoader):
    """A YAML loader that refuses duplicate keys (the second would silently win otherwise); merge
    keys (``<<: *base``) work as in any YAML loader, the mapping's own keys overriding the merged
    ones."""


MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG:  # `<<`: SafeLoader merges it below
            continue
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first at line {seen[key] + 1}); keep one of them",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_lines(node: yaml.Node | None, loc: Loc = ()) -> dict[Loc, int]:
    """Map every key path of a composed YAML document to its 1-based line."""
    lines: dict[Loc, int] = {}
    if node is None:
        return lines
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            sub = (*loc, key_node.value)
            lines.update(_yaml_lines(value_node, sub))
            lines[sub] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_yaml_lines(item, (*loc, i)))
    return lines


def read_document(path: Path, what: str = "instance") -> tuple[Any, dict[Loc, int]]:
    """Parse a YAML or JSON file (an instance or a plan); returns the data and a key-path → line
    map."""
    source = str(path)
    if not path.exists():
        hint = ", or the name of a bundled one (`hetopt instances`)" if what == "instance" else ""
        raise InputError(
            source,
            [
                Problem(
                    "",
                    f"file does not exist (looked for {path.resolve()}); give the path of a "
                    f"YAML or JSON {what} file{hint}",
                )
            ],
        )
    if path.is_dir():
        raise InputError(
            source, [Problem("", f"is a directory; give the path of a YAML or JSON {what} file")]
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(source, [Problem("", f"cannot be read as UTF-8 text ({exc})")]) from None
    if not text.strip():
        needs = (
            (
                "an instance needs at least the keys name, model, training and cluster (`hetopt "
                "schema` prints the format)"
            )
            if what == "instance"
            else "a plan needs the keys micro_batch and pipelines"
        )
        raise InputError(source, [Problem("", f"the file is empty; {needs}")])
    too_deep = InputError(
        source,
        [
            Problem(
                "",
                "nested too deeply, or a YAML anchor that holds itself (`&a {x: *a}`); write "
                "the structure out flat",
            )
        ],
    )
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text), {}
        except json.JSONDecodeError as exc:
            raise InputError(
                source, [Problem("", f"malformed JSON: {exc.msg}", line=exc.lineno)]
            ) from None
        except RecursionError:
            raise too_deep from None
    lines: dict[Loc, int] = {}
    try:
        lines = _yaml_lines(yaml.compose(text, Loader=yaml.SafeLoader))
        # a SafeLoader that also refuses duplicate keys
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark else None
        # Name the key path when the error sits on a key (duplicate keys), else just the line.
        on_line = [loc for loc, ln in lines.items() if ln == line and loc]
        path = format_path(max(on_line, key=len)) if on_line else ""
        what = exc.problem or str(exc)
        raise InputError(source, [Problem(path, f"malformed YAML: {what}", line=line)]) from None
    except yaml.YAMLError as exc:
        raise InputError(source, [Problem("", f"malformed YAML: {exc}")]) from None
    except RecursionError:
        raise too_deep from None
    return data, lines


def parse_instance_file(
    data: Any, source: str, lines: dict[Loc, int] | None = None
) -> InstanceFile:
    """Validate parsed data against the instance schema."""
    return validate_document(
        data,
        source,
        InstanceFile,
        "an instance is a mapping with keys name, model, training and cluster",
        lines,
    )


def validate_document(
    data: Any, source: str, schema: type[M], what: str, lines: dict[Loc, int] | None = None
) -> M:
    """Validate parsed data against a schema, turning pydantic errors into key-path problems."""
    lines = lines or {}
    if not isinstance(data, dict):
        given = "no data" if data is None else f"a {type(data).__name__}"
        raise InputError(
            source,
            [
                Problem(
                    "",
                    f"the top level must be a mapping: {what}; the file holds {given}",
                    value=data,
                    has_value=data is not None,
                )
            ],
        )
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        errors = _drop_missing_explained_by_typos(exc.errors())
        problems = [_problem_from_pydantic(err, lines, schema) for err in errors]
        raise InputError(source, _unique(problems)) from None


def _drop_missing_explained_by_typos(errors: list[dict]) -> list[dict]:
    """A misspelt key shows up twice (unknown 'nic_gpbs', missing 'nic_gbps'); report only the
    typo."""
    typos = {
        (tuple(e["loc"][:-1]), k)
        for e in errors
        if e["type"] == "extra_forbidden"
        for k in [str(e["loc"][-1])]
    }

    def explained(e: dict) -> bool:
        parent, key = tuple(e["loc"][:-1]), str(e["loc"][-1])
        return any(
            p == parent and difflib.get_close_matches(t, [key], n=1, cutoff=0.6) for p, t in typos
        )

    return [e for e in errors if not (e["type"] == "missing" and explained(e))]


def _problem_from_pydantic(err: dict, lines: dict[Loc, int], root: type[BaseModel]) -> Problem:
    loc = _strip_union_tags(tuple(err["loc"]))
    path = format_path(loc)
    line = line_for(loc, lines)
    kind = err["type"]
    ctx = err.get("ctx", {})
    field = _field_at(loc, root)
    hint = f" — {field.description}" if field is not None and field.description else ""
    if kind == "union_tag_invalid":
        return Problem(
            format_path((*loc, "kind")),
            f"unknown kind; expected one of {ctx.get('expected_tags')}",
            value=ctx.get("tag"),
            has_value=True,
            line=line_for((*loc, "kind"), lines),
        )
    if kind == "missing":
        return Problem(path, f"required key is missing; add it{hint}", line=line)
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1], root)
        key = str(loc[-1])
        return Problem(
            path,
            f"unknown key {key!r}{did_you_mean(key, allowed)}; allowed keys here: "
            f"{', '.join(allowed)}",
            line=line,
        )
    messages = {
        "greater_than": f"must be greater than {ctx.get('gt', 0):g}",
        "greater_than_equal": f"must be at least {ctx.get('ge', 0):g}",
        "less_than_equal": f"must be at most {ctx.get('le', 0):g}",
        "int_type": "must be a whole number",
        "float_type": "must be a number",
        "bool_type": "must be true or false",
        "string_type": "must be a text string",
        "list_type": "must be a list",
        "dict_type": "must be a mapping of keys to values",
        "model_type": "must be a mapping of keys to values",
        "too_short": f"needs at least {ctx.get('min_length')} item(s)",
        "too_long": f"takes at most {ctx.get('max_length')} item(s)",
        "string_pattern_mismatch": "may use only letters, digits, '_', '.' and '-'",
        "string_too_short": "must not be empty",
        "union_tag_not_found": "needs a 'kind' key: one of step, markov, diurnal, trace",
        "value_error": str(
            ctx.get("error", err["msg"])
        ),  # a validator's own sentence, without "Value error, "
    }
    message = messages.get(kind, err["msg"][0].lower() + err["msg"][1:])
    return Problem(path, message + hint, value=err.get("input"), has_value=True, line=line)


def _strip_union_tags(loc: Loc) -> Loc:
    """Pydantic puts the tag of a discriminated union into the path (generator.markov.seed); drop
    it."""
    out: list[str | int] = []
    skip_next = False
    for i, part in enumerate(loc):
        if skip_next:
            skip_next = False
            continue
        out.append(part)
        if (
            part == "generator"
            and i + 1 < len(loc)
            and loc[i + 1] in ("step", "markov", "diurnal", "trace")
        ):
            skip_next = True
    return tuple(out)


def line_for(loc: Loc, lines: dict[Loc, int]) -> int | None:
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return None


def _model_class_at(loc: Loc, root: type[BaseModel]) -> type[BaseModel] | None:
    """The pydantic section class that holds the keys at `loc` (None when `loc` is not a
    section)."""
    cls: Any = root
    for part in loc:
        cls = _unwrap(cls)
        if typing.get_origin(cls) in (list, dict):
            cls = typing.get_args(cls)[-1]  # list item or dict value, whatever the index or key
        elif isinstance(cls, type) and issubclass(cls, BaseModel) and part in cls.model_fields:
            cls = cls.model_fields[part].annotation
        else:
            return None
    cls = _unwrap(cls)
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _unwrap(cls: Any) -> Any:
    """Strip Optional[...] / Annotated[...] down to the concrete type."""
    while True:
        origin = typing.get_origin(cls)
        if origin is typing.Annotated:
            cls = typing.get_args(cls)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(cls) if a is not type(None)]
            if len(args) != 1:
                return cls
            cls = args[0]
        else:
            return cls


def _allowed_keys(loc: Loc, root: type[BaseModel]) -> list[str]:
    cls = _model_class_at(loc, root)
    return list(cls.model_fields) if cls is not None else []


def _field_at(loc: Loc, root: type[BaseModel]):
    if not loc or isinstance(loc[-1], int):
        return None
    cls = _model_class_at(loc[:-1], root)
    if cls is None:
        return None
    return cls.model_fields.get(str(loc[-1]))


def _unique(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        if (p.path, p.message) not in seen:
            seen.add((p.path, p.message))
            out.append(p)
    return out
