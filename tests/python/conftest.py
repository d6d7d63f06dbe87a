import os
import subprocess
import sys
import textwrap

import pytest

# The host backend presents this many devices (read when ferry first creates its host client), so
# that sharding runs over real multi-device meshes.
os.environ.setdefault("FERRY_HOST_DEVICES", "8")

import ferry  # noqa: E402


def all_backends_required() -> bool:
    """In CI (CI=true, or FERRY_REQUIRE_ALL_BACKENDS=1) every backend, the PJRT plugins and
    ferry's own plugin must start: a test that needs one that cannot fails with the reason instead
    of skipping (FERRY_REQUIRE_ALL_BACKENDS=0 turns this off). tests/required_backends.h is the
    C++ side of the same rule."""
    required = os.environ.get("FERRY_REQUIRE_ALL_BACKENDS", "")
    if required:
        return required != "0"
    return os.environ.get("CI") == "true"


def skip_or_fail_unavailable(reason: str, allow_module_level: bool = False):
    """Skips with `reason`, or fails with it where every backend is required."""
    if all_backends_required():
        pytest.fail(f"{reason} [every backend is required here (CI=true or "
                    "FERRY_REQUIRE_ALL_BACKENDS=1): install what it needs, or set "
                    "FERRY_REQUIRE_ALL_BACKENDS=0 to skip]", pytrace=False)
    pytest.skip(reason, allow_module_level=allow_module_level)


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
