"""How a run ends when it does not train to its last step: the exit statuses, and the
error of a bad argument (:class:`UsageError`, exit :data:`USAGE_EXIT`), one home each for
the run and every command."""

from __future__ import annotations

from elastic_dew.mentions import Namer, name_mentions

__all__ = ["UsageError", "USAGE_EXIT", "FAILED_EXIT"]

#: The exit status of a bad argument (argparse's).
USAGE_EXIT = 2
#: The exit status of a run that failed: an error that is not a slice loss, a wait for
#: slices past ``--timeout``, slice losses past ``--max-attempts``.
FAILED_EXIT = 1


class UsageError(ValueError):
    """A bad argument, found before anything was touched.

    Its text may name settings with :func:`~elastic_dew.settings.mention`: ``str()`` names
    them as Python does (``run_dir=``), a command line as its flags (``--run-dir``).
    """

    def wording(self, name: Namer | None = None) -> str:
        """The refusal, worded for Python or for another surface (a command line's).

        Args:
          name: names each setting the text mentions (default: Python's ``field=value``).

        Returns:
          The refusal's text.
        """
        return name_mentions(super().__str__(), name)

    def __str__(self) -> str:
        return self.wording()
