import math
import types

import pytest

from course_lib.studies import amp_skips as A


def test_skip_note_names_the_skipped_steps_and_their_scales():
    ran = types.SimpleNamespace(skipped=[False, False, True, False], scales=[65536.0, 65536.0, 65536.0, 32768.0])
    clean = types.SimpleNamespace(skipped=[False] * 4, scales=[1.0] * 4)
    note = A.skip_note({"fp16_autocast_scaler": ran})["recipe_skips"]   # no reference run: no gaps
    assert note == ("`fp16_autocast_scaler` skipped step 2 (its scaled gradients overflowed FP16 at a scale "
                    "of 2\u00b9\u2076). A gradient's norm does not size the update here: every run clips its "
                    "gradients to a norm of 1 before the optimizer's step, and AdamW moves each weight by about its "
                    "learning rate whatever the gradient's size. A skipped step is a whole update missing, and "
                    "the table's final loss (one step's loss, on one batch) may reflect it.")
    assert A.skip_note({"fp32": clean})["recipe_skips"] == "No run skipped a step here."
    # with losses: the skipped step's gap and the next one, beside a same-prefix run that skipped nothing
    ran.losses, clean.losses = [3.0, 2.8, 2.9, 2.7], [3.0, 2.8, 2.6, 2.5]
    peer = types.SimpleNamespace(skipped=[False] * 4, scales=[1.0] * 4, losses=[3.0, 2.8, 2.85, 2.5])
    note = A.skip_note({"fp32": clean, "fp16_autocast_scaler": ran, "fp16_autocast_no_scaler": peer,
                        "bf16_autocast": peer})["recipe_skips"]
    assert ("Its loss minus `fp32`'s was +0.300 and +0.200 at steps 2 and 3: a step's loss is measured before its "
            "update, so step 3 is the first to miss the skipped one (`fp16_autocast_no_scaler`, which skipped "
            "nothing: +0.250 and +0.000). A difference at step 2 cannot come from the skip.") in note
    # bf16_autocast is no prefix peer, but it shares the rise at step 2; no norms kept: none printed
    assert "`bf16_autocast`, which skipped nothing:" not in note and "gradient norms" not in note
    assert "At step 2 every autocast run's loss was above `fp32`'s, by +0.250 to +0.300" in note
    ran.grad_norms, clean.grad_norms = [1.0, 1.0, math.inf, 11.0], [1.0, 1.0, 1.01, 1.0]
    peer.grad_norms = [1.0, 1.0, 14.5, 1.0]
    note = A.skip_note({"fp32": clean, "fp16_autocast_scaler": ran, "fp16_autocast_no_scaler": peer})["recipe_skips"]
    ran.lrs = [3e-3] * 4
    note = A.skip_note({"fp32": clean, "fp16_autocast_scaler": ran, "fp16_autocast_no_scaler": peer},
                       clip_norm=0.5)["recipe_skips"]
    # the inf sits beside the run that overflowed; the norms before clipping do not size AdamW's update
    assert ("which this page does not explain further. The unscaled gradient norms at steps 2 and 3, before "
            "clipping, were `fp16_autocast_scaler` inf (the overflow that made the skip) and 11; `fp32` 1.01 and 1; "
            "`fp16_autocast_no_scaler` 14.5 and 1. A gradient's norm does not size the update here: every run clips "
            "its gradients to a norm of 0.5 before the optimizer's step, and AdamW moves each weight by about its "
            "learning rate, 0.003, whatever the gradient's size. A skipped step is a whole update missing") in note
    assert "how large the update was" not in note and "where the other runs took a large one" not in note
    assert "clips" not in A.skip_note({"fp16_autocast_scaler": ran}, clip_norm=None)["recipe_skips"]
    with pytest.raises(ValueError, match="clip_norm must be None or a positive"):
        A.skip_note({"fp16_autocast_scaler": ran}, clip_norm=0.0)


def test_skip_note_says_a_rise_every_autocast_run_shares():
    # step 1: every autocast run above fp32, bf16_autocast (never skipped) too; at step 2 it is back
    fp32 = types.SimpleNamespace(skipped=[False] * 4, scales=[1.0] * 4, losses=[3.0, 2.0, 2.5, 2.4])
    scaler = types.SimpleNamespace(skipped=[False, True, False, False], scales=[65536.0] * 4,
                                   losses=[3.0, 2.3, 2.7, 2.5])
    bf16 = types.SimpleNamespace(skipped=[False] * 4, scales=[1.0] * 4, losses=[3.0, 2.15, 2.505, 2.4])
    note = A.skip_note({"fp32": fp32, "bf16_autocast": bf16, "fp16_autocast_scaler": scaler})["recipe_skips"]
    assert ("At step 1 every autocast run's loss was above `fp32`'s, by +0.150 to +0.300 (`bf16_autocast` +0.150, "
            "which skipped nothing), and at step 2 the autocast runs that skipped nothing were back within 0.005 of it: a "
            "rise on one batch, shared by runs that never skipped, which this page does not explain further.") in note
    # perturbed fp32 runs as a yardstick: one that rises at step 1 as far as half the autocast runs' smallest
    # rise says the rise is the run's sensitivity; controls that stay near fp32 there say they do not explain it
    def note_with(*draws, recipe="fp32"):
        runs = {f"c{i}": types.SimpleNamespace(skipped=[False] * 4, scales=[1.0] * 4, losses=list(d))
                for i, d in enumerate(draws, 1)}
        return A.skip_note({"fp32": fp32, "bf16_autocast": bf16, "fp16_autocast_scaler": scaler},
                           controls=A.PerturbedRuns(recipe, 1e-4, runs))["recipe_skips"]

    rising = ([3.0, 2.08, 2.5, 2.4], [3.0, 2.0, 2.52, 2.4])
    note = note_with(*rising)
    assert ("a rise on one batch, shared by runs that never skipped. As a yardstick, `fp32` itself, trained again "
            "from its initial weights each multiplied by 1 + 0.0001 × N(0, 1) (a relative change of about 0.0001, "
            "against BF16's unit roundoff of 0.0039; two draws, no autocast), was +0.080 and +0.000 from its unperturbed run "
            "at step 1, and up to 0.080 at any step: one of the two draws rose at step 1 at least half as far as "
            "the smallest autocast rise, with no autocast rounding at all. Around this step one batch's loss is "
            "sensitive to small differences in the weights, and rounding is one source of such differences; with "
            "one run per recipe, a recipe's own effect there cannot be told from that sensitivity.") in note
    # the skipped run's first loss after the skip (step 2), against the yardstick's widest draw there (0.02):
    # beyond it, but the run was already beyond the draws (0.08) at the skipped step, before the skip could act
    assert ("At step 2, the first loss after the skip, the yardstick's draws were within 0.020 of `fp32` and "
            "`fp16_autocast_scaler` was +0.200, beyond the yardstick. But at step 1, before the skip could act, it "
            "was already +0.300, while the yardstick's draws were within 0.080 of `fp32` there: the run had drifted "
            "apart before it skipped, and this page cannot tell how much of the gap the skip caused.") in note
    # a same-kind run that skipped nothing, as far apart at the skipped step and back within the yardstick after
    # it: the closer control, which points to the skip for the gap that stayed; one that drifted less is none
    def with_peer(losses):
        peer = types.SimpleNamespace(skipped=[False] * 4, scales=[1.0] * 4, losses=losses)
        runs = {f"c{i}": types.SimpleNamespace(skipped=[False] * 4, scales=[1.0] * 4, losses=list(d))
                for i, d in enumerate(rising, 1)}
        return A.skip_note({"fp32": fp32, "fp16_autocast_scaler": scaler, "fp16_autocast_no_scaler": peer},
                           controls=A.PerturbedRuns("fp32", 1e-4, runs))["recipe_skips"]

    assert ("it was already +0.300, while the yardstick's draws were within 0.080 of `fp32` there: the run had "
            "drifted apart before it skipped. `fp16_autocast_no_scaler` had drifted as far at step 1 (+0.320) and "
            "skipped nothing, and at step 2 it was back within the yardstick (+0.010), while `fp16_autocast_scaler` "
            "stayed +0.200: compared with that run, which came back, the gap that stayed points to the skip (one "
            "pair of runs, on one batch).") in with_peer([3.0, 2.32, 2.51, 2.4])
    for losses in ([3.0, 2.2, 2.51, 2.4], [3.0, 2.32, 2.6, 2.4]):   # drifted less far; not back after the skip
        assert "page cannot tell how much of the gap the skip caused." in with_peer(losses)
    # draws as far apart as the run at the skipped step, near fp32 after it: the skip's cost shows through
    note = note_with([3.0, 2.35, 2.5, 2.4], [3.0, 2.0, 2.52, 2.4])
    assert ("the yardstick's draws were within 0.020 of `fp32` and `fp16_autocast_scaler` was +0.200: beyond the "
            "yardstick, so the skip's cost shows through the run's sensitivity.") in note
    note = note_with([3.0, 2.2, 2.5, 2.4], [3.0, 2.08, 2.9, 2.4])
    assert ("one of the two draws rose at step 1 as far as the smallest autocast rise or further, and one more at "
            "least half as far") in note
    assert ("the yardstick's draws were within 0.400 of `fp32` and `fp16_autocast_scaler` was +0.200: within the "
            "yardstick, so this page cannot tell the skip's cost from the run's sensitivity.") in note
    note = note_with([3.0, 2.07, 2.5, 2.4], [3.0, 2.0, 2.6, 2.4])
    assert ("was +0.070 and +0.000 from its unperturbed run at step 1, and up to 0.100 at any step: a perturbation "
            "this small does not set off the rise, which this page does not explain further.") in note
    # controls of another recipe are no yardstick for fp32
    assert "which this page does not explain further." in note_with(*rising, recipe="bf16_autocast")
    bf16.losses = [3.0, 1.9, 2.5, 2.4]      # bf16_autocast below fp32 at step 1: no shared rise to report
    assert "every autocast run" not in A.skip_note({"fp32": fp32, "bf16_autocast": bf16,
                                                    "fp16_autocast_scaler": scaler})["recipe_skips"]


def test_perturbed_runs_are_run_recipes_run_from_nudged_weights():
    from course_lib.device import SizeProfile
    from course_lib.train import run_recipe

    small = SizeProfile("small")
    plain = run_recipe("fp32", small, "cpu", steps=3)
    same = A.perturbed_runs(small, "cpu", steps=3, scale=0.0, draws=1)
    assert (same.recipe, same.scale, list(same.runs)) == ("fp32", 0.0, ["fp32, perturbed (1)"])
    assert same.runs["fp32, perturbed (1)"].losses == plain.losses            # scale 0: run_recipe's run, bit for bit
    nudged = A.perturbed_runs(small, "cpu", steps=3, scale=1e-3, draws=2)
    first, second = (h.losses for h in nudged.runs.values())
    assert first[0] != plain.losses[0] and first != second                   # each draw its own noise
    assert first[0] == pytest.approx(plain.losses[0], rel=1e-2)              # ... and a small one
    assert A.perturbed_runs(small, "cpu", steps=3, scale=1e-3, draws=1).runs["fp32, perturbed (1)"].losses == first
    for bad, match in (({"scale": -1e-4}, "scale must be"), ({"scale": math.nan}, "scale must be"),
                       ({"draws": 0}, "draws must be"), ({"steps": 0}, "steps must be"), ({"draws": True}, "draws")):
        with pytest.raises(ValueError, match=match):
            A.perturbed_runs(small, "cpu", **{"steps": 2, **bad})
