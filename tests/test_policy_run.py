"""``policy run`` end to end against the emulated SO-101 follower (Feetech wire protocol):
an (untrained) policy and actuator drive it through the same bus and window as ``live``;
episodes complete with no protection trip and torque ends off, also on SIGINT."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import torch

from nactuator.hardware.emulator import Emulator
from nactuator.hardware.emulator.world_arm import WorldArm
from nactuator.hardware.recorder import with_hardware
from nactuator.input_filters import input_filter_spec
from nactuator.models import NeuralActuator, bundle_to_dict, save_bundle
from nactuator.platforms import load_platform
from nactuator.policy import deploy
from nactuator.policy.fit import POLICY_FORMAT
from nactuator.policy.network import PolicyNet
from nactuator.world.protection import make_protection

STATS_KEYS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")
STS = {"Protection_Current": 185, "Over_Current_Protection_Time": 20, "Overload_Torque": 80,
       "Protection_Time": 200, "Protective_Torque": 20}


def _files(tmp_path, n: int = 6) -> tuple[str, str]:
    stats = {k: {"mean": [0.0] * n, "std": [1.0] * n} for k in STATS_KEYS}
    act = NeuralActuator(n_motors=n, norm_stats=stats,
                         model_config={"arch": "mlp", "hidden": 16, "n_layers": 1})
    actuator = tmp_path / "actuator.pt"
    save_bundle(bundle_to_dict(act, "so101", {"input_filters": input_filter_spec(1)}),
                actuator)
    torch.manual_seed(0)
    net = PolicyNet(n + 5, n, history=8, width=16, depth=1, heads=2)
    for prm in net.head.parameters():  # a policy that holds still: zero offsets
        torch.nn.init.zeros_(prm)
    policy = tmp_path / "lift_hold-force_estimate.pt"
    torch.save({"format": POLICY_FORMAT, "task": "lift_hold", "condition": "force_estimate",
                "platform": "so101", "seconds_per_episode": 0.5,
                "hparams": dict(d_in=n + 5, n_out=n, history=8, width=16, depth=1, heads=2),
                "feature_stats": {"mean": [0.0] * (n + 5), "std": [1.0] * (n + 5)},
                "action_stats": {"mean": [0.0] * n, "std": [1.0] * n},
                "state_dict": net.state_dict()}, policy)
    return str(policy), str(actuator)


def _arm(platform):
    arm = WorldArm(platform, seed=0, q0=np.array([0.0, 0.0, 0.3, 1.05, 0.0, 0.27]))
    arm.world.set_protection(make_protection("feetech", 1, platform.n, STS))
    arm.world.set_external_force([0.0, 0.0, -0.3 * 9.81])  # a 300 g object in the jaw
    return arm


def test_policy_run_drives_the_emulated_follower_and_ends_torque_off(tmp_path,
                                                                     monkeypatch) -> None:
    policy, actuator = _files(tmp_path)
    p = with_hardware(load_platform("so101"), rx_timeout_ms=5000.0, reply_timeout_ms=5000.0)
    monkeypatch.setattr(deploy, "load_platform", lambda name: p)
    arm = _arm(p)
    with Emulator("feetech", p, arm=arm) as follower:
        summary = deploy.run_policy(policy, actuator, follower.port, seconds=0.5, episodes=2)
        assert [t.get("Torque_Enable") for t in follower.tables.values()] == [0] * p.n
    assert summary.startswith("policy run: 2/2 episodes")
    assert f"{2 * round(0.5 * p.fps)} cycles" in summary
    assert not arm.world.protection.tripped.any()


def test_policy_run_exits_clean_on_sigint_with_torque_off(tmp_path, monkeypatch) -> None:
    policy, actuator = _files(tmp_path)
    p = with_hardware(load_platform("so101"), rx_timeout_ms=5000.0, reply_timeout_ms=5000.0)
    monkeypatch.setattr(deploy, "load_platform", lambda name: p)
    with Emulator("feetech", p, arm=_arm(p)) as follower:
        stop = threading.Event()

        def interrupt_once_driving() -> None:  # Ctrl-C once torque is on and goals flow
            table = next(iter(follower.tables.values()))
            while not stop.is_set() and table.get("Torque_Enable") != 1:
                stop.wait(0.01)
            if not stop.wait(0.3):
                os.kill(os.getpid(), signal.SIGINT)
        thread = threading.Thread(target=interrupt_once_driving, daemon=True)
        thread.start()
        try:
            summary = deploy.run_policy(policy, actuator, follower.port, seconds=30.0)
        finally:
            stop.set()
            thread.join()
        assert [t.get("Torque_Enable") for t in follower.tables.values()] == [0] * p.n
    assert "interrupted (Ctrl-C), torque off" in summary and "0/1 episodes" in summary
