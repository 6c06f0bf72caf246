"""The Newton engine: ``SolverFeatherstone`` (with our gradient fix) stepping B arms.

The reference implementation, and the path for any model that is not a serial chain. One
control step: the forward runs the platform's substeps with no tape on two persistent
ping-pong states; the backward replays that one step from the saved inputs under a fresh
``wp.Tape`` into a fixed set of recorded states, seeds the output gradients and reads the
gradients of ``joint_f``, ``q`` and ``qd`` (physics.md §5: constant memory in the horizon).
A Newton model and its states are built per batch size.
"""

from __future__ import annotations

import torch
import warp as wp

from nactuator.platforms import Platform
from nactuator.sim.builder import build_newton_model

__all__ = ["NewtonEngine"]


def _flat(t: torch.Tensor) -> wp.array:
    # A view, not a copy: wp.copy moves it into the solver's persistent arrays.
    return wp.from_torch(t.detach().contiguous().reshape(-1))


class NewtonEngine:
    """Newton model, solver and persistent states for one batch size."""

    def __init__(self, platform: Platform, batch: int, device: str, solver_cls: type,
                 angular_damping: float) -> None:
        self.batch, self.n = batch, platform.n
        self.substeps, self.dt = platform.substeps, platform.substep_dt
        self.device = device
        self.model = build_newton_model(platform, batch, device)
        self.solver = solver_cls(
            self.model,
            angular_damping=angular_damping,
            update_mass_matrix_interval=1,
            use_tile_gemm=False,
        )
        self.ping_pong = [self.model.state(requires_grad=False) for _ in range(2)]
        self.control = self.model.control(requires_grad=False)
        self.recorded = [self.model.state(requires_grad=True) for _ in range(self.substeps + 1)]
        self.recorded_control = self.model.control(requires_grad=True)

    def _shape(self, a: wp.array) -> torch.Tensor:
        return wp.to_torch(a).reshape(self.batch, self.n).clone()

    def forward(self, tau: torch.Tensor, q: torch.Tensor, qd: torch.Tensor):
        a, b = self.ping_pong
        wp.copy(a.joint_q, _flat(q))
        wp.copy(a.joint_qd, _flat(qd))
        wp.copy(self.control.joint_f, _flat(tau))
        for _ in range(self.substeps):
            self.solver.step(a, b, self.control, None, self.dt)
            a, b = b, a
        return self._shape(a.joint_q), self._shape(a.joint_qd)

    def backward(self, tau, q, qd, grad_q, grad_qd):
        states, control = self.recorded, self.recorded_control
        wp.copy(states[0].joint_q, _flat(q))
        wp.copy(states[0].joint_qd, _flat(qd))
        wp.copy(control.joint_f, _flat(tau))
        tape = wp.Tape()
        with tape:
            for i in range(self.substeps):
                self.solver.step(states[i], states[i + 1], control, None, self.dt)
        # The states own their .grad buffers, so backward copies the seeds into them.
        tape.backward(grads={states[-1].joint_q: _flat(grad_q),
                             states[-1].joint_qd: _flat(grad_qd)})
        grads = (
            self._shape(control.joint_f.grad),
            self._shape(states[0].joint_q.grad),
            self._shape(states[0].joint_qd.grad),
        )
        tape.zero()
        return grads
