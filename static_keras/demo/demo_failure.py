"""`DemoFailure`: a demo's promise did not hold (it exits non-zero)."""


class DemoFailure(RuntimeError):
    """An invariant the demo promises did not hold."""
