"""Residual action correction (issue 22 item 4): Δu = π(target) learned through model + sim."""

from nactuator.correction.residual import (
    CorrectionError,
    ResidualPolicy,
    fit_residual,
    model_tracking,
)

__all__ = ["CorrectionError", "ResidualPolicy", "fit_residual", "model_tracking"]
