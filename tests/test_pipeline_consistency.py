"""The rooms must agree on what the model sees. Training, `eval`, `infer` and `live` all use
`nactuator.rollout` and the checkpoint's input filters (`nactuator.input_filters`); these
tests check that the data each room feeds the model is the same (same windows, padding,
temperature filter and fill of dropped telemetry), so the same checkpoint gives the same
numbers. The recording is the real SO-101 NAD data with dropped servo reads written into
it (telemetry_valid = 0, values NaN), as the recorder stores them. Every test runs twice:
with the default filters, and with the causal pooled statistics (``data.pool_frames``, the
feature group ``pooled``) a model reads on top."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nactuator.data import read_dataset
from nactuator.data.datamodule import NADDataModule
from nactuator.data.episodes import filter_episode
from nactuator.data.importers import import_nad
from nactuator.data.writer import DatasetWriter
from nactuator.eval.episodes import load_episodes
from nactuator.eval.infer import predict_episodes
from nactuator.eval.protocol import episode_rollouts as eval_rollout
from nactuator.input_filters import POOLED_KEYS, TELEMETRY_KEYS
from nactuator.models import NeuralActuator
from nactuator.platforms import load_platform
from nactuator.rollout import StreamingWindow, causal_windows, closed_loop_rollout, episode_block
from nactuator.sim import Simulator

WINDOW = 9
TINY = {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32,
        "head_hidden": 16, "tau_init_scale": 1.0}
OUTPUTS = ("tau", "force", "gate", "condition")


def with_dropped_reads(frames: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """The episode as the recorder stores failed reads: 4 % of (frame, motor) reads lost at
    random, a servo silent for 15 frames, one cycle where the whole bus failed; frame 0 is
    complete (the rollouts start from its state)."""
    rng = np.random.default_rng(seed)
    length, n = frames["q"].shape
    valid = (rng.random((length, n)) > 0.04).astype(np.float32)
    valid[40:55, 2] = 0
    valid[70] = 0
    valid[0] = 1
    out = {k: np.array(v) for k, v in frames.items()}
    for key in TELEMETRY_KEYS:
        out[key][valid == 0] = np.nan
    out["telemetry_valid"] = valid
    return out


@pytest.fixture(scope="module", params=[None, 64], ids=["plain", "pooled"])
def so101(nad_dir, tmp_path_factory, request):
    root = tmp_path_factory.mktemp("pipeline")
    import_nad(nad_dir / "so101", root / "nad")
    source = read_dataset(root / "nad")
    platform = load_platform("so101")
    with DatasetWriter(root / "dropped", platform, source.fps) as w:
        for ep in source.episodes:
            w.add_episode(with_dropped_reads(ep.frames, ep.index), ep.task, ep.split, ep.meta)
    dm = NADDataModule([root / "dropped"], "so101", window_length=WINDOW, horizon=6,
                       batch_size=4, seed=0, pool_frames=request.param)
    dm.setup("fit")
    torch.manual_seed(0)
    features, config = ["command", "state", "telemetry", "error"], dict(TINY)
    if request.param:  # conf/train/pooled_condition.yaml: the channels and their head
        features.append("pooled")
        config["condition_head"] = {"kind": "pooled", "hidden": 8}
        assert set(POOLED_KEYS) <= set(dm.norm_stats)
    actuator = NeuralActuator(features, n_motors=6, norm_stats=dm.norm_stats,
                              model_config=config).eval()
    # As `eval` and `infer` load it: the command channels derived, nothing filtered yet.
    episodes = {ep.index: ep for ep in load_episodes(root / "dropped", platform, None)}
    return dm, actuator, episodes


def _validation(so101):
    dm, actuator, episodes = so101
    (episode,) = [ep for ep in episodes.values() if ep.split == "validation"]
    assert (episode.frames["telemetry_valid"] == 0).sum() > 30  # the recording lost reads
    return dm, actuator, episode


def test_validation_in_training_is_the_eval_protocol(so101):
    """A whole-episode validation batch rolled out as the LightningModule does equals
    `nactuator eval`'s rollout of the same episode, to float precision."""
    dm, actuator, episode = _validation(so101)
    episode = filter_episode(episode, dm.input_filters)  # what `eval` does
    batch = next(iter(dm.val_dataloader()))
    assert int(batch["length"][0]) == episode.length
    assert bool(batch["pad"][0, : WINDOW - 1].all()) and not batch["pad"][0, WINDOW - 1:].any()
    sim = Simulator("so101")
    steps = 80  # past the dropped reads of frames 40-55 and 70
    short = {k: v[:, : WINDOW + steps] for k, v in batch.items() if v.ndim >= 2}
    with torch.no_grad():
        trained = closed_loop_rollout(actuator, sim.step, short, WINDOW,
                                      qd0=torch.zeros(1, 6))
    (evaluated,) = eval_rollout(actuator, sim, [episode])
    # the untrained model moves the arm, so equal states mean equal windows and steps
    assert np.abs(evaluated.q[steps] - evaluated.q[0]).max() > 1e-4
    np.testing.assert_allclose(evaluated.q[: steps + 1], trained.q[0].numpy(), atol=1e-6)
    for key in OUTPUTS:
        np.testing.assert_allclose(getattr(evaluated, key)[:steps],
                                   getattr(trained, key)[0].numpy(), atol=1e-5, err_msg=key)


def test_live_streaming_and_infer_agree_on_a_recording_with_dropped_reads(so101):
    """The live loop's path (raw frames and their `valid` flags pushed one at a time into
    the StreamingWindow with the checkpoint's filters, as LiveLoop.cycle does) and `infer`
    (the whole episode filtered, then all windows at once) give the same torque, force,
    gate and condition on every frame, the dropped ones included."""
    dm, actuator, episode = _validation(so101)
    spec = dm.input_filters
    (offline,) = predict_episodes(actuator, [filter_episode(episode, spec)])

    stream = StreamingWindow(actuator.inputs, actuator.window_length, 6, filters=spec)
    valid = episode.frames["telemetry_valid"] > 0.5
    live = {k: [] for k in OUTPUTS}
    with torch.inference_mode():
        for t in range(episode.length):
            stream.push({k: episode.frames[k][t] for k in stream.frame_keys}, valid=valid[t])
            out = actuator(stream.tensors())
            for key in OUTPUTS:
                live[key].append(out[key][0].reshape(-1).numpy().copy())
    for key in OUTPUTS:
        np.testing.assert_allclose(np.array(live[key]).reshape(offline[key].shape),
                                   offline[key], atol=1e-5, err_msg=key)
    # The fill rule matters on exactly those frames: zero-filled inputs give other forces.
    (zero,) = predict_episodes(actuator, [filter_episode(episode, {**spec, "missing": "zero"})])
    changed = np.abs(zero["force"] - offline["force"]).max(axis=1) > 1e-4
    assert changed.any() and not changed[: int(np.argmin(valid.all(axis=1)))].any()
    if "pool" in spec:  # the pooled channels reach the outputs: another horizon, other outputs
        (short,) = predict_episodes(actuator, [filter_episode(episode,
                                                              {**spec, "pool": {"frames": 8}})])
        assert np.abs(short["condition"] - offline["condition"]).max() > 1e-4


def test_teacher_forced_rollout_is_infer(so101):
    """The rollout with the simulator replaced by the recording (teacher forcing) reads the
    same windows as `infer`: same torque, force, gate and condition."""
    dm, actuator, episode = _validation(so101)
    filtered = filter_episode(episode, dm.input_filters)
    (offline,) = predict_episodes(actuator, [filtered])
    frames = 120
    q = torch.from_numpy(filtered.frames["q"][:frames])
    qd = torch.from_numpy(filtered.frames["qd"][:frames])
    position = {"t": 0}

    def replay(q_now, qd_now, tau):  # the "simulator" returns the recorded next state
        position["t"] += 1
        return q[position["t"]].unsqueeze(0), qd[position["t"]].unsqueeze(0)

    keys = sorted({*actuator.inputs, "q", "qd"})
    block = episode_block([{k: filtered.frames[k][:frames] for k in keys}], keys, WINDOW)
    with torch.no_grad():
        replayed = closed_loop_rollout(actuator, replay, block, WINDOW)
    for key in OUTPUTS:
        np.testing.assert_allclose(getattr(replayed, key)[0].numpy(),
                                   offline[key][: frames - 1], atol=1e-5, err_msg=key)


def test_training_windows_are_the_infer_windows(so101):
    """Every window the DataModule serves (training segments and whole validation episodes)
    equals the window `infer` builds at that frame from the episode filtered by the
    checkpoint's spec: one filter, one window, whatever room asks."""
    dm, actuator, episodes = so101
    keys = list(actuator.inputs)
    by_dm_index = {e.index: episodes[e.dataset_episode] for e in dm.episodes}
    offline = {i: causal_windows(filter_episode(ep, dm.input_filters).frames, keys, WINDOW)
               for i, ep in by_dm_index.items()}

    checked = dropped = 0
    for b, batch in enumerate(dm.train_dataloader()):
        if b == 25:
            break
        for row, (e, s) in enumerate(zip(batch["episode_index"].tolist(),
                                         batch["start"].tolist(), strict=True)):
            for i in range(batch["q"].shape[1] - WINDOW + 1):  # step i: window ends at s + i
                for key in [*keys, "pad"]:
                    served = batch[key][row, i : i + WINDOW]
                    torch.testing.assert_close(served, offline[e][key][s + i], atol=0, rtol=0)
                valid = by_dm_index[e].frames["telemetry_valid"]
                dropped += int((valid[max(s + i - WINDOW + 1, 0) : s + i + 1] == 0).any())
                checked += 1
    assert checked > 500 and dropped > 50  # many windows, many holding dropped reads

    batch = dm.split_episodes("validation")
    (e,) = batch["episode_index"].tolist()
    length = int(batch["length"][0])
    for key in [*keys, "pad"]:
        windows = batch[key][0].unfold(0, WINDOW, 1)[:length]  # (T, [n,] L)
        windows = windows.permute(0, 2, 1) if windows.ndim == 3 else windows
        torch.testing.assert_close(windows, offline[e][key], atol=0, rtol=0)


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


def test_the_condition_frames_are_what_infer_scores_at_those_frames(so101, tmp_path):
    """``data.condition_frames`` (conf/train/condition_frames.yaml): every frame the
    DataModule draws for the pooled condition head gives, through the head's training path
    (:meth:`NeuralActuator.pooled_condition_logit`, the module's ``condition_frames_loss``),
    the condition `infer` computes at that frame of that episode (the episode filtered and
    pooled as a whole, dropped reads included) -- and so what `live` computes, above; the
    loss is the BCE of those scores against the frames' labels."""
    from nactuator.training.losses import condition_loss
    from nactuator.training.module import NeuralActuatorModule

    dm, _, _ = so101
    source = read_dataset(dm.paths[0])  # the recording, with condition labels written in
    platform = load_platform("so101")
    with DatasetWriter(tmp_path / "labelled", platform, source.fps) as w:
        for ep in source.episodes:
            condition = np.ones_like(ep.frames["q"])
            condition[:, 3] = ep.index % 2  # elbow_flex restricted in every other run
            condition[:20] = np.nan  # and the first frames unlabelled
            w.add_episode({**ep.frames, "condition": condition}, ep.task, ep.split, ep.meta)
    _, actuator, _ = so101
    episodes = {ep.index: ep for ep in load_episodes(tmp_path / "labelled", platform,
                                                     None)}
    served = NADDataModule([tmp_path / "labelled"], "so101", window_length=WINDOW, horizon=6,
                           batch_size=4,
                           seed=0, pool_frames=dm.input_filters.get("pool", {}).get("frames"),
                           condition_frames=512)
    frames = next(iter(served.train_dataloader()))["condition_frames"]
    if actuator.condition_head is None:  # the plain model has no pooled head to train
        with pytest.raises(ValueError, match="condition_head"):
            actuator.pooled_condition_logit(frames)
        return
    by_dm_index = {e.index: episodes[e.dataset_episode] for e in served.episodes}
    offline = {i: predict_episodes(actuator, [filter_episode(ep, served.input_filters)])[0]
               for i, ep in by_dm_index.items() if ep.split == "train"}
    with torch.no_grad():
        logit = actuator.pooled_condition_logit(frames)
    expected = np.stack([offline[e]["condition"][t] for e, t in zip(
        frames["episode_index"].tolist(), frames["frame"].tolist(), strict=True)])
    np.testing.assert_allclose(torch.sigmoid(logit).numpy(), expected, atol=1e-6)
    valid = [by_dm_index[e].frames["telemetry_valid"] for e in offline]
    assert sum(int((v == 0).any()) for v in valid) == len(valid)  # dropped reads in them
    assert len(set(frames["episode_index"].tolist())) > 1 and (frames["frame"] >= 20).all()
    assert frames["condition_valid"].all() and 0 < frames["condition"][:, 0, 3].mean() < 1

    module = NeuralActuatorModule(platform="so101", features=actuator.features,
                                  condition_head={"kind": "pooled", "hidden": 8})
    module.actuator = actuator
    with torch.no_grad():
        loss = module.condition_frames_loss(frames)
    torch.testing.assert_close(loss, condition_loss(
        torch.logit(torch.from_numpy(expected).double()).float(),
        frames["condition"][:, 0], frames["condition_valid"][:, 0]), rtol=0, atol=1e-4)
