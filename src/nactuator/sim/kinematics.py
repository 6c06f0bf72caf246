"""Differentiable forward kinematics in torch, read from the Newton model's joint frames.

Newton places a child body at ``X_world_child = X_world_parent * X_p * X_joint(q) * X_c^-1``
where ``X_p``/``X_c`` are the joint's frames in parent and child, and ``X_joint`` is a
rotation about (revolute) or a translation along (prismatic) the joint axis, expressed in the
``X_p`` frame. Re-doing that chain in torch gives the end-effector point and its Jacobian
with autograd for free, so an external force can enter the simulator as ``J_v(q)^T f``
without touching Newton's ``body_f`` adjoint (physics.md §5).
"""

from __future__ import annotations

import numpy as np
import torch

from nactuator.constants import GRAVITY

__all__ = ["ChainKinematics"]

_REVOLUTE, _PRISMATIC = 1, 0  # newton.JointType values, kept local so this file needs no newton
_GRAVITY = (0.0, 0.0, -GRAVITY)


def _quat_xyzw_to_matrix(q: np.ndarray) -> np.ndarray:
    x, y, z, w = (float(v) for v in q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def _axis_angle(axis: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Rodrigues: (3,) unit axis, (B,) angles -> (B, 3, 3)."""
    x, y, z = axis
    k = torch.stack([torch.stack([0 * x, -z, y]), torch.stack([z, 0 * x, -x]),
                     torch.stack([-y, x, 0 * x])])
    s, c = torch.sin(angle)[:, None, None], torch.cos(angle)[:, None, None]
    eye = torch.eye(3, dtype=angle.dtype, device=angle.device)
    return eye + s * k + (1 - c) * (k @ k)


class ChainKinematics(torch.nn.Module):
    """Forward kinematics, end-effector Jacobian, gravity torque and joint inertia in torch.

    Built once from the first replica's joint frames (``builder.joint_arrays``); every method
    takes ``q`` of shape (B, n) in any float dtype and device and is differentiable.
    """

    def __init__(self, arrays: dict[str, np.ndarray], kinds: list[str], armature: list[float],
                 ee_body: int, ee_offset: tuple[float, float, float]) -> None:
        super().__init__()
        n = len(kinds)
        self.n = n
        self.kinds = list(kinds)
        self.joint_parent = [int(v) for v in arrays["joint_parent"]]
        self.joint_child = [int(v) for v in arrays["joint_child"]]
        if sorted(self.joint_child) != list(range(n)):
            raise ValueError(f"expected one child body per joint, got children {self.joint_child}")
        # Parent joint of each body, so ancestors can be walked from the end effector.
        self._body_joint = {c: j for j, c in enumerate(self.joint_child)}

        def frames(key: str) -> tuple[torch.Tensor, torch.Tensor]:
            x = arrays[key]
            rot = np.stack([_quat_xyzw_to_matrix(t[3:7]) for t in x])
            f64 = torch.float64
            return torch.tensor(rot, dtype=f64), torch.tensor(x[:, :3], dtype=f64)

        rp, pp = frames("joint_X_p")
        rc, pc = frames("joint_X_c")
        # Store X_c^-1 directly: R^T, -R^T p.
        rc_inv = rc.transpose(1, 2)
        pc_inv = -(rc_inv @ pc[:, :, None])[:, :, 0]
        nb = n
        inertia = np.asarray(arrays["body_inertia"][:nb], dtype=np.float64).reshape(nb, 3, 3)
        self.register_buffer("rot_p", rp)
        self.register_buffer("pos_p", pp)
        self.register_buffer("rot_c_inv", rc_inv)
        self.register_buffer("pos_c_inv", pc_inv)
        self.register_buffer("axis", torch.tensor(arrays["joint_axis"][:n], dtype=torch.float64))
        self.register_buffer("body_mass",
                             torch.tensor(arrays["body_mass"][:nb], dtype=torch.float64))
        self.register_buffer("body_com", torch.tensor(arrays["body_com"][:nb], dtype=torch.float64))
        self.register_buffer("body_inertia", torch.tensor(inertia))
        self.register_buffer("armature", torch.tensor(armature, dtype=torch.float64))
        self.register_buffer("ee_offset", torch.tensor(ee_offset, dtype=torch.float64))
        self.register_buffer("gravity", torch.tensor(_GRAVITY, dtype=torch.float64))
        self.ee_body = ee_body
        self.ee_ancestors = self._ancestors(ee_body)
        # (body, joint): the joint moves the body (its ancestors), for point_torque
        self.register_buffer("_moved_by", torch.tensor(
            [[j in self._ancestors(k) for j in range(n)] for k in range(n)]), persistent=False)

    def _ancestors(self, body: int) -> list[int]:
        joints = []
        while body >= 0:
            j = self._body_joint[body]
            joints.append(j)
            body = self.joint_parent[j]
        return sorted(joints)

    def _subtree(self, joint: int) -> list[int]:
        """Bodies moved by ``joint``."""
        return [b for b in range(self.n) if joint in self._ancestors(b)]

    def _check(self, q: torch.Tensor) -> None:
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
        if q.ndim != 2 or q.shape[1] != self.n:
            raise ValueError(f"q must have shape (B, {self.n}), got {tuple(q.shape)}")
        if not q.is_floating_point():
            raise TypeError(f"q must be a floating-point tensor, got {q.dtype}")

    def frames(self, q: torch.Tensor) -> dict[str, torch.Tensor]:
        """World poses of bodies and joint frames: rotations (B, n, 3, 3), positions (B, n, 3)
        and joint axes in world (B, n, 3)."""
        self._check(q)
        dt, dev = q.dtype, q.device
        rp, pp = self.rot_p.to(dev, dt), self.pos_p.to(dev, dt)
        rci, pci = self.rot_c_inv.to(dev, dt), self.pos_c_inv.to(dev, dt)
        axis = self.axis.to(dev, dt)
        batch = q.shape[0]
        body_rot: list[torch.Tensor | None] = [None] * self.n
        body_pos: list[torch.Tensor | None] = [None] * self.n
        joint_pos, joint_axis = [None] * self.n, [None] * self.n
        eye = torch.eye(3, dtype=dt, device=dev).expand(batch, 3, 3)
        zero = torch.zeros(batch, 3, dtype=dt, device=dev)
        for j in range(self.n):  # MJCF order is topological: parents come first
            parent = self.joint_parent[j]
            r_w = eye if parent < 0 else body_rot[parent]
            p_w = zero if parent < 0 else body_pos[parent]
            # joint frame in world
            r_j = r_w @ rp[j]
            p_j = p_w + (r_w @ pp[j][:, None])[..., 0]
            a_w = (r_j @ axis[j][:, None])[..., 0]
            if self.kinds[j] == "revolute":
                r_m = r_j @ _axis_angle(axis[j], q[:, j])
                p_m = p_j
            else:
                r_m = r_j
                p_m = p_j + a_w * q[:, j:j + 1]
            child = self.joint_child[j]
            body_rot[child] = r_m @ rci[j]
            body_pos[child] = p_m + (r_m @ pci[j][:, None])[..., 0]
            joint_pos[j], joint_axis[j] = p_j, a_w
        return {
            "body_rot": torch.stack(body_rot, 1),
            "body_pos": torch.stack(body_pos, 1),
            "joint_pos": torch.stack(joint_pos, 1),
            "joint_axis": torch.stack(joint_axis, 1),
        }

    def ee_position(self, q: torch.Tensor) -> torch.Tensor:
        """End-effector point in the world (= base) frame, (B, 3) [m]."""
        f = self.frames(q)
        off = self.ee_offset.to(q.device, q.dtype)
        rot = f["body_rot"][:, self.ee_body]
        return f["body_pos"][:, self.ee_body] + (rot @ off[:, None])[..., 0]

    def ee_jacobian(self, q: torch.Tensor) -> torch.Tensor:
        """Linear Jacobian of the end-effector point, (B, 3, n): columns a x (p - o) for
        revolute joints, a for prismatic ones, zero for joints that do not move the point."""
        f = self.frames(q)
        off = self.ee_offset.to(q.device, q.dtype)
        p = f["body_pos"][:, self.ee_body] + (f["body_rot"][:, self.ee_body] @ off[:, None])[..., 0]
        cols = []
        for j in range(self.n):
            a = f["joint_axis"][:, j]
            if j not in self.ee_ancestors:
                cols.append(torch.zeros_like(a))
            elif self.kinds[j] == "revolute":
                cols.append(torch.linalg.cross(a, p - f["joint_pos"][:, j]))
            else:
                cols.append(a)
        return torch.stack(cols, -1)

    def ee_torque(self, q: torch.Tensor, force: torch.Tensor) -> torch.Tensor:
        """Joint torques ``J_ee(q)^T f`` (B, n) of a force ``force`` (B, 3) [N, base frame] at
        the end-effector point: what a payload or a push at the tip does to the joints."""
        return torch.einsum("bkn,bk->bn", self.ee_jacobian(q), force.to(q.dtype))

    def point_torque(self, q: torch.Tensor, body: torch.Tensor, point: torch.Tensor,
                     force: torch.Tensor) -> torch.Tensor:
        """Joint torques ``J_p(q)^T f`` (B, n) of a force ``force`` (B, 3) [N, base frame]
        at ``point`` (B, 3) [m, in the frame of chain body ``body`` (B,) (long; -1: no
        force, a zero row)]: what a contact anywhere on the arm does to the joints."""
        f = self.frames(q)
        rows = torch.arange(q.shape[0], device=q.device)
        b = body.clamp(min=0)
        rot, pos = f["body_rot"][rows, b], f["body_pos"][rows, b]
        p = pos + (rot @ point.to(q.dtype)[..., None])[..., 0]
        force = force.to(q.dtype)
        moves = self._moved_by.to(q.device)[b] & (body >= 0)[:, None]
        cols = []
        for j in range(self.n):
            a = f["joint_axis"][:, j]
            lever = (torch.linalg.cross(a, p - f["joint_pos"][:, j])
                     if self.kinds[j] == "revolute" else a)
            cols.append((lever * force).sum(-1))
        return torch.stack(cols, -1) * moves

    def _com_world(self, f: dict[str, torch.Tensor]) -> torch.Tensor:
        com = self.body_com.to(f["body_pos"].device, f["body_pos"].dtype)
        return f["body_pos"] + (f["body_rot"] @ com[None, :, :, None])[..., 0]

    def gravity_torque(self, q: torch.Tensor) -> torch.Tensor:
        """Joint torques that hold the arm still against gravity at ``q``, (B, n)."""
        f = self.frames(q)
        com = self._com_world(f)
        mass = self.body_mass.to(q.device, q.dtype)
        g = self.gravity.to(q.device, q.dtype)
        hold = []
        for j in range(self.n):
            a, o = f["joint_axis"][:, j], f["joint_pos"][:, j]
            total = torch.zeros_like(q[:, 0])
            for b in self._subtree(j):
                lever = torch.linalg.cross(a, com[:, b] - o) if self.kinds[j] == "revolute" else a
                total = total - mass[b] * (lever * g).sum(-1)  # hold = -(generalised gravity)
            hold.append(total)
        return torch.stack(hold, -1)

    def joint_inertia(self, q: torch.Tensor) -> torch.Tensor:
        """Diagonal of the joint-space mass matrix including armature, (B, n): the inertia
        each joint drives with every other joint locked (kg*m^2, or kg on prismatic joints)."""
        f = self.frames(q)
        com = self._com_world(f)
        mass = self.body_mass.to(q.device, q.dtype)
        inertia = self.body_inertia.to(q.device, q.dtype)
        out = []
        for j in range(self.n):
            a, o = f["joint_axis"][:, j], f["joint_pos"][:, j]
            total = self.armature[j].to(q.device, q.dtype) + torch.zeros_like(q[:, 0])
            for b in self._subtree(j):
                if self.kinds[j] == "revolute":
                    r = f["body_rot"][:, b]
                    i_world = r @ inertia[b] @ r.transpose(1, 2)
                    rot_term = (a[:, None, :] @ i_world @ a[:, :, None])[:, 0, 0]
                    arm = torch.linalg.cross(a, com[:, b] - o)
                    total = total + rot_term + mass[b] * (arm * arm).sum(-1)
                else:
                    total = total + mass[b]
            out.append(total)
        return torch.stack(out, -1)
