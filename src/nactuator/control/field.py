"""A learned Jacobian field J_θ(observation): the Neural Jacobian Fields recipe on world
point tracks.

Self-supervised, as the seed fits its field: at random poses near a start pose, random
small command perturbations δu are sent and held ``horizon`` control steps, and the
tracked point's motion Δx (the world's own end-effector, plus Gaussian track noise) is
recorded; a small MLP maps the observation to a 3 × n_u Jacobian and is fitted by
``‖J_θ(obs) δu − Δx‖²``. Nothing of the world's model is read: only commands in, point
tracks and servo telemetry out.

The observation (:data:`OBSERVATIONS`, stored in the file) is the measured joints ``q``
(always; as sin q, cos q) and optionally what a servo reports about its load: ``effort``
(the platform's effort signal, Present_Load on the STS3215) and ``error`` (q_cmd − q: a
loaded arm sags below its command). A joints-only field cannot tell a loaded arm from an
empty one; the extra inputs are recorded at the settled pose before each perturbation
(as a tracking tick reads them before it decides) and normalised by statistics of the
fit's training split, stored in the file. With ``prior="fk"`` the field learns only a
correction to rigid FK, J = J_FK(q) + ΔJ_θ(obs), so the geometry it need not learn is
given; with ``prior="fk_scale"`` only a bounded gain per joint column,
J = J_FK(q) · diag(1 + ½ tanh c_θ(obs)), so FK's directions are kept (the residual
designs, docs/tracking.md). A ``signed`` field has one set of columns for a command step
up and one for a step down: the world's servos answer the two differently (gravity and
friction; a linear J explains ~0.7 of Δx's variance, one per sign ~0.95), and the loop
solves for a step whose signs match the columns it used (``control.track``).

``nactuator field fit`` collects (at one or several payloads), fits and saves a field file
(:func:`save_field`: weights, sizes, observation, normalisation; loaded with
``weights_only=True`` so a file runs no code); ``nactuator track --method field --field
FILE`` tracks with it. Files of format 1 (joints only) still load and give the same J.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from nactuator.atomic import atomic_path
from nactuator.constants import GRAVITY
from nactuator.errors import UserError
from nactuator.platforms import Platform

__all__ = ["FIELD_FORMAT", "OBSERVATIONS", "PRIORS", "JacobianField", "collect_perturbations",
           "fit_field", "fk_priors", "load_field", "save_field"]

FIELD_FORMAT = "nactuator-jacobian-field/2"
_OLD_FORMATS = ("nactuator-jacobian-field/1",)  # joints only, no prior: still loaded
OBSERVATIONS = ("q", "effort", "error")  # what the field may read; "q" always first
PRIORS = ("none", "fk", "fk_scale")
SCALE_BOUND = 0.5  # fk_scale: each FK column scaled by 1 ± at most this
CLIP = 3.0  # normalised extra inputs are clipped to ±CLIP (JacobianField.forward)


def _check_observation(observation: Sequence[str]) -> tuple[str, ...]:
    obs = tuple(observation)
    unknown = [o for o in obs if o not in OBSERVATIONS]
    if unknown or not obs or obs[0] != "q" or len(set(obs)) != len(obs):
        raise UserError(f"field observation {list(obs)}: expected 'q' first, then any of "
                        f"{list(OBSERVATIONS[1:])} once each")
    return obs


def collect_perturbations(platform: Platform, q0: np.ndarray, joints: list[int], poses: int,
                          per_pose: int, horizon: int, spread: float = 0.3,
                          delta: float = 0.04, noise: float = 0.0005,
                          payload_kg: float | Sequence[float] = 0.0,
                          world: str | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """``poses × per_pose`` world arms per payload, run in lock-step, each settled at its
    pose (its payload hung), then its command stepped by δu and held ``horizon`` steps.

    Returns (N = payloads × poses × per_pose rows): ``q`` (N, n) settled joints, ``effort``
    (N, n) and ``error`` (N, n: command − joints) read there, ``du`` (N, k), ``dx`` (N, 3)
    with track noise, and ``payload_g`` (N,) (for reports; the field never reads it)."""
    from nactuator.world import World, load_world

    payloads = np.atleast_1d(np.asarray(payload_kg, float))
    rng = np.random.default_rng(seed)
    k = len(joints)
    # One block of `poses` random poses per payload (the same draw order as one payload
    # always had, so a one-payload collection is unchanged).
    base = np.repeat(np.asarray(q0, float)[None], poses * len(payloads), axis=0)
    base[:, joints] += rng.uniform(-spread, spread, (len(base), k))
    start = np.repeat(base, per_pose, axis=0)
    mass = np.repeat(payloads, poses * per_pose)
    du = rng.uniform(-delta, delta, (len(start), k))
    w = World(platform, load_world(platform, world, seed), seed=seed, n_envs=len(start))
    w.reset(start)
    force = np.zeros((len(start), 3))
    force[:, 2] = -GRAVITY * mass
    w.set_external_force(force)
    w.step(float(w.params.physics["settle_seconds"]))
    tel = w.telemetry()  # the observation the field is conditioned on, as a bus reads it
    q = tel["q"]
    error = w.goal() - q  # read before the step: after it, it would carry δu itself
    x0 = w.ee_position()
    goal = start.copy()
    goal[:, joints] += du
    for _ in range(horizon):
        w.set_goal(goal)
        w.step(platform.control_dt)
    dx = w.ee_position() - x0 + noise * rng.standard_normal(x0.shape)
    return {"q": q, "effort": tel["effort"], "error": error, "du": du, "dx": dx,
            "payload_g": 1000.0 * mass}


def fk_priors(kinematics, q: np.ndarray) -> np.ndarray:
    """(N, 3, n) rigid-FK dx/dq of the end-effector at each row of ``q`` (N, n): the prior
    of a residual field (``prior="fk"``), as the kinematic loop computes it."""
    from .jacobian import Points, kinematic_jacobian

    points = Points.end_effector(kinematics)
    return np.stack([kinematic_jacobian(kinematics, points, qi)[1] for qi in np.asarray(q)])


class JacobianField(torch.nn.Module):
    """J_θ(obs): (B, n) joints [+ (B, n) effort, (B, n) error] -> (B, 3, k) Jacobian of the
    tracked point: the net's own (``prior == "none"``), rigid FK's plus a correction
    (``"fk"``), or rigid FK's columns each scaled by a bounded factor (``"fk_scale"``)."""

    def __init__(self, n: int, joints: list[int], hidden: int = 64,
                 observation: Sequence[str] = ("q",), norm: dict | None = None,
                 prior: str = "none", signed: bool = False) -> None:
        super().__init__()
        self.n, self.hidden = n, hidden
        self.signed = bool(signed)
        self.joints = list(joints)
        self.observation = _check_observation(observation)
        if prior not in PRIORS:
            raise UserError(f"field prior {prior!r}: expected one of {list(PRIORS)}")
        self.prior = prior
        extra = self.observation[1:]
        norm = norm or {}
        missing = [o for o in extra if o not in norm]
        if missing:
            raise ValueError(f"field inputs {missing} need normalisation statistics")
        # Plain lists in the file; tensors here (fixed, not trained).
        self.norm = {o: {"mean": [float(v) for v in norm[o]["mean"]],
                         "std": [float(v) for v in norm[o]["std"]]} for o in extra}
        self._mean = {o: torch.tensor(self.norm[o]["mean"], dtype=torch.float32) for o in extra}
        self._std = {o: torch.tensor(self.norm[o]["std"], dtype=torch.float32) for o in extra}
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2 * n + n * len(extra), hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, (2 if self.signed else 1)
                            * (len(joints) if prior == "fk_scale" else 3 * len(joints))))
        if prior != "none":
            # The correction starts at zero: an unfitted residual field is rigid FK.
            torch.nn.init.zeros_(self.net[-1].weight)
            torch.nn.init.zeros_(self.net[-1].bias)

    def forward(self, q: torch.Tensor, extra: dict[str, torch.Tensor] | None = None,
                prior: torch.Tensor | None = None) -> torch.Tensor:
        """``extra[name]`` (B, n) raw for each observation beyond q; ``prior`` (B, 3, k)
        the rigid-FK columns of the controlled joints (residual priors only). Returns
        (B, 3, k), or for a signed field (B, 2, 3, k): the columns for a command step up
        (index 0) and down (index 1)."""
        features = [torch.sin(q), torch.cos(q)]  # joint angles are periodic
        for o in self.observation[1:]:
            # Clipped to ±CLIP std: a loop can read effort or lag far outside what the
            # collection saw (a joint at rest there, driven here); the field then answers
            # at the edge of its data instead of extrapolating a tanh net.
            z = (extra[o] - self._mean[o]) / self._std[o]
            features.append(z.clamp(-CLIP, CLIP))
        k = len(self.joints)
        out = self.net(torch.cat(features, -1)).reshape(len(q), 2 if self.signed else 1, -1)
        if self.prior == "none":
            J = out.reshape(len(q), -1, 3, k)
        elif prior is None:
            raise ValueError(f"a residual field (prior {self.prior!r}) needs the rigid-FK prior")
        elif self.prior == "fk_scale":
            # Rigid FK's directions kept, each joint's column scaled within 1 ± SCALE_BOUND:
            # whatever the observation reads, the step cannot turn against FK.
            J = prior[:, None] * (1.0 + SCALE_BOUND * torch.tanh(out))[:, :, None, :]
        else:
            J = prior[:, None] + out.reshape(len(q), -1, 3, k)
        return J if self.signed else J[:, 0]

    def predict(self, J: torch.Tensor, du: torch.Tensor) -> torch.Tensor:
        """Δx (B, 3) of command steps ``du`` (B, k) from :meth:`forward`'s J: a signed
        field takes each joint's column for the sign of its step (gravity and friction make
        a servo answer a step up and a step down differently)."""
        if self.signed:
            J = torch.where((du >= 0)[:, None, :], J[:, 0], J[:, 1])
        return torch.einsum("bij,bj->bi", J, du)

    def jacobian(self, q: np.ndarray, n: int, effort: np.ndarray | None = None,
                 q_cmd: np.ndarray | None = None, prior: np.ndarray | None = None
                 ) -> np.ndarray:
        """(3, n) at one measured ``q``, zero in the columns it does not control. A field
        that reads ``effort`` or ``error`` needs the servo's effort and the command now
        held (error = q_cmd − q); ``prior`` (3, n) is rigid FK's dx/dq at ``q`` for a
        residual field. A signed field gives the mean of its up and down columns (what
        a central difference measures)."""
        return self.jacobians(q, n, effort, q_cmd, prior).mean(0)

    def jacobians(self, q: np.ndarray, n: int, effort: np.ndarray | None = None,
                  q_cmd: np.ndarray | None = None, prior: np.ndarray | None = None
                  ) -> np.ndarray:
        """(2, 3, n): the columns for a step up and for a step down (the same twice for a
        field that is not signed); arguments as :meth:`jacobian`."""
        q = np.asarray(q, np.float64)
        extra = {}
        for o in self.observation[1:]:
            value = effort if o == "effort" else (None if q_cmd is None else
                                                  np.asarray(q_cmd, np.float64) - q)
            if value is None:
                raise UserError(f"this Jacobian field reads {o!r}: the plant must report "
                                f"{'effort' if o == 'effort' else 'the command'}")
            extra[o] = torch.tensor(np.asarray(value, np.float32)[None])
        pri = None
        if self.prior != "none":
            if prior is None:
                raise ValueError(f"a residual field (prior {self.prior!r}) needs the "
                                 "rigid-FK prior")
            pri = torch.tensor(np.asarray(prior, np.float32)[None][:, :, self.joints])
        with torch.no_grad():
            J = self(torch.tensor(q.astype(np.float32)[None]), extra, pri)[0].numpy()
        out = np.zeros((2, 3, n))
        out[:, :, self.joints] = J
        return out


def _norm_stats(data: dict[str, np.ndarray], names: Sequence[str], rows: np.ndarray) -> dict:
    """Per-motor mean and std of each extra input on the training rows; a channel that
    does not vary (the gripper at rest) gets std 1 rather than a division by ~0."""
    out = {}
    for o in names:
        x = np.asarray(data[o], np.float64)[rows]
        std = x.std(0)
        out[o] = {"mean": x.mean(0).tolist(),
                  "std": np.where(std > 1e-6, std, 1.0).tolist()}
    return out


def fit_field(data: dict[str, np.ndarray], n: int, joints: list[int], steps: int = 3000,
              lr: float = 3e-3, seed: int = 0, observation: Sequence[str] = ("q",),
              prior: str = "none", priors: np.ndarray | None = None, signed: bool = False
              ) -> tuple[JacobianField, dict[str, float]]:
    """Fit by full-batch Adam on ‖J_θ(obs) δu − Δx‖²; reports the fit on a 20 % hold-out.

    ``priors`` (N, 3, n): rigid FK at each sample's q (:func:`fk_priors`), needed with
    ``prior="fk"`` or ``"fk_scale"``. The extra inputs are normalised by their
    training-split statistics."""
    observation = _check_observation(observation)
    torch.manual_seed(seed)
    q = torch.tensor(data["q"], dtype=torch.float32)
    du = torch.tensor(data["du"], dtype=torch.float32)
    dx = torch.tensor(data["dx"], dtype=torch.float32)
    order = torch.randperm(len(q))
    cut = int(0.8 * len(q))
    tr, te = order[:cut], order[cut:]
    extra = {o: torch.tensor(np.asarray(data[o]), dtype=torch.float32)
             for o in observation[1:]}
    pri = None
    if prior != "none":
        if priors is None:
            raise ValueError(f"fit_field(prior={prior!r}) needs the rigid-FK priors (fk_priors)")
        pri = torch.tensor(np.asarray(priors)[:, :, joints], dtype=torch.float32)
    field = JacobianField(n, joints, observation=observation,
                          norm=_norm_stats(data, observation[1:], tr.numpy()), prior=prior,
                          signed=signed)
    opt = torch.optim.Adam(field.parameters(), lr=lr)

    def loss(idx: torch.Tensor) -> torch.Tensor:
        J = field(q[idx], {o: v[idx] for o, v in extra.items()},
                  None if pri is None else pri[idx])
        pred = field.predict(J, du[idx])
        return ((pred - dx[idx]) ** 2).sum(-1).mean()

    for _ in range(steps):
        opt.zero_grad()
        value = loss(tr)
        value.backward()
        opt.step()
    field.eval()
    with torch.no_grad():
        held = float(loss(te))
        zero = float((dx[te] ** 2).sum(-1).mean())
    return field, {"train_mse": float(value.detach()), "heldout_mse": held,
                   "heldout_r2": 1.0 - held / zero, "samples": len(q)}


def save_field(path: str | os.PathLike, field: JacobianField, platform: str,
               info: dict) -> Path:
    """One file: the format tag, the platform, the sizes, the observation and its
    normalisation, the prior, the weights and ``info`` (how it was collected and how well
    it fits; plain numbers and strings)."""
    path = Path(path)
    payload = {"format": FIELD_FORMAT, "platform": platform, "n": field.n,
               "joints": field.joints, "hidden": field.hidden,
               "observation": list(field.observation), "norm": field.norm,
               "prior": field.prior, "signed": field.signed,
               "state_dict": field.state_dict(), "info": info}
    with atomic_path(path, suffix=".pt") as tmp:
        torch.save(payload, tmp)
    return path


def load_field(path: str | os.PathLike, expect_platform: str | None = None) -> JacobianField:
    """A field saved by :func:`save_field` (or a format-1, joints-only file); a clear
    error for anything else."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--field {path}: no such file (make one with `nactuator field fit`)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated file, a pickle with code, not a torch file
        raise UserError(f"--field {path}: not a Jacobian field file ({exc})") from exc
    fmt = payload.get("format") if isinstance(payload, dict) else None
    if fmt != FIELD_FORMAT and fmt not in _OLD_FORMATS:
        found = fmt if isinstance(payload, dict) else type(payload).__name__
        raise UserError(f"--field {path}: not a Jacobian field file (expected format "
                        f"{FIELD_FORMAT!r}, found {found!r})")
    if expect_platform is not None and payload["platform"] != expect_platform:
        raise UserError(f"--field {path} was fitted on {payload['platform']!r}, not "
                        f"{expect_platform!r}")
    # Format 1 had neither observation nor prior: the joints only, no prior.
    field = JacobianField(int(payload["n"]), [int(j) for j in payload["joints"]],
                          int(payload["hidden"]),
                          observation=payload.get("observation", ("q",)),
                          norm=payload.get("norm"), prior=payload.get("prior", "none"),
                          signed=bool(payload.get("signed", False)))
    field.load_state_dict(payload["state_dict"])
    field.info = dict(payload.get("info", {}))
    field.format = fmt
    return field.eval()
