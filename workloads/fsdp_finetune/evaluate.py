"""Held-out evaluation: greedy exact match and response-token loss, on a plain (unsharded) model.

Used before and after training in local mode (the cluster run reports training metrics only;
score its exported model with this module). Prompts are rendered with the same chat template as training
(`data.tokenize_example`), so the scores measure what was trained.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from workloads.fsdp_finetune.data import (
    IGNORE_INDEX,
    make_batch,
    render_chat,
    to_device,
    tokenize_examples,
    uses_varlen,
)
from workloads.fsdp_finetune.loss import loss_sum

# The generation stops at whichever of these the tokenizer knows: ChatML's end of turn
# (what a fine-tuned Qwen emits after an answer) or the document EOS packed between examples.
_STOP_TOKENS = ("<|im_end|>",)


def _stop_ids(tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    for token in _STOP_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return sorted(i for i in ids if i is not None)


@torch.no_grad()
def evaluate(
    model,
    tokenizer,
    records: Sequence[dict],
    *,
    instruction_field: str = "instruction",
    response_field: str = "response",
    max_new_tokens: int = 8,
    batch_size: int = 64,
) -> dict:
    """Score `model` on `records`: `{"exact_match", "loss", "count", "samples"}`.

    `exact_match` is the fraction of records whose greedy answer (generation up to the end-of-turn
    token, at most `max_new_tokens`) equals the reference after stripping whitespace. `loss` is
    the mean cross-entropy over all response tokens (prompt masked, token-weighted), comparable
    with the training loss under `mask_prompt`. `samples` holds the first few
    (instruction, reference, answer) triples for the log. The model's train/eval mode is restored.
    """
    if not records:
        return {"exact_match": float("nan"), "loss": float("nan"), "count": 0, "samples": []}
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        instructions = [str(r[instruction_field]) for r in records]
        references = [str(r[response_field]) for r in records]
        answers: list[str] = []
        for start in range(0, len(records), batch_size):
            answers += _generate(model, tokenizer, instructions[start : start + batch_size], device, max_new_tokens)
        loss_sum, token_count = 0.0, 0
        for start in range(0, len(records), batch_size):
            pairs = list(zip(instructions[start : start + batch_size], references[start : start + batch_size],
                             strict=True))
            batch_sum, batch_count = _response_loss(model, tokenizer, pairs, device)
            loss_sum += batch_sum
            token_count += batch_count
    finally:
        model.train(was_training)
    matches = sum(a.strip() == ref.strip() for a, ref in zip(answers, references, strict=True))
    return {
        "exact_match": matches / len(records),
        "loss": loss_sum / token_count if token_count else math.nan,
        "count": len(records),
        "samples": [
            {"instruction": i, "reference": ref, "answer": a}
            for i, ref, a in list(zip(instructions, references, answers, strict=True))[:3]
        ],
    }


def _generate(model, tokenizer, instructions: list[str], device, max_new_tokens: int) -> list[str]:
    """Greedy answers for a batch of prompts, cut at the first stop token."""
    prompts = [render_chat(tokenizer, i, None) for i in instructions]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    # Left padding: every prompt then ends at the same column and generation appends after it.
    width = max(len(p) for p in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention[row, width - len(ids):] = 1
    stop_ids = _stop_ids(tokenizer)
    output = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=stop_ids,
        pad_token_id=pad_id,
    )
    answers = []
    for row in output[:, width:].tolist():
        cut = next((k for k, token in enumerate(row) if token in stop_ids), len(row))
        answers.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
    return answers


def _response_loss(model, tokenizer, pairs: list[tuple[str, str]], device) -> tuple[float, int]:
    """Sum of response-token cross-entropy and the number of those tokens, for one batch.

    One example per row, right-padded, laid out as a packed training block (`data.make_batch`):
    `position_ids` restart at the padding, which is ignored and attends only to itself, and flash
    attention gets the same varlen arguments as in training.
    """
    examples = tokenize_examples(tokenizer, pairs, mask_prompt=True)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(ids) for ids, _ in examples)
    input_ids = np.full((len(examples), width), pad_id, dtype=np.int64)
    labels = np.full((len(examples), width), IGNORE_INDEX, dtype=np.int64)
    position_ids = np.empty((len(examples), width), dtype=np.int64)
    for row, (ids, labs) in enumerate(examples):
        input_ids[row, : len(ids)] = ids
        labels[row, : len(ids)] = labs
        position_ids[row, : len(ids)] = np.arange(len(ids))
        position_ids[row, len(ids):] = np.arange(width - len(ids))
    varlen = uses_varlen(getattr(model.config, "_attn_implementation", None) or "")
    inputs = to_device(make_batch(input_ids, labels, position_ids, varlen=varlen), device)
    # The training loss's own code (position t predicts token t+1), so the two are comparable.
    total = loss_sum(model, inputs.pop("input_ids"), inputs.pop("labels"), **inputs)
    return float(total), int((labels[:, 1:] != IGNORE_INDEX).sum())
