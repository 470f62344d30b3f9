"""The misuse cases of tests/distribute/test_misuse.py that depend on Keras (checkpoint paths,
variables, the output's last op, optimizer conversion), run on Keras 3."""
from tests.distribute.test_misuse import (  # noqa: F401 (collected here, on Keras 3)
    test_a_checkpoint_of_another_model_is_refused_and_left_alone,
    test_a_stock_keras_optimizer_becomes_its_ttf_twin_with_a_warning,
    test_the_model_output_is_checked_once_at_setup,
    test_the_same_model_resumes,
    test_warm_start_takes_the_matching_parts_and_starts_at_step_0,
    trained_dir,
)
