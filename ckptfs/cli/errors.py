"""How a command fails: the exceptions reported as one line, and the exit statuses."""

from __future__ import annotations


class CliError(Exception):
    """A command-line failure to report as one line and a non-zero exit: the command's
    error status (`error_exit` of its parser, else 1)."""


class UsageError(CliError):
    """Bad input on the command line, refused before anything starts: exit status 2 from
    every command (mount included)."""


#: exit status of verify/ls/latest/fsck/gc... when the check (or the run) could not be done
EXIT_ERROR = 2

#: the exit status of a command whose output pipe was closed (`ckptfs ls STORE | head`):
#: what a shell reports for coreutils, which SIGPIPE kills (128 + 13)
EXIT_PIPE = 141

#: the exit status of a command interrupted with Ctrl-C (128 + SIGINT), as a shell's
EXIT_INTERRUPTED = 130
