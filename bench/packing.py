"""Packing benchmark: useful tokens / computed tokens, packing against padding each example to seq_len.

Both layouts see the same tokenized examples (chat template, EOS after each example):

* packing (`data.pack`): examples end to end, cut into full `seq_len` blocks. Every computed
  position holds a real token; the only loss is the trailing partial block. It is charged here
  as if it had been padded and computed (useful = all tokens, computed = blocks rounded up), so
  the figure is a lower bound.
* padding: each example (plus its EOS) padded to `seq_len`; one longer than `seq_len` takes as
  many padded rows as it needs (nothing truncated, to be fair to padding).
* for reference, padding to the longest example of each micro-batch (dynamic padding, batches of
  `--micro-batch` in a seeded random order), which is what a data collator without packing does.

Two generated data sets: the local mode's arithmetic set (short, uniform examples) and a set with
varied lengths (log-normal prompt and answer lengths, up to a few thousand tokens). The headline
combines the configured pairings: arithmetic at the local mode's `seq_len` (128) and the varied set
at the variable file's `job.seq_len`; every other pairing is printed and listed under "cases".

Run: `python -m bench.packing` (prints human lines, then one JSON line). Target: packing >= 0.98.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from workloads.fsdp_finetune.data import pack, tokenize_examples  # noqa: E402
from workloads.fsdp_finetune.local_assets import make_arithmetic_records, make_tokenizer  # noqa: E402

TARGET = 0.98
LOCAL_SEQ_LEN = 128  # the local mode's block length (launch.local_job)


def varied_records(n: int, seed: int) -> list[dict]:
    """Instructions and answers of log-normal word counts over a pseudo-word vocabulary."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "zu", "pe", "qua", "dor", "fen", "gil"]
    words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(800)})

    def text(median_words: float, sigma: float) -> str:
        count = max(1, min(3000, int(rng.lognormvariate(math.log(median_words), sigma))))
        out = []
        for k in range(count):
            out.append(rng.choice(words))
            if k % 12 == 11:
                out[-1] += "."
        return " ".join(out)

    return [{"instruction": text(25, 0.8), "response": text(80, 1.0)} for _ in range(n)]


def measure(lengths: list[int], seq_len: int, packed_rows: int, micro_batch: int, seed: int) -> dict:
    """Efficiencies for examples of `lengths` tokens (EOS included) at `seq_len`."""
    useful = sum(lengths)
    packed_kept = packed_rows * seq_len
    packed_computed = math.ceil(useful / seq_len) * seq_len  # the dropped tail charged as a padded block
    padded_rows = sum(math.ceil(n / seq_len) for n in lengths)
    # Dynamic padding: rows of at most seq_len tokens, batched in a random order, each batch padded
    # to its longest row.
    rows = [min(seq_len, n - k) for n in lengths for k in range(0, n, seq_len)]
    random.Random(seed).shuffle(rows)
    batches = [rows[i:i + micro_batch] for i in range(0, len(rows), micro_batch)]
    dynamic = sum(max(batch) * len(batch) for batch in batches)
    return {
        "seq_len": seq_len,
        "examples": len(lengths),
        "useful_tokens": useful,
        "packing_efficiency": useful / packed_computed,
        "dropped_tail_tokens": useful - packed_kept,
        "padding_efficiency": useful / (padded_rows * seq_len),
        "dynamic_padding_efficiency": useful / dynamic,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print one human line per case and a final JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arithmetic", type=int, default=4000, help="arithmetic examples (local mode: 4000)")
    parser.add_argument("--varied", type=int, default=2000, help="varied-length examples")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[128, 512, 2048], help="block lengths, tokens")
    parser.add_argument("--micro-batch", type=int, default=4, help="batch size for the dynamic-padding reference")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from config import load_config

    cluster_seq_len = load_config().job.seq_len
    seq_lens = sorted(set(args.seq_lens) | {LOCAL_SEQ_LEN, cluster_seq_len})
    start = time.perf_counter()
    sets = {
        "arithmetic": make_arithmetic_records(args.arithmetic, args.seed),
        "varied": varied_records(args.varied, args.seed),
    }
    with tempfile.TemporaryDirectory() as tmp:
        corpus = [f"{r['instruction']}\n{r['response']}" for records in sets.values() for r in records[:1000]]
        tokenizer = make_tokenizer(tmp, corpus, vocab_size=2048)
    eos = tokenizer.eos_token_id

    cases = []
    for name, records in sets.items():
        examples = tokenize_examples(tokenizer, [(r["instruction"], r["response"]) for r in records], mask_prompt=True)
        lengths = [len(ids) + 1 for ids, _ in examples]  # + the EOS each layout appends
        for seq_len in seq_lens:
            input_ids, labels = pack(examples, seq_len, eos)
            assert input_ids.size == min(sum(lengths), input_ids.shape[0] * seq_len)
            case = {"set": name, **measure(lengths, seq_len, input_ids.shape[0], args.micro_batch, args.seed)}
            case["mean_example_tokens"] = float(np.mean(lengths))
            case["max_example_tokens"] = int(max(lengths))
            cases.append(case)
            print(f"{name:10s} seq_len={seq_len:5d} examples={len(lengths):5d} mean={case['mean_example_tokens']:7.1f} "
                  f"max={case['max_example_tokens']:5d} tok | packing {case['packing_efficiency']:.4f} "
                  f"(tail {case['dropped_tail_tokens']} tok) | padding to seq_len {case['padding_efficiency']:.4f} | "
                  f"dynamic padding {case['dynamic_padding_efficiency']:.4f}")

    headline_cases = [c for c in cases if (c["set"], c["seq_len"]) in
                      {("arithmetic", LOCAL_SEQ_LEN), ("varied", cluster_seq_len)}]
    useful = sum(c["useful_tokens"] for c in headline_cases)
    packing = useful / sum(c["useful_tokens"] / c["packing_efficiency"] for c in headline_cases)
    padding = useful / sum(c["useful_tokens"] / c["padding_efficiency"] for c in headline_cases)
    worst = min(c["packing_efficiency"] for c in cases)
    print(f"headline (arithmetic@{LOCAL_SEQ_LEN} + varied@{cluster_seq_len}): packing {packing:.4f} vs padding "
          f"{padding:.4f} = {packing / padding:.1f}x useful work per computed token; worst packing case {worst:.4f}; "
          f"target {TARGET}: {'met' if packing >= TARGET else 'NOT met'} ({time.perf_counter() - start:.1f} s)")
    print(json.dumps({
        "bench": "packing",
        "packing_efficiency": round(packing, 5),
        "padding_efficiency": round(padding, 5),
        "ratio": round(packing / padding, 3),
        "target": TARGET,
        "met": packing >= TARGET,
        "worst_case_packing_efficiency": round(worst, 5),
        "cases": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in c.items()} for c in cases],
    }))
    return 0 if packing >= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
