"""``python -m data_prep.text_to_sql``: the builder's command line (:mod:`data_prep.text_to_sql.build`)."""

import sys

from data_prep.text_to_sql.build import main

sys.exit(main())
