"""The differentiable simulator of Contract 3: batched rigid-body steps as torch ops.

One control step is one ``torch.autograd.Function``. Its forward runs the platform's
substeps without a tape; its backward replays that one step from the saved inputs and
returns the gradients of the torque, ``q`` and ``qd`` (physics.md §5: constant memory in the
horizon). Torch runs between steps, so a network can close the loop on the simulated state.

Two engines implement the step (``Simulator(..., engine=...)``):

- ``"chain"`` (:mod:`nactuator.sim.chain`): one Warp kernel per control step, one thread
  per arm, the articulated-body algorithm for serial chains of revolute/prismatic joints.
  The default for every model it can step (all shipped platforms).
- ``"newton"`` (:mod:`nactuator.sim.newton_engine`): Newton's ``SolverFeatherstone`` with
  our gradient fix. The reference, and the engine for tree-shaped models.

``sim.engine`` in the platform YAML pins one; the ``engine`` argument overrides the YAML.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import warp as wp
from newton.solvers import SolverFeatherstone

from nactuator.platforms import Platform, load_platform
from nactuator.sim.builder import (
    ENGINES,
    SimSetupError,
    body_index,
    body_name,
    build_newton_model,
    joint_arrays,
    sim_settings,
)
from nactuator.sim.chain import ChainEngine, ChainGeometry, NotASerialChain, chain_geometry
from nactuator.sim.kinematics import ChainKinematics
from nactuator.sim.newton_engine import NewtonEngine
from nactuator.sim.solver import GradientSafeFeatherstone
from nactuator.sim.stability import check_stability

__all__ = ["Simulator"]

_NO_SCOPE = nullcontext()


def _warp_device(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} requested but torch sees no CUDA device")
        wp.init()
        if not wp.is_cuda_available():
            raise ValueError(f"device {str(device)!r} requested but Warp sees no CUDA device")
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index}"
    raise ValueError(f"device must be 'cpu' or 'cuda[:i]', got {str(device)!r}")


class _StepFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, engine, stream_scope, tau, q, qd):
        with stream_scope():
            q1, qd1 = engine.forward(tau, q, qd)
        ctx.engine, ctx.stream_scope = engine, stream_scope
        ctx.save_for_backward(tau, q, qd)
        return q1, qd1

    @staticmethod
    def backward(ctx, grad_q1, grad_qd1):
        tau, q, qd = ctx.saved_tensors
        with ctx.stream_scope():
            g_tau, g_q, g_qd = ctx.engine.backward(tau, q, qd, grad_q1, grad_qd1)
        return None, None, g_tau, g_q, g_qd


class Simulator:
    """Batched differentiable simulator of one platform (Contract 3).

    ``Simulator("so101")`` or ``Simulator(platform, device="cuda", engine="newton")``.
    States and torques are (B, n) float32 tensors on ``device`` in the platform's channel
    order; any B works. ``engine`` is ``"chain"`` or ``"newton"`` (default: the platform's
    ``sim.engine``, else ``"chain"`` for a serial chain and ``"newton"`` otherwise);
    ``self.engine`` says which one runs. ``gradient_fix=False`` runs Newton's stock solver,
    whose multi-substep gradients are wrong; it exists to demonstrate that (Newton only).
    """

    def __init__(self, platform: Platform | str, device: str = "cpu", *,
                 engine: str | None = None, gradient_fix: bool = True) -> None:
        if isinstance(platform, str):
            platform = load_platform(platform)
        if not isinstance(platform, Platform):
            raise TypeError(f"platform must be a Platform or a platform name, got "
                            f"{type(platform).__name__}")
        if engine is not None and engine not in ENGINES:
            raise ValueError(f"engine must be one of {list(ENGINES)} or None, got {engine!r}")
        self.platform = platform
        self._wp_device = _warp_device(torch.device(device))
        # "cuda" and "cuda:0" compare unequal in torch: pin the index so input checks work.
        self.device = torch.device(self._wp_device)
        self.settings = sim_settings(platform)

        reference = build_newton_model(platform, 1, "cpu")
        arrays = joint_arrays(reference, platform.n)
        kinematics = ChainKinematics(
            arrays,
            kinds=[c.kind for c in platform.channels],
            armature=[c.armature for c in platform.channels],
            ee_body=body_index(reference, platform.end_effector.body),
            ee_offset=platform.end_effector.offset,
        )
        self._body_names = [body_name(reference, k) for k in range(platform.n)]
        self.stability = check_stability(platform, kinematics, self.settings)
        self.kinematics = kinematics.to(self.device)
        self.engine, geometry = self._choose_engine(engine, arrays, gradient_fix)
        self._solver_cls = GradientSafeFeatherstone if gradient_fix else SolverFeatherstone
        self._newton_engines: dict[int, NewtonEngine] = {}
        self._chain: ChainEngine | None = None
        if self.engine == "chain":
            with wp.ScopedDevice(self._wp_device):
                self._chain = ChainEngine(platform, geometry, self.settings, self._wp_device)
        as_tensor = lambda v: torch.tensor(v, dtype=torch.float32, device=self.device)  # noqa: E731
        # Effort bounds (n,) on `device`, in N*m or N per channel: what `step` clips to.
        self.torque_min = as_tensor(platform.torque_min)
        self.torque_max = as_tensor(platform.torque_max)
        self._velocity_limit = float(platform.velocity_limit)

    def _choose_engine(self, requested: str | None, arrays,
                       gradient_fix: bool) -> tuple[str, ChainGeometry | None]:
        """The engine to run (argument, else ``sim.engine``, else chain where possible) and,
        for a serial chain, its geometry."""
        where = self.platform.source or self.platform.name
        try:
            geometry, error = chain_geometry(arrays, where), None
        except NotASerialChain as e:
            geometry, error = None, e
        engine = requested or self.settings.engine or ("chain" if error is None else "newton")
        if engine == "chain":
            if error is not None:
                how = "requested" if requested else "pinned by sim.engine"
                raise SimSetupError(f"engine 'chain' {how}, but {error}") from error
            if not gradient_fix:
                raise ValueError("gradient_fix=False selects Newton's stock solver; it needs "
                                 "engine='newton' (the chain engine has no such variant)")
        return engine, geometry

    @property
    def n(self) -> int:
        return self.platform.n

    def _engine(self, batch: int) -> ChainEngine | NewtonEngine:
        if self._chain is not None:
            return self._chain
        if batch not in self._newton_engines:
            with wp.ScopedDevice(self._wp_device):
                self._newton_engines[batch] = NewtonEngine(
                    self.platform, batch, self._wp_device, self._solver_cls,
                    self.settings.angular_damping)
        return self._newton_engines[batch]

    def _stream_scope(self):
        if self._chain is not None and self.device.type == "cpu":
            # The chain engine's launches are recorded with their device and arrays, so on
            # the CPU there is nothing to scope (a Warp scope costs ~10 us per step).
            return _NO_SCOPE
        if self.device.type == "cuda":
            # Warp work goes on torch's current stream, so no extra synchronisation is needed.
            stream = wp.stream_from_torch(torch.cuda.current_stream(self.device))
            return wp.ScopedStream(stream)
        return wp.ScopedDevice(self._wp_device)

    # -- input checks -------------------------------------------------------------------
    def _check(self, name: str, x, shape: tuple[int | None, ...], what: str) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != torch.float32:
            raise TypeError(f"{name} must be torch.float32, got {x.dtype}")
        if x.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, x.shape,
                                                                               strict=True)):
            raise ValueError(f"{name} must have shape {what}, got {tuple(x.shape)}")
        if x.device != self.device:
            raise ValueError(f"{name} is on {x.device}, the simulator is on {self.device}")

    @staticmethod
    def _check_finite(**tensors: torch.Tensor) -> None:
        # One reduction for all inputs on the fast path: a NaN or inf anywhere makes the sum
        # non-finite (so does a float32 overflow, which then just costs the detailed pass).
        total = sum(x.detach().sum() for x in tensors.values())
        if bool(torch.isfinite(total)):
            return
        for name, x in tensors.items():
            if not bool(torch.isfinite(x).all()):
                bad = (~torch.isfinite(x)).nonzero()[0].tolist()
                raise ValueError(f"{name} contains NaN or inf (first at index {tuple(bad)})")

    def _batch_of(self, q) -> int:
        if isinstance(q, torch.Tensor) and q.ndim >= 1 and q.shape[0] >= 1:
            return int(q.shape[0])
        raise ValueError(f"q must have shape (B, {self.n}) with B >= 1, got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")

    # -- Contract 3 ---------------------------------------------------------------------
    def step(self, q: torch.Tensor, qd: torch.Tensor, tau: torch.Tensor,
             f_ext: torch.Tensor | None = None, tau_ext: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One control step (``platform.substeps`` substeps) -> (q1, qd1), each (B, n).

        ``tau`` is clipped to the platform's torque bounds (zero gradient where clipped);
        ``f_ext`` (B, 3) [N, base frame, on the end-effector point] is added as
        ``J_v(q)^T f``, and ``tau_ext`` (B, n) [N m] (the joint torque of external forces
        elsewhere, e.g. :meth:`ChainKinematics.point_torque`) as it is, after the clip:
        the environment is not bound by the motors' limits; the returned ``qd1`` is clipped
        to ``±platform.velocity_limit`` (zero gradient through a clipped component)."""
        n = self.n
        batch = self._batch_of(q)
        what = f"(B, {n}) = ({batch}, {n})"
        self._check("q", q, (batch, n), what)
        self._check("qd", qd, (batch, n), what)
        self._check("tau", tau, (batch, n), what)
        if f_ext is None:
            self._check_finite(q=q, qd=qd, tau=tau)
        else:
            self._check("f_ext", f_ext, (batch, 3), f"(B, 3) = ({batch}, 3)")
            self._check_finite(q=q, qd=qd, tau=tau, f_ext=f_ext)
        torque = torch.clamp(tau, self.torque_min, self.torque_max)
        if tau_ext is not None:
            self._check("tau_ext", tau_ext, (batch, n), what)
            self._check_finite(tau_ext=tau_ext)
            torque = torque + tau_ext
        if f_ext is not None:
            torque = torque + self.kinematics.ee_torque(q, f_ext)
        q1, qd1 = _StepFunction.apply(self._engine(batch), self._stream_scope, torque, q, qd)
        return q1, torch.clamp(qd1, -self._velocity_limit, self._velocity_limit)

    def replay(self, q0: torch.Tensor, qd0: torch.Tensor, taus: torch.Tensor,
               f_ext: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay a fixed torque sequence open loop from (q0, qd0) (B, n) under ``taus``
        (B, T, n) [and ``f_ext`` (B, T, 3)]: returns the states after each step, q and qd of
        shape (B, T, n). No model in the loop: that is a rollout (``nactuator.rollout``)."""
        batch = self._batch_of(q0)
        if not isinstance(taus, torch.Tensor) or taus.ndim != 3 or taus.shape[0] != batch \
                or taus.shape[2] != self.n:
            shape = tuple(taus.shape) if isinstance(taus, torch.Tensor) else type(taus).__name__
            raise ValueError(f"taus must have shape (B, T, {self.n}) with B = {batch}, got {shape}")
        if f_ext is not None and (not isinstance(f_ext, torch.Tensor) or f_ext.ndim != 3
                                  or tuple(f_ext.shape) != (batch, taus.shape[1], 3)):
            shape = tuple(f_ext.shape) if isinstance(f_ext, torch.Tensor) else type(f_ext).__name__
            raise ValueError(f"f_ext must have shape (B, T, 3) = ({batch}, {taus.shape[1]}, 3), "
                             f"got {shape}")
        q, qd = q0, qd0
        qs, qds = [], []
        for t in range(taus.shape[1]):
            q, qd = self.step(q, qd, taus[:, t], None if f_ext is None else f_ext[:, t])
            qs.append(q)
            qds.append(qd)
        return torch.stack(qs, 1), torch.stack(qds, 1)

    # The name before "rollout" meant only the model in the loop (Contract 3 documented it).
    rollout = replay

    def chain_bodies(self, mjcf_body: torch.Tensor) -> torch.Tensor:
        """Chain body indices (-1: none) of body indices in the platform's robot MJCF (as
        a dataset's ``contact_link`` stores them; NaN or negative: none), matched by name."""
        import mujoco  # only here: the MJCF's own body numbering

        if not hasattr(self, "_mjcf_to_chain"):
            model = mujoco.MjModel.from_xml_path(str(self.platform.robot_model_path()))
            names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, k)
                     for k in range(model.nbody)]
            self._mjcf_to_chain = torch.tensor(
                [self._body_names.index(nm) if nm in self._body_names else -1 for nm in names])
        ids = torch.nan_to_num(mjcf_body.to(torch.float64), nan=-1.0).round().long()
        known = (ids >= 0) & (ids < self._mjcf_to_chain.numel())
        table = self._mjcf_to_chain.to(ids.device)
        return torch.where(known, table[ids.clamp(0, table.numel() - 1)], -1)

    def ee_position(self, q: torch.Tensor) -> torch.Tensor:
        """End-effector point (platform ``end_effector``) in the base frame, (B, 3) [m]."""
        return self.kinematics.ee_position(q)

    def ee_jacobian(self, q: torch.Tensor) -> torch.Tensor:
        """Linear Jacobian of the end-effector point, (B, 3, n)."""
        return self.kinematics.ee_jacobian(q)

    def gravity_torque(self, q: torch.Tensor) -> torch.Tensor:
        """Joint torques that hold the arm still against gravity at ``q``, (B, n)."""
        return self.kinematics.gravity_torque(q)
