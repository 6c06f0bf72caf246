"""Contact anywhere on the arm (issue 23): which link is touched, where and how hard, from an
external joint-torque residual (docs/contact.md)."""

from .estimate import ContactEstimate, calibrate_threshold, detect, isolate, localise
from .surface import LinkSurfaces, load_contact_config

__all__ = ["ContactEstimate", "LinkSurfaces", "calibrate_threshold", "detect", "isolate",
           "load_contact_config", "localise"]
