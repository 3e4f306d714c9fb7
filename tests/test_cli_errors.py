"""Each command-line entry point's failure path goes through config.errors: the one error type, the one printer
(`run_cli`), the same exit codes (2: refused input, 1: failed while running) and the same printed line."""

from __future__ import annotations

import json

import pytest
import yaml

from charts.errors import ChartError
from config import ConfigError, load_or_exit
from config.errors import FAILED, REFUSED, UserError, run_cli
from config.model import Problem
from ops.launcher import LauncherError
from tests.helpers import REPO
from tests.vendored import ChartsUnavailable


def _exit(capsys, main, *args) -> tuple[int, str]:
    """Run `main(*args)` as its `__main__` block does: the exit code and what went to stderr."""
    with pytest.raises(SystemExit) as exited:
        run_cli(main, *args)
    return exited.value.code, capsys.readouterr().err


def test_the_project_errors_are_user_errors():
    for kind in (ConfigError, ChartError, ChartsUnavailable, LauncherError):
        assert issubclass(kind, UserError), kind


def test_config_error_keeps_its_lines_and_names_the_file_and_field():
    error = ConfigError("a.yaml", [Problem(path="job.max_steps", message="must be at least 1")])
    assert str(error) == "a.yaml: job.max_steps: must be at least 1"
    assert (error.file, error.field, error.exit_code) == ("a.yaml", "job.max_steps", REFUSED)
    two = ConfigError("a.yaml", [Problem(path="x", message="bad"), Problem(path="y", message="worse")])
    assert str(two).splitlines() == ["a.yaml: x: bad", "a.yaml: y: worse"] and two.field is None


def test_load_or_exit_prints_through_report_and_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: [\n")
    with pytest.raises(SystemExit) as exited:
        load_or_exit(bad)
    assert exited.value.code == REFUSED
    assert capsys.readouterr().err.startswith(f"{bad}: line ")


def test_scan_without_manifests_names_the_folder_and_the_fix(tmp_path, capsys):
    from ops.scan import main

    code, err = _exit(capsys, main, [str(tmp_path / "dist"), str(tmp_path / "out")])
    assert code == REFUSED
    assert err == f"{tmp_path / 'dist'}: no manifests; run `make synth-k8s` first\n"
    assert not (tmp_path / "out").exists()


def test_charts_cli_names_the_file_when_manifests_cannot_be_made(monkeypatch, capsys):
    import charts.__main__ as cli

    def broken(config, config_file, outdir):
        raise ChartError("RayJob ray-efa: spec.entrypoint is empty")

    monkeypatch.setattr(cli, "synthesize", broken)
    monkeypatch.setattr(cli, "_quiet_node_banner", lambda: None)
    file = REPO / "config" / "cluster.yaml"
    code, err = _exit(capsys, cli.main, [str(file)])
    assert code == FAILED
    assert err == f"{file}: cannot synthesize the Kubernetes manifests: RayJob ray-efa: spec.entrypoint is empty\n"


def test_charts_cli_refuses_a_bad_variable_file(tmp_path, capsys):
    from charts.__main__ import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"cluster": {"name": 5}}))
    code, err = _exit(capsys, main, [str(bad), "--outdir", str(tmp_path / "dist")])
    assert code == REFUSED
    assert err.startswith(f"{bad}: ") and "Traceback" not in err
    assert not (tmp_path / "dist").exists()


def test_launcher_render_refuses_unreadable_outputs(tmp_path, capsys):
    from ops.launcher import main

    outputs = tmp_path / "outputs.json"
    outputs.write_text("{not json")
    code, err = _exit(capsys, main, ["render", str(REPO / "config" / "cluster.yaml"), "--outputs", str(outputs),
                                     "--out-dir", str(tmp_path / "out")])
    assert code == REFUSED
    assert err.startswith(f"{outputs}: cannot read outputs (")


def test_vendored_check_names_the_missing_chart(monkeypatch, capsys):
    import tests.vendored as vendored

    def missing(name, **_):
        raise ChartsUnavailable(f"{name} not found; check out ../shared")

    monkeypatch.setattr(vendored, "chart_dir", missing)
    code, err = _exit(capsys, vendored.main, [])
    assert code == REFUSED
    assert err == f"{next(iter(vendored.CHARTS))} not found; check out ../shared\n"


@pytest.mark.parametrize(("raised", "code"), [(LookupError("no RayJob ray/ray-efa"), REFUSED),
                                              (TimeoutError("2 pods of ray-efa still there after 300 s"), FAILED)])
def test_stop_says_what_it_could_not_do(monkeypatch, capsys, raised, code):
    pytest.importorskip("kubernetes")
    import kubernetes.config

    import ops.stop as stop_cli

    def stop(*_, **__):
        raise raised

    monkeypatch.setattr(kubernetes.config, "new_client_from_config", lambda **_: None)
    monkeypatch.setattr(stop_cli, "stop", stop)
    got, err = _exit(capsys, stop_cli.main, [str(REPO / "config" / "cluster.yaml")])
    # charts.ray starts jsii, whose Node.js banner may come first.
    assert (got, err.splitlines()[-1]) == (code, f"stop: {raised}")


def test_config_suits_lists_the_rules_broken_and_exits_1(capsys):
    from config.__main__ import main

    file = REPO / "config" / "examples" / "p5.yaml"
    code, err = _exit(capsys, main, ["suits", "ec2", str(file)])
    if code == 0:
        pytest.skip(f"{file} suits the EC2 target")
    assert code == FAILED and err.strip() and "Traceback" not in err


def test_outputs_file_error_is_json_free_of_traceback(tmp_path, capsys):
    from ops.launcher import main

    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"Stacks": []}))
    code, err = _exit(capsys, main, ["render", str(REPO / "config" / "cluster.yaml"), "--outputs", str(outputs),
                                     "--out-dir", str(tmp_path / "out")])
    assert code == REFUSED and "Traceback" not in err and err.strip()
