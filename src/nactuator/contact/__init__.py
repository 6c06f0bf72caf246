"""Contact anywhere on the arm (issue 23): which link is touched, where and how hard, from an
external joint-torque residual (docs/contact.md)."""

from .estimate import (
    ContactCalibration,
    ContactEstimate,
    calibrate_threshold,
    detect,
    estimate_frames,
    external_torque,
    isolate,
    localise,
    tare,
)
from .surface import LinkSurfaces, load_contact_config

__all__ = ["ContactCalibration", "ContactEstimate", "LinkSurfaces", "calibrate_threshold",
           "detect", "estimate_frames", "external_torque", "isolate", "load_contact_config",
           "localise", "tare"]
