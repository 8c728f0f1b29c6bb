"""The errors ATOM raises for bad input: each names what is wrong and where."""


class AtomError(Exception):
    """Base of ATOM's own errors."""


class UnsupportedArchitectureError(AtomError, ValueError):
    pass


class CheckpointError(AtomError, ValueError):
    """A checkpoint is incomplete or does not fit the model (missing shard, shape, coverage)."""


class UnsupportedQuantizationError(AtomError, ValueError):
    pass


class UnsupportedConfigError(AtomError, ValueError):
    pass
