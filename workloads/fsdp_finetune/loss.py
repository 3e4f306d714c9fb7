"""The training loss, in one place: the sum of next-token cross-entropies, computed in chunks.

For a 151,936-token vocabulary the logits are the largest activation of a small model: at
sequence length 2048 and micro-batch 8 they are 16,384 x 151,936 values, 5 GB in bf16 and twice
that as the fp32 copy a stable log-softmax wants, all kept alive until backward. Here the decoder
runs once (`model.model`), and the LM head plus cross-entropy run over chunks of at most
`chunk_tokens` positions, each under `torch.utils.checkpoint`: only one chunk's logits exist at
a time, in forward and again (recomputed) in backward. The extra cost is one more LM-head matmul
per token in backward (about 4 % of the FLOPs of Qwen2.5-1.5B at 2048 tokens).

Labels are unshifted, as the data side produces them (position t predicts token t+1): the labels
are shifted left by one and padded with `IGNORE_INDEX`, so hidden states need no slicing (a
slice of a non-contiguous tensor would be copied).

Under FSDP2 the root unit owns the embeddings, the final norm and the (tied) LM head; its
forward hooks all-gather them. Calling `model.model` and `model.lm_head` from outside
`model.forward` would skip those hooks, so `install_fsdp_loss` registers `causal_lm_loss_sum`
as an FSDP forward method on the root (`register_fsdp_forward_method`), which runs the same
pre-/post-forward hooks around it; `loss_sum` dispatches to it when it is there.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from workloads.fsdp_finetune.data import IGNORE_INDEX

# Positions per LM-head chunk: 4096 x 151,936 logits = 1.2 GB bf16 (+2.5 GB fp32 for the softmax);
# large enough that the chunk's matmul still runs at full speed.
DEFAULT_CHUNK_TOKENS = 4096

_FSDP_METHOD = "fsdp_causal_lm_loss_sum"


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Labels aligned with the positions that predict them: `labels[:, t+1]` at `t`, IGNORE_INDEX last."""
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


def _chunk_ce_sum(hidden: torch.Tensor, lm_head: torch.nn.Module, labels: torch.Tensor) -> torch.Tensor:
    # fp32 only for this chunk's logits: a stable log-softmax over a large vocabulary.
    return F.cross_entropy(lm_head(hidden).float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


_compiled_chunk_ce_sum = None


def compiled_chunk_ce_sum():
    """`_chunk_ce_sum` under `torch.compile` (made once): the LM-head matmul, fp32 cast and cross-entropy
    fuse, so the fp32 logits of a chunk never exist in full; dynamic shapes, as the last chunk is shorter."""
    global _compiled_chunk_ce_sum
    if _compiled_chunk_ce_sum is None:
        _compiled_chunk_ce_sum = torch.compile(_chunk_ce_sum, dynamic=True)
    return _compiled_chunk_ce_sum


def token_ce_sum(hidden: torch.Tensor, lm_head: torch.nn.Module, labels: torch.Tensor, *,
                 chunk_tokens: int = DEFAULT_CHUNK_TOKENS, compile: bool = False) -> torch.Tensor:
    """Sum of cross-entropies of `lm_head(hidden)` against shifted `labels` (B, T), chunked over positions.

    `hidden` is (B, T, H), `labels` are the unshifted labels (B, T). With gradients enabled each
    chunk runs under non-reentrant activation checkpointing so its logits are freed right away.
    """
    flat_hidden = hidden.reshape(-1, hidden.size(-1))  # a view: hidden states are contiguous
    flat_labels = shift_labels(labels).reshape(-1)
    total = hidden.new_zeros((), dtype=torch.float32)
    grad = torch.is_grad_enabled()
    chunk_fn = compiled_chunk_ce_sum() if compile else _chunk_ce_sum
    for start in range(0, flat_hidden.size(0), chunk_tokens):
        h, y = flat_hidden[start:start + chunk_tokens], flat_labels[start:start + chunk_tokens]
        if grad:
            total = total + checkpoint(chunk_fn, h, lm_head, y, use_reentrant=False)
        else:
            total = total + chunk_fn(h, lm_head, y)
    return total


def causal_lm_loss_sum(model, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask=None,
                       chunk_tokens: int = DEFAULT_CHUNK_TOKENS, **model_kwargs) -> torch.Tensor:
    """Sum of next-token cross-entropies of a Hugging Face causal LM (`model.model` + `model.lm_head`).

    `model_kwargs` go to the decoder: `position_ids` of packed blocks, and flash attention's
    `cu_seq_lens_*`/`max_length_*` (`data.make_batch`). No KV cache: with one, transformers would
    not read packed sequences from `position_ids` (it builds the block-causal mask only without).
    The chunks are compiled when `install_fsdp_loss(..., compile=True)` marked the model.
    """
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                         **model_kwargs).last_hidden_state
    return token_ce_sum(hidden, model.lm_head, labels, chunk_tokens=chunk_tokens,
                        compile=getattr(model, _COMPILE_FLAG, False))


_COMPILE_FLAG = "_fsdp_loss_compiled"


def install_fsdp_loss(model, *, compile: bool = False) -> None:
    """Make `loss_sum` on this FSDP2 root run under the root's unshard/reshard hooks (see module doc);
    `compile` compiles the chunked LM head + cross-entropy (`job.compile`)."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    setattr(model, _COMPILE_FLAG, compile)
    setattr(model, _FSDP_METHOD, types.MethodType(causal_lm_loss_sum, model))
    register_fsdp_forward_method(model, _FSDP_METHOD)


def loss_sum(model, input_ids: torch.Tensor, labels: torch.Tensor, *, attention_mask=None,
             chunk_tokens: int = DEFAULT_CHUNK_TOKENS, **model_kwargs) -> torch.Tensor:
    """Summed token loss of `model` (an FSDP2 root prepared by `install_fsdp_loss`, or a plain model)."""
    method = getattr(model, _FSDP_METHOD, None)
    if method is not None:
        return method(input_ids, labels, attention_mask, chunk_tokens, **model_kwargs)
    return causal_lm_loss_sum(model, input_ids, labels, attention_mask, chunk_tokens, **model_kwargs)
