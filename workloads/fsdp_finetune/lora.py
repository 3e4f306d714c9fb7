"""LoRA with FSDP2: adapters from PEFT put into the model before it is sharded, and their export.

`job.method: lora` freezes every weight of the base model and trains low-rank adapters only (Hu et al.
2021): each targeted linear layer W (out x in) gains B (out x r) and A (r x in), and computes
W x + alpha/r * B A x. The adapters are PEFT's own `lora.Linear` modules (peft 0.21.2,
`get_peft_model`), injected in place into the Hugging Face model, which is then sharded by
`model.shard_model` like any other: FSDP2 shards frozen and trainable parameters alike, and only the
adapters have gradients, reduce-scatters and AdamW state.

* Base weights: bf16 on GPU (frozen: no master copy needed; FSDP2 all-gathers them in bf16 as it would the
  fp32 master weights), fp32 on CPU (gloo, and the exact comparisons of the tests). The adapters stay fp32
  (PEFT's `autocast_adapter_dtype`): they are the master weights of what trains.
* Initial adapters: drawn from `job.seed` alone, the same on every rank (a rank's shard is cut from the
  same tensor everywhere), and outside the per-rank generator that training draws dropout from.
* Checkpoints (`checkpoint.save_checkpoint(frozen=False)`): the adapters and their optimizer state only; the
  base comes from `job.model` again at resume.
* Export (`export_lora`): the adapter folder in PEFT's format (`adapter_config.json`,
  `adapter_model.safetensors`) under `<export>/adapter`, and with `job.export.merge` the merged model
  (W + alpha/r * B A, PEFT's `merge_and_unload` arithmetic) as a plain Hugging Face model at `<export>`.
"""

from __future__ import annotations

import tempfile

import torch
import torch.distributed as dist

from config.errors import UserError

ADAPTER_NAME = "default"  # PEFT's name for a model's one adapter; the saved folder drops it
ADAPTER_DIR = "adapter"  # the adapter folder, under the export location
# peft 0.21.2 tuners/lora/layer.py: LoRA's parameters are `lora_A.<adapter>.weight` and `lora_B.<adapter>.weight`
# inside the targeted module, whose own weight moves to `base_layer.weight`.
_A, _B, _BASE = f".lora_A.{ADAPTER_NAME}.weight", f".lora_B.{ADAPTER_NAME}.weight", ".base_layer."


class LoraTargetError(UserError, ValueError):
    """`job.lora.target_modules` names something that is not a linear layer of the model."""


def linear_module_names(model) -> list[str]:
    """Qualified names of the model's `nn.Linear` layers (what LoRA can adapt)."""
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def target_problem(model, targets: list[str], model_name: str = "the model") -> str | None:
    """Why `targets` (PEFT's `target_modules`: names or dotted suffixes) cannot be adapted in `model`, or None.

    PEFT matches a target against a module's qualified name, whole or as a dotted suffix (peft 0.21.2
    tuners/tuners_utils.py `check_target_module_exists`); a target matching no linear layer is refused
    here, naming the linear layers' names, rather than left to PEFT (which refuses only when all miss).
    """
    names = linear_module_names(model)
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if not missing:
        return None
    leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
    verb = "is not a linear layer" if len(missing) == 1 else "are not linear layers"
    return (f"{', '.join(repr(m) for m in missing)} {verb} "
            f"of {model_name} ({type(model).__name__}); its linear layers are named {', '.join(leaves)}: "
            f"list some of those in job.lora.target_modules")


def check_targets(arch, targets: list[str], model_name: str) -> None:
    """Raise `LoraTargetError` when a target is not a linear layer of `arch` (a Hugging Face config): the model
    is built on the meta device, so no memory and about a second for any size (the plan calls this)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(arch)
    problem = target_problem(model, list(targets), model_name)
    if problem:
        raise LoraTargetError(problem)


def peft_config(lora: dict, *, base_model: str | None = None):
    """PEFT's `LoraConfig` for `job.lora` (a causal LM; biases not trained)."""
    from peft import LoraConfig

    return LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                      target_modules=list(lora["target_modules"]), bias="none", task_type="CAUSAL_LM",
                      base_model_name_or_path=base_model)


def apply_lora(model, lora: dict, *, seed: int, base_model: str | None = None, model_name: str | None = None):
    """Freeze `model` and inject PEFT's LoRA adapters into it, in place; return the `PeftModel` around it.

    Call before `shard_model`: the Hugging Face model itself (`model`, which the PeftModel wraps) is what gets
    sharded and trained; the PeftModel is kept for its config and `save_pretrained`. The adapters are drawn
    from `seed` with the global generator's state restored afterwards, so every rank starts from the same
    adapters and the per-rank stream (dropout) is untouched. Raises `LoraTargetError` for a target that is not
    a linear layer.
    """
    from peft import get_peft_model

    problem = target_problem(model, list(lora["target_modules"]), model_name or base_model or "the model")
    if problem:
        raise LoraTargetError(problem)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # autocast_adapter_dtype (the default): adapters in fp32 even on a bf16 base.
        peft_model = get_peft_model(model, peft_config(lora, base_model=base_model), adapter_name=ADAPTER_NAME)
    return peft_model


def trainable_count(model) -> int:
    """Parameters that train (the adapters under LoRA)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters of a full model state dict, under the names `PeftModel.state_dict()` gives them."""
    return {f"base_model.model.{k}": v for k, v in state.items() if ".lora_" in k}


def merged_state(state: dict[str, torch.Tensor], *, scaling: float,
                 dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """A full (LoRA-injected) model state dict with each adapter merged into its base weight.

    W' = W + scaling * B A in fp32, then cast to `dtype`: the arithmetic of PEFT's `merge_and_unload` (peft 0.21.2
    tuners/lora/layer.py `Linear.get_delta_weight`, no fan_in_fan_out for Linear). Names lose PEFT's
    `base_layer.`, so the result loads into the plain model class.
    """
    out = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        if key.endswith(f"{_BASE}weight"):
            module = key[: -len(f"{_BASE}weight")]
            a, b = state.get(module + _A), state.get(module + _B)
            if a is not None and b is not None:
                value = value.float() + scaling * (b.float() @ a.float())
        key = key.replace(_BASE, ".")
        out[key] = value.to(dtype) if dtype is not None and value.is_floating_point() else value
    return out


def export_lora(model, peft_model, tokenizer, destination: str, *, lora: dict, merge: bool,
                dtype: torch.dtype | None = None, max_shard_size: str = "5GB") -> None:
    """Write the adapters (PEFT's format) to `<destination>/adapter` and, with `merge`, the merged model to
    `destination`. Collective, as `checkpoint.export_hf_model`: every rank gathers, rank 0 writes.

    Without `merge` only the adapters are gathered (frozen parameters left out), a few MB; with it the whole
    model is, one layer at a time to rank 0's CPU (`cpu_offload`), as the full fine-tune's export does.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from workloads.fsdp_finetune.checkpoint import copy_tree, tied_aliases, write_hf_folder

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=not merge)
    state = get_model_state_dict(model, options=options)
    if (dist.get_rank() if dist.is_initialized() else 0) != 0:
        return
    destination = destination.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="lora-export-") as tmp:
        adapters = {k: v.to(torch.float32) for k, v in adapter_state(state).items()}
        # PeftModel.save_pretrained takes the state dict to write (kwargs["state_dict"], peft 0.21.2 peft_model.py);
        # it drops the adapter name from the keys and writes adapter_config.json beside them.
        peft_model.save_pretrained(f"{tmp}/{ADAPTER_DIR}", state_dict=adapters, safe_serialization=True)
        tokenizer.save_pretrained(f"{tmp}/{ADAPTER_DIR}")
        if merge:
            aliases = tied_aliases(model)
            merged = merged_state({k: v for k, v in state.items() if k not in aliases},
                                  scaling=lora["alpha"] / lora["rank"], dtype=dtype)
            write_hf_folder(tmp, model, merged, tokenizer, dtype=dtype, max_shard_size=max_shard_size)
        copy_tree(tmp, destination)
