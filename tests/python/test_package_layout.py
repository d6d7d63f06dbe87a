"""The package is split into modules by concern (ferry._errors, _dtypes, _devices, _sharding,
_inputs, _transfers, _arrays, _files, _settings); what users and the extension see stays `ferry.X`."""

import inspect
import pathlib
import re

import ferry


def test_every_public_name_is_there_and_reports_the_ferry_module():
    for name in ferry.__all__:
        value = getattr(ferry, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            expected = "ferry._ferry" if name == "Device" else "ferry"
            assert value.__module__ == expected, f"ferry.{name} reports {value.__module__}"


def test_public_names_are_listed_once():
    duplicates = sorted({name for name in ferry.__all__ if ferry.__all__.count(name) > 1})
    assert not duplicates, duplicates


def test_the_helpers_module_cc_calls_by_name_are_in_the_package():
    # src/python/module.cc defines Array's Python-side methods by looking ferry._array_* up at
    # call time (PythonHelper): a name lost in a move would fail only when that method is called.
    source = pathlib.Path(__file__).resolve().parents[2] / "src" / "python" / "module.cc"
    text = source.read_text()
    names = set(re.findall(r'PythonHelper\("(\w+)"\)', text))
    names |= set(re.findall(r'import_\("ferry"\)\.attr\("(\w+)"\)', text))
    assert len(names) >= 10, sorted(names)
    missing = sorted(name for name in names if not callable(getattr(ferry, name, None)))
    assert not missing, f"module.cc calls ferry.{missing}, which the package lacks"


def test_a_pickled_array_names_its_rebuilder_in_the_ferry_namespace():
    import pickle

    array = ferry.device_put(ferry.empty(3), "host:0")
    payload = pickle.dumps(array)
    assert b"ferry" in payload and b"_unpickle_array" in payload
    assert b"ferry._arrays" not in payload, "a pickle must not depend on the module layout"
