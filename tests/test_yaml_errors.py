"""YAML syntax errors in the variable file name the line and the likely fix (config/yaml_source.py
`syntax_problem`): a tab, a key indented off its section, a missing colon."""

from __future__ import annotations

import pytest

from config import load_config
from config.loader import ConfigError
from tests.helpers import REPO

DEFAULT = (REPO / "config" / "cluster.yaml").read_text()


def error_of(tmp_path, text: str) -> str:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


def line_of(text: str, starts: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(starts))


def test_a_tab_is_named_with_its_line_and_the_fix(tmp_path):
    text = DEFAULT.replace("  endpoint_access:", "\tendpoint_access:", 1)
    message = error_of(tmp_path, text)
    assert f"line {line_of(text, chr(9) + 'endpoint_access')}, column 1: a tab in the indentation" in message
    assert "replace the tab with spaces" in message


def test_a_key_indented_off_its_section_is_named(tmp_path):
    text = DEFAULT.replace("  endpoint_access:", "   endpoint_access:", 1)
    message = error_of(tmp_path, text)
    assert f"line {line_of(text, '   endpoint_access')}, column 4: wrong indentation: `   endpoint_access: " in message
    assert "is indented 3 spaces" in message and "malformed" not in message


def test_the_mis_indented_line_is_blamed_not_the_line_where_yaml_stopped(tmp_path):
    text = DEFAULT.replace("    instance_type: m7i.2xlarge", "   instance_type: m7i.2xlarge", 1)
    message = error_of(tmp_path, text)
    assert f"line {line_of(text, '   instance_type: m7i')}, column 4: wrong indentation" in message


def test_a_missing_colon_is_named_on_its_own_line(tmp_path):
    text = DEFAULT.replace("  endpoint_access: ", "  endpoint_access ", 1)
    message = error_of(tmp_path, text)
    assert f"line {line_of(text, '  endpoint_access ')}, column 3: a missing colon" in message
    assert "Write `key: value`" in message
