"""Every shipped negative control of the recommender and tpu_embedding cases that the numbers
must catch declares the hypothesis of `verify.explain` that must explain it, unless it is
listed here with why no hypothesis can tell it; each declared cause names a hypothesis the
explanation stage can find."""
import cases.recommender as recommender
import cases.tpu_embedding as tpu_embedding

# Controls no hypothesis of verify.explain can tell, and why.
NOT_EXPLAINABLE = {
    "control-resume-kernel-rows-not-permuted": "its first divergence is an evaluation metric "
    "at step 0 (a restored kernel whose rows meet the wrong inputs); no hypothesis reads metrics",
    "control-keras3-tf-repeated-rows": "repeated ids squared apart in the accumulator: no "
    "hypothesis models a sparse update's pieces",
    "control-keras3-ftrl-dense-update": "FTRL recomputing untouched rows: FTRL's update is not "
    "recovered from the captured state",
    "control-keras3-tf-dense-ids": "repeated ids squared apart in the accumulator (as above)",
    "control-concat-order": "a kernel whose rows meet the wrong inputs: the loss differs from "
    "step 1 with equal variables, which no hypothesis attributes to a layout",
}
KNOWN = ("structure", "input", "drop_step", "loss_scale", "clip_global_norm", "clip_norm",
         "clip_value", "gradient_scale", "slot_not_restored", "initial_accumulator",
         "adam_step_count", "learning_rate", "epsilon", "adam_one_minus_beta_2", "combiner",
         "ftrl_beta")


def test_every_numeric_control_declares_its_cause_or_says_why_not():
    shipped = [recommender.make_case(o) for o in recommender.RECIPES] + [tpu_embedding.CASE]
    for case in shipped:
        for implementation in case.implementations:
            expect = implementation.expect
            if expect is None:
                continue
            name = implementation.name
            if name in NOT_EXPLAINABLE:
                assert not expect.cause, f"{name} declares a cause and is listed as not one"
                continue
            assert expect.cause.split(" ")[0] in KNOWN, f"{case.name} {name}: {expect.cause!r}"
