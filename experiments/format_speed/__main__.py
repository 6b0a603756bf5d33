import sys

from experiments.format_speed.cli import main

sys.exit(main())
