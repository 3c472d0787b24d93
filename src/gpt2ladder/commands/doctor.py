"""`gpt2ladder doctor`: the machine's capabilities -> the checks (`measure.doctor`) -> a report or JSON."""

from __future__ import annotations

import json
import sys

from gpt2ladder.measure.doctor import data_disk, diagnose
from gpt2ladder.report.doctor import format_report, marks_for
from gpt2ladder.runtime.hardware import cap_memory, detect, resolve_device


def doctor_command(args) -> int:
    device = resolve_device(args.device)
    caps = cap_memory(device, detect(device, probe=True), args.gpu_memory)
    report = diagnose(caps, disk=data_disk())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report, marks_for(sys.stdout)))
    return 0
