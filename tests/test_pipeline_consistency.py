"""The rooms must agree on what the model sees. Training, `eval`, `infer` and `live` all use
`nactuator.rollout`; these tests check that the data each room feeds it is the same (same
windows, padding and temperature filter), so the same checkpoint gives the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nactuator.data import read_dataset
from nactuator.data.datamodule import NADDataModule
from nactuator.data.importers import import_nad
from nactuator.eval.episodes import filter_temperature
from nactuator.eval.infer import predict_episodes
from nactuator.eval.protocol import rollout as eval_rollout
from nactuator.models import NeuralActuator
from nactuator.rollout import StreamingWindow, causal_windows, closed_loop_rollout
from nactuator.sim import Simulator

WINDOW = 9
TINY = {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32,
        "head_hidden": 16, "tau_init_scale": 1.0}


@pytest.fixture(scope="module")
def so101(nad_dir, tmp_path_factory):
    ds = tmp_path_factory.mktemp("pipeline") / "so101"
    import_nad(nad_dir / "so101", ds)
    dm = NADDataModule([ds], "so101", window_length=WINDOW, horizon=6, batch_size=1, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    actuator = NeuralActuator(n_motors=6, norm_stats=dm.norm_stats, model_config=TINY).eval()
    (episode,) = [ep for ep in read_dataset(ds).episodes if ep.split == "validation"]
    episode = filter_temperature(episode, int(dm.hparams["temperature_median"]))
    return dm, actuator, episode


def test_validation_in_training_is_the_eval_protocol(so101):
    """A whole-episode validation batch rolled out as the LightningModule does equals
    `nactuator eval`'s rollout of the same episode, to float precision."""
    dm, actuator, episode = so101
    batch = next(iter(dm.val_dataloader()))
    assert int(batch["length"][0]) == episode.length
    assert bool(batch["pad"][0, : WINDOW - 1].all()) and not batch["pad"][0, WINDOW - 1:].any()
    sim = Simulator("so101")
    steps = 40
    short = {k: v[:, : WINDOW + steps] for k, v in batch.items() if v.ndim >= 2}
    with torch.no_grad():
        trained = closed_loop_rollout(actuator, sim.step, short, WINDOW,
                                      qd0=torch.zeros(1, 6))
    (evaluated,) = eval_rollout(actuator, sim, [episode])
    # the untrained model moves the arm, so equal states mean equal windows and steps
    assert np.abs(evaluated.q[steps] - evaluated.q[0]).max() > 1e-4
    np.testing.assert_allclose(evaluated.q[: steps + 1], trained.q[0].numpy(), atol=1e-6)
    np.testing.assert_allclose(evaluated.force[:steps], trained.force[0].numpy(), atol=1e-5)


def test_live_infer_and_eval_give_the_same_forces_on_recorded_frames(so101):
    """On the same recorded frames: `infer` (all windows at once), the live loop's streaming
    window (one frame at a time) and the rollout with the simulator replaced by the recording
    (teacher forcing) produce identical force, gate and condition."""
    _, actuator, episode = so101
    frames = 60
    keys = actuator.inputs
    recorded = {k: np.asarray(episode.frames[k][:frames], dtype=np.float32)
                for k in ("q_cmd", "q", "qd", "effort", "voltage", "temperature")}

    (offline,) = predict_episodes(actuator, [episode])

    stream = StreamingWindow(keys, actuator.window_length, 6)
    live = []
    with torch.no_grad():
        for t in range(frames):
            stream.push({k: recorded[k][t] for k in keys})
            live.append(actuator(stream.tensors())["force"][0].numpy())

    q, qd = torch.from_numpy(recorded["q"]), torch.from_numpy(recorded["qd"])
    position = {"t": 0}

    def replay(q_now, qd_now, tau):  # the "simulator" returns the recorded next state
        position["t"] += 1
        return q[position["t"]].unsqueeze(0), qd[position["t"]].unsqueeze(0)

    block = {k: torch.from_numpy(np.concatenate([np.zeros((WINDOW - 1, 6), np.float32), v]))
             .unsqueeze(0) for k, v in recorded.items()}
    block["pad"] = torch.arange(WINDOW - 1 + frames).unsqueeze(0) < WINDOW - 1
    with torch.no_grad():
        replayed = closed_loop_rollout(actuator, replay, block, WINDOW)

    np.testing.assert_allclose(np.array(live), offline["force"][:frames], atol=1e-6)
    np.testing.assert_allclose(replayed.force[0].numpy(), offline["force"][: frames - 1],
                               atol=1e-6)
    np.testing.assert_allclose(replayed.gate[0].numpy(), offline["gate"][: frames - 1],
                               atol=1e-6)


def test_the_streaming_window_is_the_offline_window():
    rng = np.random.default_rng(0)
    frames = {"q": rng.normal(size=(5, 2)).astype(np.float32)}
    offline = causal_windows(frames, ["q"], 3)
    stream = StreamingWindow(["q"], 3, 2)
    for t in range(5):
        stream.push({"q": frames["q"][t]})
        now = stream.tensors()
        assert stream.warm == (t >= 2)
        np.testing.assert_array_equal(now["q"][0].numpy(), offline["q"][t].numpy())
        np.testing.assert_array_equal(now["pad"][0].numpy(), offline["pad"][t].numpy())
    assert offline["pad"][0].tolist() == [True, True, False]
