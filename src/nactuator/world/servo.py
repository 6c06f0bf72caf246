"""The hidden servo: firmware position loop -> PWM -> DC motor -> current limit -> gearbox.

Everything here is vectorised over ``(n_envs, n_motors)`` arrays and uses output-shaft units
(rad, rad/s, N*m); :mod:`nactuator.world.world` converts to joint units and talks to MuJoCo.

Signal chain of one motor (``position_pid``, DYNAMIXEL/Feetech style):

1. firmware tick (its own rate): error e = goal - position in encoder counts;
   PWM = kp/kp_div * e + ki/ki_div * sum(e) + kd/kd_div * de/tick, clipped to the PWM limit;
2. H-bridge: applied voltage = duty * bus voltage (duty = PWM / pwm_full);
3. DC motor: i = (V - ke * omega_motor) / R(T), clipped to the current limit; motor torque
   kt(T) * i; through the gearbox: tau_out = efficiency * ratio * kt(T) * i;
4. backlash: the rotor (reflected inertia) crosses the gear play freely before it drives the
   output again; while crossing, no torque reaches the joint;
5. gearbox friction (Coulomb + Stribeck + load-dependent) is handed to MuJoCo as the joint's
   ``frictionloss`` (a constraint: proper stiction), viscous friction as joint damping;
6. thermal: C dT/dt = i^2 R(T) - (T - T_ambient) / R_th; R(T) = R25 (1 + a_R (T - 25)),
   kt(T) = kt25 (1 + a_kt (T - 25)).

``joint_impedance`` (Franka) replaces 1-3 with tau = kp e - kd qd clipped to the torque limit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ServoBank", "T_REF"]

T_REF = 25.0  # degC at which resistance and kt are specified


class ServoBank:
    """Servo firmware and motor state for ``n_envs`` arms of ``n`` motors each."""

    def __init__(self, motors: dict[str, np.ndarray], controller: str, n_envs: int,
                 physics_dt: float) -> None:
        self.p = motors  # key -> (n,) float arrays
        self.controller = controller
        self.n_envs = n_envs
        self.n = len(next(iter(motors.values())))
        self.dt = physics_dt
        # Firmware period as a whole number of physics steps (at least one).
        hz = motors["firmware_hz"]
        self.firmware_every = np.maximum(1, np.round(1.0 / (hz * physics_dt))).astype(np.int64)
        shape = (n_envs, self.n)
        self.torque_enabled = np.ones(shape, dtype=bool)
        self.goal_counts = np.zeros(shape, dtype=np.int64)  # pid: encoder counts
        self.goal = np.zeros(shape)  # impedance: rad
        self.pwm = np.zeros(shape, dtype=np.int64)  # firmware output [PWM counts]
        self.integral = np.zeros(shape)
        self.prev_error = np.zeros(shape)
        self.derivative = np.zeros(shape)
        self.current = np.zeros(shape)  # A
        self.tau_cmd = np.zeros(shape)  # impedance: commanded torque
        self.temperature = np.full(shape, T_REF)
        self.gap = np.zeros(shape)  # backlash: rotor minus output angle [rad]
        self.rotor_vel = np.zeros(shape)  # rotor speed referred to the output [rad/s]
        self.engaged = np.ones(shape, dtype=bool)
        self.tau_out = np.zeros(shape)  # torque delivered to the joint [N*m]
        self.step_count = 0
        if controller == "position_pid":
            self.armature = motors["rotor_inertia"] * motors["gear_ratio"] ** 2
        else:
            self.armature = motors["armature"]

    # -- firmware ---------------------------------------------------------------------

    def counts(self, theta: np.ndarray) -> np.ndarray:
        """Encoder reading (integer counts) of output angles ``theta`` [rad]."""
        cpr = self.p["counts_per_rev"]
        return np.floor(theta * cpr / (2 * np.pi) + self.p["zero_count"] + 0.5).astype(np.int64)

    def firmware_tick(self, theta: np.ndarray, omega: np.ndarray) -> None:
        """Run the position loop on the motors whose firmware period ends this physics step."""
        due = (self.step_count % self.firmware_every) == 0  # (n,)
        if not due.any():
            return
        p = self.p
        if self.controller == "joint_impedance":
            tau = p["kp"] * (self.goal - theta) - p["kd"] * omega
            tau = np.clip(tau, -p["torque_limit"], p["torque_limit"])
            tau = np.where(self.torque_enabled, tau, 0.0)
            self.tau_cmd = np.where(due, tau, self.tau_cmd)
            return
        error = (self.goal_counts - self.counts(theta)).astype(np.float64)
        # The derivative is low-pass filtered as the firmware's velocity estimate is;
        # a raw one-count difference per tick would be pure quantisation noise.
        tick = self.firmware_every * self.dt
        alpha = tick / (p["velocity_filter"] + tick)
        raw_d = error - self.prev_error
        derivative = self.derivative + alpha * (raw_d - self.derivative)
        integral = np.clip(self.integral + error,
                           -p["integral_limit"] * p["ki_divisor"] / np.maximum(p["ki"], 1e-12),
                           p["integral_limit"] * p["ki_divisor"] / np.maximum(p["ki"], 1e-12))
        out = (p["kp"] / p["kp_divisor"] * error
               + p["ki"] / p["ki_divisor"] * integral
               + p["kd"] / p["kd_divisor"] * derivative)
        pwm = np.clip(np.round(out), -p["pwm_limit"], p["pwm_limit"]).astype(np.int64)
        on = self.torque_enabled
        pwm = np.where(on, pwm, 0)
        integral = np.where(on, integral, 0.0)
        self.pwm = np.where(due, pwm, self.pwm)
        self.integral = np.where(due, integral, self.integral)
        self.derivative = np.where(due, derivative, self.derivative)
        self.prev_error = np.where(due, error, self.prev_error)

    @property
    def duty(self) -> np.ndarray:
        if self.controller == "joint_impedance":
            return np.full_like(self.tau_cmd, np.nan)
        return self.pwm / self.p["pwm_full"]

    # -- motor + gearbox ----------------------------------------------------------------

    def resistance(self) -> np.ndarray:
        return self.p["resistance"] * (1.0 + self.p["resistance_temp_coeff"]
                                       * (self.temperature - T_REF))

    def kt_motor(self) -> np.ndarray:
        return self.p["kt_motor"] * (1.0 + self.p["kt_temp_coeff"] * (self.temperature - T_REF))

    def drive(self, omega: np.ndarray, bus_voltage: np.ndarray) -> np.ndarray:
        """Advance motor, current limit and backlash by one physics step.

        ``omega``: output-shaft speed (n_envs, n); ``bus_voltage``: (n_envs, 1).
        Returns the torque the gearbox delivers to the joints [N*m].
        """
        p = self.p
        if self.controller == "joint_impedance":
            tau_motor = self.tau_cmd
            self.current = np.full_like(tau_motor, np.nan)
        else:
            ratio = p["gear_ratio"]
            kt = self.kt_motor()
            rotor = np.where(self.engaged, omega, self.rotor_vel)
            volts = self.duty * bus_voltage
            current = (volts - kt * ratio * rotor) / self.resistance()
            current = np.clip(current, -p["current_limit"], p["current_limit"])
            # Torque off = H-bridge open: no current, so no back-EMF braking either.
            self.current = np.where(self.torque_enabled, current, 0.0)
            tau_motor = p["efficiency"] * ratio * kt * self.current
        return self._backlash(tau_motor, omega)

    def _backlash(self, tau_motor: np.ndarray, omega: np.ndarray) -> np.ndarray:
        half = 0.5 * self.p["backlash"]
        if not (half > 0).any():
            self.tau_out = tau_motor
            return tau_motor
        side = np.sign(self.gap)
        # Engaged and pushing into the tooth it touches: rigid, torque goes through.
        pushing = self.engaged & (np.sign(tau_motor) == side) & (half > 0)
        stay = pushing | (half <= 0)
        leaving = self.engaged & ~stay
        self.rotor_vel = np.where(leaving, omega, self.rotor_vel)
        free = ~stay
        # Free rotor: accelerated by the motor torque alone through the play.
        armature = np.maximum(self.armature, 1e-9)
        rotor_vel = self.rotor_vel + self.dt * tau_motor / armature
        gap = self.gap + self.dt * (rotor_vel - omega)
        hit = free & (np.abs(gap) >= half)
        gap = np.clip(gap, -half, half)
        self.gap = np.where(free, gap, self.gap)
        # Inelastic tooth impact: the rotor takes the output's speed, then drives it.
        self.rotor_vel = np.where(free & ~hit, rotor_vel, omega)
        self.engaged = stay | hit
        self.tau_out = np.where(self.engaged, tau_motor, 0.0)
        return self.tau_out

    def friction_budget(self, omega: np.ndarray) -> np.ndarray:
        """Dry friction level [N*m] for MuJoCo's frictionloss: Coulomb + Stribeck + load."""
        p = self.p
        stribeck = p["stribeck"] * np.exp(-((omega / p["stribeck_velocity"]) ** 2))
        return p["coulomb"] + stribeck + p["load_friction"] * np.abs(self.tau_out)

    # -- thermal --------------------------------------------------------------------------

    def heat(self, ambient: float) -> None:
        if self.controller == "joint_impedance":
            return
        p = self.p
        power = self.current**2 * self.resistance()
        cooling = (self.temperature - ambient) / p["thermal_resistance"]
        self.temperature = self.temperature + self.dt * (power - cooling) / p["thermal_capacity"]

    def supply_current(self) -> np.ndarray:
        """Current each motor draws from the bus (H-bridge: duty * motor current) (n_envs,)."""
        if self.controller == "joint_impedance":
            return np.zeros(self.n_envs)
        return (self.duty * self.current).sum(axis=1)
