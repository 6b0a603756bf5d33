"""``python -m recipe.mrtpo.tools.report``: see :mod:`recipe.mrtpo.tools.report.build`."""

import sys

from recipe.mrtpo.tools.report.build import main

sys.exit(main())
