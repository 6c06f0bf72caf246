"""nactuator.experiments: drivers that start trainings in child processes and score them.

``cv.run_cv`` (``nactuator cv``: k-fold cross-validation by episode), ``adapt.adapt``
(``nactuator adapt``: fine-tuning on N new episodes), ``sweep.run_sweep`` (``nactuator
sweep``: offline wandb-format sweeps) and ``bam.bench_bam`` (``nactuator bench-bam``). Each
training is ``nactuator train`` run through :mod:`nactuator.child`; each score is the
evaluation protocol (:mod:`nactuator.eval`). They sit above training and eval, which never
import them. Nothing is imported here, so ``nactuator sweep`` does not pay for Lightning.
"""
