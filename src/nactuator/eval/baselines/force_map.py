"""Family 5: end-effector force from external joint torques, and the contact decision.

``tau_ext = J_v(q)^T f`` on the arm joints (the gripper carries no end-effector force), so

    f = (J_v^T)^+ tau_ext = (J_v J_v^T + lambda^2 I)^-1 J_v tau_ext

with J_v the (3, n_arm) linear Jacobian of the platform's end-effector point and the damping
``lambda`` [m] of ``conf/eval/baselines.yaml`` keeping the inverse bounded near
singularities (it biases |f| low only where J_v J_v^T has eigenvalues near lambda^2): the
solve is :func:`nactuator.sim.dynamics.ee_force_from_joint_torques`, the one the contact
residual's end-effector readout uses too. A classical estimator has no gate: it calls
contact when ``|f| > contact_threshold_n``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["contact_decision"]


def contact_decision(force: np.ndarray, threshold_n: float) -> np.ndarray:
    """(T,) 1.0 where |f| > threshold (contact), else 0.0: a classical method's 'gate'."""
    return (np.linalg.norm(force, axis=1) > threshold_n).astype(np.float64)
