"""Every backend this machine is meant to have starts: host, opencl (PoCL), pjrt (the XLA CPU
plugin, found through the installed xla-cpu-pjrt) and ferry's own PJRT plugin beside the package.
The device-parametrised tests quietly run on whatever backends start (conftest.DEVICE_NAMES); this
file is where a missing one is noticed. Each case skips with the reason outside CI and fails in
CI (CI=true, or FERRY_REQUIRE_ALL_BACKENDS=1), so a package built without the pjrt backend or a
machine without PoCL is red there, never green by skipping."""

import os

import numpy as np
import pytest

import ferry
import ferry.jax
from conftest import skip_or_fail_unavailable


@pytest.mark.parametrize("backend", ["host", "opencl", "pjrt"])
def test_backend_starts_and_puts(backend):
    try:
        devices = ferry.devices(backend)
    except ferry.Error as error:
        skip_or_fail_unavailable(f"the {backend} backend cannot start here: {error}")
    assert devices, f"the {backend} backend started with no device"
    array = ferry.device_put(np.array([1.5, -2.0, 3.25]), devices[0])
    assert ferry.device_get(array).tolist() == [1.5, -2.0, 3.25]


def test_ferrys_pjrt_plugin_is_installed_beside_the_package():
    try:
        path = ferry.jax.plugin_path()
    except ferry.Error as error:
        skip_or_fail_unavailable(f"no ferry_pjrt_plugin.so: {error}")
    assert os.path.isfile(path), path
    assert os.path.dirname(path) == os.path.dirname(ferry.__file__)
