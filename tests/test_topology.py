"""Topology-aware sharding: the mesh from the variable file, the placement check, and a real 4-rank run.

The multi-rank tests run the real `train_step` on gloo processes (`harness.mesh_steps`):
full vs hybrid sharding, resume of a full-sharding checkpoint under hybrid and under another
world size, and the collective byte accounting against known collectives and the analytic count.
"""

from __future__ import annotations

import pytest
import torch

from config import ConfigError, load_config
from tests.helpers import EXAMPLES, REPO, load_variant
from workloads.fsdp_finetune.checkpoint import rescale_data_state
from workloads.fsdp_finetune.topology import (
    MeshPlan,
    cross_node_bytes_per_step,
    mesh_plan,
    placement_problem,
    plan_from,
    ring_bytes,
)

# ---- the mesh from the variable file -------------------------------------------------------


@pytest.mark.parametrize(
    ("file", "sharding", "shape", "node_of_last", "shard_group_of_last"),
    [
        # 2 x g6.12xlarge: 4 ranks per node, two nodes -> shard in the node, replicate across.
        (REPO / "config" / "cluster.yaml", "hybrid", (2, 4), 1, [4, 5, 6, 7]),
        # one node: nothing crosses a network, so one full-sharding group.
        (EXAMPLES / "single-node.yaml", "full", (4,), 0, [0, 1, 2, 3]),
        # 2 x g6.4xlarge, one GPU each: a shard group of one would be plain replication.
        (EXAMPLES / "socket.yaml", "full", (2,), 1, [0, 1]),
        # 2 x p5.48xlarge: 8 ranks per node.
        (EXAMPLES / "p5.yaml", "hybrid", (2, 8), 1, list(range(8, 16))),
    ],
    ids=["default", "single-node", "socket", "p5"],
)
def test_mesh_from_the_example_files(file, sharding, shape, node_of_last, shard_group_of_last):
    config = load_config(file)
    plan = mesh_plan(config)
    last = config.world_size - 1
    assert (plan.sharding, plan.mesh_shape) == (sharding, shape)
    assert plan.node_index(last) == node_of_last
    assert plan.shard_group(last) == shard_group_of_last
    # Ranks that share a node: contiguous blocks of the node's GPUs.
    per_node = config.instance(config.cluster.worker_groups[0]).gpus
    for rank in range(config.world_size):
        assert plan.node_index(rank) == rank // per_node


def test_hybrid_replicate_groups_take_one_rank_per_node():
    plan = mesh_plan(load_config())
    assert plan.replicate_group(5) == [1, 5]
    assert plan.mesh_dim_names == ("replicate", "shard")


def test_explicit_full_on_two_nodes_spans_them(tmp_path):
    plan = mesh_plan(load_variant(tmp_path, {"job": {"sharding": "full"}}))
    assert plan.mesh_shape == (8,) and plan.shard_group(7) == list(range(8))
    assert plan.shard_group_spans_nodes()


def _two_groups(**job) -> dict:
    return {"job": {"global_batch_size": 64, **job}, "cluster": {"worker_groups": [
        {"name": "gpu", "instance_type": "g6.12xlarge", "nodes": 2, "gpus_per_pod": 4},
        {"name": "big", "instance_type": "g6.48xlarge", "nodes": 1, "gpus_per_pod": 8},
    ]}}


def test_heterogeneous_groups_shard_fully_under_auto(tmp_path):
    config = load_variant(tmp_path, _two_groups())
    assert config.ranks_per_node is None
    plan = mesh_plan(config)
    assert plan.sharding == "full" and plan.mesh_shape == (16,)


def test_heterogeneous_groups_refuse_hybrid_at_load(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_variant(tmp_path, _two_groups(sharding="hybrid"))
    (problem,) = err.value.problems
    assert problem.path == "job.sharding"
    assert "gpu: 4, big: 8" in problem.message and "sharding: full" in problem.message


def test_several_pods_per_node_shard_fully_under_auto(tmp_path):
    # p5.48xlarge with 4 GPUs per pod: two pods a node, which Ray numbers in no node order.
    config = load_variant(tmp_path, group={"instance_type": "p5.48xlarge", "gpus_per_pod": 4,
                                           "gpudirect_rdma": True})
    assert config.ranks_per_node == 8 and config.pods_per_node(config.cluster.worker_groups[0]) == 2
    assert mesh_plan(config).sharding == "full"


def test_several_pods_per_node_refuse_hybrid_at_load(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_variant(tmp_path, {"job": {"sharding": "hybrid"}},
                     group={"instance_type": "p5.48xlarge", "gpus_per_pod": 4, "gpudirect_rdma": True})
    (problem,) = err.value.problems
    assert problem.path == "job.sharding"
    assert "2 pods on each p5.48xlarge" in problem.message and "gpus_per_pod: 8" in problem.message


def test_one_pod_per_node_keeps_hybrid(tmp_path):
    config = load_variant(tmp_path, {"job": {"sharding": "hybrid"}},
                          group={"instance_type": "p5.48xlarge", "gpus_per_pod": 8, "gpudirect_rdma": True})
    assert mesh_plan(config).sharding == "hybrid"


# ---- the placement check ---------------------------------------------------------------------


def test_placement_accepts_the_planned_layout_also_with_two_pods_per_node():
    plan = plan_from("hybrid", world_size=8, ranks_per_node=4)
    # Two pods of 2 GPUs per node share the node's K8S_NODE_NAME.
    assert placement_problem(plan, ["ip-a"] * 4 + ["ip-b"] * 4) is None


def test_placement_refuses_a_shard_group_spread_over_nodes():
    plan = plan_from("hybrid", world_size=8, ranks_per_node=4)
    # Ray numbered pod A (node a), pod B (node b), pod C (node a), pod D (node b), 2 ranks each.
    names = ["ip-a", "ip-a", "ip-b", "ip-b", "ip-a", "ip-a", "ip-b", "ip-b"]
    problem = placement_problem(plan, names)
    assert problem is not None
    assert "expects 2 nodes of 4 ranks" in problem  # what was expected
    assert "[0, 1, 2, 3] should share one node but is spread over ['ip-a', 'ip-b']" in problem  # what was found
    assert "rank 2 on ip-b" in problem and "job.sharding: full" in problem


def test_placement_refuses_two_shard_groups_on_one_node():
    plan = plan_from("hybrid", world_size=4, ranks_per_node=2)
    assert "both on ip-a" in placement_problem(plan, ["ip-a"] * 4)


def test_full_sharding_places_anywhere():
    plan = plan_from("full", world_size=4, ranks_per_node=2)
    assert placement_problem(plan, ["x", "y", "x", "y"]) is None
    assert "expected 4 ranks, found 3" in placement_problem(plan, ["x", "y", "x"])


# ---- accounting -----------------------------------------------------------------------------


def test_ring_bytes_of_each_collective():
    assert ring_bytes("all_gather", size_bytes=800, group_size=4) == 600
    assert ring_bytes("reduce_scatter", size_bytes=800, group_size=4) == 600
    assert ring_bytes("all_reduce", size_bytes=800, group_size=2) == 800
    assert ring_bytes("all_reduce", size_bytes=800, group_size=1) == 0


def test_analytic_cross_node_bytes_by_hand():
    full = MeshPlan(sharding="full", world_size=8, replicate=1, shard=8, ranks_per_node=4)
    hybrid = plan_from("hybrid", world_size=8, ranks_per_node=4)
    kw = dict(params=800, grad_accumulation=2, param_bytes=2, reduce_bytes=4, root_params=80)
    # Per micro-batch: gather 800 + 720 bf16 params, reduce-scatter 800 fp32 grads, 7/8 of each.
    assert cross_node_bytes_per_step(full, **kw) == 2 * ((1520 * 2) * 7 // 8 + 3200 * 7 // 8)
    # Once per step: all-reduce of a quarter of the fp32 grads over 2 nodes.
    assert cross_node_bytes_per_step(hybrid, **kw) == 2 * 200 * 4 // 2
    assert cross_node_bytes_per_step(plan_from("auto", world_size=4, ranks_per_node=4), **kw) == 0


def test_data_position_rescales_to_the_same_consumed_prefix():
    # 4 ranks at position 6 consumed 24 micro-batches of the epoch; 2 ranks get there at 12.
    assert rescale_data_state({"epoch": 1, "position": 6}, saved_world=4, world=2) == {"epoch": 1, "position": 12}
    assert rescale_data_state({"epoch": 0, "position": 6}, saved_world=4, world=8) == {"epoch": 0, "position": 3}


# ---- real runs on gloo ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Rank 0's reports of: full and hybrid (3 steps each, checkpoint after 2; with AdamW and with SGD),
    step 3 resumed from the full checkpoint under hybrid and from the hybrid one under full, all on 4
    ranks as 2 nodes x 2; and step 3 resumed from the full checkpoint by 2 ranks."""
    from harness.mesh_steps import launch, read
    from workloads.fsdp_finetune.local_assets import prepare_local_assets

    root = tmp_path_factory.mktemp("mesh")
    assets = prepare_local_assets(root / "assets")
    ckpt, hybrid_ckpt = str(root / "ckpt"), str(root / "hybrid_ckpt")
    base = {"model_dir": str(assets.model_dir), "global_rows": 8, "seq": 32, "seed": 5, "lr": 1e-3}
    launch({**base, "ranks_per_node": 2, "accum": 2, "out_dir": str(root / "four"), "phases": [
        {"name": "full", "sharding": "full", "steps": 3, "save_dir": ckpt, "save_after": 2,
         "known_collective": True},
        {"name": "hybrid", "sharding": "hybrid", "steps": 3, "known_collective": True, "save_dir": hybrid_ckpt,
         "save_after": 2},
        {"name": "full_sgd", "sharding": "full", "steps": 3, "optimizer": "sgd"},
        {"name": "hybrid_sgd", "sharding": "hybrid", "steps": 3, "optimizer": "sgd"},
        {"name": "hybrid_resumed", "sharding": "hybrid", "steps": 1, "start_step": 2, "load_dir": ckpt},
        {"name": "full_from_hybrid", "sharding": "full", "steps": 1, "start_step": 2, "load_dir": hybrid_ckpt},
    ]}, world=4)
    # Two ranks on one node (full sharding), 4 micro-batches each: the same global batch.
    launch({**base, "ranks_per_node": 2, "accum": 4, "out_dir": str(root / "two"), "phases": [
        {"name": "full_resumed", "sharding": "full", "steps": 1, "start_step": 2, "load_dir": ckpt},
    ]}, world=2)
    names = ("full", "hybrid", "full_sgd", "hybrid_sgd", "hybrid_resumed", "full_from_hybrid")
    out = {name: read(root / "four", name) for name in names}
    out["full_resumed"] = read(root / "two", "full_resumed")
    return out


def _assert_same_state(got: dict, want: dict, *, atol: float) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=atol, msg=key)


@pytest.mark.slow
def test_full_and_hybrid_give_the_same_parameters(runs):
    full, hybrid = runs["full"], runs["hybrid"]
    assert hybrid["plan"]["mesh_shape"] == [2, 2] and full["plan"]["mesh_shape"] == [4]
    assert hybrid["losses"] == pytest.approx(full["losses"], rel=1e-6)
    # SGD: parameters move linearly in the gradients, which differ only by summation order.
    _assert_same_state(runs["hybrid_sgd"]["state"], runs["full_sgd"]["state"], atol=1e-7)
    # AdamW divides by sqrt(v): where v ~ 0 a rounding-level gradient difference moves a parameter
    # by up to a few % of the learning rate (1e-3), still far below one update.
    _assert_same_state(hybrid["state"], full["state"], atol=5e-5)


@pytest.mark.slow
@pytest.mark.parametrize("resumed", ["hybrid_resumed", "full_resumed"])
def test_a_full_sharding_checkpoint_resumes_under_hybrid_and_on_fewer_ranks(runs, resumed):
    """Model and AdamW state reshard on load (DCP): step 3 after the resume equals step 3 uninterrupted."""
    assert runs[resumed]["losses"] == pytest.approx(runs["full"]["losses"][2:], rel=1e-5)
    # A fresh AdamW state would move every parameter by about lr = 1e-3 on its first step.
    _assert_same_state(runs[resumed]["state"], runs["full"]["state"], atol=5e-5)


@pytest.mark.slow
def test_a_hybrid_checkpoint_resumes_under_full_sharding(runs):
    assert runs["full_from_hybrid"]["losses"] == pytest.approx(runs["hybrid"]["losses"][2:], rel=1e-5)
    _assert_same_state(runs["full_from_hybrid"]["state"], runs["hybrid"]["state"], atol=5e-5)


@pytest.mark.slow
def test_known_collectives_are_counted_by_group(runs):
    full_gather, full_reduce = runs["full"]["known_collective"]
    hybrid_gather, hybrid_reduce = runs["hybrid"]["known_collective"]
    # 1000 fp32 per rank gathered: over 4 ranks on 2 nodes, then over the 2 ranks of node 0.
    assert full_gather == {"kind": "all_gather", "ranks": [0, 1, 2, 3], "payload_bytes": 16000,
                           "ring_bytes": 12000, "cross_node": True}
    assert hybrid_gather == {"kind": "all_gather", "ranks": [0, 1], "payload_bytes": 8000,
                             "ring_bytes": 4000, "cross_node": False}
    assert full_reduce == hybrid_reduce == {"kind": "all_reduce", "ranks": [0, 1, 2, 3], "payload_bytes": 1000,
                                            "ring_bytes": 1500, "cross_node": True}


@pytest.mark.slow
def test_counted_cross_node_bytes_match_the_analytic_count(runs):
    plans = {"full": plan_from("full", world_size=4, ranks_per_node=2),
             "hybrid": plan_from("hybrid", world_size=4, ranks_per_node=2)}
    for name, plan in plans.items():
        report = runs[name]
        want = cross_node_bytes_per_step(plan, params=report["params_padded"], grad_accumulation=2, param_bytes=4,
                                         reduce_bytes=4, root_params=report["root_params_padded"])
        counted = [step["cross_node_bytes"] for step in report["per_step"]]
        # Besides FSDP2's traffic the step all-reduces three scalars over the world (label count,
        # loss, grad norm): at most a few dozen bytes.
        assert all(0 <= got - want <= 64 for got in counted), (name, counted, want)
    # Hybrid: nothing of FSDP2's per-micro-batch traffic crosses the nodes.
    hybrid_cross = [row for row in runs["hybrid"]["table"] if row["cross_node"] and row["ring_bytes"] > 64]
    assert [(row["kind"], row["ranks"]) for row in hybrid_cross] == [("all_reduce", [0, 2])]
    # ... and its all-reduce runs once per FSDP unit per step (last micro-batch only), not per micro-batch.
    assert hybrid_cross[0]["calls"] == 3 * runs["hybrid"]["steps"]
