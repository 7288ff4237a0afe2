"""pathwaysutils' handled slice-loss log record as one WARNING line.

Its own module, importing no JAX, so that whatever sets up logging (``observe.logs``, the
command line, ``k8s render``) can install it without starting JAX; the elastic layer installs
it too (:func:`elastic_dew.elastic.slices.retry.make_manager`), for library users.
"""

from __future__ import annotations

import logging
import sys

from elastic_dew._compat import pathwaysutils as pw_private

__all__ = ["HandledSliceLossFilter", "install_slice_loss_filter"]


def _is_jax_runtime_error(error: BaseException) -> bool:
    """Whether ``error`` is JAX's runtime error (never, while JAX has not been imported)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(error, jax.errors.JaxRuntimeError)


class HandledSliceLossFilter(logging.Filter):
    """File pathwaysutils' "Elastic event detected" ERROR as one WARNING line.

    pathwaysutils' ``Manager.elastic_retry`` logs that record (with the traceback) only
    after ``is_error_due_to_slice_down`` accepted the error, just before it consults the
    retry policy: it is a slice loss being handled, not a failure. Installed on the
    manager's logger, the filter sees only that logger's own records, and changes only an
    ERROR with that message whose exception is a ``JaxRuntimeError``: it becomes a WARNING
    that names the error in one line (``Elastic event detected: handled slice loss
    (DATA_LOSS: ...); recovering``). The traceback is kept only while elastic_dew's debug
    lines are on (``-v``). pathwaysutils' other records keep their severity.
    """

    LOGGER = pw_private.MANAGER_LOGGER
    MESSAGE = pw_private.SLICE_LOSS_MESSAGE

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.name == self.LOGGER
            and record.levelno == logging.ERROR
            and record.msg == self.MESSAGE
            and record.exc_info
            and record.exc_info[1] is not None
            and _is_jax_runtime_error(record.exc_info[1])
        ):
            error = record.exc_info[1]
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = "%s: handled slice loss (%s); recovering", (self.MESSAGE, first)
            if not logging.getLogger("elastic_dew").isEnabledFor(logging.DEBUG):
                record.exc_info, record.exc_text = None, None
        return True


def install_slice_loss_filter() -> None:
    """Put one :class:`HandledSliceLossFilter` on pathwaysutils' manager logger."""
    manager_logger = logging.getLogger(HandledSliceLossFilter.LOGGER)
    if not any(isinstance(f, HandledSliceLossFilter) for f in manager_logger.filters):
        manager_logger.addFilter(HandledSliceLossFilter())
