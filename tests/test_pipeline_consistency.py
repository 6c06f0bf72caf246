"""The rooms must agree on what the model sees: a training rollout and the evaluation
protocol, started from the same frame, are the same computation (same windows, same padding,
same temperature filter, same simulator steps)."""

from __future__ import annotations

import numpy as np
import torch

from nactuator.data import read_dataset
from nactuator.data.datamodule import NADDataModule
from nactuator.data.importers import import_nad
from nactuator.eval.episodes import filter_temperature
from nactuator.eval.protocol import rollout as eval_rollout
from nactuator.models import NeuralActuator
from nactuator.sim import Simulator
from nactuator.training.rollout import rollout as train_rollout

HISTORY, HORIZON = 8, 6
TINY = {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32,
        "head_hidden": 16, "tau_init_scale": 1.0}


def test_eval_protocol_replays_the_training_rollout_from_frame_zero(nad_dir, tmp_path):
    ds = tmp_path / "so101"
    import_nad(nad_dir / "so101", ds)
    dm = NADDataModule([ds], "so101", history=HISTORY, horizon=HORIZON, batch_size=1, seed=0)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    assert int(batch["start"][0]) == 0 and bool(batch["pad"][0, :HISTORY].all())

    torch.manual_seed(0)
    actuator = NeuralActuator(n_motors=6, norm_stats=dm.norm_stats, model_config=TINY).eval()
    sim = Simulator("so101")
    one = {k: v[:1] for k, v in batch.items()}
    with torch.no_grad():
        trained = train_rollout(actuator, sim.step, one, HISTORY, HORIZON,
                                q0=one["q"][:, HISTORY], qd0=torch.zeros(1, 6))

    (episode,) = [ep for ep in read_dataset(ds).episodes if ep.split == "validation"]
    window = int(dm.hparams["temperature_median"])
    (evaluated,) = eval_rollout(actuator, sim, [filter_temperature(episode, window)], HISTORY)

    # the untrained model moves the arm, so equal states mean equal windows and steps
    assert np.abs(evaluated.q[HORIZON] - evaluated.q[0]).max() > 1e-4
    np.testing.assert_allclose(evaluated.q[: HORIZON + 1], trained.q[0].numpy(), atol=1e-6)
    np.testing.assert_allclose(evaluated.force[:HORIZON], trained.force[0].numpy(), atol=1e-5)
