"""Training objectives as plug-ins (``objective=ce|distill|<plug-in>``): the interface and registry in
:mod:`spp.training.objectives.base`, one folder per objective (importing this package registers the project's
own, their configs in Hydra's ConfigStore as ``objective/<name>_schema``)."""

from spp.training.objectives import ce, distill  # noqa: F401  (registers objective=ce and objective=distill)
from spp.training.objectives.base import (
    Objective,
    ObjectiveConfig,
    ObjectiveLoss,
    block_outputs,
    build_objective,
    get_objective,
    objective_names,
    register_objective,
    teacher_forward,
)

__all__ = ["Objective", "ObjectiveConfig", "ObjectiveLoss", "block_outputs", "build_objective", "get_objective",
           "objective_names", "register_objective", "teacher_forward"]
