"""ttf.distribute.Job on Keras 3: the user's-own-model tests of tests/distribute/test_job.py
(resume bit for bit, the NaN guard on their own tf.data, publishing to a follower) and the
README's Job example, run here with TF_USE_LEGACY_KERAS unset."""
from tests.distribute.test_job import (  # noqa: F401 (collected here, on Keras 3)
    rows,
    test_own_dataset_and_the_nan_guard,
    test_own_model_fits_resumes_and_evaluates,
    test_publishing_serves_the_trained_rows,
)
from tests.test_readme import run_job_example


def test_keras3_is_what_runs():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    assert tf.keras.__name__.startswith("keras") and not tf.keras.__name__.startswith("tf_keras")


def test_readme_job_example_runs_on_keras3(tmp_path):
    run_job_example(tmp_path)
