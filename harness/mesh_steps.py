"""Run `train_step` on real gloo ranks under a chosen sharding and report losses, bytes and time.

One process per rank, each started as

    python -m harness.mesh_steps SPEC.json   (env RANK, WORLD_SIZE, and MASTER_ADDR + MASTER_PORT
                                                    or MESH_STEPS_INIT_METHOD=file://STORE)

so a launcher can put ranks in different network namespaces (`bench/two_node.py`) or on one
machine (`launch_local`). Ranks `i*R .. i*R+R-1` (R = `ranks_per_node`) pretend to be node i:
each sets `K8S_NODE_NAME` to `sim-node-i` unless the launcher set it, and the start-up
placement check (`topology.check_placement`) runs on that, as on the cluster.

The spec runs phases in one process group (each builds the model afresh from `model_dir`):

    {"model_dir", "ranks_per_node", "global_rows", "seq", "accum", "seed", "lr", "threads", "out_dir",
     "phases": [{"name", "sharding", "steps", "start_step", "load_dir", "save_dir", "save_after",
                 "optimizer" (adamw | sgd), "root_reshard", "warmup_steps", "known_collective"}]}

The data of step s is a fixed set of `global_rows` random sequences (some positions masked),
split by rank and micro-batch, so every sharding and world size sees the same global batch.
Rank 0 writes `out_dir/<name>.json` (losses, per-step bytes from `CollectiveCounter`, the table,
seconds per step) and `out_dir/<name>.pt` (the full model state).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parent.parent


def global_batch(step: int, *, rows: int, seq: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: ids and labels (rows x seq), uneven prompt masking per row."""
    gen = torch.Generator().manual_seed(seed * 100_003 + step)
    ids = torch.randint(0, vocab, (rows, seq), generator=gen)
    labels = ids.clone()
    masked = torch.randint(0, seq // 2, (rows,), generator=gen)
    for r in range(rows):
        labels[r, : int(masked[r])] = -100
    return ids, labels


def rank_micro_batches(step: int, *, rank: int, world: int, spec: dict, vocab: int) -> list[dict]:
    """This rank's share of step `step`'s global batch, as `accum` micro-batches."""
    ids, labels = global_batch(step, rows=spec["global_rows"], seq=spec["seq"], vocab=vocab, seed=spec["seed"])
    per_rank = spec["global_rows"] // world
    accum = spec["accum"]
    per_micro = per_rank // accum
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    ids, labels = ids[mine], labels[mine]
    return [{"input_ids": ids[i * per_micro:(i + 1) * per_micro], "labels": labels[i * per_micro:(i + 1) * per_micro]}
            for i in range(accum)]


def _phase(spec: dict, phase: dict, rank: int, world: int) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from workloads.fsdp_finetune.checkpoint import load_checkpoint, save_checkpoint
    from workloads.fsdp_finetune.comm_count import CollectiveCounter
    from workloads.fsdp_finetune.model import build_model, decoder_layers, shard_model
    from workloads.fsdp_finetune.topology import build_mesh, check_placement, node_name, padded_numel, plan_from
    from workloads.fsdp_finetune.train import build_optimizer, build_scheduler, train_step

    device = torch.device("cpu")
    plan = plan_from(phase["sharding"], world_size=world, ranks_per_node=spec["ranks_per_node"])
    check_placement(plan, node_name())
    mesh = build_mesh(plan, "cpu")
    model = build_model(spec["model_dir"], attn_implementation="sdpa", device=device)
    layer_shapes = [p.shape for layer in decoder_layers(model) for p in layer.parameters()]
    all_shapes = [p.shape for p in model.parameters()]
    layer_ids = {id(p) for layer in decoder_layers(model) for p in layer.parameters()}
    root_shapes = [p.shape for p in model.parameters() if id(p) not in layer_ids]
    shard_model(model, device=device, mesh=mesh, root_reshard_after_forward=phase.get("root_reshard", False))
    job = {"learning_rate": spec["lr"], "weight_decay": 0.0, "warmup_steps": 0, "max_steps": 1000}
    # SGD is linear in the gradients, so rounding-level gradient differences stay rounding-level in
    # the parameters; AdamW (the workload's) divides by sqrt(v) and can amplify them where v ~ 0.
    optimizer = (torch.optim.SGD(model.parameters(), lr=spec["lr"]) if phase.get("optimizer") == "sgd"
                 else build_optimizer(model, job, device))
    scheduler = build_scheduler(optimizer, job)
    start = phase.get("start_step", 0)
    if phase.get("load_dir"):
        load_checkpoint(phase["load_dir"], model=model, optimizer=optimizer, scheduler=scheduler, device=device)
    counter = CollectiveCounter(plan.node_index)
    losses, times, per_step = [], [], []
    vocab = model.config.vocab_size
    warmup = phase.get("warmup_steps", 0)
    tokens = 0
    for step in range(start, start + phase["steps"]):
        micro = rank_micro_batches(step, rank=rank, world=world, spec=spec, vocab=vocab)
        dist.barrier()
        began = time.perf_counter()
        before = len(counter.calls)
        with counter:
            out = train_step(model, optimizer, micro, grad_clip=1.0, device=device)
        loss = float(out["loss_sum"]) / max(1, int(out["label_tokens"]))
        dist.barrier()
        times.append(time.perf_counter() - began)
        if step - start >= warmup:
            tokens += out["tokens"] * world
        scheduler.step()
        losses.append(loss)
        step_calls = counter.calls[before:]
        per_step.append({"cross_node_bytes": sum(c.ring_bytes for c in step_calls if c.cross_node),
                         "intra_node_bytes": sum(c.ring_bytes for c in step_calls if not c.cross_node),
                         "calls": len(step_calls)})
        if phase.get("save_dir") and step + 1 - start == phase.get("save_after", phase["steps"]):
            save_checkpoint(phase["save_dir"], model=model, optimizer=optimizer, scheduler=scheduler,
                            step=step + 1, data_state={"epoch": 0, "position": 0}, device=device)
    known = None
    if phase.get("known_collective"):
        # A collective of known size on the shard group and on the world: the accounting check.
        probe = CollectiveCounter(plan.node_index)
        shard_pg = mesh.get_group("shard")
        with probe:
            dist.all_gather_into_tensor(torch.empty(1000 * len(plan.shard_group(rank))), torch.ones(1000),
                                        group=shard_pg)
            dist.all_reduce(torch.ones(250))
        known = [{"kind": c.kind, "ranks": list(c.ranks), "payload_bytes": c.payload_bytes,
                  "ring_bytes": c.ring_bytes, "cross_node": c.cross_node} for c in probe.calls]
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        out_dir = Path(spec["out_dir"])
        torch.save(state, out_dir / f"{phase['name']}.pt")
        timed = times[warmup:] or times
        (out_dir / f"{phase['name']}.json").write_text(json.dumps({
            "plan": {"sharding": plan.sharding, "mesh_shape": list(plan.mesh_shape), "nodes": plan.nodes},
            "losses": losses,
            "per_step": per_step,
            "table": counter.table(),
            "steps": phase["steps"],
            "seconds_per_step": sum(timed) / len(timed),
            "tokens_per_s": tokens / sum(timed) if tokens else None,
            "params_padded": padded_numel(all_shapes, plan.shard),
            "root_params_padded": padded_numel(root_shapes, plan.shard),
            "layer_params_padded": padded_numel(layer_shapes, plan.shard),
            "known_collective": known,
        }))
    dist.barrier()


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ.setdefault("K8S_NODE_NAME", f"sim-node-{rank // spec['ranks_per_node']}")
    torch.set_num_threads(spec.get("threads", 1))
    # Ranks on this machine meet through a FileStore (`launch` without `port`); across namespaces, env:// TCP.
    dist.init_process_group("gloo", init_method=os.environ.get(STORE_ENV, "env://"), rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=spec.get("timeout_s", 300)))
    try:
        for phase in spec["phases"]:
            _phase(spec, phase, rank, world)
    finally:
        dist.destroy_process_group()


STORE_ENV = "MESH_STEPS_INIT_METHOD"


def launch(spec: dict, *, world: int, prefix=lambda rank: [], env=lambda rank: {}, master_addr="127.0.0.1",
           port: int | None = None, timeout_s: float = 600) -> None:
    """Start `world` rank processes (command `prefix(rank) + [python, -m, ...]`), wait, raise if one fails.

    With `port` the ranks meet at `master_addr:port` (TCP; ranks in other network namespaces). Without it
    they share this machine's file system and meet through a FileStore in `out_dir`, not a port picked by
    binding port 0 and releasing it, which another process can take before rank 0 binds it (see tests/ranks.py).
    """
    out_dir = Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = out_dir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    if port:
        rendezvous = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(port)}
    else:
        store = out_dir / "gloo-store"
        store.unlink(missing_ok=True)  # left by an earlier group that died: it would be read as this group's
        rendezvous = {STORE_ENV: f"file://{store}"}
    procs = []
    for rank in range(world):
        rank_env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), **rendezvous, "PYTHONPATH": str(REPO),
                    "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **env(rank)}
        procs.append(subprocess.Popen([*prefix(rank), sys.executable, "-m", "harness.mesh_steps",
                                       str(spec_path)], env=rank_env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout_s
    outputs, failed = [], []
    try:
        for rank, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=max(1, deadline - time.monotonic()))
            outputs.append(out)
            if proc.returncode:
                failed.append((rank, proc.returncode, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if failed:
        rank, code, out = failed[0]
        raise RuntimeError(f"rank {rank} exited {code}:\n{out[-4000:]}")


def read(out_dir, name: str) -> dict:
    """A phase's report (rank 0) plus its model state under "state"."""
    out_dir = Path(out_dir)
    report = json.loads((out_dir / f"{name}.json").read_text())
    report["state"] = torch.load(out_dir / f"{name}.pt", weights_only=True)
    return report


if __name__ == "__main__":
    main(sys.argv[1])
