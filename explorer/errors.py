"""Exception types raised at the engine's boundary.

Every error a user can cause (bad model, bad pin, impossible plan) is one of these, with a
message that says what is wrong and what to do about it.
"""


class ExplorerError(Exception):
    """Base class: an error the user can act on (the CLI prints the message, exit code 2)."""


class UnknownModel(ExplorerError, KeyError):
    """The model name is neither a built-in example nor a `file.py:function` reference."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnsupportedModel(ExplorerError):
    """The model could not be captured or contains an op the engine has no rule for."""


class InfeasiblePlan(ExplorerError):
    """No plan satisfies the constraints (pins, device count, batch split, memory)."""


class UnknownPreset(ExplorerError, KeyError):
    """The device preset name is unknown or the cluster file is malformed."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class PlanFileError(InfeasiblePlan):
    """A plan document cannot be used: missing, unreadable, unknown schema, newer version, or
    edited after it was saved."""


class ModelFilesOff(ExplorerError):
    """A page asked the server to load a ``path.py:function`` model file, which runs code on
    the server, and the server was not started with ``--allow-model-files``."""


class NotCalibrated(ExplorerError):
    """Measured costs were asked for devices that are not this machine's calibrated ``local``
    preset (run ``explorer calibrate`` first, or use ``--cost analytic``)."""
