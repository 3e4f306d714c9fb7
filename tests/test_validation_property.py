"""Property: `config check`'s verdict holds up on files pushed to the edges of the model (harness/fuzz_files.py).

Fixed seeds only (hypothesis `derandomize`), so the suite is deterministic: every refused file exits 2 naming
the file and the field, with no traceback; the first accepted files build as a deploy would (CDK synth with
cfn-lint, cdk8s synth with the CRD validation). bench/validation_fuzz.py draws new random files every run.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from harness.fuzz_files import deploys, refusal_problems, variable_files, verdict, write

# Each drawn file goes through the config CLI; the accepted ones through CDK and cdk8s synth.
pytestmark = pytest.mark.slow

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

FIXED = settings(derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
# Synthesis costs 10-30 s a file: the suite builds this many accepted files; the bench script builds more.
SYNTHESIZED = 2


@settings(FIXED, max_examples=80)
@given(variable_files())
def test_refused_files_exit_2_naming_file_and_field(tmp_path_factory, example):
    data, mutated = example
    path = write(data, tmp_path_factory.mktemp("fuzz"))
    result = verdict(path)
    assert result.traceback is None, (mutated, result.traceback)
    if result.code != 0:
        assert refusal_problems(path, result) == [], (mutated, result.err)


def test_accepted_files_deploy(tmp_path_factory):
    built: list[list[str]] = []

    @settings(FIXED, max_examples=40)
    @given(variable_files())
    def collect(example):
        if len(built) >= SYNTHESIZED:
            return
        data, mutated = example
        work = tmp_path_factory.mktemp("deploy")
        path = write(data, work)
        if verdict(path).code == 0:
            problems = deploys(path, work)
            assert problems == [], (mutated, problems)
            built.append(mutated)

    collect()
    assert len(built) == SYNTHESIZED, "the fixed seed found too few accepted files to build"
