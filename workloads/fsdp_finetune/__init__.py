"""FSDP2 fine-tuning on Ray Train: `train.train_func` per worker, `launch.main` in the driver."""
