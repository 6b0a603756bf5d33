"""``python -m data_prep.instruction_following``: the builder's command line (:mod:`data_prep.instruction_following.build`)."""

import sys

from data_prep.instruction_following.build import main

sys.exit(main())
