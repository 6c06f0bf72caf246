"""Image-space supervision (issue 20): a pinhole camera with a learnable se(3) extrinsic,
link geometry from the platform MJCF plus ``conf/vision/geoms``, differentiable soft
silhouettes in pure torch, reference masks from MuJoCo ray casting, hand-eye refinement."""
