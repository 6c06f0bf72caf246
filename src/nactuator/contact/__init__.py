"""Contact anywhere on the arm (issue 23): which link is touched, where and how hard, from an
external joint-torque residual (docs/contact.md)."""

from .estimate import (
    ContactCalibration,
    ContactEstimate,
    ContactStream,
    calibrate_threshold,
    check_calibration,
    detect,
    ee_force_from_torque,
    episode_residual,
    estimate_frame,
    estimate_frames,
    external_torque,
    isolate,
    localise,
    model_sha256,
    residual_ee_force,
    tare,
)
from .surface import LinkSurfaces, load_contact_config

__all__ = ["ContactCalibration", "ContactEstimate", "ContactStream", "LinkSurfaces",
           "calibrate_threshold", "check_calibration", "detect", "ee_force_from_torque",
           "episode_residual", "estimate_frame", "estimate_frames", "external_torque",
           "isolate", "load_contact_config", "localise", "model_sha256", "residual_ee_force",
           "tare"]
