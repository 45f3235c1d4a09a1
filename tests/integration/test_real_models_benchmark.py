"""benchmarks/real_models.py --quick: the real-model benchmark runs end to end on small
models (structure only: a row per model and step, float32 / Grappler / tf_mpt speed-ups and
tf_mpt's Casts, graph timing's candidates, a second float32 Session's ratio as the run's noise;
no timing is asserted). tf_keras builds the models."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from support.helpers import child_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None,
                    reason='needs tf_keras: python -m pip install --no-deps "tf_keras==2.21.*"')
@pytest.mark.heavy
def test_quick_run_prints_a_row_per_model_and_step():
    env = child_env(keep=("TF_MPT_OP_COSTS",))  # the injected times
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "real_models.py"),
                           "--quick"], env=env, capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("CPU: ") and "native bfloat16: " in lines[0]
    rows = [line for line in lines
            if re.match(r"\| (MobileNetV2|LSTM) \| (inference|training)", line)]
    assert len(rows) == 4, proc.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[2]) > 0
        assert re.fullmatch(r"\d+\.\d\dx", cells[3]) and re.fullmatch(r"\d+\.\d\dx", cells[4])
        folds = "batch norm(s) folded" in cells[9]
        assert re.fullmatch(r"\d+\.\d\dx", cells[5]) if folds else cells[5] == "-"
        assert re.fullmatch(r"\d+\.\d\dx", cells[6])  # float32 again: the run's noise
        # graph timing's candidates: none here (the suite's table stands in for this CPU)
        assert cells[8] == "not timed (target not here, or TF_MPT_TIMING_BUDGET=0)", row
        assert int(cells[7]) >= 0 and cells[9].startswith("Converted ")
        converted = int(re.match(r"Converted (\d+)/", cells[9]).group(1))
        assert converted > 0 or "kept float32 by the cost model" in cells[9], row
    assert any("batch norm(s) folded" in row for row in rows)  # MobileNetV2's inference
    assert sum(line.startswith("| geometric mean |") for line in lines) == 2
