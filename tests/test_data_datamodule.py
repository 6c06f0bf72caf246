"""NADDataModule: Contract 2 batches, window alignment, padding, splits, norm stats, seeding.

Synthetic datasets encode each frame's identity in its values (q = 1000 * episode + frame),
so every alignment claim is checked exactly.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from nactuator.data import DataFormatError, DatasetWriter
from nactuator.data.datamodule import NADDataModule
from nactuator.data.importers import import_nad
from nactuator.platforms import load_platform

OMX = load_platform("omx")
N = OMX.n


def coded_frames(code: int, T: int) -> dict[str, np.ndarray]:
    """Frames whose q equals 1000 * code + frame index on every channel."""
    t = np.arange(T, dtype=np.float64)
    ident = np.repeat((1000 * code + t)[:, None], N, axis=1)
    force = np.full((T, 3), np.nan)
    force[T // 2 :] = [0.0, 0.0, -2.0]
    cond = np.full((T, N), np.nan)
    cond[:, 2] = 0.0
    return {
        "q_cmd": ident + 0.5,
        "q": ident,
        "qd": np.ones((T, N)) * code,
        "effort": np.sin(t)[:, None].repeat(N, 1),
        "voltage": np.full((T, N), 12.0),
        "temperature": np.full((T, N), 35.0),
        "force": force,
        "condition": cond,
        "payload_mass": np.full(T, 0.1 * code),
    }


@pytest.fixture
def coded(tmp_path):
    """Episodes 0..4: train 40, 25, 12 frames; validation 30; test 50 frames."""
    root = tmp_path / "coded"
    layout = [(40, "train"), (25, "train"), (12, "train"), (30, "validation"), (50, "test")]
    with DatasetWriter(root, OMX, OMX.fps) as w:
        for code, (T, split) in enumerate(layout):
            w.add_episode(coded_frames(code, T), f"task{code % 2}", split)
    return root


def test_batch_matches_contract_2(coded):
    dm = NADDataModule(coded, "omx", window_length=9, horizon=10, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 12-frame episode is skipped (tested below)
        batch = next(iter(dm.train_dataloader()))
    T = 8 + 10 + 1
    for key in ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "condition"):
        assert batch[key].shape == (4, T, N) and batch[key].dtype == torch.float32
    assert batch["force"].shape == (4, T, 3)
    assert batch["condition_valid"].shape == (4, T, N)
    assert batch["condition_valid"].dtype == torch.bool
    for key in ("force_valid", "payload_mass", "pad"):
        assert batch[key].shape == (4, T)
    assert batch["force_valid"].dtype == torch.bool and batch["pad"].dtype == torch.bool
    assert batch["episode_index"].shape == (4,) and batch["start"].shape == (4,)
    assert torch.isfinite(batch["force"]).all() and torch.isfinite(batch["condition"]).all()


def test_frames_are_aligned_and_padded(coded):
    dm = NADDataModule(coded, "omx", window_length=9, horizon=10, batch_size=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = next(iter(dm.train_dataloader()))
    # Every valid start of the three train episodes, once: s in [0, L - H - 1].
    assert len(batch["start"]) == (40 - 10) + (25 - 10) + (12 - 10)
    offsets = torch.arange(-8, 11)
    for b in range(len(batch["start"])):
        e, s = int(batch["episode_index"][b]), int(batch["start"][b])
        frame = s + offsets  # frame index of each of the T positions
        real = frame >= 0
        assert torch.equal(batch["pad"][b], ~real)
        q = batch["q"][b, :, 0]
        assert torch.equal(q[real], (1000 * e + frame[real]).float())  # one episode only
        assert (q[~real] == 0).all() and (batch["q_cmd"][b][~real] == 0).all()
        assert s + 10 < dm.episodes[e].length  # the scored frame s + H exists
        # force: NaN -> 0 with a validity flag; second half of each episode labelled
        length = dm.episodes[e].length
        labelled = real & (frame >= length // 2)
        assert torch.equal(batch["force_valid"][b], labelled)
        assert (batch["force"][b, :, 2][labelled] == -2.0).all()
        assert (batch["force"][b][~labelled] == 0).all()
        assert torch.equal(batch["condition_valid"][b, :, 2], real)
        assert not batch["condition_valid"][b, :, [0, 1, 3, 4]].any()
        np.testing.assert_allclose(batch["payload_mass"][b][real], 0.1 * e, rtol=1e-6)
    assert set(batch["start"].tolist()) == set(range(30))


def test_short_episodes_are_skipped_with_a_warning_and_none_left_is_an_error(coded):
    dm = NADDataModule(coded, "omx", horizon=20, batch_size=8)
    with pytest.warns(UserWarning, match=r"skipping 1 train episode\(s\) shorter than horizon "
                      r"\+ 1 = 21 frames: task0#2 \(12 frames\)"):
        n = sum(len(b["start"]) for b in dm.train_dataloader())
    assert n == (40 - 20) + (25 - 20)
    late = NADDataModule(coded, "omx", horizon={0: 20, 3: 40}, batch_size=8)
    with pytest.raises(DataFormatError, match=r"no train episode has horizon \+ 1 = 41 frames "
                       r"\(3 train episodes, longest 40 frames\)"):
        late.epoch = 3
        late.train_dataloader()


def test_the_curriculum_sets_the_horizon_once_per_epoch(coded):
    dm = NADDataModule(coded, "omx", window_length=9, horizon={0: 5, 2: 9}, batch_size=2)
    loader = dm.train_dataloader()
    assert dm.horizon == 5 and next(iter(loader))["q"].shape[1] == 9 + 5
    dm.epoch = 1
    assert dm.horizon == 5
    dm.epoch = 2
    loader = dm.train_dataloader()
    assert dm.horizon == 9 and {b["q"].shape[1] for b in loader} == {9 + 9}
    assert len(loader) == ((40 - 9) + (25 - 9) + (12 - 9) + 1) // 2


def test_validation_and_test_serve_whole_episodes(coded):
    dm = NADDataModule(coded, "omx", window_length=9, horizon=10, batch_size=64)
    (val,) = list(dm.val_dataloader())
    assert val["episode_index"].tolist() == [3] and val["length"].tolist() == [30]
    assert val["q"].shape == (1, 8 + 30, N)
    assert val["pad"][0].tolist() == [True] * 8 + [False] * 30
    assert torch.equal(val["q"][0, 8:, 0], (3000 + torch.arange(30)).float())
    both = NADDataModule(f"{coded},{coded}", "omx", eval_batch_size=None).split_episodes("test")
    assert both["length"].tolist() == [50, 50]
    mixed = NADDataModule(coded, "omx").split_episodes("train")  # 40, 25 and 12 frames
    assert mixed["q"].shape == (3, 8 + 40, N) and mixed["length"].tolist() == [40, 25, 12]
    # a shorter episode repeats its last frame past its end (those steps are not scored)
    assert (mixed["q"][2, 8 + 11:, 0] == 2011).all()
    again = NADDataModule(coded, "omx").split_episodes("train")
    assert torch.equal(mixed["q"], again["q"])  # deterministic
    by_two = list(NADDataModule(f"{coded},{coded}", "omx", eval_batch_size=1).test_dataloader())
    assert [b["length"].tolist() for b in by_two] == [[50], [50]]


def test_norm_stats_use_the_train_split_only(coded):
    dm = NADDataModule(coded, "omx")
    stats = dm.norm_stats
    train_q = np.concatenate([1000 * c + np.arange(T) for c, T in ((0, 40), (1, 25), (2, 12))])
    np.testing.assert_allclose(stats["q"]["mean"], [train_q.mean()] * N, rtol=1e-6)
    np.testing.assert_allclose(stats["q"]["std"], [train_q.std()] * N, rtol=1e-5)
    np.testing.assert_allclose(stats["error"]["mean"], [0.5] * N, rtol=1e-6)
    assert stats["error"]["std"] == [1.0] * N  # constant channel: std floored to 1
    assert stats["voltage"]["mean"] == pytest.approx([12.0] * N)
    assert set(stats) == {"q_cmd", "q", "qd", "effort", "voltage", "temperature", "error",
                          # exogenous inputs of counterfactual models (data/commands.py)
                          "supply_voltage", "initial_temperature"}
    train_qd = np.concatenate([np.full(T, c) for c, T in ((0, 40), (1, 25), (2, 12))])
    np.testing.assert_allclose(stats["qd"]["mean"], [train_qd.mean()] * N, rtol=1e-6)


def test_seeded_sampling(coded):
    def starts(seed, epochs=2):
        dm = NADDataModule(coded, "omx", horizon=5, batch_size=8, seed=seed)
        orders = []
        for epoch in range(epochs):
            dm.epoch = epoch
            orders.append(torch.cat([b["start"] * 100 + b["episode_index"]
                                     for b in dm.train_dataloader()]).tolist())
        return orders

    a, b, c = starts(0), starts(0), starts(1)
    assert a == b  # same seed, same order, epoch by epoch
    assert a[0] != a[1]  # a new order each epoch ...
    assert sorted(a[0]) == sorted(a[1])  # ... of the same segments
    assert a[0] != c[0]


def test_samples_per_epoch_draws_a_fixed_number(coded):
    dm = NADDataModule(coded, "omx", horizon=5, batch_size=8, samples_per_epoch=20)
    loader = dm.train_dataloader()
    assert len(loader) == 3
    assert sum(len(b["start"]) for b in loader) == 20


def test_condition_frames_are_labelled_train_frames_drawn_beside_the_same_segments(tmp_path):
    """``condition_frames`` K: every training batch carries K single frames (windows of
    length 1) drawn from the condition-labelled frames of every train episode only, each
    the episode's own frame (q codes episode and frame), with its labels; the segments are
    those the DataModule serves without the option, and the draw is seeded per epoch."""
    root = tmp_path / "labelled"
    layout = [(40, "train"), (25, "train"), (12, "train"), (30, "validation"), (50, "test")]
    with DatasetWriter(root, OMX, OMX.fps) as w:
        for code, (T, split) in enumerate(layout):
            frames = coded_frames(code, T)
            if code == 1:  # an unlabelled train episode: never drawn
                frames["condition"][:] = np.nan
            if code == 0:  # labels on frames 10.. only
                frames["condition"][:10] = np.nan
            w.add_episode(frames, f"task{code % 2}", split)

    def batches(**kwargs):
        dm = NADDataModule(root, "omx", horizon=5, batch_size=4, samples_per_epoch=12,
                           seed=3, **kwargs)
        out = []
        for epoch in range(2):
            dm.epoch = epoch
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out.append(list(dm.train_dataloader()))
        return out

    plain, drawn, again = batches(), batches(condition_frames=64), batches(condition_frames=64)
    seen = set()
    for epoch in range(2):
        assert len(plain[epoch]) == len(drawn[epoch]) == 3
        for p, d, a in zip(plain[epoch], drawn[epoch], again[epoch], strict=True):
            assert "condition_frames" not in p
            for key, value in p.items():  # the same segments with and without frames
                torch.testing.assert_close(d[key], value, rtol=0, atol=0)
            f = d["condition_frames"]
            assert f["q"].shape == f["condition"].shape == (64, 1, N)
            assert f["force"].shape == (64, 1, 3) and not f["pad"].any()
            episode, frame = f["episode_index"].numpy(), f["frame"].numpy()
            assert set(episode) <= {0, 2}  # train, labelled
            assert (frame[episode == 0] >= 10).all()
            np.testing.assert_array_equal(f["q"][:, 0, 0].numpy(), 1000 * episode + frame)
            assert f["condition_valid"][:, 0, 2].all() and not f["condition_valid"][:, 0, 0].any()
            for key, value in f.items():  # seeded
                torch.testing.assert_close(a["condition_frames"][key], value, rtol=0, atol=0)
            seen |= set(zip(episode.tolist(), frame.tolist(), strict=True))
    assert len(seen) > 40  # frames from all over both episodes, not one segment's
    firsts = [b["condition_frames"]["frame"] for b in (drawn[0][0], drawn[1][0])]
    assert not torch.equal(*firsts)  # a new draw each epoch
    with pytest.raises(ValueError, match="condition_frames"):
        NADDataModule(root, "omx", condition_frames=0)
    unlabelled = tmp_path / "unlabelled"
    with DatasetWriter(unlabelled, OMX, OMX.fps) as w:
        frames = coded_frames(0, 40)
        frames["condition"][:] = np.nan
        w.add_episode(frames, "task0", "train")
    with pytest.raises(DataFormatError, match="no train frame .* condition label"):
        NADDataModule(unlabelled, "omx", horizon=5, condition_frames=8).setup("fit")


def test_temperature_glitches_are_filtered(tmp_path):
    frames = coded_frames(0, 60)
    frames["temperature"][10, 1] = 95.0  # one-frame spike
    frames["temperature"][30:33, 0] = [49.0, 54.0, 58.0]  # a burst, as in the SO-101 files
    frames["temperature"][40:, 3] = 40.0  # a real step is kept
    with DatasetWriter(tmp_path / "ds", OMX, OMX.fps) as w:
        w.add_episode(frames, "t", "train")
    temp = NADDataModule(tmp_path / "ds", "omx").split_episodes("train")["temperature"][0, 8:]
    assert temp[10, 1] == 35.0 and (temp[30:33, 0] == 35.0).all()
    # Causal: the trailing 11 frames show the step once 6 of them have it (frame 45).
    assert temp[44, 3] == 35.0 and temp[45, 3] == 40.0 and temp[-1, 3] == 40.0
    assert (temp[:, 2] == 35.0).all()
    raw = NADDataModule(tmp_path / "ds", "omx", temperature_median=1).split_episodes("train")
    assert raw["temperature"][0, 8 + 10, 1] == 95.0


def test_temperature_median_never_mixes_episodes(tmp_path):
    a, b = coded_frames(0, 20), coded_frames(1, 20)
    a["temperature"][:] = 30.0
    b["temperature"][:] = 50.0
    with DatasetWriter(tmp_path / "ds", OMX, OMX.fps) as w:
        w.add_episode(a, "t", "train")
        w.add_episode(b, "t", "train")
    temp = NADDataModule(tmp_path / "ds", "omx").split_episodes("train")["temperature"][:, 8:, 0]
    assert (temp[0] == 30.0).all() and (temp[1] == 50.0).all()


def test_several_datasets_and_platform_mismatch(coded, tmp_path):
    dm = NADDataModule(f"{coded},{coded}", "omx", horizon=5)
    assert len(dm.episodes) == 10
    assert dm.episodes[7].dataset_episode == 2 and dm.episodes[7].index == 7
    so101 = load_platform("so101")
    other = tmp_path / "so101"
    with DatasetWriter(other, so101, so101.fps) as w:
        f = coded_frames(0, 20)
        w.add_episode({k: (np.repeat(v[:, :1], 6, 1) if v.ndim == 2 and v.shape[1] == N else v)
                       for k, v in f.items()}, "t", "train")
    with pytest.raises(DataFormatError, match="dataset is for platform 'so101' but the "
                       "DataModule is for 'omx'"):
        NADDataModule([coded, other], "omx").setup()


def test_real_so101_smoke(nad_dir, tmp_path):
    out = tmp_path / "so101"
    import_nad(nad_dir / "so101", out)
    dm = NADDataModule(out, "so101", horizon=128, batch_size=16, samples_per_epoch=32)
    batch = next(iter(dm.train_dataloader()))
    assert batch["q"].shape == (16, 137, 6)
    labelled = batch["force"][batch["force_valid"]]  # (frames, 3)
    assert len(labelled) > 0
    assert torch.allclose(labelled, torch.tensor([0.0, 0.0, -4.9]))  # x, y unlabelled -> 0
    assert 10 < dm.norm_stats["voltage"]["mean"][0] < 13
    assert max(dm.norm_stats["temperature"]["mean"]) < 45  # glitches filtered before stats
    assert dm.split_episodes("train")["temperature"].max() < 45  # raw files reach 150 degC
    (val,) = list(dm.val_dataloader())
    assert val["length"].tolist() == [694]  # the validation run: 694 frames


def test_lightning_fit_with_a_horizon_curriculum(coded):
    import lightning as L

    seen = []

    class Probe(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, i):
            seen.append(("train", self.current_epoch, batch["q"].shape[1]))
            return (self.w * batch["q"].mean()) ** 2

        def validation_step(self, batch, i):
            seen.append(("val", self.current_epoch, batch["q"].shape[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dm = NADDataModule(coded, "omx", window_length=9, horizon={0: 5, 1: 9}, batch_size=4,
                       samples_per_epoch=8)
    trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(Probe(), datamodule=dm)
    train = [t for kind, _, t in seen if kind == "train"]
    assert train == [14, 14, 18, 18]  # 2 batches per epoch; T = L + H
    assert ("val", 1, 8 + 30) in seen  # validation serves the whole episode


def test_a_missing_split_is_a_clear_error(tmp_path):
    with DatasetWriter(tmp_path / "ds", OMX, OMX.fps) as w:
        w.add_episode(coded_frames(0, 30), "t", "train")
        w.add_episode(coded_frames(1, 30), "t", "validation")
    dm = NADDataModule(tmp_path / "ds", "omx")
    with pytest.raises(DataFormatError, match=r"no test episodes \(episodes per split: "
                       r"\{'train': 1, 'validation': 1, 'test': 0\}\)"):
        dm.test_dataloader()
