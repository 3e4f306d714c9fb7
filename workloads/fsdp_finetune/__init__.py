"""FSDP2 fine-tuning on Ray Train: `train.train_func` per worker, `launch.main` in the driver.

Imports run one way, down this list; a module may import the ones above it, never one below (nor anything of
`workloads.preflight`, `workloads.plan` or the verify tools, which sit above this package's worker floor):

Worker floor (what `train_func` runs on each Ray worker; `workloads.plan` and `workloads.preflight` may import it):
  run_folder, deadline, job_logs, storage_check  where a run's files are; the job's deadline; the driver's log
  data, loss, model, lora, checkpoint            the dataset, the loss, the model and adapters, saving and loading
  topology, comm_count, metrics, prometheus      the device mesh, communication volume, MFU, the workers' gauges
  tracking, evaluate, console, local_assets      metrics files and plots, held-out evaluation, the demo's console
  train_hooks                                    the training loop's test seam (`TrainHooks`, no-op in production)
  train                                          `train_func`: the training loop of each worker

Driver floor (the `python -m workloads.fsdp_finetune` process; may import `workloads.preflight`'s hub check and
runner, which import only the worker floor):
  run_plan     `RunPlan`: the embedded local job, and where a local or cluster run goes
  settings     every check before a worker starts (`SettingProblem`, `refuse` raises them as one `UserError`)
  trainer      the `TorchTrainer` of a plan (`build_trainer`, `run_training`)
  local_demo   `--local`: evaluate, train with a progress bar, evaluate again, summarize
  cluster_job  the cluster run: token and settings, plan, storage check, deadline, preflight, fit
  launch       the entry: `parse_args` and `main`, composing the two above
  __main__     `python -m workloads.fsdp_finetune`: `launch.main` through `config.errors.run_cli`

`workloads.preflight.__main__` may import `settings` (the Hub token check); nothing on the worker floor, in
`workloads.preflight` (but its `__main__`) or in `workloads.plan` imports the driver floor.
"""
