"""Physical constants and label definitions shared by several rooms, defined once.

``GRAVITY`` is the gravity of every simulated world (the chain and Newton engines, the
MuJoCo parity model, the hidden world's payload) and of the payload force labels (NAD:
f_z = -m g). ``CONTACT_THRESHOLD_N`` is what "in contact" means for a labelled force: the
contact gate's training target (``training.losses``) and its score (``eval.metrics``).
"""

GRAVITY = 9.81  # m/s², acting along -z of the base frame
CONTACT_THRESHOLD_N = 0.01  # a labelled frame is "in contact" when |f| exceeds this [N]

__all__ = ["CONTACT_THRESHOLD_N", "GRAVITY"]
