"""One-GPU throughput: this workload's settings against the walkthrough's, in the same run, without Ray.

Model: the Qwen2.5-1.5B architecture from its config (hidden 1536, intermediate 8960, 28 layers,
12 heads, 2 KV heads, vocab 151936, tied embeddings), random weights, nothing downloaded.
World size 1 in this process (a one-rank process group), so both sides run their real FSDP code.

* workload: the workload's own code path. The model is built like `model.build_model` does it
  (fp32 master weights, sdpa, no KV cache, train mode) but from the config (`from_config`, random
  weights) instead of `from_pretrained`; then its `shard_model` (FSDP2 `fully_shard` per decoder
  layer then root, bf16 compute / fp32 reduce, `torch.compile` per layer, and
  `reshard_after_forward=False`, right at world size 1 where there is nothing to gather),
  `build_optimizer` (fused AdamW on CUDA) and `train_step` (chunked LM head + cross-entropy).
  Settings for one H200 (141 GB): seq 2048, micro-batch 8 (16,384 tokens per step; activations
  without checkpointing are ~2.8 MB per token for this model, ~45 GB, beside ~25 GB of fp32
  weights, grads and Adam states), compile on, activation checkpointing off (it recomputes the
  forward, ~+33 % FLOPs, only worth it when memory is short). All switchable with flags.
* walkthrough: pure bf16 weights, FSDP1 `FullyShardedDataParallel` with `size_based_auto_wrap_policy`,
  AdamW, seq 128, batch 1, `model(input_ids, labels=input_ids).loss.backward()`.

MFU convention: `metrics.flops_per_token` = 6N + 12 L d T (PaLM appendix B: the full T^2
attention score and value products, no causal halving, no recomputation counted), divided by the
GPU's dense bf16 peak, which comes from the device name through the catalog
(`config/instances.yaml` `gpu_device_names`: H200 SXM 989, H200 NVL 835, H100 SXM 989, L4 121
TFLOP/s); an unlisted GPU gets no MFU. Targets on an H200: workload MFU >= 40 % and >= 20x the
walkthrough's tokens/s. Warm-up steps (compilation included) are excluded from the timing.
Between the two sides dynamo is reset and memory freed, so each side's peak memory is its own.
If `torch.compile` cannot build a kernel (no C compiler or Triton), the workload side falls back
to eager and the output says so. The process group is one rank on an in-memory store (no port).
Runs without Ray and without flash-attn (sdpa), e.g. Python 3.12, torch 2.11, transformers 5.17.
The plan's prediction (`workloads.plan.predict`, fake tensors, before any GPU work) of the workload's
peak memory and step time is printed beside the measured `torch.cuda.max_memory_allocated()` and
step time: the gap is the plan's error (target: memory within 15 %).

    python bench/gpu_throughput.py                     # on a GPU
    python bench/gpu_throughput.py --micro-batch 12    # more tokens per step if memory allows
    python bench/gpu_throughput.py --no-compile        # eager layers
    python bench/gpu_throughput.py --tiny              # anywhere: tiny shapes (compile off), both sides, in seconds
    python bench/gpu_throughput.py --lora              # LoRA case: Qwen2.5-7B architecture on one GPU (below)
    python bench/gpu_throughput.py --lora --tiny       # the LoRA case's code path anywhere, in seconds
    python bench/gpu_throughput.py --dcgm              # GPU + DCGM: dcgm-exporter's fields without SYS_ADMIN (below)

--lora: the workload's LoRA path (`workloads/fsdp_finetune/lora.py`, `job.method: lora`) on the Qwen2.5-7B
architecture (the plan's table), random weights: the frozen base in bf16, PEFT's adapters (rank 16, alpha 32,
every linear layer of a block) in fp32, `shard_model` and `train_step` as above; seq 2048, micro-batch 4, compile
on, activation checkpointing off (the bf16 base is 14 GiB; 4 x 2048 tokens of activations fit an H200).
No walkthrough side (it has no LoRA). MFU is printed under two conventions: the usual 6N + 12LdT, and
4N + 12LdT (a frozen base computes no weight gradients: forward 2N, backward 2N for the inputs' gradients;
the adapters' own FLOPs are under 1 % and left out). The plan's LoRA prediction is printed beside the measurement.

--dcgm: not a throughput figure but what only a GPU can show for the metrics stack's dcgm-exporter, which runs with
every capability dropped and asks the node monitoring agent's host engine over TCP: a client with CapEff 0 asks a
DCGM host engine for every field the exporter's counters list names, while bf16 matmuls keep the tensor pipe busy,
and each field is printed as served or N/A (harness/dcgm.py; docs/observability.md, "To check on a GPU").
Exit 2, saying why, without an NVIDIA GPU or without DCGM.

--tiny uses the GPU when there is one and the CPU otherwise (FSDP1 then runs on CPU with
`device_id=cpu`); its figures only show that the script works, they are not the target. Last line is JSON.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MFU_TARGET = 0.40
MFU_CONVENTION = ("flops/token = 6N + 12*L*d*T (PaLM appendix B: full T^2 attention, no causal halving, "
                  "recomputation not counted) / dense bf16 peak")
SPEEDUP_TARGET = 20.0
PLAN_TFLOPS = 989.0  # the plan's step time where the catalog does not know the device (CPU --tiny): H200 dense bf16

QWEN25_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
                  rope_theta=1000000.0, rms_norm_eps=1e-6)
QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, vocab_size=152064, max_position_embeddings=131072, tie_word_embeddings=False,
                rope_theta=1000000.0, rms_norm_eps=1e-6)
LORA = {"rank": 16, "alpha": 32.0, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=512, max_position_embeddings=1024, tie_word_embeddings=True)


def _config(tiny: bool, lora: bool = False):
    from transformers import Qwen2Config

    return Qwen2Config(**(TINY if tiny else QWEN25_7B if lora else QWEN25_15B))


def gpu_peak(device_name: str) -> tuple[str, float] | None:
    """(GPU model, dense bf16 TFLOP/s) from the catalog. `config/gpus.py` is loaded by path: it needs
    only PyYAML, while the `config` package would import pydantic, which a bare GPU machine may lack."""
    path = Path(__file__).resolve().parent.parent / "config" / "gpus.py"
    spec = importlib.util.spec_from_file_location("_catalog_gpus", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gpu_peak_for_device(device_name)


def compile_works(device) -> tuple[bool, str | None]:
    """Whether `torch.compile` can build and run a kernel here (inductor needs a C compiler, and Triton on GPU)."""
    import torch

    try:
        fn = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2 + 1)
        fn(torch.ones(8, device=device))
        return True, None
    except Exception as exc:  # noqa: BLE001 - any backend failure means: run eager
        return False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
    finally:
        torch._dynamo.reset()


def free_between_sides(device) -> None:
    """Drop compiled graphs and cached memory so the next side's peak memory is its own."""
    import torch

    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _timed(step, device, warmup: int, iters: int) -> float:
    import torch

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / iters


def bench_workload(cfg, device, *, seq: int, micro: int, accum: int, ac: bool, compile_: bool, warmup: int,
                   iters: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from workloads.fsdp_finetune.model import resolve_attn_implementation, shard_model
    from workloads.fsdp_finetune.train import build_optimizer, train_step

    torch.manual_seed(0)
    # As model.build_model, with random weights from the config instead of from_pretrained.
    attn = resolve_attn_implementation("sdpa", device)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=attn)
    model.config.use_cache = False
    model.to(device)
    shard_model(model, device=device, activation_checkpointing=ac, compile=compile_, reshard_after_forward=False)
    job = {"learning_rate": 2e-5, "weight_decay": 0.0}
    optimizer = build_optimizer(model, job, device)
    gen = torch.Generator().manual_seed(0)
    batches = [{"input_ids": (ids := torch.randint(0, cfg.vocab_size, (micro, seq), generator=gen)),
                "labels": ids.clone()} for _ in range(accum)]

    def step():
        train_step(model, optimizer, batches, grad_clip=1.0, device=device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = _timed(step, device, warmup, iters)
    result = {"seq_len": seq, "micro_batch": micro, "accumulation": accum, "activation_checkpointing": ac,
              "compile": compile_, "reshard_after_forward": False, "fp32_master_weights": True,
              "step_s": seconds, "tokens_per_s": micro * seq * accum / seconds}
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def bench_lora(cfg, device, *, seq: int, micro: int, accum: int, ac: bool, compile_: bool, warmup: int,
               iters: int) -> dict:
    """The LoRA path of `train.build_sharded_model` with random weights from the config: a frozen base (bf16 on a
    GPU, fp32 on CPU), PEFT's adapters injected before `shard_model`, the optimizer over the adapters alone."""
    import torch
    from transformers import AutoModelForCausalLM

    from workloads.fsdp_finetune.lora import apply_lora, trainable_count
    from workloads.fsdp_finetune.model import resolve_attn_implementation, shard_model
    from workloads.fsdp_finetune.train import build_optimizer, train_step

    torch.manual_seed(0)
    attn = resolve_attn_implementation("sdpa", device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
    model.config.use_cache = False
    apply_lora(model, LORA, seed=0)
    model.to(device)
    shard_model(model, device=device, activation_checkpointing=ac, compile=compile_, reshard_after_forward=False)
    optimizer = build_optimizer(model, {"learning_rate": 2e-4, "weight_decay": 0.0}, device)
    gen = torch.Generator().manual_seed(0)
    batches = [{"input_ids": (ids := torch.randint(0, cfg.vocab_size, (micro, seq), generator=gen)),
                "labels": ids.clone()} for _ in range(accum)]

    def step():
        train_step(model, optimizer, batches, grad_clip=1.0, device=device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = _timed(step, device, warmup, iters)
    result = {"seq_len": seq, "micro_batch": micro, "accumulation": accum, "activation_checkpointing": ac,
              "compile": compile_, "lora": LORA, "trainable_params": trainable_count(model),
              "params": sum(p.numel() for p in model.parameters()), "base_dtype": str(dtype).removeprefix("torch."),
              "step_s": seconds, "tokens_per_s": micro * seq * accum / seconds}
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def lora_flops_per_token(cfg, seq: int) -> float:
    """4N + 12LdT: a frozen base computes no weight gradients (forward 2N, input-gradient backward 2N)."""
    from workloads.fsdp_finetune.metrics import flops_per_token, matmul_params

    return flops_per_token(cfg, seq) - 2.0 * matmul_params(cfg)


def main_lora(args, device, cfg, *, seq: int, micro: int, warmup: int, iters: int, compile_: bool,
              compile_note: str | None, catalog_gpu, peak: float | None, device_name: str) -> None:
    """The --lora case: the workload's LoRA step alone, with the plan's LoRA prediction beside it."""
    import torch.distributed as dist

    from workloads.fsdp_finetune.metrics import flops_per_token, mfu

    planned = plan_prediction(cfg, seq=seq, micro=micro, accum=args.accumulation, ac=args.activation_checkpointing,
                              compile_=compile_, peak_tflops=catalog_gpu[1] if catalog_gpu else PLAN_TFLOPS,
                              lora=LORA)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)
    ours = bench_lora(cfg, device, seq=seq, micro=micro, accum=args.accumulation, ac=args.activation_checkpointing,
                      compile_=compile_, warmup=warmup, iters=iters)
    dist.destroy_process_group()
    ours["mfu_6n"] = mfu(ours["tokens_per_s"], cfg, seq, peak)
    ours["mfu_4n"] = None if peak is None else ours["tokens_per_s"] * lora_flops_per_token(cfg, seq) / (peak * 1e12)
    where = device_name + (" (--tiny: not the target)" if args.tiny else "")
    print(f"device: {where}; model: {'tiny Qwen2' if args.tiny else 'Qwen2.5-7B architecture'}, random weights; "
          f"LoRA rank {LORA['rank']} on {', '.join(LORA['target_modules'])}: {ours['trainable_params']:,} trainable "
          f"of {ours['params']:,} parameters, base in {ours['base_dtype']}")
    print(f"flops/token: 6N + 12LdT {flops_per_token(cfg, seq):.3e}, 4N + 12LdT {lora_flops_per_token(cfg, seq):.3e}")
    m6 = f"{ours['mfu_6n']:.1%}" if ours["mfu_6n"] is not None else "n/a"
    m4 = f"{ours['mfu_4n']:.1%}" if ours["mfu_4n"] is not None else "n/a"
    mem = f"{ours['peak_memory_gib']:.2f} GiB" if "peak_memory_gib" in ours else "n/a (CPU)"
    print(f"lora         {ours['tokens_per_s']:12.0f} tokens/s  step {ours['step_s']:.3f} s  MFU {m6} (6N), {m4} (4N)"
          f"  peak memory {mem}")
    plan_error = None
    if planned is not None:
        print(f"plan (workloads.plan, LoRA): peak memory {planned['peak_memory_gib']:.2f} GiB predicted, {mem} "
              f"measured; step {planned['step_s']:.3f} s predicted, {ours['step_s']:.3f} s measured")
        if "peak_memory_gib" in ours:
            plan_error = {"memory": round(planned["peak_memory_gib"] / ours["peak_memory_gib"] - 1, 4),
                          "step_time": round(planned["step_s"] / ours["step_s"] - 1, 4), "memory_target": 0.15}
    print(json.dumps({"case": "lora", "device": where, "tiny": args.tiny, "peak_tflops": peak,
                      "compile_fallback": compile_note, "lora": ours, "plan": planned, "plan_error": plan_error}))


def bench_walkthrough(cfg, device, *, seq: int, batch: int, warmup: int, iters: int) -> dict:
    import functools

    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.config.use_cache = False
    policy = functools.partial(size_based_auto_wrap_policy,
                               min_num_params=int(1e4 if cfg.hidden_size < 512 else 1e8))
    # On CPU FSDP1 needs device_id=cpu explicitly (it otherwise looks for an accelerator).
    model = FSDP(model, auto_wrap_policy=policy, device_id=device, use_orig_params=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = _timed(step, device, warmup, iters)
    result = {"seq_len": seq, "batch": batch, "step_s": seconds, "tokens_per_s": batch * seq / seconds,
              "fsdp1": True, "bf16_weights": True}
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def plan_prediction(cfg, *, seq: int, micro: int, accum: int, ac: bool, compile_: bool,
                    peak_tflops: float, lora: dict | None = None) -> dict | None:
    """`workloads.plan`'s prediction for this benchmark's own configuration (one rank, full sharding,
    `reshard_after_forward=False`), made on fake tensors before any process group exists; None, with
    the reason printed, where the plan cannot run here. Compilation is not simulated: with `compile`
    the real step fuses the loss's fp32 logits away, so the plan's peak errs high."""
    try:
        from workloads.fsdp_finetune.topology import plan_from
        from workloads.plan import predict
        from workloads.plan.simulate import release_fake_process_group
    except ImportError as exc:
        print(f"plan: not run ({exc}); measured figures only")
        return None
    mesh = plan_from("full", world_size=1, ranks_per_node=1)
    step = predict(cfg, mesh, micro_batch_size=micro, seq_len=seq, grad_accumulation=accum,
                   activation_checkpointing=ac, bf16_tflops=peak_tflops, reshard_after_forward=False, lora=lora)
    release_fake_process_group()
    return {"peak_memory_gib": round(step["peak_bytes"] / 2**30, 3), "step_s": round(step["step_time_s"], 4),
            "efficiency": step["efficiency"], "peak_tflops": peak_tflops, "compile_simulated": False,
            "compile": compile_}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true",
                        help="tiny model (GPU if present, else CPU), both sides: checks the script, not the target")
    parser.add_argument("--lora", action="store_true",
                        help="the LoRA case: Qwen2.5-7B architecture, frozen bf16 base, rank-16 adapters (see above)")
    parser.add_argument("--seq-len", type=int, default=None, help="default 2048 (64 with --tiny)")
    parser.add_argument("--micro-batch", type=int, default=None, help="sequences per micro-batch; default 8, "
                        "4 with --lora (2 with --tiny)")
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.compile each decoder layer (default: on on a GPU, off on CPU)")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--iters", type=int, default=None)
    from harness import dcgm

    dcgm.add_arguments(parser)
    args = parser.parse_args()
    dcgm.check_arguments(parser, args)
    if args.dcgm:
        sys.exit(dcgm.run(args))

    import torch
    import torch.distributed as dist

    from workloads.fsdp_finetune.metrics import flops_per_token, mfu

    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    cfg = _config(args.tiny, args.lora)
    seq = args.seq_len or (64 if args.tiny else 2048)
    micro = args.micro_batch or (2 if args.tiny else 4 if args.lora else 8)
    warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    iters = args.iters or (2 if args.tiny else 10)
    device_name = torch.cuda.get_device_name(device) if use_cuda else "CPU"
    catalog_gpu = gpu_peak(device_name) if use_cuda else None
    peak = catalog_gpu[1] if catalog_gpu and not args.tiny else None
    compile_ = (use_cuda and not args.tiny) if args.compile is None else args.compile
    compile_note = None
    if compile_:
        ok, reason = compile_works(device)
        if not ok:
            compile_, compile_note = False, f"torch.compile unavailable ({reason}); the workload side runs eager"
            print(f"note: {compile_note}", flush=True)
    if args.lora:
        main_lora(args, device, cfg, seq=seq, micro=micro, warmup=warmup, iters=iters, compile_=compile_,
                  compile_note=compile_note, catalog_gpu=catalog_gpu, peak=peak, device_name=device_name)
        return
    planned = plan_prediction(cfg, seq=seq, micro=micro, accum=args.accumulation, ac=args.activation_checkpointing,
                              compile_=compile_, peak_tflops=catalog_gpu[1] if catalog_gpu else PLAN_TFLOPS)
    # After the plan (its fake process group is gone): one rank on an in-memory store, no port to collide.
    dist.init_process_group("nccl" if use_cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)

    ours = bench_workload(cfg, device, seq=seq, micro=micro, accum=args.accumulation,
                          ac=args.activation_checkpointing, compile_=compile_, warmup=warmup, iters=iters)
    free_between_sides(device)
    walk_seq = 16 if args.tiny else 128
    theirs = bench_walkthrough(cfg, device, seq=walk_seq, batch=1, warmup=warmup, iters=max(iters, 5))
    ours["mfu"] = mfu(ours["tokens_per_s"], cfg, seq, peak)
    theirs["mfu"] = mfu(theirs["tokens_per_s"], cfg, walk_seq, peak)
    speedup = ours["tokens_per_s"] / theirs["tokens_per_s"]
    dist.destroy_process_group()

    where = device_name + (" (--tiny: not the target)" if args.tiny else "")
    peak_text = (f"{catalog_gpu[0]} dense bf16 peak {catalog_gpu[1]:g} TFLOP/s (catalog)" if catalog_gpu
                 else "no catalog peak for this device: MFU n/a")
    print(f"device: {where}; {peak_text}; model: {'tiny Qwen2' if args.tiny else 'Qwen2.5-1.5B architecture'}, "
          "random weights")
    print(f"MFU convention: {MFU_CONVENTION}")
    print(f"flops/token: workload {flops_per_token(cfg, seq):.3e}, walkthrough {flops_per_token(cfg, walk_seq):.3e}")
    for name, r in (("workload", ours), ("walkthrough", theirs)):
        m = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a (no CPU peak)"
        mem = f"{r['peak_memory_gib']:.2f} GiB" if "peak_memory_gib" in r else "n/a (CPU)"
        print(f"{name:12s} {r['tokens_per_s']:12.0f} tokens/s  step {r['step_s']:.3f} s  MFU {m}  peak memory {mem}")
    print(f"speed-up {speedup:.1f}x (targets on an H200: MFU >= 40%, speed-up >= 20x)")
    plan_error = None
    if planned is not None:
        measured = f"{ours['peak_memory_gib']:.2f} GiB" if "peak_memory_gib" in ours else "n/a (CPU)"
        print(f"plan (workloads.plan): peak memory {planned['peak_memory_gib']:.2f} GiB predicted, {measured} "
              f"measured; step {planned['step_s']:.3f} s predicted at {planned['efficiency']:.0%} of "
              f"{planned['peak_tflops']:g} TFLOP/s, {ours['step_s']:.3f} s measured"
              + ("; compile is not simulated (the plan's peak errs high)" if compile_ else ""))
        if "peak_memory_gib" in ours:
            plan_error = {"memory": round(planned["peak_memory_gib"] / ours["peak_memory_gib"] - 1, 4),
                          "step_time": round(planned["step_s"] / ours["step_s"] - 1, 4), "memory_target": 0.15}
    mfu_met = None if peak is None else bool(ours["mfu"] >= MFU_TARGET)
    speedup_met = None if peak is None else bool(speedup >= SPEEDUP_TARGET)
    print(json.dumps({
        "device": where, "tiny": args.tiny, "gpu_model": catalog_gpu[0] if catalog_gpu else None,
        "peak_tflops": peak, "mfu_convention": MFU_CONVENTION, "compile_fallback": compile_note,
        "workload_tokens_per_s": round(ours["tokens_per_s"], 1), "workload_mfu": ours["mfu"],
        "walkthrough_tokens_per_s": round(theirs["tokens_per_s"], 1), "walkthrough_mfu": theirs["mfu"],
        "speedup": round(speedup, 2),
        "targets": {"mfu": MFU_TARGET, "speedup": SPEEDUP_TARGET},
        "mfu_target_met": mfu_met, "speedup_target_met": speedup_met,
        "targets_met": None if peak is None else bool(mfu_met and speedup_met),
        "workload": ours, "walkthrough": theirs, "plan": planned, "plan_error": plan_error,
    }))


if __name__ == "__main__":
    main()
