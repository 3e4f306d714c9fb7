"""`python -m workloads.fsdp_finetune`: see `workloads.fsdp_finetune.launch`."""

import sys

from workloads.fsdp_finetune.launch import main

sys.exit(main())
