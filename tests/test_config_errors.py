"""Errors that point to the fix: line and column, the nearest valid name, the quoting hint, and what YAML
itself would lose silently (a duplicate key, a non-finite number)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from config import ConfigError, load_config
from tests.helpers import DEFAULT_FILE, REPO


def _errors(tmp_path, text: str) -> list[str]:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value).splitlines()


def _default_with(old: str, new: str) -> str:
    text = DEFAULT_FILE.read_text()
    assert old in text
    return text.replace(old, new, 1)


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_version_read_as_a_number_gets_the_quoting_hint(tmp_path):
    text = re.sub(r"kubernetes_version: \S+", "kubernetes_version: 1.30", DEFAULT_FILE.read_text())
    (line,) = _errors(tmp_path, text)
    assert 'cluster.kubernetes_version: YAML reads 1.30 as the number 1.3; put it in quotes: "1.30"' in line
    assert line.endswith(f"(line {_line_of(text, 'kubernetes_version:')}, column 3)")


def test_mistyped_instance_type_suggests_the_nearest(tmp_path):
    (line,) = _errors(tmp_path, _default_with("instance_type: g6.12xlarge", "instance_type: g6.12xlarg"))
    assert "unknown instance type 'g6.12xlarg' (did you mean 'g6.12xlarge'?)" in line
    assert "p5.48xlarge" in line  # the list of GPU types the catalog has


def test_mistyped_key_suggests_the_field(tmp_path):
    text = _default_with("  gpus_per_pod:", "  gpus_per_pdo:")
    lines = _errors(tmp_path, text)
    typo = next(line for line in lines if "gpus_per_pdo" in line)
    assert "cluster.worker_groups.0.gpus_per_pdo: unknown key (did you mean 'gpus_per_pod'?" in typo
    assert typo.endswith(f"(line {_line_of(text, 'gpus_per_pdo')}, column 7)")


def test_key_far_from_any_field_gets_no_guess(tmp_path):
    (line,) = _errors(tmp_path, DEFAULT_FILE.read_text() + "zzzz: 1\n")
    assert "zzzz: unknown key (typo?)" in line and "did you mean" not in line


def test_enum_value_suggests_the_nearest(tmp_path):
    (line,) = _errors(tmp_path, re.sub(r"transport: \w+", "transport: efaa", DEFAULT_FILE.read_text()))
    assert "nccl.transport: Input should be 'efa' or 'socket' (got 'efaa') (did you mean 'efa'?)" in line


def test_cross_field_problem_has_its_line(tmp_path):
    text = _default_with("gpus_per_pod: 4", "gpus_per_pod: 3")
    (line,) = _errors(tmp_path, text)
    assert "cluster.worker_groups.0.gpus_per_pod: 3 does not divide" in line
    assert line.endswith(f"(line {_line_of(text, 'gpus_per_pod: 3')}, column 7)")


def test_duplicate_key_is_refused_with_both_lines(tmp_path):
    text = DEFAULT_FILE.read_text() + "region: us-west-2\n"
    (line,) = _errors(tmp_path, text)
    first = _line_of(text, "region:")
    assert f"line {len(text.splitlines())}, column 1: duplicate key 'region' (first at line {first})" in line


@pytest.mark.parametrize("value", [".inf", "-.Inf", ".nan", ".NaN"])
def test_non_finite_number_is_refused(tmp_path, value):
    text = re.sub(r"learning_rate: \S+", f"learning_rate: {value}", DEFAULT_FILE.read_text())
    (line,) = _errors(tmp_path, text)
    assert f"'{value}' is not a finite number" in line
    assert f"line {_line_of(text, 'learning_rate:')}" in line


def test_quoted_text_in_a_number_field_is_refused_by_the_model(tmp_path):
    # Only YAML's own float spellings are numbers; "inf" in quotes reaches the model as text and is refused there.
    lines = _errors(tmp_path, re.sub(r"learning_rate: \S+", 'learning_rate: "abc"', DEFAULT_FILE.read_text()))
    assert any("job.learning_rate" in line for line in lines)


def _check_cli(path) -> subprocess.CompletedProcess:
    """`python -m config check FILE` as a user runs it (about 2 s: the CLI's own imports)."""
    return subprocess.run([sys.executable, "-m", "config", "check", str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("section, key, typo, meant", [
    # A required section: pydantic reports it missing first, which sent the user to add what is already there.
    ("cluster", "  worker_groups:", "  worker_grups:", "worker_groups"),
    # A required field inside a list item.
    ("cluster.worker_groups.0", "      nodes: 2 ", "      node: 2 ", "nodes"),
    # A field with a default: only the unknown key.
    ("network", "  max_azs:", "  max_az:", "max_azs"),
])
def test_a_key_typos_first_line_names_the_file_the_key_and_the_field_meant(tmp_path, section, key, typo, meant):
    text = _default_with(key, typo)
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    result = _check_cli(path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    written = typo.strip().rstrip(":").split(":")[0]
    assert lines[0].startswith(f"{path}: {section}.{written}: unknown key (did you mean '{meant}'?")
    assert lines[0].endswith(f"(line {_line_of(text, typo.strip())}, column {len(typo) - len(typo.lstrip()) + 1})")
    # One message for the one mistake: no second line asking to add the field the file already has.
    assert lines == [lines[0]], lines


def test_a_key_typo_is_listed_before_the_problems_it_does_not_cause(tmp_path):
    text = _default_with("  worker_groups:", "  worker_grups:").replace("max_azs: 2 ", "max_azs: 99 ", 1)
    lines = _errors(tmp_path, text)
    assert len(lines) == 2
    assert ("cluster.worker_grups: unknown key (did you mean 'worker_groups'? that required field is missing)"
            in lines[0])
    assert "network.max_azs: Input should be less than or equal to" in lines[1]
