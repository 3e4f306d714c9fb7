"""`python -m workloads.plan [FILE] [--json]`: see `workloads.plan`."""

from __future__ import annotations

import argparse
import json
import sys

from config.errors import UserError
from workloads.plan import DEFAULT_EFFICIENCY, RESERVE_GIB, PlanRefusal, make_plan, render


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with the plan; 2 when the job does not fit (or the file or the model is unusable)."""
    from config.cli import add_file_argument, chosen_file
    from config.loader import load_or_exit, resolve_path
    from workloads.fsdp_finetune.lora import LoraTargetError
    from workloads.plan.architectures import ArchitectureError

    parser = argparse.ArgumentParser(prog="python -m workloads.plan", description=__doc__.split(":")[0])
    add_file_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--efficiency", type=float, default=DEFAULT_EFFICIENCY,
                        help=f"fraction of the GPU's dense bf16 peak sustained (default {DEFAULT_EFFICIENCY})")
    parser.add_argument("--reserve-gib", type=float, default=RESERVE_GIB,
                        help=f"GiB per GPU kept free for CUDA context, NCCL and fragmentation (default {RESERVE_GIB})")
    parser.add_argument("--skip-unknown", action="store_true",
                        help="an architecture known neither locally nor in the table is a warning, exit 0 "
                             "(the RayJob's job.sh: the plan must not block a model it cannot see)")
    parser.add_argument("--prediction-out", metavar="FILE",
                        help="also write the predicted tokens/s and MFU as JSON here (the training driver exports "
                             "them to Prometheus beside the measured ones)")
    parser.add_argument("--online", action="store_true",
                        help="ask the Hugging Face Hub for a model not cached here, with the token of "
                             "job.hf_token_secret (read from Secrets Manager with your AWS credentials); a Hub "
                             "that refuses says which field sets the token (default: no network, the built-in table)")
    args = parser.parse_args(argv)
    if not 0 < args.efficiency <= 1:
        parser.error("--efficiency must be in (0, 1]")
    chosen = chosen_file(parser, args)
    file = str(resolve_path(chosen))
    config = load_or_exit(chosen)
    token, online = None, False
    if args.online:
        token, online, problem = online_token(config)
        if problem:
            raise UserError(problem, file=file)
    try:
        plan = make_plan(config, efficiency=args.efficiency, reserve_gib=args.reserve_gib, online=online,
                         token=token)
    except ArchitectureError as exc:
        if not args.skip_unknown:
            raise UserError(str(exc), file=file, field="job.model") from None
        print(f"{file}: job.model: {exc}", file=sys.stderr)
        return 0
    except LoraTargetError as exc:
        raise UserError(str(exc), file=file, field="job.lora.target_modules") from None
    except PlanRefusal as refusal:
        from workloads.plan import suggest

        options = suggest.suggest(config, refusal.plan, efficiency=args.efficiency, reserve_gib=args.reserve_gib)
        refusal.plan["suggestions"] = options
        print(json.dumps(refusal.plan) if args.json else render(refusal.plan, file) + "\n" + suggest.render(options))
        fitting = next((o for o in options if o["fits"]), None)
        instead = (f"; what fits instead: {fitting['change']} (peak {fitting['peak_gib_per_gpu']:.1f} GiB, "
                   f"${fitting['run_cost_usd']:,.2f})" if fitting else "")
        raise UserError(f"{refusal}{instead}", file=file) from None
    print(json.dumps(plan) if args.json else render(plan, file))
    if args.prediction_out:
        write_prediction(plan, args.prediction_out, run_name=config.job.run_name)
    return 0


def write_prediction(plan: dict, path: str, *, run_name: str) -> None:
    """The plan's throughput and MFU as the training driver reads them (`run_plan.read_plan_prediction`)."""
    from pathlib import Path

    prediction = {"run_name": run_name, "tokens_per_s": plan["tokens_per_s"], "mfu": plan["predicted_mfu"]}
    Path(path).write_text(json.dumps(prediction) + "\n")


def online_token(config) -> tuple[str | None, bool, str | None]:
    """(the job's token or None, whether to read the Hub, a problem line or None): fetch `job.hf_token_secret`
    with this machine's AWS credentials, then ask the Hub whether that token (or no token) may read `job.model`.
    A Hub that does not answer is noted and the plan falls back to the cache and the table."""
    from config.hub import hub_access
    from workloads.fsdp_finetune.model import is_local_path
    from workloads.hf_token import TokenError, fetch_token

    job = config.job
    if is_local_path(job.model) or job.model.startswith("s3://"):
        return None, False, None
    token = None
    if job.hf_token_secret:
        try:
            token = fetch_token(job.hf_token_secret, region=config.region)
        except TokenError as exc:
            return None, False, str(exc)
    access = hub_access(job.model, token=token)
    if access.status in ("needs_token", "denied"):
        return None, False, f"job.hf_token_secret: {access.message}"
    if not access.ok:
        print(f"note: {access.message}; planning from the cache and the table", file=sys.stderr)
        return None, False, None
    return token, True, None


if __name__ == "__main__":
    from config.errors import run_cli

    run_cli(main)
