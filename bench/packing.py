"""Packing benchmark: useful / computed tokens of whole-example packing, concatenation and padding.

All layouts see the same tokenized examples (chat template, EOS after each example). A token is
useful when it is computed with its whole example before it in view, and nothing else:

* whole-example packing (`data.pack`, what the job does): best-fit into `seq_len` blocks, never
  split; the rest of a block is padding. Every example token is useful; an example longer than
  `seq_len` is truncated (its cut tokens are neither useful nor computed, and are reported).
* concatenation (the job's layout before): examples end to end, cut into full `seq_len` blocks,
  the trailing partial block dropped. Every position is a real token, but the part of an example
  that spills into the next block is trained with its prompt out of view: not useful. (Attention
  also runs across unrelated examples there; that costs no compute, so it is not counted.)
* padding: one example per `seq_len` row (truncated like packing), the rest padding.
* for reference, dynamic padding: rows of one example (truncated at `seq_len`) in a seeded random
  order, each micro-batch of `--micro-batch` rows padded to its longest, as a collator without
  packing does.

Data sets, all generated: "alpaca-like" (the default job's kind of data: log-normal prompt and
answer lengths, a few hundred tokens), "long-tailed" (a heavier answer tail, some examples longer
than 2048 tokens), and the local mode's "arithmetic" set (short examples of nearly one length).
The headline is whole-example packing on the first two at the variable file's `job.seq_len`,
against the target; every pairing is printed and listed under "cases".

Run: `python -m bench.packing` (prints human lines, then one JSON line). Target: >= 0.95.
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

TARGET = 0.95
LOCAL_SEQ_LEN = 128  # the local mode's block length (launch.local_job)
HEADLINE_SETS = ("alpaca-like", "long-tailed")


def lognormal_records(n: int, seed: int, *, prompt_words: float, prompt_sigma: float, answer_words: float,
                      answer_sigma: float) -> list[dict]:
    """Instructions and answers of log-normal word counts (medians and sigmas given) over pseudo-words."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "zu", "pe", "qua", "dor", "fen", "gil"]
    words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(800)})

    def text(median_words: float, sigma: float) -> str:
        count = max(1, min(6000, int(rng.lognormvariate(math.log(median_words), sigma))))
        out = []
        for k in range(count):
            out.append(rng.choice(words))
            if k % 12 == 11:
                out[-1] += "."
        return " ".join(out)

    return [{"instruction": text(prompt_words, prompt_sigma), "response": text(answer_words, answer_sigma)}
            for _ in range(n)]


def concatenation(lengths: np.ndarray, seq_len: int) -> tuple[int, int]:
    """(useful, computed) tokens of end-to-end packing cut into full blocks, the partial tail dropped."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    kept = int(lengths.sum()) // seq_len * seq_len
    # An example's tokens in the block it starts in see their whole prefix; the rest spill over.
    first_block_end = np.minimum((starts // seq_len + 1) * seq_len, kept)
    useful = np.clip(np.minimum(starts + lengths, first_block_end) - starts, 0, None)
    return int(useful.sum()), kept


def measure(examples, seq_len: int, eos: int, micro_batch: int, seed: int) -> dict:
    """Useful / computed tokens of every layout, for `examples` at `seq_len`."""
    lengths = np.array([len(ids) + 1 for ids, _ in examples], dtype=np.int64)  # + the EOS each layout appends
    capped = np.minimum(lengths, seq_len)
    packed = pack(examples, seq_len, eos)
    assert packed.example_tokens == int(capped.sum()) and packed.truncated_tokens == int((lengths - capped).sum())
    concat_useful, concat_computed = concatenation(lengths, seq_len)
    rows = capped.tolist()
    random.Random(seed).shuffle(rows)
    dynamic = sum(max(batch) * len(batch) for batch in (rows[i:i + micro_batch] for i in range(0, len(rows),
                                                                                                micro_batch)))
    return {
        "seq_len": seq_len,
        "examples": len(lengths),
        "mean_example_tokens": float(lengths.mean()),
        "max_example_tokens": int(lengths.max()),
        "whole_example_packing": packed.fill,
        "concatenation": concat_useful / concat_computed if concat_computed else 0.0,
        "padding": float(capped.sum()) / (len(lengths) * seq_len),
        "dynamic_padding": float(capped.sum()) / dynamic,
        "truncated_examples": packed.truncated_examples,
        "truncated_token_share": packed.truncated_tokens / float(lengths.sum()),
        "concatenation_spilled_share": 1 - concat_useful / float(min(lengths.sum(), concat_computed) or 1),
        "blocks": len(packed),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print one human line per case and a final JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arithmetic", type=int, default=4000, help="arithmetic examples (local mode: 4000)")
    parser.add_argument("--varied", type=int, default=2000, help="examples of each generated-text set")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512, 2048], help="block lengths, tokens")
    parser.add_argument("--micro-batch", type=int, default=4, help="batch size for the dynamic-padding reference")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from config import load_config

    cluster_seq_len = load_config().job.seq_len
    start = time.perf_counter()
    sets = {
        "alpaca-like": lognormal_records(args.varied, args.seed, prompt_words=25, prompt_sigma=0.8,
                                         answer_words=80, answer_sigma=1.0),
        "long-tailed": lognormal_records(args.varied, args.seed + 1, prompt_words=30, prompt_sigma=1.0,
                                         answer_words=120, answer_sigma=1.6),
        "arithmetic": make_arithmetic_records(args.arithmetic, args.seed),
    }
    seq_lens = {name: sorted(set(args.seq_lens) | {cluster_seq_len}) for name in HEADLINE_SETS}
    seq_lens["arithmetic"] = [LOCAL_SEQ_LEN]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = [f"{r['instruction']}\n{r['response']}" for records in sets.values() for r in records[:1000]]
        tokenizer = make_tokenizer(tmp, corpus, vocab_size=2048)
    tokenizer.model_max_length = 1 << 30  # long-tailed examples exceed 4096 tokens: truncation is packing's job
    eos = tokenizer.eos_token_id

    cases = []
    for name, records in sets.items():
        examples = tokenize_examples(tokenizer, [(r["instruction"], r["response"]) for r in records], mask_prompt=True)
        for seq_len in seq_lens[name]:
            case = {"set": name, **measure(examples, seq_len, eos, args.micro_batch, args.seed)}
            cases.append(case)
            print(f"{name:11s} seq_len={seq_len:5d} examples={case['examples']:5d} "
                  f"mean={case['mean_example_tokens']:7.1f} max={case['max_example_tokens']:5d} tok | "
                  f"whole-example packing {case['whole_example_packing']:.4f} "
                  f"({case['truncated_examples']} truncated, {case['truncated_token_share']:.2%} of tokens) | "
                  f"concatenation {case['concatenation']:.4f} ({case['concatenation_spilled_share']:.2%} spilled) | "
                  f"padding {case['padding']:.4f} | dynamic padding {case['dynamic_padding']:.4f}")

    headline = {c["set"]: c for c in cases if c["set"] in HEADLINE_SETS and c["seq_len"] == cluster_seq_len}
    worst = min(c["whole_example_packing"] for c in headline.values())
    met = worst >= TARGET
    figures = "; ".join(f"{name}: whole-example packing {c['whole_example_packing']:.4f}, concatenation "
                        f"{c['concatenation']:.4f}, padding {c['padding']:.4f}" for name, c in headline.items())
    print(f"headline at seq_len={cluster_seq_len}: {figures}; target {TARGET} for whole-example packing: "
          f"{'met' if met else 'NOT met'} ({time.perf_counter() - start:.1f} s)")
    print(json.dumps({
        "bench": "packing",
        "seq_len": cluster_seq_len,
        **{f"{name}_{method}": round(c[method], 5) for name, c in headline.items()
           for method in ("whole_example_packing", "concatenation", "padding")},
        "target": TARGET,
        "met": met,
        "cases": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in c.items()} for c in cases],
    }))
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
