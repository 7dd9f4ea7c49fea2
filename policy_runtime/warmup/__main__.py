"""``python -m policy_runtime.warmup`` (cli.py)."""

import sys

from policy_runtime.report import quiet_on_closed_pipe
from policy_runtime.warmup.cli import main

sys.exit(quiet_on_closed_pipe(main))
