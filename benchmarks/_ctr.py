"""What the serving benchmarks share: a ttf DeepFM trained with Adam, and a publisher's clock moved by hand.

Imports ttf and the model zoo, so a benchmark whose other process must stay stock TensorFlow imports this
module only where it trains.
"""
import tensorflow as tf

from models import ctr


class ManualClock:
    """A Publisher's clock, moved by hand: one delta per publish() while staging."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def deepfm_trainer(dim, seed=0, lr=0.001):
    """A ttf DeepFM on the criteo schema with its Adam; returns (model, step), step(features, labels) one
    training step on a batch of {"ids", "dense"} features."""
    model = ctr.build(ctr.spec_for("criteo", model="fm", embedding_dim=dim), "ttf", seed=seed)
    return model, train_step(model, ctr.make_optimizer("ttf", "adam", lr))


def train_step(model, optimizer):
    """One traced training step of a models/ctr.py model: step(features, labels) -> the mean loss."""
    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            logits = model.logits(features, training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return step
