"""What runs on the cluster: the fine-tune (`fsdp_finetune/`), its preflight, the planner, the checks, the watchdog.

The code bundle (`charts/bundle.py`) ships this folder and `config/` to the pods, so it may import `config` only.
"""
