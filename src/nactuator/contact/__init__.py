"""Contact anywhere on the arm (issue 23): which link is touched, where and how hard, from an
external joint-torque residual (docs/contact.md)."""

from .estimate import (
    ContactCalibration,
    ContactEstimate,
    ContactFilter,
    ContactStream,
    FilterSettings,
    calibrate_threshold,
    check_calibration,
    detect,
    episode_residual,
    estimate_frame,
    estimate_frames,
    estimate_recording,
    estimator_settings,
    external_torque,
    filter_frames,
    isolate,
    localise,
    localise_window,
    model_sha256,
    residual_ee_force,
    tare,
)
from .surface import LinkSurfaces, load_contact_config

__all__ = ["ContactCalibration", "ContactEstimate", "ContactFilter", "ContactStream",
           "FilterSettings", "LinkSurfaces", "calibrate_threshold", "check_calibration",
           "detect", "episode_residual", "estimate_frame",
           "estimate_frames", "estimate_recording", "estimator_settings", "external_torque",
           "filter_frames", "isolate", "load_contact_config", "localise", "localise_window",
           "model_sha256", "residual_ee_force",
           "tare"]
