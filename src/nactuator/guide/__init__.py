"""The guided path from a connected arm to a live force sensor (``nactuator calibrate-arm``):
check the buses, record the protocol of ``conf/calibrate/<platform>.yaml`` with known
weights, adapt the shipped pretrained actuator to it, score it on the held-out last run and
write the bundle for ``live --ckpt``; every step resumable (docs/hardware.md)."""

from nactuator.guide.calibrate import Interrupted, calibrate_arm, check_arm
from nactuator.guide.protocol import (
                                      CalibrateError,
                                      State,
                                      Step,
                                      adapt_steps,
                                      load_protocol,
                                      parse_weights,
                                      plan_steps,
)

__all__ = ["CalibrateError", "Interrupted", "State", "Step", "adapt_steps", "calibrate_arm",
           "check_arm", "load_protocol", "parse_weights", "plan_steps"]
