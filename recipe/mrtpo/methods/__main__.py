"""``python3 -m recipe.mrtpo.methods [list | names | overrides NAME | reads NAME]`` (:func:`registry.main`)."""

import sys

from recipe.mrtpo.methods.registry import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
