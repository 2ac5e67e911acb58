"""``python -m gpt_optuna.cli``: the ``gpt-optuna`` command."""

import sys

from gpt_optuna.cli import main

sys.exit(main())
