"""``python -m data_prep.tool_calling``: the builder's command line (:mod:`data_prep.tool_calling.build`)."""

import sys

from data_prep.tool_calling.build import main

sys.exit(main())
