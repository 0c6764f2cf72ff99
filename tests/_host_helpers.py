"""A module-level function for tests/library/test_failures_cpu.py: model code that does host work."""


def host_value(x):
    raise RuntimeError("host read")
