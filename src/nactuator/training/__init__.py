"""nactuator.training: the actuator model trained through the differentiable simulator.

``module.NeuralActuatorModule`` (the LightningModule), ``cli.lightning_main`` / ``cli.train``
(``nactuator fit|validate|test|train``, ``make train``); see docs/training.md. The drivers
that start trainings and score them (cv, adapt, sweep, bench-bam) are ``nactuator.experiments``.
Nothing is imported here, so that e.g. ``nactuator train --help`` does not pay for importing
Lightning and Warp.
"""
