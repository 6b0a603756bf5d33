"""``python -m experiments.mini_credit``: the miniature credit-assignment experiment (:mod:`.cli`)."""

import sys

from experiments.mini_credit.cli import main

sys.exit(main())
