"""nactuator.planning: command sequences optimised through a counterfactual actuator model
and the differentiable simulator (``nactuator plan``, docs/counterfactual.md).

May import models, sim, data (the hidden world only through ``data.synth``), platforms.
"""

from nactuator.planning.plan import PlanError, PlanResult, optimise_commands, plan, read_target

__all__ = ["PlanError", "PlanResult", "optimise_commands", "plan", "read_target"]
