import sys

from experiments.real_model_learning.runs import main

sys.exit(main())
