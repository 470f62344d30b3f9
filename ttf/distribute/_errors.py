"""The errors a job raises, typed so a caller maps them to its own exit codes without reading
TensorFlow's message text. Each message is one line naming the cause and the fix."""
import re

import tensorflow as tf

from ttf._errors import error_summary


class JobError(RuntimeError):
    """A ttf job stopped; the message says why and how to go on."""


class BadInputError(JobError, ValueError):
    """An input line could not be parsed by the schema: `location` is `file:line: reason`."""

    def __init__(self, location):
        super().__init__(f"{location} (fix the file or the schema, or read with strict=False to skip and count "
                         "bad lines)")
        self.location = location


class LostParameterServerError(JobError):
    """A parameter server (or the network to it) failed; resume from the last checkpoint."""


class LostRankError(JobError):
    """Another rank of a synchronous job stopped (or the network failed); resume from the last checkpoint."""


class SaveFailedError(JobError):
    """A checkpoint save failed; nothing was recorded and the previous checkpoint is whole."""


# The reader's "file:line: bad <schema> line: reason" inside a TensorFlow error's text.
_BAD_LINE = re.compile(r"(\S+:\d+: bad \S+ line: .*?)(?: \(read with strict=False|\n|$)")


def bad_input(error):
    """A BadInputError for a TensorFlow error raised by ttf's reader on a bad line, else None."""
    if not isinstance(error, tf.errors.InvalidArgumentError):
        return None
    found = _BAD_LINE.search(str(error))
    return BadInputError(found.group(1)) if found else None


def lost_parameter_server(error, ps_hosts):
    err = LostParameterServerError(
        f"lost contact with the cluster ({error_summary(error)}). A parameter server "
        f"({', '.join(ps_hosts) or 'see above'}) or the network failed; restart the job with the same checkpoint_dir "
        "to resume from the last checkpoint.")
    err.cause, err.ps_hosts = error_summary(error), tuple(ps_hosts)
    return err


def lost_rank(error, rank, runtime, detail=None):
    """detail: what the backend found out (e.g. which worker was lost), in place of the error's summary."""
    err = LostRankError(
        f"(rank {rank}): a {runtime} collective failed ({detail or error_summary(error)}). Another rank stopped or the "
        "network failed; restart every rank with the same checkpoint_dir to resume from the last checkpoint.")
    err.cause, err.rank, err.runtime = error_summary(error), rank, runtime
    return err
