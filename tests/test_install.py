"""tools/install.py, what `make setup` installs with: pip's settings reach uv, and a quiet step still prints."""

from __future__ import annotations

import sys
import time

from tools import install


def test_pips_sources_and_constraints_are_passed_to_uv():
    flags = install.uv_flags({"index-url": [], "extra-index-url": ["https://download.pytorch.org/whl/cpu"],
                              "find-links": ["/opt/wheels"], "constraint": ["/etc/c.txt"]})
    assert flags == ["--index", "https://download.pytorch.org/whl/cpu", "--find-links", "/opt/wheels",
                     "--constraint", "/etc/c.txt", "--index-strategy", "unsafe-best-match"]


def test_the_uv_pin_is_in_requirements():
    assert install.pinned(install.UV_PIN_FILE, "uv").startswith("uv==")


def test_a_quiet_step_prints_a_line_at_least_every_heartbeat(monkeypatch, capsys):
    monkeypatch.setattr(install, "HEARTBEAT_S", 0.5)
    code = install.run_labelled("quiet", [sys.executable, "-c", "import time; print('start', flush=True); "
                                          "time.sleep(2.2); print('end')"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("quiet: still working") >= 2
    assert "quiet: start" in out and "quiet: end" in out and "quiet: done in" in out


def test_a_failed_step_says_so(capsys):
    assert install.run_labelled("broken", [sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert "broken: failed (exit 3)" in capsys.readouterr().out


def test_a_step_that_prints_nothing_at_all_gets_the_heartbeat(monkeypatch, capsys):
    # As `pip config list` or venv's ensurepip: no output to react to, the thread's clock alone.
    monkeypatch.setattr(install, "HEARTBEAT_S", 0.4)
    with install.Heartbeat(lambda elapsed: f"reading: {elapsed:.1f} s"):
        time.sleep(1.3)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 2 and all(line.startswith("reading: ") for line in lines)


def test_no_heartbeat_while_the_step_speaks(monkeypatch, capsys):
    monkeypatch.setattr(install, "HEARTBEAT_S", 0.5)
    with install.Heartbeat(lambda elapsed: "quiet") as beat:
        for _ in range(12):
            time.sleep(0.1)
            beat.said()
    assert "quiet" not in capsys.readouterr().out
