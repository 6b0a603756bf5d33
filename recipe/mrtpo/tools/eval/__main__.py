"""``python -m recipe.mrtpo.tools.eval``: see :mod:`recipe.mrtpo.tools.eval.harness`."""

import sys

from recipe.mrtpo.tools.eval.harness import main

sys.exit(main())
