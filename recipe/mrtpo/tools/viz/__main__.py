"""``python -m recipe.mrtpo.tools.viz``: see :mod:`recipe.mrtpo.tools.viz.render`."""

import sys

from recipe.mrtpo.tools.viz.render import main

sys.exit(main())
