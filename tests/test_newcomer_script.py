"""bench/newcomer.py's measuring parts (harness/newcomer.py): the README commands it runs, and the longest
stretch without output."""

from __future__ import annotations

import os

from harness import newcomer
from tests.helpers import REPO


def test_it_runs_the_readmes_commands_in_order():
    commands = newcomer.readme_commands(REPO / "README.md")
    assert commands[:2] == ["make help", "make demo"] and "make test" in commands
    assert all(c.startswith("make ") for c in commands)


def test_the_longest_silence_is_measured(tmp_path, capsys):
    code, wall, silent, where = newcomer.run_timed("echo a; sleep 1.5; echo b; sleep 0.2", tmp_path,
                                                   dict(os.environ))
    assert code == 0 and wall >= 1.7
    assert 1.4 <= silent < wall and where == "a"
    assert "    a" in capsys.readouterr().out


def test_cold_points_every_cache_at_an_empty_folder(tmp_path):
    env = newcomer.cold_caches(tmp_path / "caches")
    assert set(env) == {"UV_CACHE_DIR", "PIP_CACHE_DIR", "npm_config_cache", "HF_HOME"}
    for folder in env.values():
        assert folder.startswith(str(tmp_path)) and os.path.isdir(folder) and not os.listdir(folder)
