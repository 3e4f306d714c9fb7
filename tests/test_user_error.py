"""The one user-facing error type (config/errors.py): its text, its exit code, and the one printer."""

from __future__ import annotations

import io

import pytest

from config.errors import FAILED, REFUSED, UserError, report, run_cli


def test_the_text_names_the_file_the_field_and_the_fix():
    error = UserError("must be at least 1", file="config/cluster.yaml", field="job.max_steps", fix="set 1 or more")
    assert str(error) == "config/cluster.yaml: job.max_steps: must be at least 1; set 1 or more"
    assert error.exit_code == REFUSED


def test_parts_that_do_not_apply_are_left_out():
    assert str(UserError("no such run", fix="list runs with --list")) == "no such run; list runs with --list"


def test_several_problems_are_one_line_each():
    error = UserError.of(["a.yaml: x: bad", "a.yaml: y: worse"], exit_code=FAILED)
    assert str(error).splitlines() == ["a.yaml: x: bad", "a.yaml: y: worse"]
    assert error.exit_code == FAILED


def test_report_prints_the_text_and_returns_the_code():
    stream = io.StringIO()
    assert report(UserError("broken", field="--file", exit_code=FAILED), stream) == FAILED
    assert stream.getvalue() == "--file: broken\n"


def test_run_cli_exits_with_the_error_code_and_prints_it(capsys):
    def main(value):
        raise UserError(f"bad {value}", file="f.yaml")

    with pytest.raises(SystemExit) as exited:
        run_cli(main, "x")
    assert exited.value.code == REFUSED
    assert capsys.readouterr().err == "f.yaml: bad x\n"


def test_run_cli_passes_a_return_code_through_and_lets_other_errors_out():
    with pytest.raises(SystemExit) as exited:
        run_cli(lambda: 3)
    assert exited.value.code == 3
    with pytest.raises(ZeroDivisionError):
        run_cli(lambda: 1 / 0)
