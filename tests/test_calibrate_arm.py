"""``nactuator calibrate-arm``: the protocol, the weights, the step scaling, and the resume
logic (fast, the recording / adapt / bundle steps replaced by recorders of their calls);
then end to end against two emulated SO-101 arms whose follower really carries the weights
(slow), and Ctrl-C in the middle of a step (slow)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from nactuator.guide import calibrate as cal
from nactuator.guide.protocol import (
    CalibrateError,
    State,
    adapt_steps,
    load_protocol,
    parse_weights,
    plan_steps,
    protocol_path,
    resolve_weights,
    weights_advice,
)


@pytest.fixture(scope="module")
def proto():
    return load_protocol("so101")


def test_the_protocol_plans_every_step_per_weight_and_holds_out_the_last(proto):
    steps = plan_steps(proto, [100.0, 250.0])
    keys = [s.key for s in steps]
    assert keys == ["01-free", "02-lift_hold-100g", "03-lift_hold-250g", "04-pick_place-100g",
                    "05-pick_place-250g", "06-held_out-250g"]
    assert [s.payload_g for s in steps] == [0, 100, 250, 100, 250, 250]
    assert [s.split for s in steps] == ["train"] * 5 + ["test"]
    assert steps[2].task == "lift_hold_250g" and "250 g weight" in steps[2].prompt
    assert steps[0].episodes == 3 and steps[0].seconds == 30 and steps[1].episodes == 2
    assert steps[3].episodes == 3
    assert {s.seconds for s in plan_steps(proto, [100.0, 250.0], episode_seconds=2)} == {2.0}
    assert load_protocol("omx")["pretrained"] == "pretrained/omx"


def test_weights_are_checked_in_grams(proto):
    assert parse_weights("200, 100", proto) == [100.0, 200.0]
    for bad, why in (("100", "give 2 to 3"), ("100,200,300,400", "give 2 to 3"),
                     ("100,9000", "outside 20-500 g"), ("100,100", "must differ"),
                     ("1OO,200", "grams separated by commas")):
        with pytest.raises(CalibrateError, match=why):
            parse_weights(bad, proto)


def test_adapt_steps_scale_with_minutes_and_the_horizon_fits_the_data(proto):
    a = proto["adapt"]
    assert adapt_steps(10 * 60, proto) == min(a["max_steps"], 10 * a["steps_per_minute"])
    assert adapt_steps(5 * 60, proto) == 5 * a["steps_per_minute"]
    assert adapt_steps(5, proto) == a["min_steps"]
    assert adapt_steps(10 ** 5, proto) == a["max_steps"]
    assert cal.fit_horizon({0: 32, 3: 64, 6: 128}, 100) == {0: 32, 3: 64, 6: 99}
    assert cal.fit_horizon(64, 1000) == {0: 64}


def test_weights_are_asked_for_until_valid_and_kept_for_the_resume(proto, tmp_path):
    state = State(tmp_path)
    answers = iter(["lots", "100", "150,300"])
    asked = []

    def ask(question):
        asked.append(question)
        return next(answers)

    assert resolve_weights(None, state, proto, ask) == [150.0, 300.0]
    assert len(asked) == 3 and "grams" in asked[0]
    with pytest.raises(CalibrateError, match="--weights-g"):
        resolve_weights(None, state, proto, None)  # nobody at a terminal
    state.set(weights_g=[150.0, 300.0])
    assert resolve_weights(None, State(tmp_path), proto, None) == [150.0, 300.0]
    with pytest.raises(CalibrateError, match="started with 150,300 g"):
        resolve_weights("100,200", State(tmp_path), proto, None)


def test_fewer_weights_than_the_protocol_takes_print_its_advice(proto, tmp_path, capsys):
    # The advice (docs/results.md §12.5: three weights read the force best) comes with the
    # question, and again when --weights-g gave fewer than the most the protocol takes.
    most = proto["weights"]["count"][1]
    assert most == 3 and "Three weights" in weights_advice([100.0, 200.0], proto)
    assert weights_advice([100.0, 200.0, 300.0], proto) is None
    assert weights_advice([100.0, 200.0], {"weights": {"count": [2, 3]}}) is None
    resolve_weights(None, State(tmp_path), proto, lambda q: "100,200,300")
    assert "Three weights" in capsys.readouterr().out


def test_a_protocol_whose_advice_is_not_text_is_refused_naming_the_field(tmp_path):
    import yaml

    raw = yaml.safe_load(protocol_path("so101").read_text())
    raw["weights"]["advice"] = ["three", "weights"]
    bad = tmp_path / "so101.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(CalibrateError, match=r"weights\.advice.*must be text"):
        load_protocol("so101", bad)


class FakeSteps:
    """Stands in for the bus check, ``record``, ``adapt`` and the bundle writer, and
    counts what was asked of each; ``stop_at`` makes that recording step end early, as
    Ctrl-C ends ``record`` (it returns; its dataset lacks whole episodes)."""

    def __init__(self, monkeypatch, stop_at: str | None = None):
        self.checks, self.recorded, self.adapted, self.prompts = 0, [], 0, []
        self.stop_at = stop_at
        monkeypatch.setattr(cal, "check_arm", self.check)
        monkeypatch.setattr(cal, "_record_step", self.record)
        monkeypatch.setattr(cal, "_recorded_whole", self.whole)
        monkeypatch.setattr(cal, "_adapt_step", self.adapt)
        monkeypatch.setattr(cal, "_write_bundle", self.bundle)

    def check(self, p, *args):
        self.checks += 1
        return {role: {"servos": [1, 2, 3, 4, 5, 6], "voltage_v": 12.0, "temperature_c": 25.0}
                for role in ("leader", "follower")}

    def prompt(self, step, i, total):
        self.prompts.append((step.key, i, total))

    def record(self, p, leader, follower, step, folder, *rest):
        self.recorded.append(step.key)
        folder.mkdir(parents=True)
        (folder / "frames").write_text(str(step.episodes * step.seconds * p.fps))
        if step.key != self.stop_at:
            (folder / "whole").touch()

    def whole(self, folder, step):
        return ((folder / "whole").exists(), float(step.episodes * step.seconds),
                int(step.seconds * 60))

    def adapt(self, start, proto, data, n_train, train_s, shortest, steps, out, extra_args):
        self.adapted += 1
        self.adapt_args = dict(start=start, data=data, n_train=n_train, train_s=train_s,
                               shortest=shortest)
        summary = {"episodes": ["06-held_out-200g#0"],
                   "pretrained": {"joints_deg": 3.0, "joints_command_deg": 2.0,
                                  "force_n": 0.4, "force_reference_n": 0.3},
                   "adapted": {"joints_deg": 1.5, "joints_command_deg": 2.0,
                               "force_n": 0.1, "force_reference_n": 0.3}}
        return {"checkpoint": str(out / "ft.ckpt"), "steps": 64, "train_seconds": train_s,
                "pretrained": start, "summary": summary, "wall_s": 1.0}

    def bundle(self, ckpt, bundle, extra):
        bundle.write_text(json.dumps(extra))


def test_a_rerun_skips_every_finished_step_and_redoes_the_one_cut_short(monkeypatch,
                                                                       tmp_path):
    out = tmp_path / "arm"
    args = dict(platform="so101", leader="L", follower="F", out=out, weights_g="100,200")
    fake = FakeSteps(monkeypatch, stop_at="03-lift_hold-200g")
    with pytest.raises(cal.Interrupted, match="03-lift_hold-200g was stopped"):
        cal.calibrate_arm(**args, prompt=fake.prompt)
    assert fake.recorded == ["01-free", "02-lift_hold-100g", "03-lift_hold-200g"]
    state = json.loads((out / "calibrate.json").read_text())
    assert sorted(state["steps"]) == ["check", "record/01-free", "record/02-lift_hold-100g"]
    assert state["weights_g"] == [100.0, 200.0]

    fake = FakeSteps(monkeypatch)  # the rerun: weights from the state file, nothing asked
    text = cal.calibrate_arm(**{**args, "weights_g": None}, prompt=fake.prompt)
    assert fake.checks == 1  # recordings were pending: the arm is checked again
    assert fake.recorded == ["03-lift_hold-200g", "04-pick_place-100g", "05-pick_place-200g",
                             "06-held_out-200g"]
    assert [k for k, _, _ in fake.prompts] == fake.recorded
    assert fake.prompts[0][1:] == (3, 6)
    assert fake.adapted == 1
    assert fake.adapt_args["n_train"] == 13  # 3 free runs, 4 lift-and-hold, 6 pick-and-place
    assert fake.adapt_args["train_s"] == 13 * 30
    assert [Path(d).name for d in fake.adapt_args["data"]][-1] == "06-held_out-200g"
    assert "1.50 °" in text and "command following 2.00 °" in text
    assert "force 0.100 N vs 0.300 N (linear regression): better" in text
    assert f"nactuator live --ckpt {out / 'actuator.pt'} --platform so101 --port F" in text
    assert json.loads((out / "actuator.pt").read_text())["calibrate_arm"]["weights_g"] == [
        100.0, 200.0]

    fake = FakeSteps(monkeypatch)  # everything done: no check, no recording, no training
    assert cal.calibrate_arm(**args, prompt=fake.prompt) == text
    assert (fake.checks, fake.recorded, fake.adapted, fake.prompts) == (0, [], 0, [])
    with pytest.raises(CalibrateError, match="another protocol, weights or episode length"):
        cal.calibrate_arm(**args, episode_seconds=2, prompt=fake.prompt)


# --------------------------------------------------------------------- end to end (slow)

EPISODE_S = 2.5  # every run of the protocol, instead of 20-30 s
PATIENT_MS = 5000.0


def _command_following_deg(ep, arm) -> float:
    """Arm-mean error of predicting q[i + 1] = q_cmd[i] over a whole episode, in degrees."""
    q, cmd = ep.frames["q"][:, arm], ep.frames["q_cmd"][:, arm]
    return float(np.degrees(np.mean(np.abs(q[1:] - cmd[:-1]), axis=0)).mean())


@pytest.mark.slow
def test_calibrate_arm_end_to_end_on_emulated_arms_with_ctrl_c_and_resume(tmp_path,
                                                                           python_sigint):
    """Two emulated SO-101 arms (a scripted leader; a follower running the hidden world,
    which carries each weight the protocol asks for: the prompt hangs it on the end-effector).
    Ctrl-C in the second step leaves torque off and that step unrecorded; the rerun
    records the rest, adapts the shipped bundle, scores the held-out run and writes a bundle
    that `live` runs; a third run does nothing."""
    import _thread

    from nactuator.control.live import run_live
    from nactuator.data import read_dataset
    from nactuator.hardware.emulator import Emulator
    from nactuator.hardware.recorder import G, with_hardware
    from nactuator.models import load_actuator
    from nactuator.platforms import load_platform

    p = with_hardware(load_platform("so101"), record_ramp_s=0.3, record_settle_s=0.5,
                      rx_timeout_ms=PATIENT_MS, reply_timeout_ms=PATIENT_MS, read_retries=1)
    out = tmp_path / "my-arm"
    step = 1.0 / p.fps
    leader = Emulator("feetech", p, seed=1, leader=True, step_per_read=step)
    follower = Emulator("feetech", p, seed=2, step_per_read=step)
    hung: list[float] = []

    def hang(step_, i, total, interrupt_at=None):
        g = step_.payload_g
        hung.append(g)
        follower.arm.set_payload(g / 1000.0, grasp=True)  # between the jaws, as synth holds it
        if step_.key == interrupt_at:
            leader.after_reads(60, _thread.interrupt_main)  # Ctrl-C ~1 s into the run

    with leader, follower:
        run = dict(platform=p, leader=leader.port, follower=follower.port, out=out,
                   weights_g="100,200", episode_seconds=EPISODE_S, steps=8, progress=False)
        with pytest.raises(cal.Interrupted, match="02-lift_hold-100g"):
            cal.calibrate_arm(**run, prompt=lambda s, i, n: hang(s, i, n, "02-lift_hold-100g"))
        assert [follower.tables[sid].get("Torque_Enable") for sid in follower.ids] == [0] * 6
        state = json.loads((out / "calibrate.json").read_text())
        assert "record/01-free" in state["steps"] and "record/02-lift_hold-100g" not in \
            state["steps"]
        [cut] = read_dataset(out / "recordings" / "02-lift_hold-100g").episodes
        assert cut.meta["interrupted"] and cut.length < EPISODE_S * p.fps

        hung.clear()
        text = cal.calibrate_arm(**run, prompt=hang)
        assert hung == [100, 200, 100, 200, 200]  # steps 2-6, each with its weight hung
        assert [follower.tables[sid].get("Torque_Enable") for sid in follower.ids] == [0] * 6
        bundle = out / "actuator.pt"
        live_csv = tmp_path / "live.csv"
        run_live(bundle, p, follower.port, out=live_csv, seconds=1.0, quiet=True)

    # Every recording carries its own weight's label; the last one is held out.
    expected = {"01-free": (0.0, "train", 3), "02-lift_hold-100g": (100, "train", 2),
                "03-lift_hold-200g": (200, "train", 2), "04-pick_place-100g": (100, "train", 3),
                "05-pick_place-200g": (200, "train", 3), "06-held_out-200g": (200, "test", 1)}
    for key, (grams, split, runs) in expected.items():
        ds = read_dataset(out / "recordings" / key)
        assert len(ds.episodes) == runs
        for ep in ds.episodes:
            assert ep.split == split and not ep.meta["interrupted"]
            np.testing.assert_allclose(ep.frames["force"][:, 2], -grams / 1000.0 * G)
    # The printed held-out figures are the evaluation's, on the held-out run.
    result = json.loads((out / "adapt" / "adapt.json").read_text())
    assert result["held_out"]["episodes"] == ["06-held_out-200g#0 (pick_place_200g)"]
    assert result["points"][-1]["n"] == 13
    [held] = read_dataset(out / "recordings" / "06-held_out-200g").episodes
    arm = [k for k, c in enumerate(p.channels) if c.name != "gripper"]
    cf = _command_following_deg(held, arm)
    summary = json.loads((out / "calibrate.json").read_text())["steps"]["adapt"]["summary"]
    assert summary["adapted"]["joints_command_deg"] == pytest.approx(cf, rel=0.02)
    assert f"command following {cf:.2f} °" in text
    model = summary["adapted"]["joints_deg"]
    assert model == result["points"][-1]["metrics"]["arm mean (deg), model"]
    assert f"{model:.2f} °" in text and "linear regression on your recordings" in text
    # The bundle loads (safe-load rules) and says where it came from; live ran it.
    _, meta = load_actuator(bundle)
    assert meta["platform"] == "so101"
    rows = live_csv.read_text().splitlines()
    assert len(rows) > 10
    # Everything done: a third run only prints.
    t0 = time.perf_counter()
    assert cal.calibrate_arm(**run, prompt=hang) == text
    assert time.perf_counter() - t0 < 5


def test_weights_may_change_until_something_is_recorded(monkeypatch, tmp_path):
    fake = FakeSteps(monkeypatch)

    def unplugged(*args):
        raise CalibrateError("follower on F: no telemetry")

    monkeypatch.setattr(cal, "check_arm", unplugged)
    args = dict(platform="so101", leader="L", follower="F", out=tmp_path, prompt=fake.prompt)
    with pytest.raises(CalibrateError, match="no telemetry"):
        cal.calibrate_arm(**args, weights_g="100,200")
    monkeypatch.setattr(cal, "check_arm", fake.check)
    cal.calibrate_arm(**args, weights_g="150,300")  # a typo fixed before the first run
    assert fake.recorded[1] == "02-lift_hold-150g"
    with pytest.raises(CalibrateError, match="started with 150,300 g"):
        cal.calibrate_arm(**args, weights_g="100,200")
