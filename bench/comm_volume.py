"""Cross-node bytes of one training step, full vs hybrid sharding, counted on a real 4-rank gloo run.

4 CPU processes pretend to be 2 nodes x 2 ranks (`K8S_NODE_NAME` per rank; the start-up placement
check runs on it). Both shardings train the same tiny Qwen2 from the same weights on the same
global batches through `train_step`; `CollectiveCounter` records every collective the step really
issues (FSDP2's all-gathers and reduce-scatters, the hybrid all-reduce, the step's scalar
all-reduces), and classes each by whether its process group spans the two simulated nodes.
Bytes are what one rank sends under a ring algorithm: (g-1)/g of the full tensor for all-gather
and reduce-scatter, twice that for all-reduce. The analytic count (`topology.cross_node_bytes_per_step`,
which leaves out the scalar all-reduces) is printed next to it. A third, one-step run measures
what re-gathering the root unit in backward (`root_reshard_after_forward=True`, the old setting) costs.

    python bench/comm_volume.py [--steps 3] [--accum 2]

The last line is JSON. Target: ratio <= 0.25 at accumulation 2, loss_max_abs_diff within float tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WORLD, RANKS_PER_NODE = 4, 2
SHARDINGS = ("full", "hybrid")
# Review finding: the root unit resharded after forward (as before) re-gathers the embedding/LM head
# at the start of backward; measured once, under full sharding.
ROOT_RESHARDED = "full_root_resharded"


def run(root: Path, *, steps: int, accum: int, seq: int = 64) -> dict:
    """Both shardings in one 4-rank run; {sharding: report} (see `harness.mesh_steps`)."""
    from harness.mesh_steps import launch, read
    from workloads.fsdp_finetune.local_assets import prepare_local_assets

    assets = prepare_local_assets(root / "assets")
    spec = {"model_dir": str(assets.model_dir), "ranks_per_node": RANKS_PER_NODE, "global_rows": WORLD * accum,
            "seq": seq, "accum": accum, "seed": 3, "lr": 1e-3, "out_dir": str(root / "out"),
            "phases": [{"name": s, "sharding": s, "steps": steps} for s in SHARDINGS]
            + [{"name": ROOT_RESHARDED, "sharding": "full", "steps": 1, "root_reshard": True}]}
    launch(spec, world=WORLD)
    return {s: read(root / "out", s) for s in (*SHARDINGS, ROOT_RESHARDED)}


def analytic(report: dict, *, accum: int) -> int:
    from workloads.fsdp_finetune.topology import cross_node_bytes_per_step, plan_from

    plan = plan_from(report["plan"]["sharding"], world_size=WORLD, ranks_per_node=RANKS_PER_NODE)
    return cross_node_bytes_per_step(plan, params=report["params_padded"], grad_accumulation=accum, param_bytes=4,
                                     reduce_bytes=4, root_params=report["root_params_padded"])


def summarize(reports: dict, *, accum: int) -> dict:
    """The JSON result: bytes per step (all steps issue the same), ratio, loss and parameter differences."""
    per_step = {s: r["per_step"][-1] for s, r in reports.items()}
    full, hybrid = (per_step[s]["cross_node_bytes"] for s in SHARDINGS)
    losses = [reports[s]["losses"] for s in SHARDINGS]
    states = [reports[s]["state"] for s in SHARDINGS]
    return {
        "cross_node_bytes_per_step": {"full": full, "hybrid": hybrid},
        "ratio": round(hybrid / full, 4),
        "loss_max_abs_diff": max(abs(a - b) for a, b in zip(*losses, strict=True)),
        "param_max_abs_diff": max(float((states[0][k] - states[1][k]).abs().max()) for k in states[0]),
        "intra_node_bytes_per_step": {s: per_step[s]["intra_node_bytes"] for s in SHARDINGS},
        "analytic_cross_node_bytes_per_step": {s: analytic(reports[s], accum=accum) for s in SHARDINGS},
        "root_reshard_extra_cross_node_bytes_per_step": (reports[ROOT_RESHARDED]["per_step"][-1]["cross_node_bytes"]
                                                         - full),
        "grad_accumulation": accum,
        "world": WORLD,
        "ranks_per_node": RANKS_PER_NODE,
        "dtype": "float32",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--accum", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        reports = run(Path(tmp), steps=args.steps, accum=args.accum)
    result = summarize(reports, accum=args.accum)
    print(f"tiny Qwen2, {WORLD} gloo ranks as 2 nodes x {RANKS_PER_NODE}, accumulation {args.accum}, "
          f"{args.steps} steps; bytes one rank sends (ring), per step")
    print(f"{'sharding':8} {'collective':15} {'group':14} {'spans nodes':11} {'calls':>5} {'bytes':>12}")
    for sharding in SHARDINGS:
        for row in reports[sharding]["table"]:
            print(f"{sharding:8} {row['kind']:15} {str(row['ranks']):14} {str(row['cross_node']):11} "
                  f"{row['calls'] // args.steps:5d} {row['ring_bytes'] // args.steps:12d}")
    for sharding in SHARDINGS:
        print(f"{sharding:8} cross-node {result['cross_node_bytes_per_step'][sharding]:>10d} B/step "
              f"(analytic, without scalars: {result['analytic_cross_node_bytes_per_step'][sharding]:d}), "
              f"intra-node {result['intra_node_bytes_per_step'][sharding]:d} B/step")
    print(f"root unit resharded after forward (before the review fix): +"
          f"{result['root_reshard_extra_cross_node_bytes_per_step']} cross-node B/step under full sharding")
    print(f"ratio hybrid/full {result['ratio']:.4f} (target <= 0.25); loss max |diff| "
          f"{result['loss_max_abs_diff']:.3g}, parameter max |diff| {result['param_max_abs_diff']:.3g}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
