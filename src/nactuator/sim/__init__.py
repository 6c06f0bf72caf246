"""nactuator.sim: the differentiable Featherstone simulator (Newton on Warp).

``Simulator`` (Contract 3 in docs/architecture.md) steps B arms of one platform as torch
ops; ``nactuator.sim.check.run_sim_check`` verifies its gradients and MuJoCo parity.
Robot models live in ``sim/robots/*.xml``. See docs/simulator.md.
"""

import warp as wp

# Warp prints a line per loaded kernel module; keep library users' output clean.
wp.config.quiet = True

from nactuator.sim.simulator import Simulator  # noqa: E402

__all__ = ["Simulator"]
