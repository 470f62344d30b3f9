"""StepAttempts: tells a parameter-server job when a scheduled step may have run twice.

ParameterServerStrategy's ClusterCoordinator runs the step of a worker it lost again on
another worker (tf.distribute.experimental.coordinator.ClusterCoordinator.schedule: "the
function may be executed more than once"). A worker that died after its step's update
reached the parameter servers, or in the middle of it, has then trained its batch twice,
in part or whole, and nothing else in the job would know. This counter, on a parameter
server, counts how many times scheduled steps started their update: after a round, more
starts than steps scheduled means a step was run again, and an exactly-once job rolls back
to its last checkpoint (ttf.distribute.Job.follow does).
"""
import tensorflow as tf


class StepAttempts(tf.Module):
    """Counts the starts of scheduled steps' updates, where the job's variables live.

    Create it under the strategy's scope (the counter then lives on a parameter server, so
    every worker's step adds to one count); in the step, pass the value every update depends
    on (e.g. the batch's labels) through `mark`; after the round,
    `read()` minus the value before it is the number of starts. Not checkpointed.

    Example (one process: the counter is local):
      >>> import tensorflow as tf, ttf
      >>> attempts = ttf.distribute.StepAttempts()
      >>> loss = attempts.mark(tf.constant(0.5))   # the update, depending on loss, comes after
      >>> attempts.read()
      1
    """

    def __init__(self):
        super().__init__(name="step_attempts")
        self.started = tf.Variable(0, dtype=tf.int64, trainable=False, name="started")

    def mark(self, value):
        """`value`, available only once this start is counted: updates that depend on it run after."""
        with tf.control_dependencies([self.started.assign_add(1)]):
            return tf.identity(value)

    def read(self):
        return int(self.started.numpy())
