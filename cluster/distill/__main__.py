"""`python -m specray.cluster.distill ...`: the distill command alone (what a bare GPU box needs)."""
import sys

from specray.cluster.distill.cli import main

sys.exit(main())
