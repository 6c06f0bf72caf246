"""nactuator.training: the actuator model trained through the differentiable simulator.

``module.NeuralActuatorModule`` (the LightningModule), ``cli.lightning_main`` / ``cli.train``
(``nactuator fit|validate|test|train``, ``make train``), ``sweep.run_sweep`` (local offline
sweeps of wandb-format files); see docs/training.md. Nothing is imported here, so that
e.g. ``nactuator sweep`` does not pay for importing Lightning and Warp.
"""
