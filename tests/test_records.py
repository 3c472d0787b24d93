"""benchmarks/RECORDS.md is what benchmarks/records.py builds from the record folders, and every record.json
holds the fields the table and a reader need: the claim, its judge, the result with its spread, the verdict,
the device; a folder holds only its record and the files the record lists."""

import copy
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _records_module():
    spec = importlib.util.spec_from_file_location("records_table", ROOT / "benchmarks" / "records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


records = _records_module()
FOLDERS = sorted(p for p in records.RECORDS.iterdir() if p.is_dir())

RACE = {"date": "2026-12-10", "kind": "race",
        "claim": "auto reaches val 3.28 on FineWeb sooner than the write-up's rungs",
        "judge": "time to val loss 3.28 over three seeds", "baseline": "the write-up's last rung",
        "result": {"summary": "412 s (mean of 3 seeds)", "value": 412.0, "unit": "s", "spread": [405.0, 420.0],
                   "spread_kind": "min to max over seeds", "target_val_loss": 3.28, "seeds": [0, 1, 2]},
        "verdict": "measured", "git_sha": "0" * 40, "device": {"type": "cuda", "name": "NVIDIA H100", "count": 8}}


def test_there_are_records_of_every_kind_the_results_page_shows():
    kinds = {json.loads((f / "record.json").read_text())["kind"] for f in FOLDERS if (f / "record.json").is_file()}
    assert {"ladder", "rung", "parity", "scaling", "small_card", "train_vs_bench", "race"} <= kinds


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_every_record_has_the_required_fields_and_only_its_files(folder):
    assert (folder / "record.json").is_file(), f"{folder.name} holds no record.json"
    record = json.loads((folder / "record.json").read_text())
    assert records.problems(folder.name, record, folder) == []
    unlisted = {p.name for p in folder.iterdir()} - {"record.json", *record.get("files", {})}
    assert not unlisted, f"{folder.name} holds files its record does not list: {sorted(unlisted)}"


def test_the_table_is_up_to_date_with_the_records():
    assert records.TABLE.read_text() == records.render(records.load()), "run: python benchmarks/records.py"
    assert records.main(["--check"]) == 0


def test_the_table_has_a_row_per_record_linking_its_folder():
    table = records.TABLE.read_text()
    for folder in FOLDERS:
        assert f"](records/{folder.name}/)" in table


def test_a_race_record_fits_and_renders_its_spread(tmp_path):
    assert records.problems("2026-12-10_race-fineweb", RACE) == []
    row = records.render([("2026-12-10_race-fineweb", RACE)]).splitlines()[-1]
    assert "412 s (mean of 3 seeds) (min to max over seeds 405 to 420 s)" in row and "8× H100" in row


def test_a_record_missing_a_field_or_with_an_unknown_verdict_is_reported(tmp_path):
    broken = copy.deepcopy(RACE)
    del broken["judge"]
    assert records.problems("2026-12-10_x", broken) == ["judge missing or not a str"]
    odd = {**copy.deepcopy(RACE), "verdict": "great", "date": "2026-12-11"}
    odd["result"]["spread"] = [1.0]
    found = records.problems("2026-12-10_x", odd, tmp_path)
    assert any("verdict 'great'" in p for p in found) and any("spread" in p for p in found)
    assert any("does not start with its date" in p for p in found)
    listed = {**copy.deepcopy(RACE), "files": {"ladder.json": "the bench"}}
    assert records.problems("2026-12-10_x", listed, tmp_path) == ["lists ladder.json, which is not in its folder"]


def test_a_stale_table_fails_the_check(tmp_path, monkeypatch):
    stale = tmp_path / "RECORDS.md"
    stale.write_text(records.TABLE.read_text().replace("| 20", "| 19", 1))
    monkeypatch.setattr(records, "TABLE", stale)
    assert records.main(["--check"]) == 1


def test_picture_of_a_folder_without_a_ladder_is_refused_in_one_line(tmp_path, capsys):
    assert records.main(["--picture", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no ladder.json" in err
