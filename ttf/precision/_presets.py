"""A job's precision by name: "auto" resolved for this CPU, and the policy each name runs."""
from ttf.precision._cpu import cpu_has_native_bf16
from ttf.precision._policy import AdaptivePrecision


def resolve_precision(precision):
    """(precision, note): "auto" becomes "loss" on a CPU with native bf16 (avx512_bf16 or
    amx_bf16) and "fp32" elsewhere, where bf16 is emulated and slower (the note says so);
    any other name is returned as it is, with no note."""
    if precision != "auto":
        return precision, None
    if cpu_has_native_bf16():
        return "loss", None
    return "fp32", ("precision auto: this CPU has no native bf16 (avx512_bf16 / amx_bf16), where bf16 is emulated and "
                    "slower: training in fp32 (precision loss or bf16 forces bf16)")


def policy_for(precision):
    """The training step's policy for a precision name: None for "fp32", bf16 on every step
    for "bf16", and the loss-driven switch for "loss"."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return AdaptivePrecision("time", start_step=0)
    if precision == "loss":
        return AdaptivePrecision("loss", warmup_steps=20, calm_steps=10, hold_steps=50, interval=500, interval_hold=10)
    raise ValueError(f"precision must be fp32, bf16, loss or auto (resolve_precision), got {precision!r}")
