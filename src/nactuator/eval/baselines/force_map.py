"""Family 5: end-effector force from external joint torques, and the contact decision.

``tau_ext = J_v(q)^T f`` on the arm joints (the gripper carries no end-effector force), so

    f = (J_v^T)^+ tau_ext = (J_v J_v^T + lambda^2 I)^-1 J_v tau_ext

with J_v the (3, n_arm) linear Jacobian of the platform's end-effector point and the damping
``lambda`` [m] of ``conf/eval/baselines.yaml`` keeping the inverse bounded near
singularities (it biases |f| low only where J_v J_v^T has eigenvalues near lambda^2). A
classical estimator has no gate: it calls contact when ``|f| > contact_threshold_n``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["contact_decision", "force_from_joint_torques"]


def force_from_joint_torques(dynamics, q: np.ndarray, tau_ext: np.ndarray,
                             arm: Sequence[int], damping: float) -> np.ndarray:
    """(T, 3) force [N, base frame, environment on robot] from (T, n) external torques."""
    with torch.no_grad():
        jac = dynamics.ee_jacobian(torch.from_numpy(np.asarray(q, np.float64))).numpy()
    j = jac[:, :, list(arm)]  # (T, 3, n_arm)
    tau = np.asarray(tau_ext, np.float64)[:, list(arm)]
    gram = j @ j.transpose(0, 2, 1) + damping ** 2 * np.eye(3)
    return np.linalg.solve(gram, (j @ tau[:, :, None]))[..., 0]


def contact_decision(force: np.ndarray, threshold_n: float) -> np.ndarray:
    """(T,) 1.0 where |f| > threshold (contact), else 0.0: a classical method's 'gate'."""
    return (np.linalg.norm(force, axis=1) > threshold_n).astype(np.float64)
