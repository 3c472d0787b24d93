"""Recipes: parsed into parts in race order; each part's kind decides the family, optimizer and schedule."""

import re

import pytest

from gpt2ladder.defaults import OPTIM
from gpt2ladder.errors import UsageError
from gpt2ladder.model.recipe import GPT2, PARTS, SPEEDRUN, Recipe, parse_recipe, race_recipes
from gpt2ladder.training.schedule import lr_at, momentum_at


def test_gpt2_is_the_default_and_its_own_name():
    assert parse_recipe(None) == parse_recipe("gpt2") == GPT2
    assert (GPT2.family, GPT2.optimizer, GPT2.schedule, GPT2.name) == ("gpt2", "adamw", "cosine", "gpt2")


def test_parts_are_put_in_race_order_and_decide_the_three_settings():
    recipe = parse_recipe("wsd, relu2,muon,relu2")
    assert recipe.parts == ("muon", "relu2", "wsd") and recipe.name == "muon,relu2,wsd"
    assert (recipe.family, recipe.optimizer, recipe.schedule, recipe.model_parts) == ("modern", "muon", "wsd",
                                                                                      ("relu2",))
    assert parse_recipe("muon").family == "gpt2"  # an optimizer alone keeps GPT-2's model
    assert parse_recipe("speedrun") == Recipe(SPEEDRUN) and parse_recipe("gpt2,rope") == parse_recipe("rope")


def test_speedrun_in_a_list_stands_for_its_parts():
    on_top = parse_recipe("unet_skips,speedrun")
    assert set(on_top.parts) == {*SPEEDRUN, "unet_skips"} and on_top.parts[-1] == "wsd"  # in PARTS order
    assert parse_recipe("speedrun,muon") == parse_recipe("speedrun")  # a part it has already: the same recipe


@pytest.mark.parametrize("spec", ["nope", "muon,nope", ",", ""])
def test_an_unknown_part_is_one_line_naming_the_choices(spec):
    with pytest.raises(UsageError, match="choose from: gpt2, speedrun, muon") as err:
        parse_recipe(spec)
    assert "\n" not in str(err.value)


def test_race_rung_k_is_the_first_k_parts_on_gpt2():
    names = ["gpt2"] + [p.name for p in PARTS[:3]]
    recipes = race_recipes(names)
    assert [r.name for r in recipes] == ["gpt2", "muon", "muon,rope", "muon,rope,qk_norm"]


def test_wsd_holds_the_peak_then_decays_linearly_to_the_floor():
    rates = [lr_at(s, 1.0, 0.1, 10, 100, "wsd") for s in range(100)]
    assert rates[9] == 1.0 and rates[10:60] == [1.0] * 50  # stable until the last 40%
    assert rates[60] == 1.0 and rates[80] == pytest.approx(0.55) and rates[99] == pytest.approx(0.1225)
    assert lr_at(100, 1.0, 0.1, 10, 100, "wsd") == 0.1
    assert all(a >= b for a, b in zip(rates[10:], rates[11:]))
    assert lr_at(50, 1.0, 0.1, 10, 100) < 1.0  # cosine decays all along
    longer = [lr_at(s, 1.0, 0.1, 10, 100, "wsd", decay_fraction=0.7) for s in range(100)]
    assert longer[10:30] == [1.0] * 20 and longer[31] < 1.0 and longer[99] == pytest.approx(rates[99], abs=0.01)
    assert lr_at(80, 1.0, 0.1, 10, 100, "cosine", decay_fraction=0.7) == lr_at(80, 1.0, 0.1, 10, 100)  # wsd's alone
    assert lr_at(43, 1.0, 0.1, 10, 100, "wsd", 0.57) == 1.0 > lr_at(44, 1.0, 0.1, 10, 100, "wsd", 0.57)  # 57 steps


def test_the_new_model_parts_race_after_softcap_and_the_speedrun_is_the_list_the_race_has_shown():
    names = [p.name for p in PARTS]
    assert names[names.index("softcap"):] == ["softcap", "value_embeds", "unet_skips", "doc_windows", "wsd",
                                              "momentum_warmup", "polar_express", "bf16_tables", "embed_skips"]
    assert SPEEDRUN == ("muon", "rope", "qk_norm", "relu2", "rmsnorm", "zero_init", "untied_head", "softcap",
                        "value_embeds", "wsd")
    assert not {"unet_skips", "doc_windows", "momentum_warmup", "polar_express", "bf16_tables", "embed_skips"} & set(
        SPEEDRUN)
    recipe = parse_recipe("doc_windows,value_embeds,unet_skips")
    assert recipe.model_parts == ("value_embeds", "unet_skips", "doc_windows") and recipe.family == "modern"


def test_momentum_warmup_rises_linearly_from_085_to_095_over_300_steps_then_stays():
    assert momentum_at(0) == 0.85 and momentum_at(150) == pytest.approx(0.90) and momentum_at(300) == 0.95
    assert momentum_at(30) == pytest.approx(0.85 + 0.1 * 30 / 300) and momentum_at(10_000) == 0.95
    values = [momentum_at(s) for s in range(400)]
    assert all(a < b for a, b in zip(values[:300], values[1:301])) and set(values[300:]) == {0.95}
    recipe = parse_recipe("speedrun,momentum_warmup")
    assert recipe.momentum_warmup and recipe.optimizer == "muon" and recipe.parts[-1] == "momentum_warmup"
    assert not parse_recipe("speedrun").momentum_warmup
    assert momentum_at(300) == OPTIM["muon_momentum"]  # it ends at the momentum a recipe without it keeps


@pytest.mark.parametrize("spec, says", [("momentum_warmup", "momentum_warmup warms Muon's momentum"),
                                         ("rope,momentum_warmup", "momentum_warmup warms Muon's momentum"),
                                         ("speedrun-muon+polar_express",
                                          "polar_express changes Muon's orthogonalisation")])
def test_a_part_of_muon_without_muon_is_refused_in_one_line(spec, says):
    with pytest.raises(UsageError, match=re.escape(says) + ".*add muon") as err:
        parse_recipe(spec)
    assert "\n" not in str(err.value)


def test_a_recipe_written_with_signs_adds_and_takes_away_parts_left_to_right():
    """`speedrun-relu2,momentum_warmup`: speedrun's parts but relu2, and momentum_warmup; the race's rung of a written
    name trains the recipe `--recipe` gives that name."""
    from gpt2ladder.measure.race import stacked_recipe

    recipe = parse_recipe("speedrun-relu2,momentum_warmup")
    assert recipe.parts == (*(p for p in SPEEDRUN if p != "relu2"), "momentum_warmup")
    assert parse_recipe(" speedrun - relu2 + momentum_warmup ") == recipe
    assert parse_recipe("speedrun-rope-qk_norm").parts == tuple(p for p in SPEEDRUN if p not in ("rope", "qk_norm"))
    assert parse_recipe("gpt2+muon+rope") == parse_recipe("muon,rope")
    assert parse_recipe("speedrun-relu2,relu2") == parse_recipe("speedrun")  # each comma item adds its parts
    assert parse_recipe("gpt2,gpt2") == parse_recipe(",gpt2") == GPT2
    for name in ("speedrun-relu2", "speedrun+value_embeds-wsd", "momentum_warmup+speedrun"):
        assert stacked_recipe(name) == parse_recipe(name)


@pytest.mark.parametrize("spec, says", [
    ("speedrun-nope", "unknown recipe part nope; choose from: gpt2, speedrun, muon"),
    ("speedrun-unet_skips", "it takes away unet_skips, which the parts before it do not have"),
    ("speedrun+gpt2", "it adds gpt2, which is no part"),
    ("muon-muon", "recipe 'muon-muon': it takes every part away, which leaves GPT-2: name gpt2 instead"),
    ("muon-muon+rope", "it takes every part away"),
    ("speedrun+gpt2", "recipe 'speedrun+gpt2': it adds gpt2"),
    ("speedrun-muon,momentum_warmup", "momentum_warmup warms Muon's momentum, and the recipe has no muon"),
    ("untied_head,bf16_tables", "bf16_tables keeps tables in bf16, where AdamW's weight decay (under muon, none) would "
                                "round away, and the recipe has no muon"),
    ("speedrun-untied_head+bf16_tables", "bf16_tables keeps the token embedding in bf16 only where it is not the "
                                         "classifier's weight too; add untied_head"),
    ("speedrun-", "recipe 'speedrun-': it has an empty part beside a + or - sign")])
def test_a_written_recipe_that_cannot_be_read_is_one_line(spec, says):
    with pytest.raises(UsageError, match=re.escape(says)) as err:
        parse_recipe(spec)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("spec, says", [
    ("speedrun@muon_lr=0.03", "train takes them as flags: --recipe speedrun --muon-lr 0.03"),
    ("speedrun@tokens_per_step=8192@steps=3000", "train takes them as flags: --recipe speedrun --tokens-per-step 8192 "
                                                 "--steps 3000"),
    ("speedrun@", "written name@key=value; train takes them as flags (--recipe speedrun --muon-lr 0.03)"),
    ("@steps=3", "written name@key=value"), ("speedrun@steps", "written name@key=value")])
def test_a_race_rungs_settings_given_to_recipe_point_to_the_flags(spec, says):
    with pytest.raises(UsageError, match=f"recipe '{re.escape(spec)}': @ gives a race rung settings of its own"
                                         f".*{re.escape(says)}") as err:
        parse_recipe(spec)
    assert "\n" not in str(err.value)
