"""The hidden ground-truth world: servos (:mod:`.servo`) driving a MuJoCo arm.

MuJoCo is deliberately a different engine from the Newton/Featherstone simulator we train
through, and the arm here is not the nominal one: link masses and COMs are perturbed, joints
carry the servo's reflected rotor inertia, gearbox friction and backlash, an optional
elastic band loads one joint, and a held object stops the closing jaw (a one-sided spring).
External forces (payload weight, pushes) act at the platform's end-effector point through
``xfrc_applied``. Contacts stay off.

Step-wise API (used by ``data.synth`` and by the hardware emulators, in real time)::

    world = World(platform, params, seed=0, n_envs=1)
    world.reset(q0)                       # joint units, (n,) or (n_envs, n)
    world.set_goal(q_goal)                # what a Goal Position write does (quantised to counts)
    world.set_torque_enabled(True)
    world.set_external_force([0, 0, -2.0])  # N, base frame, environment on robot
    world.set_grasp(0.27)                 # an object stops the jaw at 0.27 (NaN: none)
    world.set_carried(0.4)                # or: 0.4 kg between the jaws, its weight hung
                                          # while they press it (emulators: no task plan)
    world.step(0.017)                     # advances in whole physics steps
    world.step_until(t)                   # or: catch up to wall-clock time t (emulators)
    tel = world.telemetry()               # SI, Contract-1 units, (n_envs, n) arrays
    regs = world.read_registers(env=0)    # raw register integers per motor

Every array method works on all ``n_envs`` arms at once (synth runs one task's trajectories
in lock-step); an emulator uses ``n_envs=1`` and index 0.
"""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np

from nactuator.constants import GRAVITY
from nactuator.platforms import Platform, load_platform

from .params import WorldError, WorldParams, load_world_config, resolve_world
from .protection import Protection
from .registers import quantize
from .servo import ServoBank

__all__ = ["World", "load_world"]


def _load_model(platform: Platform) -> mujoco.MjModel:
    path = platform.robot_model_path()
    if not Path(path).exists():
        raise WorldError(f"robot model {path} for platform {platform.name!r} does not exist")
    return mujoco.MjModel.from_xml_path(str(path))


def load_world(platform: str | Platform, world: str | Path | None = None,
               seed: int = 0) -> WorldParams:
    """Load, validate and resolve a world file (default ``conf/world/<platform>.yaml``)."""
    p = platform if isinstance(platform, Platform) else load_platform(platform)
    cfg, source = load_world_config(p.name, world)
    return resolve_world(p, cfg, seed, source=source, n_bodies=_load_model(p).nbody)


class World:
    """``n_envs`` copies of one hidden robot, each with its own MuJoCo data and servo state."""

    def __init__(self, platform: str | Platform, params: WorldParams,
                 seed: int | list[int] = 0, n_envs: int = 1) -> None:
        self.platform = platform if isinstance(platform, Platform) else load_platform(platform)
        if params.platform != self.platform.name:
            raise WorldError(
                f"world parameters are for {params.platform!r}, not {self.platform.name!r}"
            )
        if n_envs < 1:
            raise WorldError(f"n_envs must be >= 1, got {n_envs}")
        self.params = params
        self.n_envs = n_envs
        n = self.n = self.platform.n
        self.motors = {k: params.motor_array(k) for k in params.motors}
        self.trans = self.motors["transmission"]

        base = _load_model(self.platform)
        self._check_joints(base)
        self.dt = self.platform.control_dt / max(1, round(self.platform.control_dt
                                                          / params.physics["dt"]))
        base.opt.timestep = self.dt
        base.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
        self._perturb_links(base)
        self.servo = ServoBank(self.motors, params.controller, n_envs, self.dt)
        # Joint-side rotor inertia and viscous friction (implicit in MuJoCo's integrator).
        base.dof_armature[:n] = self.servo.armature / self.trans**2
        base.dof_damping[:n] = self.motors["viscous"] / self.trans**2
        base.dof_frictionloss[:n] = self.motors["coulomb"] / self.trans
        # One model per arm: frictionloss is load dependent and changes every step.
        self.models = [_copy_model(base) for _ in range(n_envs)]
        self.datas = [mujoco.MjData(m) for m in self.models]
        for m, d in zip(self.models, self.datas, strict=True):
            mujoco.mj_setConst(m, d)
        ee = self.platform.end_effector
        self.ee_body = mujoco.mj_name2id(base, mujoco.mjtObj.mjOBJ_BODY, ee.body)
        if self.ee_body < 0:
            raise WorldError(f"{self.platform.robot_model_path()}: no body {ee.body!r} "
                             f"(platform end_effector.body)")
        self.ee_offset = np.asarray(ee.offset, dtype=np.float64)

        self._pid = params.controller == "position_pid"
        # One noise generator per arm, so an arm's telemetry does not depend on which other
        # arms share the batch. `seed` is one int (arm i gets stream i) or one int per arm.
        if np.ndim(seed) == 0:
            keys = [(int(seed), i) for i in range(n_envs)]
        else:
            keys = [(int(x), 0) for x in seed]
        if len(keys) != n_envs:
            raise WorldError(f"got {len(keys)} seeds for {n_envs} arms")
        self.rngs = [np.random.default_rng(np.random.SeedSequence([s, 7, k])) for s, k in keys]
        self.bus_voltage = np.full((n_envs, 1), float(params.supply["voltage"]))
        self.external_force = np.zeros((n_envs, 3))
        # A contact anywhere on the arm (issue 23): body id (-1: none), point in that body's
        # frame [m], force in the base frame [N] (environment on robot).
        self.contact_body = np.full(n_envs, -1, dtype=np.int64)
        self.contact_point = np.zeros((n_envs, 3))
        self.contact_force = np.zeros((n_envs, 3))
        self.band_enabled = np.zeros(n_envs, dtype=bool)
        self.band_rest = np.zeros(n_envs)
        self.band_channel = np.full(n_envs, params.band["channel"], dtype=np.int64)
        self.grasp_jaw = np.full(n_envs, np.nan)
        self.carried_kg = np.zeros(n_envs)  # set_carried: an object the jaws hold themselves
        self.q = np.zeros((n_envs, n))
        self.qd = np.zeros((n_envs, n))
        self.omega_filtered = np.zeros((n_envs, n))
        window = max(1, round(params.sensors["velocity_window"] / self.dt))
        self._count_ring = np.zeros((window, n_envs, n), dtype=np.int64)
        self.velocity_window_s = window * self.dt
        self.step_count = 0
        self.last_registers: dict[str, np.ndarray] = {}
        # Firmware protections (world.protection): off unless a caller installs them, so
        # datasets recorded before they existed replay unchanged.
        self.protection: Protection | None = None
        self.reset(np.zeros(n))

    # -- construction helpers -----------------------------------------------------------

    def _check_joints(self, m: mujoco.MjModel) -> None:
        names = [m.joint(i).name for i in range(m.njnt)]
        if names[: self.n] != self.platform.channel_names or m.nv != self.n:
            raise WorldError(
                f"{self.platform.robot_model_path()}: joints {names} do not match the "
                f"platform channels {self.platform.channel_names} (same order expected)"
            )

    def _perturb_links(self, m: mujoco.MjModel) -> None:
        scale = np.asarray(self.params.body_mass_scale, dtype=np.float64)
        shift = np.asarray(self.params.body_com_shift, dtype=np.float64)
        if scale.size == 0:
            return
        if scale.shape[0] != m.nbody:
            raise WorldError(
                f"world parameters perturb {scale.shape[0]} bodies, model has {m.nbody}"
            )
        m.body_mass[1:] *= scale[1:]
        m.body_inertia[1:] *= scale[1:, None]
        m.body_ipos[1:] += shift[1:]

    # -- commands -----------------------------------------------------------------------

    def _per_env(self, x, width: int) -> np.ndarray:
        a = np.asarray(x, dtype=np.float64)
        if a.ndim == 1:
            a = np.broadcast_to(a, (self.n_envs, width))
        if a.shape != (self.n_envs, width):
            raise WorldError(f"expected shape ({width},) or ({self.n_envs}, {width}), "
                             f"got {a.shape}")
        return np.array(a)

    def reset(self, q0, temperature=None) -> None:
        """Put every arm at rest at ``q0`` (joint units) with its goal there."""
        q0 = self._per_env(q0, self.n)
        for i, (m, d) in enumerate(zip(self.models, self.datas, strict=True)):
            mujoco.mj_resetData(m, d)
            d.qpos[: self.n] = q0[i]
            mujoco.mj_forward(m, d)
        s = self.servo
        amb = float(self.params.thermal["ambient"])
        s.temperature = (np.full((self.n_envs, self.n), amb) if temperature is None
                         else self._per_env(np.broadcast_to(temperature, (self.n,))
                                            if np.ndim(temperature) == 0 else temperature,
                                            self.n))
        for name in ("integral", "prev_error", "derivative", "current", "tau_cmd", "gap",
                     "rotor_vel", "tau_out"):
            setattr(s, name, np.zeros((self.n_envs, self.n)))
        s.pwm = np.zeros((self.n_envs, self.n), dtype=np.int64)
        s.engaged = np.zeros((self.n_envs, self.n), dtype=bool)
        s.torque_enabled = np.ones((self.n_envs, self.n), dtype=bool)
        self.q, self.qd = q0.copy(), np.zeros_like(q0)
        self.omega_filtered = np.zeros_like(q0)
        if self._pid:
            self._count_ring[:] = s.counts(q0 / self.trans)[None]
        self.bus_voltage[:] = float(self.params.supply["voltage"])
        self.external_force[:] = 0.0
        self.contact_body[:] = -1
        self._touched_before = np.zeros(self.n_envs, dtype=bool)
        self.grasp_jaw[:] = np.nan
        self.carried_kg[:] = 0.0
        if self.protection is not None:
            self.protection.reset()
        self.set_goal(q0)

    def set_goal(self, q_goal) -> None:
        """Goal position in joint units; the register holds whole encoder counts."""
        q = self._per_env(q_goal, self.n)
        if self.params.controller == "joint_impedance":
            self.servo.goal = q / self.trans
        else:
            self.servo.goal_counts = self.servo.counts(q / self.trans)

    def set_goal_counts(self, counts) -> None:
        """Goal Position register values (what a bus write delivers)."""
        self.servo.goal_counts = self._per_env(counts, self.n).astype(np.int64)

    def goal(self) -> np.ndarray:
        """The commanded goal as the servo holds it, in joint units."""
        if self.params.controller == "joint_impedance":
            return self.servo.goal * self.trans
        m = self.motors
        return (self.servo.goal_counts - m["zero_count"]) * (2 * np.pi / m["counts_per_rev"]) \
            * self.trans

    def set_protection(self, protection: Protection | None) -> None:
        """Install firmware protections (:mod:`.protection`) on every motor; None: none."""
        if protection is not None and (protection.n_envs, protection.n) != (self.n_envs, self.n):
            raise WorldError(f"protection is for {protection.n_envs} x {protection.n} motors, "
                             f"the world has {self.n_envs} x {self.n}")
        self.protection = protection

    def set_torque_enabled(self, enabled) -> None:
        e = np.asarray(enabled, dtype=bool)
        self.servo.torque_enabled = np.array(np.broadcast_to(e, (self.n_envs, self.n)))

    def set_external_force(self, force) -> None:
        """Force on the end-effector point [N], base frame, environment on robot."""
        self.external_force = self._per_env(force, 3)

    def set_link_contact(self, body, point, force) -> None:
        """A contact force on any link: ``body`` a body id per arm (-1: none), ``point``
        (n_envs, 3) in that body's frame [m], ``force`` (n_envs, 3) base frame [N].

        Applied on top of the end-effector force, at the point (its moment about the COM).
        """
        b = np.array(np.broadcast_to(np.asarray(body, dtype=np.int64), (self.n_envs,)))
        if ((b < -1) | (b >= self.models[0].nbody)).any():
            raise WorldError(f"contact body ids {b.tolist()} outside "
                             f"-1..{self.models[0].nbody - 1}")
        self.contact_body = b
        self.contact_point = self._per_env(point, 3)
        self.contact_force = self._per_env(force, 3)

    def _apply_link_contact(self, d: mujoco.MjData, i: int) -> None:
        b, f = int(self.contact_body[i]), self.contact_force[i]
        r = d.xpos[b] + d.xmat[b].reshape(3, 3) @ self.contact_point[i] - d.xipos[b]
        d.xfrc_applied[b, :3] += f
        d.xfrc_applied[b, 3:] += np.cross(r, f)

    def set_band(self, enabled, rest=None, channel=None) -> None:
        """Elastic band on ``channel`` (default: the world's band channel; one per arm or
        one for all): spring-damper toward ``rest`` (default: rest_offset from here)."""
        if channel is None:
            if self.params.band["channel"] < 0:
                raise WorldError(f"platform {self.platform.name!r} has no band channel")
            channel = self.params.band["channel"]
        channel = np.array(np.broadcast_to(np.asarray(channel, np.int64), (self.n_envs,)))
        if ((channel < 0) | (channel >= self.n)).any():
            raise WorldError(f"band channel {channel.tolist()} outside 0..{self.n - 1}")
        enabled = np.array(np.broadcast_to(np.asarray(enabled, bool), (self.n_envs,)))
        rows = np.arange(self.n_envs)
        if rest is None:
            rest = self.q[rows, channel] + self.params.band["rest_offset"]
        self.band_rest = np.array(np.broadcast_to(np.asarray(rest, float), (self.n_envs,)))
        self.band_channel = channel
        self.band_enabled = enabled

    def wear_gearbox(self, arms, channel: int, factor: float) -> None:
        """A worn gearbox on motor ``channel`` of the arms ``arms`` (bool mask or indices):
        dry, Stribeck, viscous and load-dependent friction and backlash times ``factor``."""
        if not factor > 0:
            raise WorldError(f"wear factor must be > 0, got {factor!r}")
        mask = np.zeros(self.n_envs, dtype=bool)
        mask[np.asarray(arms)] = True
        p = dict(self.servo.p)
        for key in ("coulomb", "stribeck", "load_friction", "backlash", "viscous"):
            a = np.array(np.broadcast_to(p[key], (self.n_envs, self.n)), dtype=np.float64)
            a[mask, channel] *= factor
            p[key] = a
        self.servo.p = p
        for i in np.flatnonzero(mask):  # viscous friction lives in MuJoCo's joint damping
            self.models[i].dof_damping[channel] = p["viscous"][i, channel] \
                / self.trans[channel] ** 2

    def set_grasp(self, jaw) -> None:
        """An object between the jaws: it stops the gripper closing below ``jaw`` (NaN: none).

        A one-sided stiff spring-damper (``workspace.grasp_stiffness``, ``grasp_damping``)
        on every gripper channel; both grippers close toward lower joint values.
        """
        self.grasp_jaw = np.array(np.broadcast_to(np.asarray(jaw, float), (self.n_envs,)))

    def set_carried(self, mass_kg) -> None:
        """An object of ``mass_kg`` between the jaws that only the gripper holds (0: none).

        The world's two grasp pieces, switched by the jaw itself instead of by a task plan:
        the object stops the jaws at ``workspace.grasp_jaw`` (:meth:`set_grasp`), and its
        weight, -m g along base z at the end effector (as a payload task's
        ``set_external_force``), hangs on every physics step the jaws press it (the grasp's
        depth > 0 on a gripper channel): from the moment they close on it until they open
        past it. ``data synth`` schedules the same two from its plan (:mod:`world.tasks`);
        whoever drives the arm without a plan (the emulator's payload, a leader arm) gets
        the weight exactly while the jaws hold it. It adds to :meth:`set_external_force`.
        A world without an object stop (``grasp_stiffness`` 0, no gripper) cannot feel the
        object: the weight then hangs for as long as it is carried.
        """
        m = np.array(np.broadcast_to(np.asarray(mass_kg, float), (self.n_envs,)))
        if not (np.isfinite(m).all() and (m >= 0).all()):
            raise WorldError(f"carried mass must be finite and >= 0 kg, got {mass_kg}")
        self.carried_kg = m
        stops = self.params.workspace.get("grasp_stiffness", 0.0) > 0 \
            and len(self.platform.gripper_indices) > 0
        jaw = float(self.params.workspace.get("grasp_jaw", np.nan)) if stops else np.nan
        self.set_grasp(np.where(m > 0, jaw, np.nan))

    def _carried_force(self) -> np.ndarray:
        """(n_envs, 3) the carried object's weight on the arms whose jaws hold it now."""
        held = self.carried_kg > 0
        stopped = np.isfinite(self.grasp_jaw)
        if stopped.any():
            g = list(self.platform.gripper_indices)
            pressed = (self.grasp_jaw[:, None] - self.q[:, g] > 0).any(axis=1)
            held &= ~stopped | pressed
        out = np.zeros((self.n_envs, 3))
        out[:, 2] = np.where(held, -self.carried_kg * GRAVITY, 0.0)
        return out

    def _grasp_force(self) -> np.ndarray:
        ws = self.params.workspace
        out = np.zeros((self.n_envs, self.n))
        for g in self.platform.gripper_indices:
            depth = self.grasp_jaw - self.q[:, g]  # > 0: the jaw pressed into the object
            push = ws["grasp_stiffness"] * depth - ws["grasp_damping"] * self.qd[:, g]
            out[:, g] = np.where(depth > 0, np.maximum(push, 0.0), 0.0)  # NaN depth: no object
        return out

    # -- simulation ---------------------------------------------------------------------

    @property
    def time(self) -> float:
        return self.step_count * self.dt

    def step(self, duration: float) -> None:
        """Advance by ``duration`` seconds (rounded to whole physics steps, at least one)."""
        for _ in range(max(1, round(duration / self.dt))):
            self._physics_step()

    def step_until(self, t: float) -> int:
        """Advance to world time ``t`` [s] (for real-time drivers: no rounding drift).

        Returns the number of physics steps taken (0 if ``t`` is not ahead of :attr:`time`).
        """
        steps = max(0, int(np.floor(t / self.dt + 1e-9)) - self.step_count)
        for _ in range(steps):
            self._physics_step()
        return steps

    def _physics_step(self) -> None:
        n, s = self.n, self.servo
        for i, d in enumerate(self.datas):
            self.q[i] = d.qpos[:n]
            self.qd[i] = d.qvel[:n]
        theta = self.q / self.trans
        omega = self.qd / self.trans
        s.step_count = self.step_count
        s.firmware_tick(theta, omega)
        guard = self.protection
        if guard is not None and self._pid:
            s.pwm = guard.limit_pwm(s.pwm, self.motors["pwm_full"])
        tau = s.drive(omega, self.bus_voltage)
        if guard is not None and self._pid:
            # A trip opens the H-bridge from the next step on, as the firmware does.
            s.torque_enabled = guard.update(s.current, s.duty, s.torque_enabled, self.dt)
        joint_force = tau / self.trans
        if self.band_enabled.any():
            j, band = self.band_channel, self.params.band
            rows = np.arange(self.n_envs)
            spring = -band["stiffness"] * (self.q[rows, j] - self.band_rest) \
                - band["damping"] * self.qd[rows, j]
            joint_force[rows, j] += np.where(self.band_enabled, spring, 0.0)
        if np.isfinite(self.grasp_jaw).any():
            joint_force += self._grasp_force()
        friction = s.friction_budget(omega) / self.trans
        ee_force = self.external_force
        if self.carried_kg.any():
            ee_force = ee_force + self._carried_force()
        pushed = np.abs(ee_force).sum(axis=1) > 0
        touched = self.contact_body >= 0
        for i, (m, d) in enumerate(zip(self.models, self.datas, strict=True)):
            m.dof_frictionloss[:n] = friction[i]
            d.qfrc_applied[:n] = joint_force[i]
            if pushed[i]:
                self._apply_ee_force(d, ee_force[i])
            else:
                d.xfrc_applied[self.ee_body] = 0.0
            if touched[i] or self._touched_before[i]:
                # Clear the last contact's body (the EE body was just rewritten above).
                for b in range(1, m.nbody):
                    if b != self.ee_body:
                        d.xfrc_applied[b] = 0.0
                if touched[i]:
                    self._apply_link_contact(d, i)
            mujoco.mj_step(m, d)
        self._touched_before = touched
        s.heat(float(self.params.thermal["ambient"]))
        sup = self.params.supply
        draw = sup["quiescent_current"] + s.supply_current()
        self.bus_voltage[:, 0] = sup["voltage"] - sup["source_resistance"] * draw
        self._update_velocity_estimates(theta, omega)
        self.step_count += 1

    def _apply_ee_force(self, d: mujoco.MjData, f: np.ndarray) -> None:
        b = self.ee_body
        r = d.xpos[b] + d.xmat[b].reshape(3, 3) @ self.ee_offset - d.xipos[b]
        # Moment of f about the body COM (where xfrc_applied acts); np.cross is slow here.
        d.xfrc_applied[b] = (f[0], f[1], f[2], r[1] * f[2] - r[2] * f[1],
                             r[2] * f[0] - r[0] * f[2], r[0] * f[1] - r[1] * f[0])

    def _update_velocity_estimates(self, theta: np.ndarray, omega: np.ndarray) -> None:
        tau = self.motors.get("velocity_filter", np.zeros(self.n))
        alpha = self.dt / (tau + self.dt)
        self.omega_filtered += alpha * (omega - self.omega_filtered)
        if self._pid:
            self._count_ring[self.step_count % self._count_ring.shape[0]] = self.servo.counts(theta)

    # -- telemetry ----------------------------------------------------------------------

    def joint_positions(self) -> np.ndarray:
        """The exact joint positions (n_envs, n) in joint units, unquantised: the hidden truth
        the encoders read (``telemetry()["q"]`` is this, quantised) and a camera sees."""
        return np.stack([d.qpos[:self.n] for d in self.datas])

    def ee_position(self) -> np.ndarray:
        out = np.zeros((self.n_envs, 3))
        b = self.ee_body
        for i, d in enumerate(self.datas):
            out[i] = d.xpos[b] + d.xmat[b].reshape(3, 3) @ self.ee_offset
        return out

    def _servo_view(self) -> dict[str, np.ndarray]:
        n, s = self.n, self.servo
        q = np.stack([d.qpos[:n] for d in self.datas])
        theta = q / self.trans
        counts = s.counts(theta) if self._pid else np.zeros(theta.shape, dtype=np.int64)
        oldest = self._count_ring[(self.step_count) % self._count_ring.shape[0]]
        return {
            "theta": theta,
            "counts": counts,
            # The firmware divides by its own nominal window (20 ms on the STS3215), which
            # is why Present_Velocity comes in whole multiples of 50 steps/s.
            "count_rate": (counts - oldest) / float(self.params.sensors["velocity_window"]),
            "omega": (self.omega_filtered if self.params.controller == "position_pid"
                      else np.stack([d.qvel[:n] for d in self.datas]) / self.trans),
            "current": s.current,
            "pwm": s.pwm,
            "duty": s.duty,
            "tau_cmd": s.tau_cmd,
            "voltage": np.broadcast_to(self.bus_voltage, counts.shape),
            "temperature": (s.temperature if self.params.controller == "position_pid"
                            else np.full(counts.shape, float(self.params.thermal["ambient"]))),
        }

    def _draw_noise(self) -> dict[str, np.ndarray]:
        """Standard-normal and uniform draws for one bus read, arm by arm."""
        normal = np.stack([r.standard_normal((3, self.n)) for r in self.rngs], axis=1)
        uniform = np.stack([r.random((2, self.n)) for r in self.rngs], axis=1)
        return {"voltage": normal[0], "current": normal[1], "torque": normal[2],
                "glitch": uniform[0], "glitch_level": uniform[1]}

    def telemetry(self) -> dict[str, np.ndarray]:
        """One bus read of every motor: Contract-1 channels in SI, (n_envs, n) each.

        Keys: q, qd, effort (the platform's effort signal), voltage, temperature, pwm,
        current (NaN where the servo has no such register), plus ``torque_true`` and
        ``current_true`` (the hidden, unquantised values, for tests and diagnostics).
        """
        regs, si = quantize(self.params.registers, self._servo_view(), self.motors,
                            self.params.sensors, self._draw_noise())
        self.last_registers = regs
        effort = {"current": si["current"], "load": si["load"], "torque": si["torque"],
                  "pwm": si["pwm"]}[self.platform.effort_signal]
        return {
            "q": si["q_servo"] * self.trans,
            "qd": si["qd_servo"] * self.trans,
            "effort": effort,
            "voltage": si["voltage"],
            "temperature": si["temperature"],
            "pwm": si["pwm"],
            "current": si["current"],
            "torque_true": self.servo.tau_out / self.trans,
            "current_true": self.servo.current.copy(),
        }

    def read_registers(self, env: int = 0) -> list[dict[str, int]]:
        """Raw register values of every motor of arm ``env`` (a fresh bus read)."""
        self.telemetry()
        goal = self.servo.goal_counts if self.params.controller == "position_pid" else None
        out = []
        for j in range(self.n):
            r = {k: int(v[env, j]) for k, v in self.last_registers.items()}
            r["torque_enable"] = int(self.servo.torque_enabled[env, j])
            if goal is not None:
                r["goal_position"] = int(goal[env, j])
            out.append(r)
        return out


def _copy_model(m: mujoco.MjModel) -> mujoco.MjModel:
    import copy

    return copy.deepcopy(m)
