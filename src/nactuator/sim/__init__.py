"""nactuator.sim: the differentiable Featherstone simulator (Newton on Warp).

``Simulator`` (Contract 3 in docs/architecture.md) steps B arms of one platform as torch
ops; ``nactuator.sim.check.run_sim_check`` verifies its gradients and MuJoCo parity.
Robot models live in ``sim/robots/*.xml``. See docs/simulator.md.
"""

import warp as wp

# Warp logs its banner and a line per loaded kernel module to stdout at INFO, which would
# corrupt machine-readable output such as `nactuator sim-check --json`. Quieten it unless the
# user already chose a level.
if wp.config.log_level == wp.LOG_INFO:
    wp.config.log_level = wp.LOG_WARNING

from nactuator.sim.simulator import Simulator  # noqa: E402

__all__ = ["Simulator"]
