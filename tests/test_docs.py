"""The documentation's generated pages cover the CLI and the instance schema.

The docs also stay inside the repository. The generators live in docs/hooks/generate.py, an mkdocs
hook; these tests call them directly, without building the site.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "docs" / "hooks" / "generate.py"


@pytest.fixture(scope="module")
def generate():
    spec = importlib.util.spec_from_file_location("hetopt_docs_generate", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cli_page(generate) -> str:
    return generate.cli_reference()


@pytest.fixture(scope="module")
def schema_page(generate) -> str:
    return generate.schema_reference()


def test_every_cli_command_has_a_section(generate, cli_page):
    commands = generate.cli_commands()
    assert "solve" in commands and "bench" in commands
    for name in commands:
        assert f"## `hetopt {name}`" in cli_page, name
        assert f"(#hetopt-{name})" in cli_page, name


def test_every_cli_option_is_listed(generate, cli_page):
    for name, command in generate.cli_commands().items():
        section = cli_page.split(f"## `hetopt {name}`", 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            if getattr(param, "param_type_name", "") == "option":
                for flag in param.opts:
                    assert f"`{flag}" in section, (name, flag)


def test_cli_defaults_are_shown(cli_page):
    solve = cli_page.split("## `hetopt solve`", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"`--time-limit[^`]*` \(default `60\.0`\)", solve)
    assert re.search(r"`--backend[^`]*` \(default `highs`\)", solve)


def test_every_top_level_schema_property_is_documented(generate, schema_page):
    from hetopt.spec.schema import json_schema

    properties = generate.schema_properties()
    assert properties == list(json_schema()["properties"])
    for key in properties:
        assert f"- **`{key}`**" in schema_page, key


def test_every_schema_section_has_a_heading(schema_page):
    from hetopt.spec.schema import json_schema

    schema = json_schema()
    for name, node in schema["$defs"].items():
        for key in node.get("properties", {}):
            assert f"- **`{key}`**" in schema_page, (name, key)
    headings = ("model", "cluster.nodes[]", "scenarios[]", "search", "replan")
    for heading in headings:
        assert f"## `{heading}`" in schema_page, heading


def test_docs_do_not_point_outside_the_repository():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        assert "../shared" not in page.read_text(encoding="utf-8"), page
