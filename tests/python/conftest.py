import os
import subprocess
import sys
import textwrap

import pytest

# The host backend presents this many devices (read when ferry first creates its host client), so
# that sharding runs over real multi-device meshes.
os.environ.setdefault("FERRY_HOST_DEVICES", "8")

import ferry  # noqa: E402


def _device_names():
    names = ["host:0"]
    try:
        names += [d.name for d in ferry.devices("opencl")][:1]
    except ferry.Error:
        pass  # no OpenCL backend or device on this machine
    try:
        names += [d.name for d in ferry.devices("pjrt")][:1]
    except ferry.Error:
        pass  # no PJRT plugin installed (pip install xla-cpu-pjrt), or built without its header
    return names


DEVICE_NAMES = _device_names()


@pytest.fixture(params=DEVICE_NAMES)
def device(request):
    """Every Python test that takes a device runs on each backend available here."""
    return ferry.device(request.param)


def run_python(code: str, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter; raises subprocess.TimeoutExpired (after killing it) on a hang."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
