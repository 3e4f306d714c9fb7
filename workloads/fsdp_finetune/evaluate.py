"""Held-out evaluation: greedy exact match and response-token loss, on a plain (unsharded) model.

`evaluate` scores a plain model in one process (the local driver, before and after training);
`HeldOutLoss` scores the sharded model on every rank during training (`train_func`, every
`job.eval_every` steps). Prompts are rendered with the same chat template as training
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
    """Sum of response-token cross-entropy and the number of those tokens, for one batch."""
    total, count = _examples_loss(model, tokenize_examples(tokenizer, pairs, mask_prompt=True), _pad_id(tokenizer),
                                  device)
    return float(total), int(count)


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _examples_loss(model, examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int, device, *,
                   width_multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss sum, label count) of right-padded (ids, labels) examples, as tensors on `device` (no host sync).

    One example per row, laid out as a packed training block (`data.make_batch`): `position_ids`
    restart at the padding, which is ignored and attends only to itself, and flash attention gets
    the same varlen arguments as in training. The batch is padded to a multiple of `width_multiple`
    positions.
    """
    width = -(-max(len(ids) for ids, _ in examples) // width_multiple) * width_multiple
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
    return total.to(torch.float64), torch.as_tensor(int((labels[:, 1:] != IGNORE_INDEX).sum()), device=device)


# ---- held-out loss during training, across ranks -----------------------------------------------


class HeldOutLoss:
    """Held-out loss and perplexity of the (sharded) model during training, every rank scoring its own shard.

    The records are tokenized once (prompt masked, as `evaluate` scores them), cut to `seq_len`,
    sorted by length and dealt round-robin to the ranks, so the shards are disjoint and about equally
    long. Each rank packs its shard into right-padded batches of at most `token_budget` positions.
    Under FSDP every forward is collective, so every rank runs the same number of batches: each
    computes every shard's batch plan (the data is the same on all ranks, so no extra collective) and
    a rank with fewer batches runs a one-token batch with nothing to score. One all-reduce of
    (loss sum, token count) gives the token-weighted mean over the whole held-out set, the figure
    one process would compute on it. Batch widths are rounded up to a multiple of `WIDTH_MULTIPLE`,
    so a `torch.compile`d model sees a few shapes, not one per batch (each new one recompiles).
    """

    WIDTH_MULTIPLE = 64

    def __init__(self, tokenizer, records: Sequence[dict], *, seq_len: int, token_budget: int,
                 rank: int = 0, world_size: int = 1):
        examples = tokenize_examples(tokenizer, [(str(r["instruction"]), str(r["response"])) for r in records],
                                     mask_prompt=True)
        examples = sorted(((ids[:seq_len], labels[:seq_len]) for ids, labels in examples),
                          key=lambda e: len(e[0]), reverse=True)
        self.count = len(examples)
        self.pad_id = _pad_id(tokenizer)
        plans = [self._plan(examples[r::world_size], token_budget) for r in range(world_size)]
        self.batches = plans[rank]
        self.steps = max(len(p) for p in plans)

    @classmethod
    def _plan(cls, examples: list, token_budget: int) -> list[list]:
        """Consecutive (longest-first) examples per batch while rows x padded width fits `token_budget`."""
        batches: list[list] = []
        for example in examples:
            width = -(-len(batches[-1][0][0]) // cls.WIDTH_MULTIPLE) * cls.WIDTH_MULTIPLE if batches else 0
            if batches and (len(batches[-1]) + 1) * width <= token_budget:
                batches[-1].append(example)
            else:
                batches.append([example])
        return batches

    @torch.no_grad()
    def __call__(self, model, device) -> dict:
        """`{"eval_loss", "eval_perplexity", "eval_tokens"}` over the whole held-out set (collective)."""
        import torch.distributed as dist

        was_training = model.training
        model.eval()
        total = torch.zeros((), dtype=torch.float64, device=device)
        tokens = torch.zeros((), dtype=torch.int64, device=device)
        try:
            for i in range(self.steps):
                batch = self.batches[i] if i < len(self.batches) else [([self.pad_id], [IGNORE_INDEX])]
                batch_sum, batch_count = _examples_loss(model, batch, self.pad_id, device,
                                                        width_multiple=self.WIDTH_MULTIPLE)
                total += batch_sum
                tokens += batch_count
        finally:
            model.train(was_training)
        figures = torch.stack([total, tokens.to(torch.float64)])
        if dist.is_initialized():
            dist.all_reduce(figures)
        loss_sum_, count = figures.tolist()
        loss = loss_sum_ / count if count else math.nan
        return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0)) if count else math.nan,
                "eval_tokens": int(count)}
