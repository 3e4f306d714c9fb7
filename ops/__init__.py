"""Commands that operate on what `charts/` and `stacks/` build, and the analyses behind them.

- `python -m ops.launcher render|up`: the EC2 target's `ray up` YAML and code bundle, and `ray up` under a deadline
  (`launcher_up.py`).
- `python -m ops.stop`: stop the fine-tune's RayJob and free its GPU nodes.
- `python -m ops.check --against OLD`: the config check, then what a deploy would replace (`replacements.py`,
  `lifecycle.py`; in-process CDK apps get cdk.json's context from `context.py`).
- `python -m ops.scan DIST OUT`: the Ray pods as plain Pods, for `make checkov`.

Floor: above `charts` and `stacks`. May import `config`, `tools`, `workloads`, `charts`, `stacks`; only `bench`,
`tests` (and `harness`) import it. docs/architecture.md has the picture.
"""
