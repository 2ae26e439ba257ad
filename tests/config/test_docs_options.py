"""The options the docs name exist in the schemas, and the generated option reference matches them
(docs/configuration.md, "Option reference")."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from pgcli.config import ALGOS, EnvConfig, EvalConfig, ModelConfig, TrainConfig
from pgcli.config import docs as schema_docs

REPO = Path(__file__).resolve().parents[2]
CONFIGURATION = (REPO / "docs" / "configuration.md").read_text()
README = (REPO / "README.md").read_text()
IDENTIFIER = re.compile(r"`([a-z_][a-z0-9_.]*)`")
NOT_OPTIONS = {"policy_kwargs"}
"""Code names the group paragraphs mention that are not options (SB3's ``policy_kwargs``)."""


def names(schema: type) -> set[str]:
    return {f.name for f in dataclasses.fields(schema)}


def section(text: str, heading: str) -> str:
    """The body of a Markdown section, up to the next heading of any level."""
    start = text.index(heading) + len(heading)
    end = text.find("\n#", start)
    return text[start : end if end >= 0 else None]


def test_generated_option_reference_is_up_to_date():
    assert schema_docs.render(CONFIGURATION) == CONFIGURATION, "run: python -m pgcli.config.docs"


def test_generated_reference_lists_every_field_of_every_schema():
    block = CONFIGURATION[CONFIGURATION.index(schema_docs.BEGIN) : CONFIGURATION.index(schema_docs.END)]
    for title, schema in schema_docs.SECTIONS:
        body = section(block, f"#### `{title}`")
        listed = set(re.findall(r"^\| `(\w+)` \|", body, re.MULTILINE))
        assert listed == {f.name for f in schema_docs.documented_fields(schema)}, title


ALGO_ROWS = re.findall(r"^\| `(\w+)` \| [^|]+ \| (.+) \|$", section(CONFIGURATION, "### `algo`"), re.MULTILINE)


def test_the_algo_table_has_a_row_per_algo():
    assert [name for name, _ in ALGO_ROWS] == list(ALGOS)


@pytest.mark.parametrize(("algo", "settings"), ALGO_ROWS, ids=[name for name, _ in ALGO_ROWS])
def test_every_setting_the_algo_table_names_is_a_field_of_that_algo(algo: str, settings: str):
    named = set(IDENTIFIER.findall(settings))
    assert named, f"no settings named for {algo}"
    unknown = named - names(ALGOS[algo].schema)
    assert not unknown, f"docs/configuration.md names {sorted(unknown)} for algo={algo}, which has no such field"


@pytest.mark.parametrize(("heading", "schema"), [("### `env`", EnvConfig), ("### `model`", ModelConfig)])
def test_group_paragraphs_name_exactly_the_schema_fields(heading: str, schema: type):
    named = {n for n in IDENTIFIER.findall(section(CONFIGURATION, heading)) if "." not in n} - NOT_OPTIONS
    assert named == names(schema)


def test_readme_group_table_lists_exactly_the_conf_options():
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \| .+ \|$", section(README, "## Config groups"), re.MULTILINE)
    assert rows
    for group, options in rows:
        files = {p.stem for p in (REPO / "conf" / group).glob("*.yaml")}
        if group == "preset":  # "applied automatically as `<algo>_<env>`": not listed one by one
            assert files
            continue
        assert set(IDENTIFIER.findall(options)) == files, group


def test_readme_top_level_keys_exist():
    paragraph = README[README.index("Top-level keys:") :].split("\n\n", 1)[0]
    keys = IDENTIFIER.findall(paragraph)
    assert "seed" in keys and "eval.every" in keys
    for key in keys:
        group, _, leaf = key.rpartition(".")
        assert leaf in names({"": TrainConfig, "eval": EvalConfig}[group]), key
