"""The deploy, change and teardown times in the docs: one table of them (docs/deploying.md, "Steps"), and every other
mention either repeats a figure of that table or is marked unmeasured. Nothing has run on AWS, so a time is an
AWS-documented figure (quoted, with the page that states it) or an unmeasured estimate; none is "measured" there."""

from __future__ import annotations

import re

from tests.helpers import REPO

DEPLOYING = (REPO / "docs" / "deploying.md").read_text()
LIFECYCLE = (REPO / "docs" / "lifecycle.md").read_text()
README = (REPO / "README.md").read_text()
CREATE_CLUSTER = "https://docs.aws.amazon.com/eks/latest/APIReference/API_CreateCluster.html"
RANGE = re.compile(r"(\d+) to (\d+) min")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = re.search(r"^#{1,3} ", text[start + len(heading):], re.MULTILINE)
    return text[start:start + len(heading) + following.start()] if following else text[start:]


def _rows(table_text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in table_text.splitlines() if line.startswith("|") and not line.startswith("| ---")]


def _steps_table() -> dict[str, str]:
    rows = _rows(_section(DEPLOYING, "## Steps"))
    assert rows[0] == ["step", "expected time"]
    return dict(rows[1:])


def test_every_aws_step_in_the_table_is_documented_or_unmeasured():
    table = _steps_table()
    for step in ("`npx cdk bootstrap`", "`npx cdk deploy --all`", "GPU nodes from zero and the image pull",
                 "`npx cdk destroy --all`"):
        assert "unmeasured" in table[step], (step, table[step])
    # The one AWS figure is quoted with its page; the page's current text gives "several minutes", no number.
    quote = '"in most cases, it takes several minutes to create a cluster"'
    assert f"{quote} ([EKS API Reference, `CreateCluster`]({CREATE_CLUSTER})" in table["`npx cdk deploy --all`"]


def test_the_readme_and_lifecycle_repeat_the_tables_ranges():
    table_ranges = {m.group(0) for cell in _steps_table().values() for m in RANGE.finditer(cell)}
    readme_steps = _section(README, "## Deploy, submit, watch, tear down")
    for where, text in (("README deploy steps", readme_steps), ("docs/lifecycle.md", LIFECYCLE),
                        ("docs/deploying.md Teardown", _section(DEPLOYING, "## Teardown"))):
        found = {m.group(0) for m in RANGE.finditer(text)}
        assert found, where
        assert found <= table_ranges, f"{where}: {sorted(found - table_ranges)} not in docs/deploying.md's table"
    # Every range outside the table is called an estimate or unmeasured in its own sentence or cell.
    for text in (readme_steps, LIFECYCLE):
        for m in RANGE.finditer(text):
            context = text[max(0, m.start() - 120):m.end()]
            assert "estimate" in context or "unmeasured" in context, context


def test_every_time_in_the_lifecycle_table_is_documented_or_unmeasured():
    table = _section(LIFECYCLE, "## Day two")
    rows = _rows(table[table.index("| step | what CloudFormation does"):table.index("In every change step")])
    assert rows[0][-1] == "time" and len(rows) == 10
    for row in rows[1:]:
        time_cell = row[-1]
        assert ("unmeasured" in time_cell or time_cell == "as the first deploy"), row
        for quote in re.findall(r'"([^"]+)"', time_cell):  # a quoted figure comes with the page that states it
            assert "](https://docs.aws.amazon.com/" in time_cell, (quote, row)


def test_no_doc_keeps_the_old_create_cluster_figure():
    # "Cluster creation typically takes between 10 and 15 minutes" is an older revision of the CreateCluster page;
    # the current page says "several minutes". Quoting the old figure as AWS's is what this test keeps out.
    for path in (REPO / "README.md", *(REPO / "docs").glob("*.md")):
        text = path.read_text()
        for m in re.finditer(r"between 10 and 15 minutes", text):
            assert "older revision" in text[max(0, m.start() - 200):m.end()], path.name
