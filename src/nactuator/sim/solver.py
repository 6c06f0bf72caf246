"""``SolverFeatherstone`` with gradients that are right across several recorded substeps.

The stock solver keeps ONE set of mass-matrix/Cholesky scratch arrays (``M, J, P, H, L``) on
itself and overwrites them every step, so the adjoint of every taped substep reads the
factor of the LAST substep (physics.md §3; newton PR #3567 review, warp#260/#249/#655).
Here each output state that is being recorded gets its own set, allocated once and cached
on that state, and swapped into the solver before the stock step runs. This relies on
private attributes of newton 1.8.0, which is why newton is pinned exactly and a
finite-difference test (tests/test_sim_grad.py) guards it.
"""

from __future__ import annotations

import warp as wp
from newton.solvers import SolverFeatherstone

__all__ = ["GradientSafeFeatherstone"]

_SCRATCH = ("M", "J", "P", "H", "L")
_CACHE_ATTR = "_nactuator_featherstone_scratch"


class GradientSafeFeatherstone(SolverFeatherstone):
    """Featherstone whose recorded substeps each keep the factor their adjoint needs."""

    def __init__(self, model, **kwargs) -> None:
        if kwargs.get("update_mass_matrix_interval", 1) != 1:
            # A skipped update would leave a state's private buffers at zero.
            raise ValueError("GradientSafeFeatherstone needs update_mass_matrix_interval=1")
        if kwargs.get("use_tile_gemm", False):
            # Tile mode keeps views into the construction-time buffers, which a swap misses.
            raise ValueError("GradientSafeFeatherstone needs use_tile_gemm=False")
        super().__init__(model, **kwargs)
        self._own_scratch = {name: getattr(self, name) for name in _SCRATCH}

    def step(self, state_in, state_out, control, contacts, dt, **kwargs) -> None:
        if state_in.requires_grad:
            scratch = getattr(state_out, _CACHE_ATTR, None)
            if scratch is None:
                scratch = {
                    name: wp.zeros_like(self._own_scratch[name], requires_grad=True)
                    for name in _SCRATCH
                }
                setattr(state_out, _CACHE_ATTR, scratch)
        else:
            scratch = self._own_scratch
        for name, array in scratch.items():
            setattr(self, name, array)
        super().step(state_in, state_out, control, contacts, dt, **kwargs)
