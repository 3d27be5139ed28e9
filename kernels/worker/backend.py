"""Which backend this worker runs on, in the words of the eval contract."""

from __future__ import annotations

from typing import Any

from tilewright.profiling.chips import TPU_INTERPRET


def backend_info() -> dict[str, Any]:
    """``{platform, mode, device_kind, jax_version}`` of the default JAX device.

    Pallas TPU kernels run natively only on a TPU; anywhere else they run in TPU
    interpret mode (on the host CPU), and every timing is labeled accordingly.
    """
    import jax

    device = jax.devices()[0]
    platform = device.platform
    if platform not in ("cpu", "tpu"):
        platform = "gpu" if platform in ("gpu", "cuda", "rocm") else platform
    return {
        "platform": platform,
        "mode": "native" if platform == "tpu" else TPU_INTERPRET,
        "device_kind": str(device.device_kind),
        "jax_version": jax.__version__,
    }

