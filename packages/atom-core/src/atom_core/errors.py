"""The errors ATOM raises for bad input: each names what is wrong and where.

Every error is one of three kinds, and the ``atom`` command exits with the kind's code (``atom_core.cli.main``
is the one place that turns an error into a one-line message and an exit code):

==========================  ====  =====================================================================
kind                        exit  what is wrong
==========================  ====  =====================================================================
:class:`UsageError`          2    the arguments: token ids, sampling settings, an output directory...
                                  (argparse's own errors exit 2 too)
:class:`CheckpointError`     3    the checkpoint: missing or corrupt files, tensors of the wrong shape
                                  or dtype, a config.json that contradicts itself
:class:`UnsupportedError`    4    well-formed input ATOM cannot run: architecture, quantization scheme,
                                  config feature, a device this machine does not have
any other :class:`AtomError`  1    named, but of no finer kind (a write that failed: disk full, read-only)
Ctrl-C                      130    interrupted (the shell's code for SIGINT); writers leave their output as it was
anything else                70    a bug: the command prints the traceback
==========================  ====  =====================================================================
"""

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CHECKPOINT = 3
EXIT_UNSUPPORTED = 4
EXIT_INTERNAL = 70  # sysexits' EX_SOFTWARE
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


class AtomError(Exception):
    """Base of ATOM's own errors."""

    exit_code = EXIT_ERROR


class UsageError(AtomError, ValueError):
    """An argument is out of range or contradicts another (or the checkpoint it is used with)."""

    exit_code = EXIT_USAGE


class CheckpointError(AtomError, ValueError):
    """A checkpoint is incomplete, corrupt or does not fit the model (missing shard, shape, dtype, coverage)."""

    exit_code = EXIT_CHECKPOINT


class UnsupportedError(AtomError, ValueError):
    """Well-formed input that ATOM (or this machine) cannot run."""

    exit_code = EXIT_UNSUPPORTED


class UnsupportedArchitectureError(UnsupportedError):
    pass


class UnsupportedQuantizationError(UnsupportedError):
    pass


class UnsupportedConfigError(UnsupportedError):
    pass


class DeviceUnavailableError(UnsupportedError):
    """The device asked for is not present (``--device cuda`` on a machine without CUDA)."""
