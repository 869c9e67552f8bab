"""``python experiments/plan.py <train.py -m overrides>``: dry run of a sweep (see :mod:`lab.plan`)."""

import sys

from lab.plan import compose_job, main, plan

__all__ = ["compose_job", "main", "plan"]

if __name__ == "__main__":
    sys.exit(main())
