"""One rank's training step on fake tensors: PyTorch's FSDP2 memory tracker and FLOP counter, no GPU.

A fake process group stands in for the job's world size; the device mesh is built from it
*before* `FakeTensorMode` is entered (inside it, mesh creation fails on a data-dependent op). The
model is built from its config on the meta device, sharded by the workload's own `shard_model`
with the job's mesh, activation checkpointing and the GPU's dtype policy (bf16 compute, fp32
master weights, `job.reduce_dtype` reductions), then materialised as fake tensors on the CPU. Each
step is the workload's own `train_step` (forward, chunked loss, backward, clip, AdamW step) on
random token ids, so what it allocates is what a GPU rank allocates, less the CUDA context, NCCL's
buffers and the caching allocator's fragmentation (the reserve the plan keeps free).

AdamW creates its moments inside the first `step()`, after that step's peak, so the first step
runs untracked (it is where the FLOPs are counted) and the peak is taken from a later one, a
steady-state step; several micro-batch sizes or sequence lengths can be measured on one model.
A real first step is needed, not just AdamW's state: Qwen2.5-7B at micro-batch 8 x 2048 peaks at
42.6 GiB in its first tracked step after AdamW's state was created by hand, 28.3 GiB in the steps
after (25 GiB more "activations" with checkpointing on; first-iteration set-up, not steady state).

Departures from the GPU run: `job.compile` is not simulated (the compiled chunked loss fuses the
fp32 logits away, so the plan errs high there); attention is sdpa's CPU flash kernel (the same
memory shape as the GPU's flash kernels: no T x T scores kept); and the loss method runs through
the root module's `__call__` instead of FSDP's registered forward method (the same FSDP
pre-/post-forward hooks run either way; the tracker only sees modules called through `__call__`).
"""

from __future__ import annotations

import contextlib
import functools
import types
from dataclasses import dataclass

import torch
import torch.distributed as dist

# The tracker's categories, grouped as the plan reports them.
CATEGORIES = {
    "parameters": ("Sharded Param", "Buffer"),
    "gathered parameters": ("Unsharded Param", "All Gather"),
    "gradients": ("Sharded Grad", "Unsharded Grad", "Reduce Scatter"),
    "optimizer state": ("OptState",),
    "activations": ("Activation", "Inputs"),
    "temporaries": ("Temp",),
}


@dataclass(frozen=True, kw_only=True)
class StepMemory:
    """Per-GPU memory of one steady-state step, bytes."""

    peak: int
    """The step's peak (all categories at the moment of the peak)."""
    by_category: dict[str, int]
    """The peak, split into `CATEGORIES`."""


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                             **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def flop_counter():
    """`FlopCounterMode` that also counts the CPU flash-attention kernel sdpa picks on fake CPU tensors
    (its registry has the CUDA kernels only, so attention would count as zero), the same way."""
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    return FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
    })


def init_fake_process_group(world_size: int) -> None:
    """A fake process group of `world_size` ranks (this process is rank 0); collectives do nothing."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() == world_size and dist.get_backend() == "fake":
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def release_fake_process_group() -> None:
    """Destroy the fake process group (a real one can then be created in this process)."""
    if dist.is_initialized() and dist.get_backend() == "fake":
        dist.destroy_process_group()


def packed_positions(micro_batch_size: int, seq_len: int) -> torch.Tensor:
    """`position_ids` of `micro_batch_size` packed blocks of two examples each (int64, [B, T]), restarting at the
    middle of each block. Only their presence and shape change what a step allocates: transformers builds its
    block-causal mask from them, the same [B, 1, T, T] whatever the example lengths."""
    half = seq_len // 2
    row = torch.cat([torch.arange(half), torch.arange(seq_len - half)])
    return row.expand(micro_batch_size, seq_len).contiguous()


def loss_through_call(model) -> None:
    """Make the FSDP2 root's loss method (`loss.install_fsdp_loss`) visible to `FSDPMemTracker`.

    The tracker follows modules through their `__call__` hooks, so the loss method goes through the root's
    `__call__` (the same FSDP pre-/post-forward hooks run); it also refuses a second root forward in one tracked
    step (gradient accumulation), so its per-module stats (not its peak) are cleared before each one
    (`tracked_step` sets the tracker this reads).
    """
    from workloads.fsdp_finetune.loss import _FSDP_METHOD, causal_lm_loss_sum

    model.forward = types.MethodType(causal_lm_loss_sum, model)

    def call(*args, **kwargs):
        tracker = getattr(model, _TRACKER_ATTR, None)
        if tracker is not None:
            tracker.reset_mod_stats()
        return model(*args, **kwargs)

    setattr(model, _FSDP_METHOD, call)


_TRACKER_ATTR = "_plan_mem_tracker"


@dataclass(frozen=True, kw_only=True)
class TrackedStep:
    """One `train_step` under the FSDP2 memory tracker, bytes by `CATEGORIES`."""

    peak: StepMemory
    """At the step's peak."""
    after: dict[str, int]
    """When the step has returned: what persists to the next step (parameters, optimizer state; gradients are
    freed by `zero_grad(set_to_none=True)`)."""


def tracked_step(model, optimizer, batches: list[dict], *, grad_clip: float, peak_only: bool = True) -> TrackedStep:
    """The workload's `train_step` on `batches` under `FSDPMemTracker` (`model` prepared by `loss_through_call`).

    Fake or real tensors alike: the plan runs it on fake ones (`FakeJob.measure`), tests/test_plan_tracked.py on
    a real model and real packed data, under the same fake process group. `peak_only`: `_peak_only_tracker`.
    """
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from workloads.fsdp_finetune.train import train_step

    tracker = (_peak_only_tracker() if peak_only else FSDPMemTracker)(model, optimizer)
    setattr(model, _TRACKER_ATTR, tracker)
    try:
        with tracker:
            train_step(model, optimizer, batches, grad_clip=grad_clip, device=torch.device("cpu"))
    finally:
        setattr(model, _TRACKER_ATTR, None)

    def by_category(kind: str) -> dict[str, int]:
        (snapshot,) = tracker.get_tracker_snapshot(kind).values()
        return {str(getattr(k, "value", k)): v for k, v in snapshot.items()}

    peak, after = by_category("peak"), by_category("current")
    group = lambda named: {name: sum(named.get(k, 0) for k in keys) for name, keys in CATEGORIES.items()}  # noqa: E731
    return TrackedStep(peak=StepMemory(peak=int(peak["Total"]), by_category=group(peak)), after=group(after))


class FakeJob(contextlib.AbstractContextManager):
    """The job's model, sharded, and its optimizer, on fake tensors; `with FakeJob(...) as job:`."""

    def __init__(self, arch, *, mesh_plan, activation_checkpointing: bool, reduce_dtype: str = "float32",
                 reshard_after_forward: bool = True, grad_clip: float = 1.0, lora: dict | None = None):
        from workloads.fsdp_finetune.topology import build_mesh

        self.arch = arch
        self.mesh_plan = mesh_plan
        self.activation_checkpointing = activation_checkpointing
        self.reduce_dtype = reduce_dtype
        self.reshard_after_forward = reshard_after_forward
        self.lora = lora
        self.grad_clip = grad_clip
        init_fake_process_group(mesh_plan.world_size)
        self.mesh = build_mesh(mesh_plan, "cpu")  # outside FakeTensorMode, see the module doc
        self._stack = contextlib.ExitStack()
        self.model = self.optimizer = None
        self.params = self.root_params = 0
        self.param_shapes: list[tuple[int, ...]] = []
        self.root_param_shapes: list[tuple[int, ...]] = []
        self.trainable_shapes: list[tuple[int, ...]] = []
        self.trainable = 0

    def __enter__(self) -> FakeJob:
        from torch._subclasses.fake_tensor import FakeTensorMode

        self._stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        try:
            self._build()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        self.model = self.optimizer = None

    def _build(self) -> None:
        from transformers import AutoModelForCausalLM

        from workloads.fsdp_finetune.model import decoder_layers, shard_model
        from workloads.fsdp_finetune.train import build_optimizer

        # LoRA (`lora.apply_lora`, as `train.build_sharded_model` on GPU): a frozen bf16 base, fp32 adapters.
        dtype = torch.bfloat16 if self.lora else torch.float32
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.arch, dtype=dtype, attn_implementation="sdpa")
        model.config.use_cache = False
        if self.lora:
            from workloads.fsdp_finetune.lora import apply_lora

            with torch.device("meta"):  # the adapters beside their base layers (PEFT moves them there otherwise)
                apply_lora(model, self.lora, seed=0, model_name=getattr(self.arch, "_name_or_path", None) or None)
        self.trainable_shapes = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
        self.trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        layer_params = {id(p) for p in decoder_layers(model).parameters()}
        self.param_shapes = [tuple(p.shape) for p in model.parameters()]
        self.root_param_shapes = [tuple(p.shape) for p in model.parameters() if id(p) not in layer_params]
        self.params = sum(p.numel() for p in model.parameters())
        self.root_params = sum(p.numel() for p in model.parameters() if id(p) not in layer_params)
        # A CUDA device only picks shard_model's GPU dtype policy (bf16 compute); the mesh, and so
        # every tensor, is on the CPU.
        shard_model(model, device=torch.device("cuda"), mesh=self.mesh, reduce_dtype=self.reduce_dtype,
                    activation_checkpointing=self.activation_checkpointing,
                    reshard_after_forward=self.reshard_after_forward)
        model.to_empty(device="cpu")
        loss_through_call(model)
        self.model = model
        # The learning rate and weight decay change no tensor's size.
        self.optimizer = build_optimizer(model, {"learning_rate": 1e-5, "weight_decay": 0.0}, torch.device("cpu"))

    def _micro_batches(self, micro_batch_size: int, seq_len: int, count: int) -> list[dict]:
        """Random token ids laid out as the training data's packed blocks (`data.make_batch`): with `position_ids`
        restarting at each example, which under sdpa make transformers build a block-causal mask per micro-batch
        (`masking_utils.find_packed_sequence_indices`; on fake tensors it always does, as on real packed blocks).
        Without them the tracked step on real data held 2.2 % more activations than the plan (the tiny model at
        micro-batch 8 x 128: the mask, and the positions' own tensors); tests/test_plan_tracked.py compares the two.
        A flash-attention job (varlen arguments, no mask) allocates less by the mask: the plan errs high there."""
        vocab = self.arch.vocab_size
        # Each micro-batch its own positions, as each real one has (one shared tensor was 4 KiB short here).
        return [{"input_ids": (ids := torch.randint(0, vocab, (micro_batch_size, seq_len))), "labels": ids,
                 "position_ids": packed_positions(micro_batch_size, seq_len)} for _ in range(count)]

    def count_flops(self, micro_batch_size: int, seq_len: int) -> tuple[float, float]:
        """(FLOPs one micro-batch executes in `train_step`, FLOPs of its forward pass alone), this rank.

        The step runs under `FlopCounterMode`, so its count is what the GPU executes: activation-
        checkpointing and chunked-loss recomputation included (the optimizer's elementwise work is
        not counted; it is small). The forward pass is counted again without gradients, so without
        recomputation: 3x it is the model FLOPs of PaLM's convention (backward = 2x forward), the one
        `metrics.flops_per_token` follows. This first step also creates AdamW's state. The counter
        runs apart from the memory tracker: its module hooks keep activations alive that a real
        step frees.
        """
        from workloads.fsdp_finetune.loss import loss_sum
        from workloads.fsdp_finetune.train import train_step

        (batch,) = self._micro_batches(micro_batch_size, seq_len, 1)
        counter = flop_counter()
        with counter:
            train_step(self.model, self.optimizer, [batch], grad_clip=self.grad_clip, device=torch.device("cpu"))
        executed = counter.get_total_flops()
        counter = flop_counter()
        inputs = dict(batch)
        with counter, torch.no_grad():
            loss_sum(self.model, inputs.pop("input_ids"), inputs.pop("labels"), **inputs)
        self.model.reshard()  # the root stays gathered after a forward (reshard_after_forward=False)
        return float(executed), float(counter.get_total_flops())

    def warm_up(self, micro_batch_size: int, seq_len: int) -> None:
        """The first step, which creates AdamW's state, uncounted: for when the FLOPs are already known."""
        from workloads.fsdp_finetune.train import train_step

        (batch,) = self._micro_batches(micro_batch_size, seq_len, 1)
        train_step(self.model, self.optimizer, [batch], grad_clip=self.grad_clip, device=torch.device("cpu"))

    def measure(self, micro_batch_size: int, seq_len: int, grad_accumulation: int) -> StepMemory:
        """The peak of one steady-state `train_step` under the FSDP2 memory tracker (after `count_flops`).

        A third micro-batch peaks like the second (both run with the window's gradient shards
        already allocated), so at most two are run.
        """
        if not self.optimizer.state:
            raise RuntimeError("count_flops first: it runs the step that creates AdamW's state")
        batches = self._micro_batches(micro_batch_size, seq_len, min(grad_accumulation, 2))
        return tracked_step(self.model, self.optimizer, batches, grad_clip=self.grad_clip).peak

    def state_floor(self) -> dict[str, int]:
        """This rank's persistent state as it will be after the first step, from the shards alone (no step run):
        its parameter shards, and for each trainable one a gradient and AdamW's two moments of the same size and
        dtype. A step's peak is at least this; when this alone exceeds the GPU, no step needs simulating."""
        params = sum(_local(p).numel() * _local(p).element_size() for p in self.model.parameters())
        trainable = sum(_local(p).numel() * _local(p).element_size() for p in self.model.parameters()
                        if p.requires_grad)
        return {"parameters": params, "gradients": trainable, "optimizer state": 2 * trainable}

    def state_bytes(self) -> dict[str, int]:
        """This rank's persistent training state, bytes: its shards of the fp32 parameters, of their
        gradients (same shapes and dtype) and of AdamW's two moments (plus its step counters)."""
        params = sum(_local(p).numel() * _local(p).element_size() for p in self.model.parameters())
        grads = sum(_local(p).numel() * _local(p).element_size() for p in self.model.parameters()
                    if p.requires_grad)
        opt = sum(_local(t).numel() * _local(t).element_size() for s in self.optimizer.state.values()
                  for t in s.values() if isinstance(t, torch.Tensor))
        return {"parameters": params, "gradients": grads, "optimizer state": opt}


@functools.cache
def _peak_only_tracker() -> type:
    """`FSDPMemTracker` keeping only the tracker-wide peak, the one figure the plan reads.

    After every op, `MemTracker._update_peak_stats` (torch 2.13.0, torch/distributed/_tools/mem_tracker.py)
    walks every module tracked so far, updating per-module peaks for `display_modulewise_snapshots`, and
    then the tracker-wide peak that `get_tracker_snapshot("peak")` returns. The module walk is a Python
    loop over some 400 modules of a 28-layer model at each of tens of thousands of ops: about a fifth of
    a plan's time. This subclass keeps the second half of that method, word for word.
    """
    from copy import deepcopy

    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    class PeakOnlyTracker(FSDPMemTracker):
        def _update_peak_stats(self, peak_state) -> None:
            for dev, dev_snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = deepcopy(dev_snap)

    return PeakOnlyTracker


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor
